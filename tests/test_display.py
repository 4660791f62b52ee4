"""Data shown on a terminal: control characters from a stream (ids, text, names) never reach it raw,
in `bridge show` (terminal, plain, HTML), `inspect`, `compact --format text`, notes and errors."""

from __future__ import annotations

import json
import re
import unicodedata

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from bridgecli.cli.app import app
from bridgecli.display import CONTROL, markup, printable
from bridgecli.errors import InputError

# what a hostile stream holds: retitle the terminal (OSC 0), clear it (CSI 2J), write the clipboard
# (OSC 52), overwrite the line (CR), a C1 CSI, a bidi override, and markup rich would read
OSC_TITLE, CLEAR, CLIPBOARD = "\x1b]0;pwned\x07", "\x1b[2J", "\x1b]52;c;aGVsbG8=\x07"
HOSTILE = f"{OSC_TITLE}{CLEAR}{CLIPBOARD}\roverwritten\x9b31m\u202eevil[/bold][red]x"
EVIL_ID = "ex\n### forged 0/0" + OSC_TITLE


def _is_control(ch: str) -> bool:
    return unicodedata.category(ch) == "Cc" or "\u202a" <= ch <= "\u202e" or "\u2066" <= ch <= "\u2069"


@given(st.text())
def test_printable_leaves_no_control_character(text):
    one_line = printable(text)
    assert not any(_is_control(ch) for ch in one_line)
    block = printable(text, lines=True)
    assert not any(_is_control(ch) for ch in block if ch not in "\n\t")
    assert block.count("\n") == text.count("\n")


@given(st.text().filter(lambda t: not any(_is_control(ch) for ch in t)))
def test_printable_keeps_text_without_control_characters(text):
    assert printable(text) == printable(text, lines=True) == text


def test_printable_names_each_escape():
    assert printable("a\x1b[2Jb\r\n\t\x00\x7f\x9b\u202e") == "a\\x1b[2Jb\\r\\n\\t\\x00\\x7f\\x9b\\u202e"
    assert printable("line 1\nline\t2\r", lines=True) == "line 1\nline\t2\\r"
    assert CONTROL.pattern  # one pattern, shared
    assert markup("[bold]x[/]") == "\\[bold]x\\[/]"


def test_error_lines_escape_the_data_they_name():
    err = InputError("bad value " + HOSTILE, file="f.jsonl", record=f"line 3 (id {EVIL_ID})", field="id")
    text = str(err)
    assert "\n" not in text and "\x1b" not in text and "\r" not in text and "\x07" not in text
    assert "\\x1b]0;pwned\\x07" in text


def test_notes_print_data_as_it_is(capsys):
    """No markup (a stray [/bold] is an error in rich; [red] would colour), no escape sequence."""
    from bridgecli.progress import note

    note(f"dropped 1 row ({HOSTILE}) :thumbs_up:")
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\r" not in err
    assert "[/bold][red]x" in err and ":thumbs_up:" in err


# ------------------------------------------------------------------------------------------- a stream


@pytest.fixture(scope="module")
def hostile(tmp_path_factory, tokenizer):
    """A closed stream whose first example has a hostile id and hostile text in prompt and response."""
    from bridgecli.data.shapes import to_pair
    from bridgecli.data.tokenize import tokenize_pair
    from test_show import synthetic, write_stream

    record = {"question": "Q " + HOSTILE, "answer": "A " + HOSTILE + "\n#### 7"}
    evil = synthetic_for(tokenize_pair(tokenizer, to_pair(record, 0, "line 1", "test")), EVIL_ID)
    folder = tmp_path_factory.mktemp("hostile")
    return write_stream(folder / "hostile.bridge", [evil, *synthetic(tokenizer)], "closure")


def synthetic_for(tok, id_):
    """An Example over ``tok`` with a selection keeping half of each side and a closure of one unit."""
    import numpy as np

    from bridgecli.format.records import Array, Closure, Example, Scores, Selection

    ex = Example(id=id_, index=0, text=tok.text, tokens=tok.tokens)
    prompt, resp = ex.tokens.prompt_positions(), ex.tokens.response_positions()
    m, n = len(prompt), len(resp)
    rng = np.random.default_rng(1)
    scores = Scores(scorer="bridge", a=Array.of(rng.normal(size=n).astype(np.float32)),
                    c=Array.of(rng.uniform(0, 0.3, size=n).astype(np.float32)),
                    A=Array.of(np.full((n, m), 0.5 / max(m, 1), dtype=np.float16), "float16"))
    keep_p, keep_r = prompt[::2].tolist(), resp[: n // 2 + 1].tolist()
    sel = Selection(method="bridge", b_p=len(keep_p), b_r=len(keep_r), prompt_keep=keep_p, response_keep=keep_r,
                    response_scores=Array.of(rng.normal(size=n)), u_sur=[0.0, 1.0])
    units = [int(resp[0]), int(resp[-1]) + 1]
    closure = Closure(segmenter="sentence", alpha=0.0, units=units, chosen=[0], supervise=resp.tolist())
    return msgspec.structs.replace(ex, scores=scores, selection=sel, closure=closure)


def _no_raw_control(text: str, *, sgr: bool = False) -> None:
    """No control character but line breaks and tabs (and, with ``sgr``, the colour codes rich writes)."""
    if sgr:
        text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    bad = sorted({f"U+{ord(ch):04X}" for ch in text if _is_control(ch) and ch not in "\n\t"})
    assert not bad, bad


def test_show_plain_terminal_and_html_escape_the_data(hostile, tmp_path):
    from rich.console import Console

    from bridgecli.analysis.render import build_view, render_terminal
    from bridgecli.steps.show import find_example

    page = tmp_path / "show.html"
    result = CliRunner().invoke(app, ["show", str(hostile), "--index", "0", "--html", str(page)])
    assert result.exit_code == 0, result.output
    _no_raw_control(result.stdout)
    assert "\\x1b]0;pwned\\x07" in result.stdout and "\\x1b[2J" in result.stdout and "\\u202e" in result.stdout
    assert "### forged" not in result.stdout.replace("\\n### forged", "")  # the id's newline is shown as \n
    _no_raw_control(page.read_text())
    header, ex = find_example(str(hostile), index=0)
    console = Console(record=True, width=100, color_system="truecolor", force_terminal=True)
    console.print(render_terminal(build_view(ex, header)))
    _no_raw_control(console.export_text(styles=True), sgr=True)
    by_id = CliRunner().invoke(app, ["show", str(hostile), "--id", "nope"])
    assert by_id.exit_code == 2 and len(by_id.stderr.splitlines()) == 1
    _no_raw_control(by_id.stderr)


def test_compact_text_cannot_forge_a_header_line(hostile, tmp_path):
    out = tmp_path / "view.txt"
    result = CliRunner().invoke(app, ["compact", str(hostile), "--format", "text", "-o", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    _no_raw_control(text)
    headers = [line for line in text.splitlines() if line.startswith("### ")]
    assert len(headers) == 4 and headers[0].startswith("### ex\\n### forged 0/0\\x1b]0;pwned\\x07  prompt kept")
    rows = tmp_path / "rows.jsonl"  # JSON escapes them itself: the id comes back as it was
    assert CliRunner().invoke(app, ["compact", str(hostile), "-o", str(rows)]).exit_code == 0
    assert json.loads(rows.read_text().splitlines()[0])["id"] == EVIL_ID


def test_inspect_shows_the_header_without_markup_or_escapes(tmp_path, tokenizer):
    from bridgecli.format.records import Header, ModelInfo, Step
    from bridgecli.format.writer import open_writer
    from test_show import synthetic

    header = Header(stage="closure", producer="test [/x]", created="2026", source=HOSTILE,
                    model=ModelInfo(source="[bold]m" + CLEAR, fingerprint="sha256:0", tokenizer_fingerprint="t"),
                    steps=[Step(step="score", producer="p", time="t", params={"data": HOSTILE, "k[/]": 1})])
    path = tmp_path / "h.bridge"
    with open_writer(path, header) as w:
        for ex in synthetic(tokenizer):
            w.write(ex)
    result = CliRunner().invoke(app, ["inspect", str(path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    _no_raw_control(result.stdout)
    assert "test [/x]" in result.stdout and "[bold]m\\x1b[2J" in result.stdout
