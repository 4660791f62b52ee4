"""``bridge inspect``: the header and a summary of any bridge stream."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..format.reader import open_reader


def summarize(path: str | None) -> dict:
    with open_reader(path) as reader:
        h = reader.header
        n = 0
        tokens = prompt = resp = 0
        kept_p = kept_r = closure_sup = 0
        budget_p = budget_r = 0
        protected_p = protected_r = 0
        gains, unit_sizes, chosen_units = [], [], 0
        a_sum, a_pos, a_count = 0.0, 0, 0
        methods: set[str] = set()
        references: dict[str, int] = {}
        for ex in reader:
            n += 1
            tokens += len(ex.tokens.input_ids)
            m, r = len(ex.tokens.prompt_positions()), len(ex.tokens.response_positions())
            prompt += m
            resp += r
            if ex.scores is not None:
                a = ex.scores.a.numpy()
                a_sum += float(a.sum())
                a_pos += int((a > 0).sum())
                a_count += a.size
            for ref_name in ex.references:
                references[ref_name] = references.get(ref_name, 0) + 1
            if ex.selection is not None:
                methods.add(ex.selection.method)
                kept_p += len(ex.selection.prompt_keep)
                kept_r += len(ex.selection.response_keep)
                budget_p += ex.selection.b_p
                budget_r += ex.selection.b_r
                protected_p += len(ex.selection.protected_prompt)
                protected_r += len(ex.selection.protected_response)
                if len(ex.selection.u_sur) > 1:
                    gains.append(ex.selection.u_sur[-1] - ex.selection.u_sur[0])
            if ex.closure is not None:
                closure_sup += len(ex.closure.supervise)
                u = np.asarray(ex.closure.units, dtype=np.int64).reshape(-1, 2)
                unit_sizes += (u[:, 1] - u[:, 0]).tolist()
                chosen_units += len(ex.closure.chosen)
    out: dict[str, Any] = {
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
        "examples": n,
        "tokens": tokens,
        "eligible_prompt_tokens": prompt,
        "eligible_response_tokens": resp,
    }
    if a_count:
        out["scores"] = {"mean_a": a_sum / a_count, "positive_a_fraction": a_pos / a_count}
    if budget_p or budget_r:
        out["selection"] = {
            "prompt_kept": kept_p,
            "response_kept": kept_r,
            "achieved_rho_p": kept_p / prompt if prompt else None,
            "achieved_rho_r": kept_r / resp if resp else None,
            "method": ", ".join(sorted(methods)),
            "budget_p": budget_p,
            "budget_r": budget_r,
            "retained": kept_p + kept_r,
            "retained_fraction": (kept_p + kept_r) / (prompt + resp) if prompt + resp else None,
            "mean_u_sur_gain": float(np.mean(gains)) if gains else None,
        }
        if protected_p or protected_r:  # select --protect-prompt / --protect-response (format 1.2)
            out["selection"]["protected_prompt"] = protected_p
            out["selection"]["protected_response"] = protected_r
    if references:
        out["references"] = references  # name -> examples carrying it (bridge reference)
    if unit_sizes:
        out["closure"] = {
            "supervised": closure_sup,
            "supervised_fraction": closure_sup / resp if resp else None,
            "units": len(unit_sizes),
            "chosen_units": chosen_units,
            "mean_unit_tokens": float(np.mean(unit_sizes)),
        }
    return out
