"""examples/make_sample.py: the generated GSM8K-style sample and its committed copy in examples/data."""

from __future__ import annotations

import json
import random
import re
from fractions import Fraction
from pathlib import Path

import pytest

from bridgecli.data.shapes import to_pair
from bridgecli.evaluation import gsm8k

from tiny import sample_module

sample = sample_module()

REPO = Path(__file__).resolve().parents[1]
COMMITTED = REPO / "examples" / "data"
SIZES = {"warm": 24, "val": 8, "train": 48, "test": 24}

ANNOTATION = re.compile(r"<<([^<>=]+)=([^<>]+)>>")
FINAL = re.compile(r"#### (-?\d+)")


# -- a tiny evaluator for + - * / and parentheses (exact, with fractions) --------------------------

def _tokens(expr: str) -> list[str]:
    toks = re.findall(r"\d+|[-+*/()]|\S", expr.replace(" ", ""))
    for t in toks:
        if not (t.isdigit() or t in "+-*/()"):
            raise ValueError(f"unexpected token {t!r} in {expr!r}")
    return toks


def evaluate(expr: str) -> Fraction:
    toks = _tokens(expr)
    pos = 0

    def peek() -> str | None:
        return toks[pos] if pos < len(toks) else None

    def take() -> str:
        nonlocal pos
        if pos >= len(toks):
            raise ValueError(f"unexpected end of {expr!r}")
        pos += 1
        return toks[pos - 1]

    def atom() -> Fraction:
        t = take()
        if t == "(":
            v = add()
            if take() != ")":
                raise ValueError(f"missing ')' in {expr!r}")
            return v
        if t == "-":
            return -atom()
        if t.isdigit():
            return Fraction(int(t))
        raise ValueError(f"unexpected {t!r} in {expr!r}")

    def mul() -> Fraction:
        v = atom()
        while peek() in ("*", "/"):
            op, rhs = take(), atom()
            v = v * rhs if op == "*" else v / rhs
        return v

    def add() -> Fraction:
        v = mul()
        while peek() in ("+", "-"):
            op, rhs = take(), mul()
            v = v + rhs if op == "+" else v - rhs
        return v

    value = add()
    if pos != len(toks):
        raise ValueError(f"trailing input in {expr!r}")
    return value


@pytest.mark.parametrize("expr, value", [
    ("1+2*3", 7), ("(1+2)*3", 9), ("48/2", 24), ("16-3-4", 9), ("60*20/100", 12), ("2*(10+12)", 44),
    ("35+3*9", 62), ("7/2", Fraction(7, 2)), ("-3+5", 2),
])
def test_evaluator(expr, value):
    assert evaluate(expr) == value


@pytest.mark.parametrize("expr", ["1+", "(1+2", "1+2)", "2**3", "__import__('os')", "1.5*2"])
def test_evaluator_rejects(expr):
    with pytest.raises((ValueError, ZeroDivisionError)):
        evaluate(expr)


# -- checking one answer ---------------------------------------------------------------------------

def check_answer(answer: str) -> int:
    """Assert the GSM8K answer is well formed and arithmetically right; return the final number."""
    lines = answer.split("\n")
    m = FINAL.fullmatch(lines[-1])
    assert m, f"last line is not '#### <int>': {lines[-1]!r}"
    final = int(m.group(1))
    steps = lines[:-1]
    assert 2 <= len(steps) <= 5, answer
    assert "####" not in "\n".join(steps)
    last = None
    for line in steps:
        found = list(ANNOTATION.finditer(line))
        assert found, f"a reasoning line without a calculator annotation: {line!r}"
        for a in found:
            expr, res = a.group(1), a.group(2)
            assert re.fullmatch(r"-?\d+", res), f"non-integer result in {a.group(0)}"
            assert evaluate(expr) == int(res), f"wrong arithmetic: {a.group(0)}"
            assert line[a.end():].startswith(res), f"{a.group(0)} is not followed by {res}: {line!r}"
            last = int(res)
    # Every template's design: the final answer is the result of the last calculation.
    assert final == last, answer
    return final


@pytest.mark.parametrize("name", sorted(sample.TEMPLATES))
def test_every_template_is_right_over_many_seeds(name):
    rng = random.Random(1234)
    for _ in range(200):
        prob = sample.make_problem(name, rng)
        assert check_answer(prob.answer) == prob.final
        assert 20 <= len(prob.question.split()) <= 60, prob.question
        assert 30 <= len(prob.answer.split()) <= 120, prob.answer
        assert prob.question.rstrip().endswith(("?", ")")), prob.question
        assert "{" not in prob.question + prob.answer and "}" not in prob.question + prob.answer


def test_enough_templates_and_all_used():
    assert len(sample.TEMPLATES) >= 12
    used = {p.template for p in sample.problems(sum(SIZES.values()), seed=0)}
    assert used == set(sample.TEMPLATES)


def test_calculations_are_computed_and_checked(monkeypatch):
    def draw(rng):
        return {"a": 6, "b": 4, "total": 10}

    monkeypatch.setitem(sample.TEMPLATES, "t", sample._Template(draw, "{a} and {b}?", (
        "Both: $<<a+b=total>>.", "Half: <<total/2=half>>, then <<2*(half+a)>>.")))
    prob = sample.make_problem("t", random.Random(0))
    assert prob.question == "6 and 4?"
    assert prob.steps == ("Both: 6 + 4 = $<<6+4=10>>10.",
                          "Half: 10 / 2 = <<10/2=5>>5, then 2 * (5 + 6) = <<2*(5+6)=22>>22.")
    assert prob.final == 22
    for steps in (("<<a-b=total>>",), ("<<a/b>>",), ("<<a**b>>",)):  # disagrees with the draw; not whole; not + - * /
        monkeypatch.setitem(sample.TEMPLATES, "t", sample._Template(draw, "?", steps))
        with pytest.raises(ValueError):
            sample.make_problem("t", random.Random(0))


# -- generate ----------------------------------------------------------------------------------------

def test_generate_is_deterministic():
    a, b = sample.generate(40, seed=7), sample.generate(40, seed=7)
    assert a == b
    assert a != sample.generate(40, seed=8)
    assert sample.generate(10, seed=7) == a[:10]


def test_generate_records():
    recs = sample.generate(60, seed=3)
    assert len(recs) == 60
    assert [r["id"] for r in recs] == [f"sample-{i:04d}" for i in range(1, 61)]
    assert len({r["question"] for r in recs}) == 60
    for r in recs:
        assert list(r) == ["id", "question", "answer"]
        assert isinstance(r["question"], str) and isinstance(r["answer"], str)
        check_answer(r["answer"])
    assert sample.generate(0) == []
    with pytest.raises(ValueError):
        sample.generate(-1)


def test_generate_uses_no_global_random_state():
    random.seed(1)
    a = sample.generate(20, seed=5)
    random.seed(2)
    random.random()
    assert sample.generate(20, seed=5) == a


# -- write_sample ------------------------------------------------------------------------------------

def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_write_sample_files(tmp_path):
    paths = sample.write_sample(tmp_path / "out")
    assert set(paths) == set(SIZES)
    all_ids, all_questions = [], []
    for split, path in paths.items():
        assert path == tmp_path / "out" / f"{split}.jsonl"
        recs = _read(path)
        assert len(recs) == SIZES[split]
        assert [r["id"] for r in recs] == [f"{split}-{i:04d}" for i in range(1, SIZES[split] + 1)]
        for r in recs:
            check_answer(r["answer"])
        all_ids += [r["id"] for r in recs]
        all_questions += [r["question"] for r in recs]
    assert len(all_ids) == len(set(all_ids)) == sum(SIZES.values())
    assert len(all_questions) == len(set(all_questions))
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.endswith(".tmp")]


def test_write_sample_deterministic_and_seeded(tmp_path):
    a = sample.write_sample(tmp_path / "a", seed=11)
    b = sample.write_sample(tmp_path / "b", seed=11)
    c = sample.write_sample(tmp_path / "c", seed=12)
    for split in SIZES:
        assert a[split].read_bytes() == b[split].read_bytes()
    assert any(a[s].read_bytes() != c[s].read_bytes() for s in SIZES)


def test_write_sample_overwrites(tmp_path):
    (tmp_path / "train.jsonl").write_text("stale\n")
    paths = sample.write_sample(tmp_path)
    assert len(_read(paths["train"])) == SIZES["train"]


def test_committed_copy_matches_the_code(tmp_path):
    paths = sample.write_sample(tmp_path, seed=0)
    for split, path in paths.items():
        committed = COMMITTED / f"{split}.jsonl"
        assert committed.is_file(), f"missing {committed}; run: python examples/make_sample.py examples/data"
        assert committed.read_bytes() == path.read_bytes(), (
            f"{committed} drifted from examples/make_sample.py; rerun: python examples/make_sample.py examples/data")
    assert (COMMITTED / "README.md").is_file()


def test_main_writes_and_reports(tmp_path, capsys):
    assert sample.main([str(tmp_path), "--seed", "4"]) == 0
    err = capsys.readouterr().err
    for split in SIZES:
        assert str(tmp_path / f"{split}.jsonl") in err
        assert (tmp_path / f"{split}.jsonl").is_file()


# -- the rest of bridgecli reads the files as GSM8K ----------------------------------------------------

@pytest.mark.parametrize("split", sorted(SIZES))
def test_records_have_the_gsm8k_shape(split):
    path = COMMITTED / f"{split}.jsonl"
    recs = _read(path)
    for i, rec in enumerate(recs):
        pair = to_pair(rec, i, f"line {i + 1}", str(path))
        assert pair.shape == "gsm8k"
        assert pair.id == rec["id"]
        assert pair.messages == ({"role": "user", "content": rec["question"]},)
        assert pair.response == rec["answer"]
    items = gsm8k.load(path)
    assert len(items) == len(recs)
    for item, rec in zip(items, recs):
        assert item.reference == str(check_answer(rec["answer"]))
