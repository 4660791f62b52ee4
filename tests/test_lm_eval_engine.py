"""bridge eval --engine lm-eval: lm-evaluation-harness on the same model object and the same local files.

A tiny random Llama with the real tokenizer scores tiny ARC / HellaSwag / MMLU files with both engines;
the prompts, choices, log-likelihoods and picks must agree item by item, and where ``acc_norm`` may differ
the difference must be lm-eval's normalisation. The checks of ``--engine`` itself run without lm-eval;
everything that runs lm-eval skips when it is not installed (CI installs it: ``.ci/run``). The last test
runs the default model on the real data (integration; skipped when the data is absent).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bridgecli.cli.app import app
from bridgecli.errors import InputError, UsageError
from bridgecli.evaluation import evaluate as bridge_evaluate
from bridgecli.evaluation import lm_eval_engine as lme
from bridgecli.evaluation import multiple_choice as mc

from mc_files import ARC_ROWS, write_hellaswag
from tiny import tiny_llama_config, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

MMLU_HEADER = "question,choice0,choice1,choice2,choice3,answer\n"


def _data(root: Path) -> Path:
    """arc/, hellaswag/, mmlu/ (two subjects, one in the original hendrycks layout) under ``root``."""
    (root / "arc").mkdir(parents=True)
    (root / "arc" / "ARC-Easy-Test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ARC_ROWS))
    (root / "hellaswag").mkdir()
    write_hellaswag(root / "hellaswag" / "hs.txt.bz2")
    mmlu = root / "mmlu"
    (mmlu / "test").mkdir(parents=True)
    (mmlu / "dev").mkdir()
    (mmlu / "test" / "anatomy_test.csv").write_text(
        MMLU_HEADER + 'Bones?,206,100,"3,000",1,0\n  Heart chambers?  ,2,3,4,5,2\nThird?,a,b,c,d,3\n')
    (mmlu / "test" / "astronomy_test.csv").write_text("Sun is a?,star,planet,moon,comet,A\nEarth is?,flat,round,cube,x,B\n")
    (mmlu / "dev" / "anatomy_dev.csv").write_text(MMLU_HEADER + "Dev q?,w,x,y,z,1\nDev q2?,w,x,y,z,0\n")
    (mmlu / "dev" / "astronomy_dev.csv").write_text("Dev a?,w,x,y,z,D\nDev b?,w,x,y,z,C\n")
    return root


DATA_FILES = {"arc_easy": "arc/ARC-Easy-Test.jsonl", "hellaswag": "hellaswag/hs.txt.bz2", "mmlu": "mmlu"}


@pytest.fixture(scope="module")
def tiny(tokenizer):
    return tiny_model(tiny_llama_config(len(tokenizer), layers=2, hidden=32), seed=3), tokenizer


@pytest.fixture
def lm_eval():
    return pytest.importorskip("lm_eval")


# -- without lm-eval ---------------------------------------------------------------------------

def test_engine_checks_before_the_model_loads(monkeypatch):
    with pytest.raises(UsageError, match="--engine vllm: choose one of bridge, lm-eval"):
        lme.check_engine("vllm")
    lme.check_engine("bridge")

    from importlib import metadata

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    with pytest.raises(UsageError) as info:
        lme.check_engine("lm-eval")
    assert "not installed" in str(info.value) and "bridgecli[lm-eval]" in str(info.value)


def test_the_engine_configures_exactly_the_tasks_that_declare_it():
    from bridgecli import registry
    from bridgecli.contracts import as_eval_task

    declared = {n for n in registry.names("eval_task") if "lm-eval" in as_eval_task(registry.get("eval_task", n).obj).engines}
    assert declared == set(lme.LM_EVAL_YAML)


def test_cli_refuses_unsupported_engine_tasks_in_one_line(tmp_path):
    bad = CliRunner().invoke(app, ["eval", "smollm2", "--engine", "lm-eval", "--task", "gsm8k", "--data", "x"])
    assert bad.exit_code == UsageError.exit_code and "not gsm8k" in bad.output
    assert "runs arc_challenge, arc_easy, hellaswag, mmlu; not gsm8k" in bad.output  # from the declarations
    bad = CliRunner().invoke(app, ["eval", "smollm2", "--engine", "nope", "--task", "mmlu", "--data", "x"])
    assert bad.exit_code == UsageError.exit_code and "--engine nope" in bad.output


def test_hellaswag_docs_rebuild_the_line(tmp_path):
    root = _data(tmp_path)
    docs = lme.hellaswag_docs(root / DATA_FILES["hellaswag"])
    assert docs[0]["activity_label"] == "Roof shingle removal" and docs[0]["ctx_b"] == ""
    for doc, item in zip(docs, mc.load_hellaswag(root / DATA_FILES["hellaswag"])):
        joined = doc["activity_label"] + ": " + doc["ctx_a"] + " " + doc["ctx_b"].capitalize()
        assert mc.hellaswag_preprocess(joined) == item.query
        assert int(doc["label"]) == item.gold


def test_bad_data_fails_with_bridges_one_line_error(tmp_path):
    path = tmp_path / "arc.jsonl"
    path.write_text(json.dumps(ARC_ROWS[0]) + "\n" + json.dumps({**ARC_ROWS[1], "answerKey": "E"}) + "\n")
    with pytest.raises(InputError) as info:
        lme.arc_docs(path)
    assert info.value.record == "line 2" and info.value.field == "answerKey"


# -- with lm-eval: both engines on a tiny random model ----------------------------------------

def _run_both(tiny, task, data, **kw):
    model, tok = tiny
    ours = bridge_evaluate(model, tok, task, data, progress=False, batch_size=3, **kw)
    theirs = lme.evaluate(model, tok, task, data, progress=False, batch_size=3, **kw)
    return ours, theirs


def _bridge_context(item, prefix=""):
    return prefix + item["query"]


@pytest.mark.parametrize("task, kw", [
    ("arc_easy", {}),
    ("arc_easy", {"limit": 2, "few_shot": 2}),  # shots: the items past the evaluated ones
    ("hellaswag", {}),
    ("hellaswag", {"limit": 2, "few_shot": 1}),
    ("mmlu", {}),
    ("mmlu", {"limit": 2, "few_shot": 2}),  # shots: the first dev rows
])
def test_engines_agree_item_by_item(lm_eval, tiny, tmp_path, task, kw):
    root = _data(tmp_path)
    data = str(root / DATA_FILES[task])
    ours, theirs = _run_both(tiny, task, data, **kw)
    assert theirs["engine"] == "lm-eval" and theirs["summary"]["settings"]["engine"] == "lm-eval"
    a, b = ours["items"], theirs["items"]
    assert len(a) == len(b) == ours["summary"]["n"] == theirs["summary"]["n"]
    k = kw.get("few_shot", 0)
    for x, y in zip(a, b):
        assert (x["index"], x["id"], x.get("subject"), x["gold"]) == (y["index"], y["id"], y.get("subject"), y["gold"])
        assert x["query"] == y["query"] and x["choices"] == y["choices"]
        # the whole context: description and few-shot examples built the same way by both engines
        if task == "mmlu":
            shots = mc.load_mmlu_csv(root / "mmlu" / "dev" / f"{x['subject']}_dev.csv")[:k]
            prefix = mc.mmlu_description(x["subject"])
        else:
            loader = mc.load_hellaswag if task == "hellaswag" else mc.load_arc
            shots = loader(data)[len(a):len(a) + k]
            prefix = ""
        prefix += "".join(s.query + s.choices[s.gold] + "\n\n" for s in shots)
        assert y["context"] == prefix + x["query"]
        assert y["loglik"] == pytest.approx(x["loglik"], abs=1e-4)
        assert y["pred"] == x["pred"] and y["correct"] == x["correct"]
        # acc_norm: lm-eval divides by the choice's characters without the leading space
        lens = [len(c) - 1 for c in x["choices"]]
        assert y["pred_norm"] == max(range(len(lens)), key=lambda i: x["loglik"][i] / lens[i])
        assert y["correct_norm"] == (y["pred_norm"] == y["gold"])
    s = theirs["summary"]
    assert s["acc"] == ours["summary"]["acc"] == s["accuracy"] and s["correct"] == ours["summary"]["correct"]
    assert s["metric"] == "acc" and 0 <= s["acc_norm"] <= 1 and s["seconds"] > 0
    # lm-eval's own aggregate equals the mean of the per-item verdicts
    per_task = s["lm_eval"]
    assert sum(r["acc"] * n for r, n in zip(per_task.values(), _sizes(b))) == pytest.approx(s["correct"])
    if task == "mmlu":
        assert s["subjects"].keys() == ours["summary"]["subjects"].keys()
        assert s["acc_macro"] == pytest.approx(ours["summary"]["acc_macro"])


def _sizes(items):
    counts: dict = {}
    for r in items:
        counts[r.get("subject")] = counts.get(r.get("subject"), 0) + 1
    return list(counts.values())


def test_acc_norm_normalisation_is_lm_evals(lm_eval, tiny, tmp_path):
    """A choice whose length with and without its leading space orders differently: lm-eval's rule decides."""
    root = _data(tmp_path)
    _, theirs = _run_both(tiny, "arc_easy", str(root / DATA_FILES["arc_easy"]))
    for y in theirs["items"]:
        with_space = max(range(len(y["choices"])), key=lambda i: y["loglik"][i] / len(y["choices"][i]))
        without = max(range(len(y["choices"])), key=lambda i: y["loglik"][i] / (len(y["choices"][i]) - 1))
        assert y["pred_norm"] == without
        if with_space != without:  # the rule matters on this item
            assert y["pred_norm"] != with_space
    assert "target delimiter excluded" in theirs["summary"]["settings"]["normalisation"]


def test_chat_template_differences_are_the_documented_ones(lm_eval, tiny, tmp_path):
    """--chat-template: both engines render one user turn and score the choices without their space,
    but lm-eval moves ALL trailing whitespace of the context into the continuation (bridge: spaces
    only), so the newline after the assistant header is scored with every choice: the same amount
    for each choice of an item, so the picks by total agree. MMLU's description becomes lm-eval's
    system message (bridge keeps it in the user turn)."""
    model, tok = tiny
    root = _data(tmp_path)
    ours, theirs = _run_both(tiny, "arc_easy", str(root / DATA_FILES["arc_easy"]), chat_template=True)
    assert theirs["summary"]["settings"]["chat_template_used"] is True
    for x, y in zip(ours["items"], theirs["items"]):
        assert y["context"].endswith("<|im_start|>assistant\n") and y["context"].count(x["query"]) == 1
        assert y["choices"] == [c.lstrip(" ") for c in x["choices"]]
        shift = [b - a for a, b in zip(x["loglik"], y["loglik"])]
        assert max(shift) - min(shift) < 1e-4 and shift[0] < -1  # the "\n" token's log-prob, on every choice
        assert y["pred"] == x["pred"]
    _, mmlu = _run_both(tiny, "mmlu", str(root / "mmlu"), limit=1, chat_template=True)
    context = mmlu["items"][0]["context"]
    assert context.startswith("<|im_start|>system\nThe following are multiple choice questions")


def test_few_shot_needs_enough_examples(lm_eval, tiny, tmp_path):
    root = _data(tmp_path)
    with pytest.raises(UsageError, match="--few-shot 3 needs 3 examples"):
        lme.evaluate(*tiny, "arc_easy", str(root / DATA_FILES["arc_easy"]), limit=2, few_shot=3, progress=False)
    with pytest.raises(UsageError, match="has 2 rows"):
        lme.evaluate(*tiny, "mmlu", str(root / "mmlu"), few_shot=3, progress=False)


def test_cli_engine_writes_bridges_result_shape_and_compares(lm_eval, tiny_model_dir, tmp_path):
    root = _data(tmp_path / "data")
    out = tmp_path / "lm"
    args = ["eval", str(tiny_model_dir), "--task", "arc_easy,mmlu", "--data", f"arc_easy={root / DATA_FILES['arc_easy']}",
            "--data", f"mmlu={root / 'mmlu'}", "--limit", "2", "-o", str(out), "--device", "cpu"]
    run = CliRunner().invoke(app, args + ["--engine", "lm-eval"])
    assert run.exit_code == 0, run.output
    arc = json.loads((out / "eval-arc_easy.json").read_text())
    assert arc["engine"] == "lm-eval" and arc["request"]["engine"] == "lm-eval" and arc["summary"]["n"] == 2
    config = arc["summary"]["settings"]["task_config"]  # lm-eval's own ARC template, recorded
    assert config["doc_to_text"] == "Question: {{question}}\nAnswer:" and config["target_delimiter"] == " "
    assert {"index", "id", "query", "choices", "gold", "loglik", "pred", "pred_norm", "correct",
            "correct_norm"} <= arc["items"][0].keys()
    assert not list(out.glob("*.partial.jsonl"))
    bridge_out = tmp_path / "bridge"
    assert CliRunner().invoke(app, args[:-4] + ["-o", str(bridge_out), "--device", "cpu"]).exit_code == 0
    table = CliRunner().invoke(app, ["eval", "--compare", str(bridge_out), str(out), "--general", "arc_easy,mmlu"])
    assert table.exit_code == 0 and "lm" in table.stdout and "bridge" in table.stdout, table.output
    # a result of one engine is not kept for a request of the other
    other = CliRunner().invoke(app, args + ["--resume"])
    assert other.exit_code == UsageError.exit_code and "engine" in other.output


# -- the default model on the real data --------------------------------------------------------

DATA = next((p for p in (Path(__file__).resolve().parents[2] / "shared" / "data", Path("/work/shared/data"))
             if p.is_dir()), Path("/work/shared/data"))


@pytest.mark.integration
@pytest.mark.parametrize("task, rel, limit", [
    ("arc_easy", "arc/ARC-Easy-Test.jsonl", 5),
    ("hellaswag", "hellaswag/hellaswag_val_full.txt.bz2", 5),
    ("mmlu", "mmlu/test/astronomy_test.csv", 5),  # one subject; its dev split is found beside test/
])
def test_default_model_engines_agree_on_real_data(lm_eval, smollm2, task, rel, limit):
    path = DATA / rel
    if not path.exists():
        pytest.skip(f"{path} not present")
    model, tok = smollm2
    kw = {"limit": limit, "few_shot": 2 if task == "mmlu" else 0, "progress": False}
    ours = bridge_evaluate(model, tok, task, str(path), **kw)
    theirs = lme.evaluate(model, tok, task, str(path), **kw)
    for x, y in zip(ours["items"], theirs["items"], strict=True):
        assert x["choices"] == y["choices"] and y["context"].endswith(x["query"])
        assert y["loglik"] == pytest.approx(x["loglik"], abs=1e-3)
        assert y["pred"] == x["pred"]
    assert theirs["summary"]["acc"] == ours["summary"]["acc"]


@pytest.fixture(scope="module")
def smollm2():
    from bridgecli.modeling.loading import load_model, load_tokenizer

    return load_model(None).eval(), load_tokenizer(None)
