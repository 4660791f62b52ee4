"""``bridge show``: what a selection keeps, in the terminal (rich) and as a self-contained HTML page.

Dropped prompt tokens are dim and struck through, kept prompt tokens plain, template tokens
muted; supervised response tokens are highlighted with a colour whose strength follows their
score (green positive, red negative); closure units are delimited. Every token carries its scores
(HTML: on hover, via ``title``).

The view keeps the stream's text and names as they are; each renderer shows them through
:func:`bridgecli.display.printable`, so no control character of the data (an escape sequence that
retitles or clears the terminal, a carriage return) reaches the terminal or the page: it is shown as
``\x1b``, ``\r``, ...; the text keeps its line breaks and tabs, ids and names are one line.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

import numpy as np

from ..display import printable
from ..format.records import Example, Header
from ..format.spec import EOS, PROMPT, RESPONSE, TEMPLATE

KIND_NAMES = {TEMPLATE: "template", PROMPT: "prompt", RESPONSE: "response", EOS: "eos"}


@dataclass
class TokenView:
    pos: int
    text: str
    kind: str
    kept: bool  # prompt: executed; response/eos: supervised; template: always True
    score: float | None = None  # response: the score the highlight follows
    strength: float = 0.0  # |score| / max |score| over the response, in [0, 1]
    unit: int | None = None  # closure unit index (response tokens)
    unit_start: bool = False
    unit_end: bool = False
    unit_size: int = 0
    unit_chosen: bool = False
    info: dict = field(default_factory=dict)  # hover details


@dataclass
class ExampleView:
    id: str
    index: int
    stage: str
    tokens: list[TokenView]
    summary: dict
    score_name: str | None


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def _heading(view: ExampleView) -> str:
    """``example ID (index K, stage S)``, with the stream's id and stage shown safely."""
    return f"example {printable(view.id)} (index {view.index}, stage {printable(view.stage)})"


def _summary(view: ExampleView, sep: str) -> str:
    return sep.join(f"{printable(k)}: {printable(v)}" for k, v in view.summary.items())


@dataclass
class _Scores:
    """The example's scores as the view shows them (all None without scores)."""

    a: np.ndarray | None = None
    c: np.ndarray | None = None
    A: np.ndarray | None = None
    loss: np.ndarray | None = None
    score: np.ndarray | None = None  # what the response highlight follows
    score_name: str | None = None
    scale: float = 0.0  # max |score|
    delta_p: np.ndarray | None = None  # prompt-side conditional scores under the kept response state
    attn_in: np.ndarray | None = None  # attention each prompt token receives


def _scores(example: Example, resp: np.ndarray, resp_index: dict[int, int]) -> _Scores:
    sc, sel = example.scores, example.selection
    out = _Scores()
    if sc is not None:
        out.a, out.c = sc.a.numpy().astype(np.float64), sc.c.numpy().astype(np.float64)
        out.A = sc.A.numpy().astype(np.float64)
        out.loss = sc.loss.numpy() if sc.loss is not None else None
    if sel is not None:
        out.score, out.score_name = sel.response_scores.numpy().astype(np.float64), "Delta_r(j|S_p)"
    elif out.a is not None:
        out.score, out.score_name = out.a, "a_j"
    out.scale = float(np.max(np.abs(out.score))) if out.score is not None and out.score.size else 0.0
    if out.a is not None and out.A is not None and out.A.size:
        s_r = [resp_index[p] for p in (sel.response_keep if sel is not None else resp.tolist()) if p in resp_index]
        out.delta_p = (out.A[s_r] * out.a[s_r, None]).sum(axis=0)
        out.attn_in = out.A.sum(axis=0)
    return out


@dataclass
class _Units:
    """The closure units: each response position's unit, the units' first and last positions and
    sizes, and the chosen ones (all empty without a closure)."""

    of: dict[int, int] = field(default_factory=dict)
    first: set[int] = field(default_factory=set)
    last: set[int] = field(default_factory=set)
    sizes: dict[int, int] = field(default_factory=dict)
    chosen: set[int] = field(default_factory=set)


def _units(example: Example) -> _Units:
    cl = example.closure
    out = _Units()
    if cl is None:
        return out
    out.chosen = set(cl.chosen)
    u = np.asarray(cl.units, dtype=np.int64).reshape(-1, 2)
    for k, (s, e) in enumerate(u):
        out.first.add(int(s))
        out.last.add(int(e) - 1)
        out.sizes[k] = int(e - s)
        for p in range(int(s), int(e)):
            out.of[p] = k
    return out


def _prompt_token(pos: int, text: str, kname: str, kept: bool, k: int, sc: _Scores) -> TokenView:
    info: dict = {"position": pos, "kept": "yes" if kept else "no (dropped)"}
    if sc.delta_p is not None and sc.attn_in is not None:
        info["Delta_p(i|S_r)"] = _fmt(sc.delta_p[k])
        info["attention received"] = _fmt(sc.attn_in[k])
    return TokenView(pos, text, kname, kept, info=info)


def _response_token(
    pos: int, text: str, kname: str, kept: bool, k: int, sc: _Scores, units: _Units, kept_cols: list[int]
) -> TokenView:
    info: dict = {"position": pos, "supervised": "yes" if kept else "no"}
    val = None
    if sc.score is not None:
        val = float(sc.score[k])
        info[sc.score_name or ""] = _fmt(val)
    if sc.a is not None and sc.c is not None and sc.A is not None:  # set together
        info["a_j"] = _fmt(sc.a[k])
        info["c_j"] = _fmt(sc.c[k])
        if sc.A.size:
            info["attention to kept prompt"] = _fmt(sc.A[k, kept_cols].sum()) if kept_cols else "0"
    if sc.loss is not None:
        info["loss"] = _fmt(sc.loss[k])
    unit = units.of.get(pos)
    if unit is not None:
        info["unit"] = f"{unit}{' (chosen)' if unit in units.chosen else ''}"
    return TokenView(
        pos,
        text,
        kname,
        kept,
        score=val,
        strength=(abs(val) / sc.scale if (val is not None and sc.scale > 0) else 0.0),
        unit=unit,
        unit_start=pos in units.first,
        unit_end=pos in units.last,
        unit_size=units.sizes.get(unit, 0) if unit is not None else 0,
        unit_chosen=unit in units.chosen,
        info=info,
    )


def build_view(example: Example, header: Header | None = None) -> ExampleView:
    tk = example.tokens
    kinds = np.frombuffer(tk.kinds, dtype=np.uint8)
    spans = tk.spans()
    prompt, resp = tk.prompt_positions(), tk.response_positions()
    sel, cl = example.selection, example.closure
    prompt_keep = set(sel.prompt_keep) if sel is not None else set(prompt.tolist())
    if cl is not None:
        supervised = set(cl.supervise)
    elif sel is not None:
        supervised = set(sel.response_keep)
    else:
        supervised = set(resp.tolist())
    resp_index = {int(p): k for k, p in enumerate(resp)}
    prompt_index = {int(p): k for k, p in enumerate(prompt)}
    sc = _scores(example, resp, resp_index)
    units = _units(example)
    kept_cols = [prompt_index[p] for p in prompt_keep if p in prompt_index]

    views = []
    for pos, kind in enumerate(kinds):
        s, e = spans[pos]
        text = example.text[s:e]
        kname = KIND_NAMES.get(int(kind), str(kind))
        if kind == PROMPT:
            views.append(_prompt_token(pos, text, kname, pos in prompt_keep, prompt_index[pos], sc))
        elif kind == RESPONSE:
            views.append(_response_token(pos, text, kname, pos in supervised, resp_index[pos], sc, units, kept_cols))
        elif kind == EOS:
            views.append(TokenView(pos, text, kname, True, info={"position": pos, "supervised": "yes (EOS, always)"}))
        else:
            views.append(TokenView(pos, text, kname, True, info={"position": pos, "kept": "yes (template, always)"}))

    summary = {
        "tokens": len(kinds),
        "prompt kept": f"{len(prompt_keep & set(prompt.tolist()))}/{len(prompt)}",
        "response supervised": f"{len(supervised & set(resp.tolist()))}/{len(resp)}",
    }
    if sel is not None:
        summary.update({"selector": sel.method, "b_p": sel.b_p, "b_r": sel.b_r})
        if sel.u_sur:
            summary["U_sur"] = " -> ".join(_fmt(x) for x in (sel.u_sur[0], sel.u_sur[-1]))
    if cl is not None:
        summary.update({"segmenter": cl.segmenter, "units": len(cl.units) // 2, "chosen units": len(cl.chosen)})
    stage = header.stage if header is not None else example.stage()
    return ExampleView(example.id, example.index, stage, views, summary, sc.score_name)


# ------------------------------------------------------------------------------------------ terminal

UNIT_OPEN, UNIT_CLOSE = "⟦", "⟧"


#: marks of the plain (no colour) view: what colour and strike-through show on a terminal
DROPPED_OPEN, DROPPED_CLOSE = "~~", "~~"
SUPERVISED_OPEN, SUPERVISED_CLOSE = "[[", "]]"


def render_plain(view: ExampleView) -> str:
    """The view as plain text, for a pipe, a file, a pager or NO_COLOR: dropped prompt tokens in
    ``~~ ~~``, supervised response tokens in ``[[ ]]`` (the notation of ``compact --format text``),
    closure units of several tokens in ``⟦ ⟧``; everything else as it is."""
    out: list[str] = []
    open_: str | None = None  # the mark whose span is open

    def close() -> None:
        nonlocal open_
        if open_ is not None:
            out.append(DROPPED_CLOSE if open_ == "dropped" else SUPERVISED_CLOSE)
            open_ = None

    def mark(kind: str | None, text: str) -> None:
        nonlocal open_
        if kind != open_:
            close()
            if kind is not None:
                out.append(DROPPED_OPEN if kind == "dropped" else SUPERVISED_OPEN)
                open_ = kind
        out.append(printable(text, lines=True))

    for t in view.tokens:
        if t.kind == "prompt":
            mark(None if t.kept else "dropped", t.text)
        elif t.kind == "response":
            multi = t.unit is not None and t.unit_size > 1
            if multi and t.unit_start:
                close()
                out.append(UNIT_OPEN)
            mark("supervised" if t.kept else None, t.text)
            if multi and t.unit_end:
                close()
                out.append(UNIT_CLOSE)
        else:
            mark(None, t.text)
    close()
    title = f"{_heading(view)}  {_summary(view, '  ')}"
    legend = (
        f"legend: kept prompt as is  {DROPPED_OPEN}dropped prompt{DROPPED_CLOSE}  "
        f"{SUPERVISED_OPEN}supervised{SUPERVISED_CLOSE}  not supervised as is  "
        f"{UNIT_OPEN} {UNIT_CLOSE} a closure unit of several tokens (other response tokens are units of their own)"
    )
    return f"{title}\n\n{''.join(out)}\n\n{legend}\n"


def render_terminal(view: ExampleView):
    """A rich renderable: title line, the text with styles, a legend."""
    from rich.console import Group
    from rich.text import Text

    title = Text(f"{_heading(view)}  ", style="bold")  # Text: no markup is read from the data
    title.append(_summary(view, "  "), style="")
    body = Text()
    for t in view.tokens:
        text = printable(t.text, lines=True)
        if t.kind == "template":
            body.append(text, style="grey50 italic")
        elif t.kind == "prompt":
            body.append(text, style="" if t.kept else "dim strike")
        elif t.kind == "eos":
            body.append(text, style="bold reverse")
        else:
            multi = t.unit is not None and t.unit_size > 1
            if multi and t.unit_start:
                body.append(UNIT_OPEN, style="cyan")
            if t.kept:
                body.append(text, style=_rich_highlight(t.score, t.strength))
            else:
                body.append(text, style="grey62")
            if multi and t.unit_end:
                body.append(UNIT_CLOSE, style="cyan")
    legend = Text("legend: ", style="dim")
    legend.append("kept prompt", style="")
    legend.append("  ")
    legend.append("dropped prompt", style="dim strike")
    legend.append("  ")
    legend.append("template", style="grey50 italic")
    legend.append("  ")
    legend.append("supervised (+)", style=_rich_highlight(1.0, 1.0))
    legend.append(" ")
    legend.append("supervised (-)", style=_rich_highlight(-1.0, 1.0))
    legend.append("  ")
    legend.append("not supervised", style="grey62")
    legend.append(
        f"  {UNIT_OPEN} {UNIT_CLOSE} a closure unit of several tokens (other response tokens are units of their own)",
        style="cyan",
    )
    if view.score_name:
        legend.append(f"  (highlight strength: |{printable(view.score_name)}|)", style="dim")
    return Group(title, Text(""), body, Text(""), legend)


def _rich_highlight(score: float | None, strength: float) -> str:
    if score is None:
        return "black on rgb(200,200,255)"
    lo = 235
    v = int(round(lo - (lo - 120) * min(1.0, max(0.0, strength))))
    if score >= 0:
        return f"black on rgb({v},{255},{v})"
    return f"black on rgb({255},{v},{v})"


# ------------------------------------------------------------------------------------------ HTML

CSS = """
body { font-family: system-ui, -apple-system, Segoe UI, Roboto, sans-serif; margin: 2em auto; max-width: 60em;
       color: #222; background: #fff; }
h1 { font-size: 1.2em; } .summary { color: #555; font-size: .9em; margin-bottom: 1em; }
.text { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; white-space: pre-wrap;
        line-height: 1.9; border: 1px solid #ddd; padding: 1em; border-radius: 6px; }
.tok { border-radius: 2px; }
.tok:hover { outline: 2px solid #333; }
.template { color: #999; font-style: italic; }
.prompt.kept { color: #111; }
.prompt.dropped { color: #aaa; text-decoration: line-through; }
.response.unsup { color: #888; }
.eos { background: #333; color: #fff; }
.unit { border: 1px dashed #9cc; border-radius: 3px; padding: 1px 0; margin: 0 1px; }
.unit.chosen { border: 1px solid #088; }
.unit.single { border: none; margin: 0; }
.legend { margin-top: 1em; font-size: .85em; color: #444; }
.legend span { margin-right: 1.2em; }
"""


def _html_color(score: float | None, strength: float) -> str:
    alpha = 0.15 + 0.75 * min(1.0, max(0.0, strength))
    if score is None:
        return f"rgba(90,90,255,{alpha:.3f})"
    return f"rgba(0,170,60,{alpha:.3f})" if score >= 0 else f"rgba(220,40,40,{alpha:.3f})"


def _title(info: dict) -> str:
    return "&#10;".join(html.escape(f"{printable(k)}: {printable(v)}", quote=True) for k, v in info.items())


def render_html(view: ExampleView, title: str = "bridge show") -> str:
    parts = []
    open_unit = None
    for t in view.tokens:
        if t.kind == "response" and t.unit is not None and t.unit != open_unit:
            if open_unit is not None:
                parts.append("</span>")
            cls = ("unit chosen" if t.unit_chosen else "unit") + (" single" if t.unit_size == 1 else "")
            parts.append(f'<span class="{cls}" data-unit="{t.unit}">')
            open_unit = t.unit
        elif t.kind != "response" and open_unit is not None:
            parts.append("</span>")
            open_unit = None
        text = html.escape(printable(t.text, lines=True))
        attrs = f'data-pos="{t.pos}" title="{_title(t.info)}"'
        if t.kind == "template":
            cls, style = "tok template", ""
        elif t.kind == "prompt":
            cls, style = f"tok prompt {'kept' if t.kept else 'dropped'}", ""
        elif t.kind == "eos":
            cls, style = "tok eos sup", ""
        elif t.kept:
            cls, style = "tok response sup", f' style="background:{_html_color(t.score, t.strength)}"'
        else:
            cls, style = "tok response unsup", ""
        parts.append(f'<span class="{cls}" {attrs}{style}>{text}</span>')
    if open_unit is not None:
        parts.append("</span>")
    summary = " &middot; ".join(html.escape(f"{printable(k)}: {printable(v)}") for k, v in view.summary.items())
    score_note = f" (strength: |{html.escape(printable(view.score_name))}|)" if view.score_name else ""
    legend = (
        '<div class="legend">'
        '<span class="prompt kept">kept prompt</span>'
        '<span class="prompt dropped">dropped prompt</span>'
        '<span class="template">template</span>'
        f'<span style="background:{_html_color(1.0, 1.0)}">supervised (+)</span>'
        f'<span style="background:{_html_color(-1.0, 1.0)}">supervised (&minus;)</span>'
        '<span class="response unsup">not supervised</span>'
        f'<span class="unit chosen">closure unit (chosen)</span><span class="unit">closure unit (not chosen)</span>'
        f"{score_note} &middot; hover a token for its scores</div>"
    )
    head = html.escape(_heading(view))
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(printable(title))}</title><style>{CSS}</style></head>\n<body>\n"
        f'<h1>{head}</h1>\n<div class="summary">{summary}</div>\n'
        f'<div class="text" id="example">{"".join(parts)}</div>\n{legend}\n</body></html>\n'
    )
