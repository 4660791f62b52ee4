"""Fuzz the stream readers with well-typed but inconsistent records.

Each case builds a small consistent stream (tokens, scores, then the real BRIDGE selection and
sentence closure), breaks one field of one record in a way that keeps every type right (so the
checksums and the decoder accept it) but makes the record inconsistent, writes the stream, and
runs ``select``, ``close`` and ``compact`` on it in this process. Every run must end in a
``FormatError`` (exit 3): never another exception (a traceback) and never success (which would
mean an output computed from a record that makes no sense), and no output file may appear.

    python bench/fuzz/records.py                 # 10,000 cases, seeds 0-9999
    python bench/fuzz/records.py --cases 500 --seed 7 -o bench/fuzz/results/records.json

tests/test_fuzz_records.py drives the same cases from hypothesis.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Callable

import msgspec
import numpy as np

from bridgecli.errors import BridgeError, FormatError
from bridgecli.format import Array, Closure, Example, Header, ModelInfo, Scores, Selection, Tokens, open_writer
from bridgecli.format.spec import EOS, PROMPT, RESPONSE, TEMPLATE

STAGE_OF = {"tokens": 0, "scores": 1, "selection": 2, "closure": 3}
HEADER = Header(stage="scores", producer="fuzz", created="2026-01-01T00:00:00+00:00",
                model=ModelInfo(source="fuzz", fingerprint="sha256:00", tokenizer_fingerprint="sha256:11"))
WORDS = ("alpha", "beta", "gamma.", "delta", "eps!", "zeta", "eta?", "theta", "iota.", "kappa")


# -- consistent streams -----------------------------------------------------------------------------

def scored_example(rng: random.Random, i: int) -> Example:
    """Template tokens, n_p prompt tokens, a template separator, n_r response tokens, EOS; offsets into
    ``text``; scores of the right shapes."""
    kinds: list[int] = [TEMPLATE] * rng.randint(0, 2) + [PROMPT] * rng.randint(0, 6) + [TEMPLATE] \
        + [RESPONSE] * rng.randint(1, 9) + [EOS]
    text, offsets = "", []
    for k in kinds:
        if k == TEMPLATE or k == EOS:
            offsets += [len(text), len(text)]
            continue
        word = rng.choice(WORDS) + " "
        offsets += [len(text), len(text) + len(word) - 1]
        text += word
    n_p, n_r = kinds.count(PROMPT), kinds.count(RESPONSE)
    gen = np.random.default_rng(rng.getrandbits(32))
    scores = Scores(scorer="bridge", a=Array.of(gen.normal(size=n_r)), c=Array.of(gen.random(n_r)),
                    A=Array.of(gen.random((n_r, n_p)), "float16"), loss=Array.of(gen.random(n_r) * 3))
    return Example(id=f"ex-{i}", index=i, text=text,
                   tokens=Tokens(input_ids=[rng.randint(0, 49151) for _ in kinds], kinds=bytes(kinds),
                                 offsets=offsets),
                   scores=scores)


def consistent_stream(rng: random.Random, stage: str) -> list[Example]:
    """2-4 examples at ``stage`` (scores, selection or closure), made by the real steps' functions."""
    from bridgecli.registry import get
    from bridgecli.steps.close import close_example
    from bridgecli.steps.select import select_example

    examples = [scored_example(rng, i) for i in range(rng.randint(2, 4))]
    if STAGE_OF[stage] >= 2:
        selector = get("selector", "bridge").obj
        rho_p, rho_r = rng.choice((0.0, 0.3, 0.75, 1.0)), rng.choice((0.0, 0.3, 0.75, 1.0))
        examples = [select_example(e, selector, "bridge", rho_p, rho_r, {"rounds": 2}) for e in examples]
    if STAGE_OF[stage] >= 3:
        segmenter = get("segmenter", "sentence").obj
        examples = [close_example(e, segmenter, "sentence", rng.choice((0.0, 0.5))) for e in examples]
    return examples


# -- mutations: each keeps every type right and makes the record inconsistent -------------------------

def _kinds(ex: Example) -> np.ndarray:
    return np.frombuffer(ex.tokens.kinds, dtype=np.uint8)


def _tok(ex: Example, **changes) -> Example:
    return msgspec.structs.replace(ex, tokens=msgspec.structs.replace(ex.tokens, **changes))


def _scores(ex: Example, **changes) -> Example:
    return msgspec.structs.replace(ex, scores=msgspec.structs.replace(ex.scores, **changes))


def _sel(ex: Example, **changes) -> Example:
    return msgspec.structs.replace(ex, selection=msgspec.structs.replace(ex.selection, **changes))


def _clo(ex: Example, **changes) -> Example:
    return msgspec.structs.replace(ex, closure=msgspec.structs.replace(ex.closure, **changes))


def _set(values: list[int], k: int, value: int) -> list[int]:
    out = list(values)
    out[k] = value
    return out


def _nan_array(arr: Array, value: float) -> Array:
    values = arr.numpy().astype(arr.dtype).copy().reshape(-1)
    values[0] = value
    return Array.of(values.reshape(arr.shape), arr.dtype)


def _other_response(ex: Example) -> int | None:
    """A response position outside the chosen units, if there is one."""
    clo = ex.closure
    chosen = set()
    for c in clo.chosen:
        chosen.update(range(clo.units[2 * c], clo.units[2 * c + 1]))
    rest = [int(p) for p in np.flatnonzero(_kinds(ex) == RESPONSE) if int(p) not in chosen]
    return rest[0] if rest else None


def _supervise_wrong(ex: Example, rng: random.Random) -> Example:
    extra = _other_response(ex)
    if extra is not None:
        return _clo(ex, supervise=sorted([*ex.closure.supervise, extra]))
    if ex.closure.supervise:
        return _clo(ex, supervise=ex.closure.supervise[:-1])
    return _clo(ex, supervise=[int(np.flatnonzero(_kinds(ex) == RESPONSE)[0])])


def _response_keep_count(ex: Example, rng: random.Random) -> Example:
    keep = ex.selection.response_keep
    if keep:
        return _sel(ex, response_keep=keep[:-1])
    return _sel(ex, response_keep=[int(np.flatnonzero(_kinds(ex) == RESPONSE)[0])])


def _shorter_text(ex: Example, rng: random.Random) -> Example:
    end = max(ex.tokens.offsets)
    return msgspec.structs.replace(ex, text=ex.text[:end - 1 - rng.randint(0, end - 1)])


Mutation = Callable[[Example, random.Random], Example]

#: name -> (the stage a stream needs for it, the mutation)
MUTATIONS: dict[str, tuple[str, Mutation]] = {
    # tokens
    "kinds_short": ("scores", lambda ex, rng: _tok(ex, kinds=ex.tokens.kinds[:-1])),
    "kinds_long": ("scores", lambda ex, rng: _tok(ex, kinds=ex.tokens.kinds + bytes([RESPONSE]))),
    "kinds_unknown": ("scores", lambda ex, rng: _tok(ex, kinds=bytes(_set(list(ex.tokens.kinds),
                                                                      rng.randrange(len(ex.tokens.kinds)),
                                                                      rng.randint(4, 255))))),
    "kinds_all_eos": ("scores", lambda ex, rng: _tok(ex, kinds=bytes([EOS] * len(ex.tokens.kinds)))),
    "kinds_no_eos": ("scores", lambda ex, rng: _tok(ex, kinds=ex.tokens.kinds[:-1] + bytes([TEMPLATE]))),
    "kinds_two_eos": ("scores", lambda ex, rng: _tok(ex, kinds=bytes([EOS]) + ex.tokens.kinds[1:])),
    "offsets_short": ("scores", lambda ex, rng: _tok(ex, offsets=ex.tokens.offsets[:-2 * rng.randint(1, 2)])),
    "offsets_beyond_text": ("scores", lambda ex, rng: _tok(ex, offsets=_set(
        ex.tokens.offsets, 2 * rng.randrange(len(ex.tokens.input_ids)) + 1, len(ex.text) + rng.randint(1, 2**40)))),
    "offsets_negative": ("scores", lambda ex, rng: _tok(ex, offsets=_set(
        ex.tokens.offsets, 2 * rng.randrange(len(ex.tokens.input_ids)), -rng.randint(1, 2**62)))),
    "text_shorter_than_offsets": ("scores", _shorter_text),
    "input_id_negative": ("scores", lambda ex, rng: _tok(ex, input_ids=_set(
        ex.tokens.input_ids, rng.randrange(len(ex.tokens.input_ids)), -rng.randint(1, 2**63)))),
    "input_id_huge": ("scores", lambda ex, rng: _tok(ex, input_ids=_set(
        ex.tokens.input_ids, rng.randrange(len(ex.tokens.input_ids)), rng.randint(2**31, 2**63 - 1)))),
    # scores
    "scores_missing": ("scores", lambda ex, rng: msgspec.structs.replace(ex, scores=None)),
    "a_wrong_length": ("scores", lambda ex, rng: _scores(ex, a=Array.of(np.zeros(ex.scores.a.shape[0]
                                                                               + rng.choice((-1, 1, 5)))))),
    "a_dtype_object": ("scores", lambda ex, rng: _scores(ex, a=Array(dtype="object", shape=ex.scores.a.shape,
                                                                      data=ex.scores.a.data))),
    "a_dtype_int": ("scores", lambda ex, rng: _scores(ex, a=Array.of(np.zeros(ex.scores.a.shape), "int32"))),
    "a_short_data": ("scores", lambda ex, rng: _scores(ex, a=Array(dtype="float32", shape=ex.scores.a.shape,
                                                                    data=ex.scores.a.data[:-1]))),
    "a_negative_shape": ("scores", lambda ex, rng: _scores(ex, a=Array(dtype="float32", shape=[-rng.randint(1, 9)],
                                                                        data=b""))),
    "a_nan": ("scores", lambda ex, rng: _scores(ex, a=_nan_array(ex.scores.a, float("nan")))),
    "c_inf": ("scores", lambda ex, rng: _scores(ex, c=_nan_array(ex.scores.c, float("inf")))),
    "loss_nan": ("scores", lambda ex, rng: _scores(ex, loss=_nan_array(ex.scores.loss, float("nan")))),
    "A_transposed": ("scores", lambda ex, rng: _scores(ex, A=Array.of(np.zeros((ex.scores.A.shape[1] + 1,
                                                                                ex.scores.A.shape[0])), "float16"))),
    "A_huge_shape": ("scores", lambda ex, rng: _scores(ex, A=Array(dtype="float16", shape=[2**40, 2**40], data=b""))),
    # selection
    "selection_missing": ("selection", lambda ex, rng: msgspec.structs.replace(ex, selection=None)),
    "b_r_huge": ("selection", lambda ex, rng: _sel(ex, b_r=rng.randint(len(ex.tokens.input_ids) + 1, 2**62))),
    "b_p_negative": ("selection", lambda ex, rng: _sel(ex, b_p=-rng.randint(1, 2**62))),
    "prompt_keep_out_of_range": ("selection", lambda ex, rng: _sel(
        ex, prompt_keep=[*ex.selection.prompt_keep, len(ex.tokens.input_ids) + rng.randint(0, 2**40)])),
    "prompt_keep_response_position": ("selection", lambda ex, rng: _sel(
        ex, prompt_keep=[*ex.selection.prompt_keep, int(np.flatnonzero(_kinds(ex) == RESPONSE)[0])])),
    "response_keep_prompt_side": ("selection", lambda ex, rng: _sel(
        ex, response_keep=[*ex.selection.response_keep, int(np.flatnonzero(_kinds(ex) == EOS)[0])])),
    "response_keep_duplicate": ("selection", lambda ex, rng: _sel(
        ex, response_keep=([*ex.selection.response_keep, ex.selection.response_keep[0]]
                           if ex.selection.response_keep else [int(np.flatnonzero(_kinds(ex) == RESPONSE)[0])] * 2))),
    "response_keep_count": ("selection", _response_keep_count),
    "response_scores_short": ("selection", lambda ex, rng: _sel(ex, response_scores=Array.of(
        np.zeros(ex.selection.response_scores.shape[0] - 1)))),
    "achieved_rho_out_of_range": ("selection", lambda ex, rng: _sel(ex, achieved_rho_r=1.0 + rng.random() + 1e-3)),
    # closure
    "closure_missing": ("closure", lambda ex, rng: msgspec.structs.replace(ex, closure=None)),
    "units_odd": ("closure", lambda ex, rng: _clo(ex, units=[*ex.closure.units, len(ex.tokens.input_ids)])),
    "unit_out_of_range": ("closure", lambda ex, rng: _clo(ex, units=_set(
        ex.closure.units, len(ex.closure.units) - 1, len(ex.tokens.input_ids) + rng.randint(1, 2**40)))),
    "unit_empty": ("closure", lambda ex, rng: _clo(ex, units=_set(ex.closure.units, 1, ex.closure.units[0]))),
    "chosen_out_of_range": ("closure", lambda ex, rng: _clo(
        ex, chosen=[*ex.closure.chosen, len(ex.closure.units) // 2 + rng.randint(0, 9)])),
    "chosen_negative": ("closure", lambda ex, rng: _clo(ex, chosen=[*ex.closure.chosen, -rng.randint(1, 9)])),
    "supervise_out_of_range": ("closure", lambda ex, rng: _clo(
        ex, supervise=[*ex.closure.supervise, len(ex.tokens.input_ids) + rng.randint(0, 2**40)])),
    "supervise_not_the_chosen_units": ("closure", _supervise_wrong),
    "alpha_out_of_range": ("closure", lambda ex, rng: _clo(ex, alpha=rng.choice((float("nan"), -0.5, 1.5)))),
    # the record
    "id_empty": ("scores", lambda ex, rng: msgspec.structs.replace(ex, id="")),
    "index_negative": ("scores", lambda ex, rng: msgspec.structs.replace(ex, index=-rng.randint(1, 2**62))),
}
#: whole-stream mutations
STREAM_MUTATIONS = ("duplicate_id", "stage_unknown")
NAMES = sorted(MUTATIONS) + list(STREAM_MUTATIONS)


def _applies(name: str, ex: Example) -> bool:
    """Whether the mutation is sure to break this example (some need a part it may lack)."""
    if name == "unit_empty" or name == "unit_out_of_range":
        return len(ex.closure.units) >= 2
    if name == "text_shorter_than_offsets":
        return max(ex.tokens.offsets) > 0
    return True


# -- running -----------------------------------------------------------------------------------------

def broken_stream(seed: int, name: str) -> tuple[Header, list[Example], str]:
    """A consistent stream with mutation ``name`` applied to one record: ``(header, examples, stage)``."""
    rng = random.Random(seed)
    stage = MUTATIONS[name][0] if name in MUTATIONS else rng.choice(("scores", "selection", "closure"))
    stage = max(stage, rng.choice(("scores", "selection", "closure")), key=STAGE_OF.get)
    examples = consistent_stream(rng, stage)
    header = msgspec.structs.replace(HEADER, stage=stage)
    if name == "duplicate_id":
        k = rng.randrange(1, len(examples))
        examples[k] = msgspec.structs.replace(examples[k], id=examples[rng.randrange(k)].id)
    elif name == "stage_unknown":
        header = msgspec.structs.replace(header, stage=rng.choice(("", "score", "closed", "tokens ", "CLOSURE")))
    else:
        fn = MUTATIONS[name][1]
        candidates = [k for k, ex in enumerate(examples) if _applies(name, ex)]
        if not candidates:  # e.g. no unit to empty: make one example that has what it needs
            return broken_stream(seed + 1_000_003, name)
        k = rng.choice(candidates)
        examples[k] = fn(examples[k], rng)
    return header, examples, stage


def run_case(seed: int, name: str, folder: Path) -> dict:
    """Write the broken stream and run select, close and compact on it; the outcome of each."""
    from bridgecli.steps.close import CloseOptions, run_close
    from bridgecli.steps.compact import CompactOptions, run_compact
    from bridgecli.steps.select import SelectOptions, run_select

    from bridgecli import progress

    header, examples, stage = broken_stream(seed, name)
    stream = folder / f"case-{seed}.bridge"
    with open_writer(stream, header) as writer:
        for ex in examples:
            writer.write(ex)
    runs = {"select": lambda out: run_select(SelectOptions(inp=str(stream), out=str(out), rounds=2)),
            "close": lambda out: run_close(CloseOptions(inp=str(stream), out=str(out))),
            "compact": lambda out: run_compact(CompactOptions(inp=str(stream), out=str(out)))}
    outcomes = {}
    quiet, progress.stderr.quiet = progress.stderr.quiet, True  # the steps' status lines are not news here
    try:
        _run_all(runs, stage, seed, folder, outcomes)
    finally:
        progress.stderr.quiet = quiet
    stream.unlink()
    return {"seed": seed, "mutation": name, "stage": stage, "outcomes": outcomes}


def _run_all(runs: dict, stage: str, seed: int, folder: Path, outcomes: dict) -> None:
    for command, run in runs.items():
        if command != "select" and STAGE_OF.get(stage, 0) < 2:
            continue  # close and compact refuse a stream without a selection anyway
        out = folder / f"out-{seed}-{command}"
        try:
            run(out)
            outcomes[command] = "exit 0"
        except FormatError as err:
            outcomes[command] = "exit 3" if "\n" not in str(err) else "exit 3, several lines"
        except BridgeError as err:
            outcomes[command] = f"exit {err.exit_code} ({type(err).__name__}: {err})"
        except Exception as exc:  # noqa: BLE001 - a traceback is what we are looking for
            outcomes[command] = f"traceback ({type(exc).__name__}: {exc})"
        if out.exists() or Path(str(out) + ".meta.json").exists():
            outcomes[command] += ", left an output"


def contained(case: dict) -> bool:
    return all(o == "exit 3" for o in case["outcomes"].values()) and bool(case["outcomes"])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0, help="first seed; case k uses seed + k")
    parser.add_argument("-o", "--output", type=Path, help="write the summary as JSON here")
    args = parser.parse_args(argv)
    os.environ.setdefault("BRIDGE_NO_PROGRESS", "1")
    counts: Counter = Counter()
    runs: Counter = Counter()
    failures = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bridge-fuzz-") as tmp:
        for k in range(args.cases):
            seed = args.seed + k
            name = NAMES[seed % len(NAMES)]
            case = run_case(seed, name, Path(tmp))
            counts[name] += 1
            runs.update(case["outcomes"].values())
            if not contained(case):
                failures.append(case)
    summary = {"cases": args.cases, "command_runs": sum(runs.values()), "outcomes": dict(runs),
               "mutations": len(NAMES), "per_mutation": dict(sorted(counts.items())), "failures": len(failures),
               "first_failures": failures[:10], "seconds": round(time.perf_counter() - start, 1)}
    print(f"{args.cases} cases ({summary['command_runs']} command runs over {len(NAMES)} mutations) in "
          f"{summary['seconds']} s: {runs.get('exit 3', 0)} exit 3, {len(failures)} cases not contained")
    for case in failures[:10]:
        print(json.dumps(case), file=sys.stderr)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(summary, indent=2) + "\n")
    return summary


if __name__ == "__main__":
    sys.exit(1 if main()["failures"] else 0)
