"""``bridge inspect``: the header and a summary of any bridge stream."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..format.reader import open_reader
from ..format.records import Example


def summary_tables(info: dict) -> list:
    """The tables ``bridge inspect`` prints of a summary (:func:`bridgecli.analysis.tables.summary_tables`)."""
    from ..analysis.tables import summary_tables as tables

    return tables(info)


def run_stats(path: str | None, *, as_json: bool = False, png: str | None = None) -> dict:
    """``bridge inspect --stats``: the distributions of the stream at ``path`` printed (a table, or JSON),
    their histograms drawn into ``png`` (:func:`bridgecli.analysis.stats.run_stats`)."""
    from ..analysis.stats import run_stats as print_stats

    return print_stats(path, as_json=as_json, png=png)


def summarize(path: str | None) -> dict:
    """What ``bridge inspect`` prints of the stream at ``path``: its header and totals over its examples."""
    totals = _Totals()
    with open_reader(path) as reader:
        for ex in reader:
            totals.add(ex)
    out: dict[str, Any] = {**_header_summary(reader), **totals.counts()}
    for part, summary in (
        ("scores", totals.scores()),
        ("selection", totals.selection()),
        ("references", totals.references or None),  # name -> examples carrying it (bridge reference)
        ("closure", totals.closure()),
        ("rows", totals.rows_summary()),
    ):
        if summary is not None:
            out[part] = summary
    return out


def _header_summary(reader) -> dict[str, Any]:
    """The stream's format and header, as ``bridge inspect`` shows them."""
    h = reader.header
    return {
        "file": reader.name,
        "format": f"{reader.version[0]}.{reader.version[1]}",
        "stage": h.stage,
        "producer": h.producer,
        "created": h.created,
        "source": h.source,
        "model": {
            "source": h.model.source,
            "fingerprint": h.model.fingerprint,
            "tokenizer_fingerprint": h.model.tokenizer_fingerprint,
            "chat_template": h.model.chat_template,
        },
        "steps": [{"step": s.step, "producer": s.producer, "time": s.time, "params": s.params} for s in h.steps],
    }


@dataclass
class _Totals:
    """Sums over a stream's examples, each part of the records counted where it is present."""

    n: int = 0
    tokens: int = 0
    prompt: int = 0
    resp: int = 0
    a_sum: float = 0.0
    a_pos: int = 0
    a_count: int = 0
    references: dict[str, int] = field(default_factory=dict)
    methods: set[str] = field(default_factory=set)
    kept_p: int = 0
    kept_r: int = 0
    budget_p: int = 0
    budget_r: int = 0
    protected_p: int = 0
    protected_r: int = 0
    gain_sum: float = 0.0  # u_sur's last minus first, over the examples with two rounds or more
    gains: int = 0
    closure_sup: int = 0
    units: int = 0
    unit_tokens: int = 0
    chosen_units: int = 0
    # what `bridge compact` writes (without --trim-tail): its rows, their executed and supervised tokens
    rows: int = 0
    executed: int = 0
    row_supervised: int = 0

    def add(self, ex: Example) -> None:
        self.n += 1
        self.tokens += len(ex.tokens.input_ids)
        self.prompt += len(ex.tokens.prompt_positions())
        self.resp += len(ex.tokens.response_positions())
        if ex.scores is not None:
            a = ex.scores.a.numpy()
            self.a_sum += float(a.sum())
            self.a_pos += int((a > 0).sum())
            self.a_count += a.size
        for ref_name in ex.references:
            self.references[ref_name] = self.references.get(ref_name, 0) + 1
        sel = ex.selection
        if sel is not None:
            self.methods.add(sel.method)
            self.kept_p += len(sel.prompt_keep)
            self.kept_r += len(sel.response_keep)
            self.budget_p += sel.b_p
            self.budget_r += sel.b_r
            self.protected_p += len(sel.protected_prompt)
            self.protected_r += len(sel.protected_response)
            if len(sel.u_sur) > 1:
                self.gain_sum += sel.u_sur[-1] - sel.u_sur[0]
                self.gains += 1
        supervise = ex.closure.supervise if ex.closure is not None else sel.response_keep if sel is not None else []
        if sel is not None and supervise:  # compact's rule: a row where a response token is supervised
            self.rows += 1
            self.executed += len(ex.tokens.input_ids) - len(ex.tokens.prompt_positions()) + len(sel.prompt_keep)
            self.row_supervised += len(supervise) + len(ex.tokens.eos_positions())
        if ex.closure is not None:
            self.closure_sup += len(ex.closure.supervise)
            u = np.asarray(ex.closure.units, dtype=np.int64).reshape(-1, 2)
            self.units += len(u)
            self.unit_tokens += int((u[:, 1] - u[:, 0]).sum())
            self.chosen_units += len(ex.closure.chosen)

    def counts(self) -> dict[str, int]:
        return {
            "examples": self.n,
            "tokens": self.tokens,
            "eligible_prompt_tokens": self.prompt,
            "eligible_response_tokens": self.resp,
        }

    def scores(self) -> dict | None:
        if not self.a_count:
            return None
        return {"mean_a": self.a_sum / self.a_count, "positive_a_fraction": self.a_pos / self.a_count}

    def selection(self) -> dict | None:
        if not (self.budget_p or self.budget_r):
            return None
        kept_p, kept_r, prompt, resp = self.kept_p, self.kept_r, self.prompt, self.resp
        out: dict[str, Any] = {
            "prompt_kept": kept_p,
            "response_kept": kept_r,
            "achieved_rho_p": kept_p / prompt if prompt else None,
            "achieved_rho_r": kept_r / resp if resp else None,
            "method": ", ".join(sorted(self.methods)),
            "budget_p": self.budget_p,
            "budget_r": self.budget_r,
            "retained": kept_p + kept_r,
            "retained_fraction": (kept_p + kept_r) / (prompt + resp) if prompt + resp else None,
            "mean_u_sur_gain": self.gain_sum / self.gains if self.gains else None,
        }
        if self.protected_p or self.protected_r:  # select --protect-prompt / --protect-response (format 1.2)
            out["protected_prompt"] = self.protected_p
            out["protected_response"] = self.protected_r
        return out

    def rows_summary(self) -> dict | None:
        """The training rows ``bridge compact`` writes (before ``--trim-tail``): how many, the tokens they
        execute (of every example's tokens) and supervise (the EOS included)."""
        if not (self.budget_p or self.budget_r or self.rows):
            return None
        return {
            "rows": self.rows,
            "executed_tokens": self.executed,
            "executed_fraction": self.executed / self.tokens if self.tokens else None,
            "supervised_tokens": self.row_supervised,
        }

    def closure(self) -> dict | None:
        if not self.units:
            return None
        return {
            "supervised": self.closure_sup,
            "supervised_fraction": self.closure_sup / self.resp if self.resp else None,
            "units": self.units,
            "chosen_units": self.chosen_units,
            "mean_unit_tokens": self.unit_tokens / self.units,
        }
