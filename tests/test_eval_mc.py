"""bridge eval, multiple choice: loaders (ARC, HellaSwag, MMLU), log-likelihood scoring, acc/acc_norm,
--compare's Table 1 and the CLI. A tiny random Llama with the real tokenizer does the scoring."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from bridgecli.cli.app import app
from bridgecli.errors import InputError, UsageError
from bridgecli.evaluation import compare as cmp
from bridgecli.evaluation import multiple_choice as mc
from bridgecli.evaluation.loglik import continuation_scores, encode_pair, loglikelihood
from bridgecli.evaluation.tasks import EvalOptions

from mc_files import ARC_ROWS, HS_LINES, write_hellaswag
from tiny import tiny_llama_config, tiny_model


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

# -- loaders ----------------------------------------------------------------------------------

def _jsonl(path: Path, rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def test_load_arc(tmp_path):
    items = mc.load_arc(_jsonl(tmp_path / "arc.jsonl", ARC_ROWS))
    assert [i.gold for i in items] == [0, 1, 0, 0]
    assert items[0].query == "Question: Which is a planet?\nAnswer:"
    assert items[0].choices == [" Mars", " Moon", " Sun"] and items[1].id == "q2"


@pytest.mark.parametrize("row, field", [
    ({"id": "x", "answerKey": "A"}, "question"),
    ({"id": "x", "question": {"choices": []}, "answerKey": "A"}, "question.stem"),
    ({"id": "x", "question": {"stem": "s", "choices": [{"text": "a", "label": "A"}, {"text": 1, "label": "B"}]},
      "answerKey": "A"}, "question.choices[1]"),
    ({**ARC_ROWS[0], "answerKey": "E"}, "answerKey"),
])
def test_load_arc_errors(tmp_path, row, field):
    with pytest.raises(InputError) as info:
        mc.load_arc(_jsonl(tmp_path / "arc.jsonl", [ARC_ROWS[0], row]))
    assert info.value.record == "line 2" and info.value.field == field and "arc.jsonl" in str(info.value)


def test_load_hellaswag_bz2_and_errors(tmp_path):
    items = mc.load_hellaswag(write_hellaswag(tmp_path / "hs.txt.bz2"))
    assert len(items) == 3 and [i.gold for i in items] == [3, 0, 2]
    assert items[0].query == "Roof shingle removal: A man is sitting on a roof. he"
    assert items[0].choices[3] == " starts pulling up roofing on a roof."
    assert items[1].query == "Family Life: How to play. Visit to find games.. Have fun."  # lm-eval preprocessing
    assert items[1].choices[1] == " Pick two now."
    short = tmp_path / "short.txt"
    short.write_text("\n".join(HS_LINES[:9]) + "\n", encoding="utf-8")
    with pytest.raises(InputError, match="short.txt, line 7: 9 lines is not a multiple of 6"):
        mc.load_hellaswag(short)
    bad = tmp_path / "bad.txt"
    bad.write_text("\n".join(HS_LINES[:7] + ["7"] + HS_LINES[8:]) + "\n", encoding="utf-8")
    with pytest.raises(InputError, match="bad.txt, line 8, field 'label'"):
        mc.load_hellaswag(bad)


MMLU_HEADER = "question,choice0,choice1,choice2,choice3,answer\n"


def _mmlu(root: Path) -> Path:
    (root / "test").mkdir(parents=True)
    (root / "dev").mkdir()
    (root / "test" / "anatomy_test.csv").write_text(
        MMLU_HEADER + 'Bones?,206,100,"3,000",1,0\nHeart chambers?,2,3,4,5,2\nThird?,a,b,c,d,3\n', encoding="utf-8")
    (root / "test" / "astronomy_test.csv").write_text("Sun is a?,star,planet,moon,comet,A\nEarth is?,flat,round,cube,x,B\n",
                                                      encoding="utf-8")  # original layout: no header, letters
    (root / "dev" / "anatomy_dev.csv").write_text(MMLU_HEADER + "Dev q?,w,x,y,z,1\nDev q2?,w,x,y,z,0\n", encoding="utf-8")
    (root / "dev" / "astronomy_dev.csv").write_text("Dev a?,w,x,y,z,D\n", encoding="utf-8")
    return root


def test_load_mmlu(tmp_path):
    root = _mmlu(tmp_path / "mmlu")
    tests, devs = mc.mmlu_files(root)
    assert list(tests) == ["anatomy", "astronomy"] and list(devs) == ["anatomy", "astronomy"]
    items = mc.load_mmlu_csv(tests["anatomy"])
    assert [i.gold for i in items] == [0, 2, 3] and items[0].subject == "anatomy"
    assert items[0].query == "Bones?\nA. 206\nB. 100\nC. 3,000\nD. 1\nAnswer:"
    assert items[0].choices == [" A", " B", " C", " D"]
    assert [i.gold for i in mc.load_mmlu_csv(tests["astronomy"])] == [0, 1]
    assert mc.mmlu_files(tests["anatomy"]) == ({"anatomy": tests["anatomy"]}, devs)  # one subject's file
    assert mc.mmlu_description("high_school_biology").startswith(
        "The following are multiple choice questions (with answers) about high school biology.\n\n")
    bad = tmp_path / "x_test.csv"
    bad.write_text(MMLU_HEADER + "q,a,b,c,d,0\nq,a,b,c,d,E\n", encoding="utf-8")
    with pytest.raises(InputError, match="x_test.csv, line 3, field 'answer'"):
        mc.load_mmlu_csv(bad)
    bad.write_text("q,a,b,0\n", encoding="utf-8")
    with pytest.raises(InputError, match="line 1: expected 6 columns"):
        mc.load_mmlu_csv(bad)


# -- log-likelihood ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(tokenizer):
    return tiny_model(tiny_llama_config(len(tokenizer), layers=2, hidden=32), seed=1), tokenizer


def _direct(model, tokenizer, context, continuation):
    """Reference: one unpadded forward of context + continuation, log-softmax, sum."""
    ctx, cont = encode_pair(tokenizer, context, continuation)
    ids = torch.tensor([ctx + cont])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].double(), -1)
    return sum(float(logp[len(ctx) - 1 + k, t]) for k, t in enumerate(cont))


REQUESTS = [("Question: Which is a planet?\nAnswer:", " Mars"), ("Question: Which is a planet?\nAnswer:", " Moon"),
            ("Bones?\nA. 1\nB. 2\nAnswer:", " A"), ("Bones?\nA. 1\nB. 2\nAnswer:", " B"),
            ("short", " a much longer continuation of several tokens"), ("trailing space ", "x")]


def test_loglikelihood_matches_direct_computation(tiny):
    model, tok = tiny
    got = loglikelihood(model, tok, REQUESTS, batch_size=3, progress=False)
    for (context, continuation), ll in zip(REQUESTS, got):
        assert ll.logprob == pytest.approx(_direct(model, tok, context, continuation), abs=1e-4)
    assert [g.n_tokens for g in got][:4] == [1, 1, 1, 1]
    one_by_one = [loglikelihood(model, tok, [r], batch_size=1, progress=False)[0] for r in REQUESTS]
    assert [g.logprob for g in got] == pytest.approx([g.logprob for g in one_by_one], abs=1e-4)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 4),
    st.integers(1, 5),
    st.integers(2, 9),
    st.lists(st.tuples(st.integers(0, 3), st.integers(1, 5)), min_size=1, max_size=8),
    st.integers(0, 2**31 - 1),
)
def test_continuation_scores_match_a_log_softmax_per_request(batch, tail, vocab, wanted, seed):
    """Each continuation's summed log-probability and greedy flag, taken on the logits' device from the
    positions it reads, equal a float32 log-softmax of the whole row (the computation it replaced)."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, tail, vocab, generator=gen).to(torch.bfloat16)
    conts = []
    for b, n in wanted:
        n = min(n, tail)
        toks = torch.randint(0, vocab, (n,), generator=gen).tolist()
        if b % 2:  # some continuations are the argmax at every position
            toks = logits[b % batch, tail - n :].float().argmax(-1).tolist()
        conts.append((b % batch, toks))
    got = continuation_scores(logits, conts)
    for (b, toks), (logprob, greedy) in zip(conts, got):
        lp = torch.log_softmax(logits[b, tail - len(toks) :].float(), dim=-1)
        target = torch.tensor(toks)
        assert logprob == pytest.approx(float(lp.gather(-1, target[:, None]).double().sum()), abs=1e-5)
        assert greedy == bool((lp.argmax(-1) == target).all())


def test_shared_inputs_take_one_forward(tiny):
    model, tok = tiny
    calls = []
    handle = model.register_forward_hook(lambda *a: calls.append(1))
    try:
        loglikelihood(model, tok, [("Bones?\nAnswer:", f" {c}") for c in "ABCD"], batch_size=8, progress=False)
    finally:
        handle.remove()
    assert len(calls) == 1


def test_encode_pair_moves_trailing_space():
    class Tok:
        eos_token_id = None
        bos_token_id = 0
        eos_token = None

        def __call__(self, text):
            return {"input_ids": [ord(c) for c in text]}

    assert encode_pair(Tok(), "ab ", "c") == ([97, 98], [32, 99])
    assert encode_pair(Tok(), "", "c") == ([0], [99])  # empty context: BOS
    with pytest.raises(UsageError):
        encode_pair(Tok(), "ab", "")


# -- the tasks --------------------------------------------------------------------------------

def test_acc_and_acc_norm_with_fixed_scores(tmp_path, monkeypatch):
    from bridgecli.evaluation.loglik import LogLik

    # item 1: " Sun" has the best total (wrong), " Mars" the best per character (-2.0/5 > -1.9/4; right);
    # item 3: " a long word here" the best per character (-2.5/17 > -1.0/4; wrong), " wet" the best total
    scores = {" Mars": -2.0, " Moon": -2.3, " Sun": -1.9, " 3": -5.0, " 4": -1.0, " 5": -6.0, " 6": -6.0,
              " wet": -1.0, " dry": -9.0, " a long word here": -2.5, " cold": -1.0, " hot": -2.0}

    def fake(model, tok, requests, **kw):
        return [LogLik(scores[cont], False, 1) for _, cont in requests]

    monkeypatch.setattr("bridgecli.evaluation.loglik.loglikelihood", fake)
    run = mc.arc_challenge_task(object(), object(), EvalOptions(data=_jsonl(tmp_path / "a.jsonl", ARC_ROWS),
                                                                progress=False))
    s, items = run["summary"], run["items"]
    assert [i["pred"] for i in items] == [2, 1, 0, 0] and [i["pred_norm"] for i in items] == [0, 1, 2, 0]
    assert s["acc"] == s["accuracy"] == 0.75 and s["acc_norm"] == 0.75
    assert s["metric"] == "acc" and s["correct"] == 3 and s["correct_norm"] == 3
    assert s["settings"]["chat_template_used"] is False
    assert items[0]["loglik"] == [-2.0, -2.3, -1.9]


def test_few_shot_contexts(tmp_path, monkeypatch):
    seen = []

    def fake(model, tok, requests, **kw):
        from bridgecli.evaluation.loglik import LogLik

        seen.extend(requests)
        return [LogLik(-1.0, False, 1) for _ in requests]

    monkeypatch.setattr("bridgecli.evaluation.loglik.loglikelihood", fake)
    mc.arc_easy_task(object(), object(), EvalOptions(data=_jsonl(tmp_path / "a.jsonl", ARC_ROWS), limit=1,
                                                     few_shot=1, progress=False))
    assert seen[0] == ("Question: 2+2?\nAnswer: 4\n\nQuestion: Which is a planet?\nAnswer:", " Mars")
    with pytest.raises(UsageError, match="--few-shot 4"):
        mc.arc_easy_task(object(), object(), EvalOptions(data=str(tmp_path / "a.jsonl"), limit=1, few_shot=4))

    seen.clear()
    root = _mmlu(tmp_path / "mmlu")
    run = mc.mmlu_task(object(), object(), EvalOptions(data=str(root), limit=1, few_shot=1, progress=False))
    assert len(run["items"]) == 2  # --limit is per subject
    context = seen[0][0]
    assert context.startswith("The following are multiple choice questions (with answers) about anatomy.\n\n"
                              "Dev q?\nA. w\nB. x\nC. y\nD. z\nAnswer: B\n\nBones?")
    assert set(run["summary"]["subjects"]) == {"anatomy", "astronomy"}
    assert run["summary"]["settings"]["limit_applies_to"] == "each subject"
    with pytest.raises(UsageError, match="astronomy_dev.csv has 1 rows"):
        mc.mmlu_task(object(), object(), EvalOptions(data=str(root), limit=1, few_shot=2, progress=False))


def test_tasks_run_on_a_tiny_model(tiny, tmp_path):
    model, tok = tiny
    run = mc.arc_challenge_task(model, tok, EvalOptions(data=_jsonl(tmp_path / "a.jsonl", ARC_ROWS), batch_size=4,
                                                        progress=False))
    item = run["items"][0]
    direct = [_direct(model, tok, item["query"], c) for c in item["choices"]]
    assert item["loglik"] == pytest.approx(direct, abs=1e-4)
    run = mc.mmlu_task(model, tok, EvalOptions(data=str(_mmlu(tmp_path / "mmlu")), progress=False))
    assert run["summary"]["n"] == 5 and 0 <= run["summary"]["acc_macro"] <= 1
    json.dumps(run)


def test_interrupted_scoring_resumes_per_item_from_the_journal(tiny, tmp_path):
    """Ctrl-C in the middle of a multiple-choice task: the batches scored before it are in the
    journal, and a resumed run scores only the rest, with the same items as an uninterrupted run."""
    from bridgecli.evaluation.journal import Journal
    from bridgecli.evaluation.run import evaluate

    model, tok = tiny
    data = _jsonl(tmp_path / "arc.jsonl", ARC_ROWS)
    run = lambda book: evaluate(model, tok, "arc_challenge", data, batch_size=1, progress=False,  # noqa: E731
                                journal=book)
    calls = []
    handle = model.register_forward_hook(lambda *a: calls.append(1))
    try:
        reference = run(None)
        total = len(calls)
        assert total == 5  # one forward per question: its one-token answers share the input (q3's
        # " a long word here" has one of its own)

        def interrupt(*a):
            if len(calls) == 2:
                raise KeyboardInterrupt
        path = tmp_path / "eval-arc_challenge.json.partial.jsonl"
        calls.clear()
        stop = model.register_forward_pre_hook(interrupt)
        try:
            with pytest.raises(KeyboardInterrupt):
                run(Journal.open(path, {"model": "tiny"}, resume=False))
        finally:
            stop.remove()
        lines = path.read_text().splitlines()
        assert len(lines) == 1 + 3 + 4  # the request, then the first two questions' choices
        assert all(isinstance(json.loads(x)["value"][0], float) for x in lines[1:])

        calls.clear()
        book = Journal.open(path, {"model": "tiny"}, resume=True)
        resumed = run(book)
    finally:
        handle.remove()
    assert len(calls) == total - 2 and book.reused == 3 + 4
    assert resumed["items"] == reference["items"]


# -- --compare --------------------------------------------------------------------------------

def _result(folder: Path, task: str, accuracy: float, **extra) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    summary = {"task": task, "n": 10, "accuracy": accuracy, "correct": int(accuracy * 10), **extra}
    (folder / f"eval-{task}.json").write_text(json.dumps({"task": task, "summary": summary, "items": []}))


def test_compare_matches_the_papers_overall(tmp_path):
    # Table 1, Llama-3.2-3B Pretrained: 43.17 54.20 56.64 28.05 | 45.52 | MATH 0.62 | 23.07
    pre = tmp_path / "pretrained"
    for task, value in (("arc_challenge", .4317), ("hellaswag", .5420), ("mmlu", .5664), ("humaneval", .2805),
                        ("math", .0062)):
        _result(pre, task, value)
    other = tmp_path / "other"
    _result(other, "arc_challenge", .5, acc_norm=.6)
    _result(other, "math", .2)
    result = cmp.compare([cmp.load_run(pre), cmp.load_run(other)], target="math")
    assert result.general == ["arc_challenge", "hellaswag", "mmlu", "humaneval"] and result.target == "math"
    row = result.rows[0]
    assert round(row["general_avg"], 2) == 45.52 and round(row["overall"], 2) == 23.07
    assert result.rows[1]["general_avg"] is None and result.rows[1]["overall"] is None  # columns missing
    normed = cmp.compare([cmp.load_run(other)], general=["arc_challenge"], metric="acc_norm")
    assert normed.target == "math" and normed.rows[0]["arc_challenge"] == pytest.approx(60.0)
    assert normed.rows[0]["overall"] == pytest.approx(40.0)
    with pytest.raises(UsageError, match="target task 'gsm8k'"):
        cmp.compare([cmp.load_run(pre)], target="gsm8k")
    with pytest.raises(InputError, match="no eval-\\*.json"):
        cmp.load_run(tmp_path)
    (tmp_path / "broken.json").write_text("{}")
    with pytest.raises(InputError, match="broken.json: not a bridge eval result"):
        cmp.load_run(tmp_path / "broken.json")

    out = CliRunner().invoke(app, ["eval", "--compare", str(pre), str(other), "--target", "math"])
    assert out.exit_code == 0, out.output
    assert "45.52" in out.stdout and "23.07" in out.stdout and "pretrained" in out.stdout and "Overall" in out.stdout


# -- the CLI ----------------------------------------------------------------------------------

def test_cli_several_tasks_one_load(tiny_model_dir, tmp_path):
    data = tmp_path / "data"
    (data / "arc").mkdir(parents=True)
    _jsonl(data / "arc" / "ARC-Challenge-Test.jsonl", ARC_ROWS)
    _mmlu(data / "mmlu")
    out_dir = tmp_path / "results"
    result = CliRunner().invoke(app, ["eval", str(tiny_model_dir), "--task", "arc_challenge,mmlu", "--data-dir",
                                      str(data), "--limit", "2", "-o", str(out_dir), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    arc = json.loads((out_dir / "eval-arc_challenge.json").read_text())
    mmlu = json.loads((out_dir / "eval-mmlu.json").read_text())
    assert arc["summary"]["n"] == 2 and mmlu["summary"]["n"] == 4 and arc["model"] == str(tiny_model_dir)
    assert "acc_norm" in arc["summary"] and arc["summary"]["seconds"] > 0
    assert "arc_challenge" in result.stdout and "mmlu" in result.stdout

    # the README's form: one task, a bare --data file, the result lands in the model folder
    single = CliRunner().invoke(app, ["eval", str(tiny_model_dir), "--task", "arc_easy", "--data",
                                      str(data / "arc" / "ARC-Challenge-Test.jsonl"), "--limit", "1"])
    assert single.exit_code == 0, single.output
    assert json.loads((tiny_model_dir / "eval-arc_easy.json").read_text())["summary"]["n"] == 1
    table = CliRunner().invoke(app, ["eval", "--compare", str(tiny_model_dir), str(out_dir), "--general", "arc_easy"])
    assert table.exit_code == 0 and tiny_model_dir.name in table.stdout, table.output

    bad = CliRunner().invoke(app, ["eval", str(tiny_model_dir), "--task", "arc_challenge,mmlu", "--data", "x.jsonl"])
    assert bad.exit_code == UsageError.exit_code and "TASK=PATH" in bad.output
    bad = CliRunner().invoke(app, ["eval", str(tiny_model_dir), "--task", "nope", "--data", "x"])
    assert bad.exit_code == 6 and "no eval task named 'nope'" in bad.output
    bad = CliRunner().invoke(app, ["eval", str(tiny_model_dir), "--task", "math"])
    assert bad.exit_code == UsageError.exit_code and "--data-dir" in bad.output


def test_cli_resume_keeps_finished_tasks_and_refuses_other_settings(tiny_model_dir, tmp_path, monkeypatch):
    data = tmp_path / "data"
    (data / "arc").mkdir(parents=True)
    _jsonl(data / "arc" / "ARC-Challenge-Test.jsonl", ARC_ROWS)
    _mmlu(data / "mmlu")
    out_dir = tmp_path / "results"
    args = ["eval", str(tiny_model_dir), "--task", "arc_challenge,mmlu", "--data-dir", str(data), "--limit", "2",
            "-o", str(out_dir), "--device", "cpu"]
    first = CliRunner().invoke(app, args[:3] + ["arc_challenge"] + args[4:])  # an interrupted run: one task done
    assert first.exit_code == 0, first.output
    arc_before = (out_dir / "eval-arc_challenge.json").read_text()

    from bridgecli.evaluation import run as run_mod

    evaluated = []
    real = run_mod.evaluate
    monkeypatch.setattr(run_mod, "evaluate", lambda m, t, task, *a, **k: evaluated.append(task) or real(m, t, task, *a, **k))
    resumed = CliRunner().invoke(app, args + ["--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert evaluated == ["mmlu"]  # arc_challenge was kept, not evaluated again
    assert (out_dir / "eval-arc_challenge.json").read_text() == arc_before
    assert "arc_challenge" in resumed.stdout and "mmlu" in resumed.stdout
    assert not list(out_dir.glob("*.partial.jsonl"))  # journals go once their result is written

    evaluated.clear()
    again = CliRunner().invoke(app, args + ["--resume"])  # everything done: no model load, no evaluation
    assert again.exit_code == 0 and evaluated == [], again.output

    other = CliRunner().invoke(app, ["1" if a == "2" else a for a in args] + ["--resume"])  # --limit 1
    assert other.exit_code == UsageError.exit_code
    assert "eval-arc_challenge.json" in other.output and "limit=2" in other.output and "1" in other.output
    assert evaluated == []
    nowhere = CliRunner().invoke(app, ["eval", "smollm2", "--task", "arc_challenge", "--data", "x", "--resume"])
    assert nowhere.exit_code == UsageError.exit_code and "--resume needs results on disk" in nowhere.output
