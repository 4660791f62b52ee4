"""bridge eval: answer extraction, GSM8K loading, batched greedy generation, the gsm8k task end to end.

Generation runs on a tiny random Llama with a byte-level BPE tokenizer trained in the test, so
nothing is downloaded."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pluggy
import pytest
import torch

from bridgecli import hookspecs, plugins, registry
from bridgecli.errors import InputError, PluginError, UsageError
from bridgecli.evaluation import EvalOptions, evaluate, render_table, write_result
from bridgecli.evaluation import gsm8k
from bridgecli.evaluation.generate import cut_at_stop, generate, render_prompt
from bridgecli.evaluation.gsm8k import extract_answer, normalize_number, reference_answer

from tiny import interrupting

REAL_GSM8K = Path("/work/shared/data/gsm8k/test.jsonl")


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

ITEMS = [
    {"question": "Tom has 3 apples and buys 4 more. How many apples does he have?",
     "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
    {"question": "A book costs $12 and a pen costs $3. What do both cost?",
     "answer": "12 + 3 = <<12+3=15>>15\n#### 15"},
    {"question": "Sara saves $1,250 a month for 2 months. How much has she saved?",
     "answer": "1,250 * 2 = <<1250*2=2500>>2,500\n#### 2,500"},
    {"question": "A tank holds 10 liters and leaks 12 liters. What is the balance?",
     "answer": "10 - 12 = <<10-12=-2>>-2\n#### -2"},
]


# -- answer extraction ------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("1000", "1000"),
    ("1,000", "1000"),
    ("$1,000", "1000"),
    ("1,000,000.", "1000000"),
    ("5.00", "5"),
    ("5.50", "5.5"),
    ("0.25", "0.25"),
    (".5", "0.5"),
    ("007", "7"),
    ("-3", "-3"),
    ("-$3", "-3"),
    ("$-3", "-3"),
    ("\u22124", "-4"),
    ("-0.0", "0"),
    ("abc", None),
    ("", None),
    ("$", None),
])
def test_normalize_number(text, expected):
    assert normalize_number(text) == expected


@pytest.mark.parametrize("text, expected", [
    # the number after #### wins over everything else
    ("She has 9 eggs, so 9 * 2 = 18.\n#### 18", "18"),
    ("#### $1,000.00 and later 7", "1000"),
    ("The answer is 5.\n#### 6", "6"),
    ("####-12", "-12"),
    # \boxed{}
    ("so the total is \\boxed{42} dollars, step 3", "42"),
    ("\\boxed{\\$1,234.50}", "1234.5"),
    # as Qwen2.5-Instruct writes it (LaTeX delimiters, units, a check after the box)
    ("Thus, Josh's profit is \\(\\boxed{50000}\\).", "50000"),
    ("\\[\n\\boxed{18 \\text{ dollars}}\n\\]", "18"),
    ("is \\(\\boxed{70,000}\\) dollars", "70000"),
    ("so $\\boxed{3}$ bolts. Check: 2 + 1 = 3 and 3 < 4.", "3"),
    ("\\boxed{\\text{18}}", "18"),
    # "the answer is" / "answer:"
    ("The answer is 42. Then 7 more steps.", "42"),
    ("Final answer: $1,250", "1250"),
    ("The answer is: **-7**", "-7"),
    ("the answer is $5.00.", "5"),
    ("First guess: answer is 3. Corrected: the answer is 4 (2 steps)", "4"),
    # last number in the text
    ("3 apples plus 4 apples make 7 apples.", "7"),
    ("He pays $2,500.", "2500"),
    ("The temperature drops to -5 degrees.", "-5"),
    ("Ages 3-4 are grouped", "4"),
    ("10 - 5 = 5 and then 8.50", "8.5"),
    ("list 1,2,3", "3"),
    ("half is .5", "0.5"),
    # nothing
    ("I don't know.", None),
    ("", None),
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_reference_answer():
    assert reference_answer("work\n#### 2,500") == "2500"
    assert reference_answer("a #### 3 b #### -4") == "-4"
    assert reference_answer("no marker 5") is None
    assert reference_answer("#### none") is None


@pytest.mark.skipif(not REAL_GSM8K.exists(), reason="GSM8K test split not available")
def test_real_gsm8k_references_parse(tmp_path):
    lines = REAL_GSM8K.read_text(encoding="utf-8").splitlines()[:20]
    sample = tmp_path / "head.jsonl"  # a temp copy of 20 lines, never stored in the repo
    sample.write_text("\n".join(lines) + "\n", encoding="utf-8")
    items = gsm8k.load(sample)
    assert len(items) == 20
    for item, line in zip(items, lines):
        raw = json.loads(line)["answer"].rsplit("####", 1)[1].strip()
        assert item.reference == raw.replace(",", "")
        assert item.reference.lstrip("-").replace(".", "").isdigit()
    assert items[0].reference == "18"


# -- data loading -----------------------------------------------------------------------------

def _write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def test_load_jsonl_and_gz(tmp_path):
    plain = _write_jsonl(tmp_path / "d.jsonl", [ITEMS[0], "", ITEMS[1]])
    items = gsm8k.load(plain)
    assert [(i.index, i.line, i.reference) for i in items] == [(0, 1, "7"), (1, 3, "15")]
    gz = tmp_path / "d.jsonl.gz"
    with gzip.open(gz, "wt", encoding="utf-8") as fh:
        fh.write(plain.read_text(encoding="utf-8"))
    assert gsm8k.load(gz) == items


def test_load_bad_json_names_file_and_line(tmp_path):
    path = _write_jsonl(tmp_path / "bad.jsonl", [ITEMS[0], ITEMS[1], '{"question": "x", "answer": '])
    with pytest.raises(InputError) as info:
        gsm8k.load(path)
    err = info.value
    assert err.file == str(path) and err.record == "line 3"
    text = str(err)
    assert "bad.jsonl" in text and "line 3" in text and "JSON" in text and "\n" not in text


@pytest.mark.parametrize("row, field", [
    ({"answer": "#### 1"}, "question"),
    ({"question": "q"}, "answer"),
    ({"question": 3, "answer": "#### 1"}, "question"),
    ({"question": "q", "answer": "no final number"}, "answer"),
])
def test_load_missing_or_bad_field(tmp_path, row, field):
    path = _write_jsonl(tmp_path / "d.jsonl", [ITEMS[0], row])
    with pytest.raises(InputError) as info:
        gsm8k.load(path)
    assert info.value.field == field and info.value.record == "line 2"
    assert f"field '{field}'" in str(info.value)


def test_load_not_an_object_and_missing_file(tmp_path):
    with pytest.raises(InputError, match="line 1.*JSON object"):
        gsm8k.load(_write_jsonl(tmp_path / "d.jsonl", ["[1, 2]"]))
    with pytest.raises(InputError, match="no such file"):
        gsm8k.load(tmp_path / "missing.jsonl")


# -- prompts ----------------------------------------------------------------------------------

def test_build_prompt_chat_and_plain(tmp_path):
    items = gsm8k.load(_write_jsonl(tmp_path / "d.jsonl", ITEMS))
    shots = gsm8k.few_shot_examples(items, evaluated=2, k=2, pool_path=None)
    assert [s.index for s in shots] == [2, 3]  # past the evaluated items
    chat = gsm8k.build_prompt("Q?", shots, chat=True)
    assert [m["role"] for m in chat] == ["user", "assistant", "user", "assistant", "user"]
    assert chat[1]["content"] == "1,250 * 2 = 2,500\n#### 2,500"  # calculator annotations removed
    assert chat[-1] == {"role": "user", "content": "Q?"}
    plain = gsm8k.build_prompt("Q?", shots, chat=False)
    assert plain.startswith("Q: Sara saves") and plain.endswith("\n\nQ: Q?\nA:") and "<<" not in plain
    assert gsm8k.build_prompt("Q?", [], chat=False) == "Q: Q?\nA:"
    with pytest.raises(UsageError, match="--few-shot 3"):
        gsm8k.few_shot_examples(items, evaluated=2, k=3, pool_path=None)
    pool = _write_jsonl(tmp_path / "pool.jsonl", ITEMS[::-1])
    assert [s.question for s in gsm8k.few_shot_examples(items, 4, 1, str(pool))] == [ITEMS[3]["question"]]


# -- a tiny model -----------------------------------------------------------------------------

CORPUS = [
    "Q: Tom has 3 apples and buys 4 more. How many apples does he have?",
    "A: 3 + 4 = 7. The answer is 7.",
    "A book costs $12 and a pen costs $3. What do both cost?",
    "Sara saves $1,250 a month for 2 months. #### 2500",
    "the quick brown fox jumps over the lazy dog 0123456789",
]


@pytest.fixture(scope="module")
def tiny():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    raw.train_from_iterator(CORPUS, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    tok.padding_side = "right"  # generate() must switch to left padding and restore this

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         initializer_range=0.5, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        # EOS logit pinned at 0 (the max of ~300 random logits is almost surely above it), so
        # generation runs until max_new_tokens or a stop string and the tests are deterministic.
        model.lm_head.weight[tok.eos_token_id] = 0
    return model, tok


PROMPTS = [
    "Q: Tom has 3 apples",
    "A book costs $12 and a pen costs $3. What do both cost?",
    "fox",
    "Sara saves $1,250 a month for 2 months. How much?",
    "the lazy dog",
]


class _CountForwards:
    def __init__(self, model):
        self.calls = 0
        self.handle = model.register_forward_hook(self._hook)

    def _hook(self, *args):
        self.calls += 1


def test_batched_equals_unbatched(tiny):
    model, tok = tiny
    batched = generate(model, tok, PROMPTS, max_new_tokens=12, batch_size=3, chat_template=False, progress=False)
    single = [generate(model, tok, [p], max_new_tokens=12, batch_size=1, chat_template=False, progress=False)[0]
              for p in PROMPTS]
    assert batched == single
    assert all(batched) and len(set(batched)) > 1  # real, prompt-dependent text
    assert tok.padding_side == "right"  # restored


def test_max_new_tokens_respected(tiny):
    model, tok = tiny
    counter = _CountForwards(model)
    try:
        out = generate(model, tok, PROMPTS[:2], max_new_tokens=5, batch_size=2, chat_template=False, progress=False)
    finally:
        counter.handle.remove()
    assert counter.calls == 5  # one forward per new token, KV cache after the first
    longer = generate(model, tok, PROMPTS[:2], max_new_tokens=9, batch_size=2, chat_template=False, progress=False)
    for short, long in zip(out, longer):
        short = short.rstrip("\ufffd")  # a byte-level token may end mid-character
        assert short and long.startswith(short) and len(long) > len(short)


def test_stop_strings_cut_and_stop_early(tiny):
    model, tok = tiny
    full = generate(model, tok, [PROMPTS[1]], max_new_tokens=40, chat_template=False, progress=False)[0]
    assert len(full) > 10
    stop = full[6:9]
    counter = _CountForwards(model)
    try:
        cut = generate(model, tok, [PROMPTS[1]], max_new_tokens=40, stop=["never-there", stop],
                       chat_template=False, progress=False)[0]
    finally:
        counter.handle.remove()
    assert cut == full[:full.find(stop)]
    assert stop not in cut
    assert counter.calls < 40  # stopped as soon as the stop string appeared


def test_stop_waits_for_every_row(tiny):
    model, tok = tiny
    full = generate(model, tok, PROMPTS[:2], max_new_tokens=20, chat_template=False, progress=False)
    stop = full[0][3:6]
    cut = generate(model, tok, PROMPTS[:2], max_new_tokens=20, stop=[stop], chat_template=False, progress=False)
    assert cut == [cut_at_stop(t, [stop]) for t in full]


def test_cut_at_stop():
    assert cut_at_stop("abc\nQ: next", ["\nQ:", "c"]) == "ab"
    assert cut_at_stop("abc", []) == "abc"
    assert cut_at_stop("abc", [""]) == "abc"


def test_chat_template_rendering(tiny):
    model, tok = tiny
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
                {"role": "user", "content": "fox"}]
    assert render_prompt(tok, messages) == "hi\n\nyo\n\nfox"  # no template: plain fallback
    tok.chat_template = ("{% for m in messages %}<s>{{ m.role }}: {{ m.content }}\n{% endfor %}"
                         "{% if add_generation_prompt %}assistant:{% endif %}")
    try:
        assert render_prompt(tok, messages) == "<s>user: hi\n<s>assistant: yo\n<s>user: fox\nassistant:"
        assert render_prompt(tok, "fox") == "<s>user: fox\nassistant:"
        assert render_prompt(tok, messages, chat_template=False) == "hi\n\nyo\n\nfox"
        out = generate(model, tok, [messages, "fox"], max_new_tokens=4, progress=False)
        assert len(out) == 2 and all(isinstance(t, str) for t in out)
    finally:
        tok.chat_template = None


def test_generate_argument_checks(tiny):
    model, tok = tiny
    assert generate(model, tok, [], progress=False) == []
    with pytest.raises(UsageError):
        generate(model, tok, ["x"], max_new_tokens=0, progress=False)
    with pytest.raises(UsageError):
        generate(model, tok, ["x"], batch_size=0, progress=False)


# -- the task end to end ----------------------------------------------------------------------

@pytest.fixture
def data_file(tmp_path):
    return str(_write_jsonl(tmp_path / "gsm8k.jsonl", ITEMS))


def test_task_with_tiny_model(tiny, data_file):
    model, tok = tiny
    options = EvalOptions(data=data_file, limit=3, few_shot=1, batch_size=2, max_new_tokens=8,
                          chat_template=True, progress=False)
    run = gsm8k.gsm8k_task(model, tok, options)
    summary, items = run["summary"], run["items"]
    assert summary["task"] == "gsm8k" and summary["n"] == 3 and len(items) == 3
    assert 0.0 <= summary["accuracy"] <= 1.0
    assert summary["correct"] == sum(i["correct"] for i in items)
    assert summary["settings"]["few_shot_indices"] == [3]
    assert summary["settings"]["chat_template_used"] is False  # the tiny tokenizer has no template
    assert summary["settings"]["stop"] == list(gsm8k.PLAIN_STOP)
    assert [i["index"] for i in items] == [0, 1, 2]
    assert [i["reference"] for i in items] == ["7", "15", "2500"]
    for item in items:
        assert set(item) == {"index", "question", "reference", "prediction", "extracted", "correct", "new_tokens",
                             "hit_limit"}
        assert item["correct"] == (item["extracted"] == item["reference"])
        # the tiny model never says EOS: an item ends at a stop string or at the 8-token limit
        assert 1 <= item["new_tokens"] <= 8 and item["hit_limit"] == (item["new_tokens"] == 8 and "\nQ:" not in
                                                                       item["prediction"])
    assert summary["generation"]["hit_limit"] == sum(i["hit_limit"] for i in items)
    json.dumps(run)  # serialisable as is


def test_task_perfect_answers_score_one(tiny, data_file, monkeypatch):
    model, tok = tiny
    seen = {}

    def fake_generate(model, tokenizer, prompts, **kwargs):
        seen.update(kwargs, prompts=prompts)
        answers = ["3 + 4 = 7\n#### 7", "They cost 15 dollars. The answer is $15.00.",
                   "She saved 1,250 * 2 = $2,500.", "The balance is -2 liters."]
        return answers[:len(prompts)]

    monkeypatch.setattr("bridgecli.evaluation.generate.generate", fake_generate)
    run = gsm8k.gsm8k_task(model, tok, EvalOptions(data=data_file, max_new_tokens=64, batch_size=4,
                                                   chat_template=False, progress=False))
    assert run["summary"]["accuracy"] == 1.0 and run["summary"]["correct"] == 4 and run["summary"]["n"] == 4
    assert [i["extracted"] for i in run["items"]] == ["7", "15", "2500", "-2"]
    assert seen["max_new_tokens"] == 64 and seen["batch_size"] == 4 and seen["stop"] == gsm8k.PLAIN_STOP
    assert seen["prompts"][0] == f"Q: {ITEMS[0]['question']}\nA:"


def test_task_option_checks(tiny, data_file):
    model, tok = tiny
    with pytest.raises(UsageError, match="few-shot"):
        gsm8k.gsm8k_task(model, tok, EvalOptions(data=data_file, few_shot=2, progress=False))
    with pytest.raises(UsageError, match="limit"):
        gsm8k.gsm8k_task(model, tok, EvalOptions(data=data_file, limit=0, progress=False))


@pytest.fixture
def only_builtin_eval_tasks(monkeypatch):
    """A plugin manager holding just the built-in eval tasks (other built-ins may not exist yet)."""
    from bridgecli.builtin import eval_tasks

    pm = pluggy.PluginManager("bridgecli")
    pm.add_hookspecs(hookspecs)
    pm.register(eval_tasks, name="bridgecli.builtin.eval_tasks")
    registry.clear_cache()
    monkeypatch.setattr(plugins, "get_manager", lambda: pm)
    yield pm
    registry.clear_cache()


def test_evaluate_through_registry_and_write(tiny, data_file, tmp_path, monkeypatch, only_builtin_eval_tasks):
    model, tok = tiny
    assert registry.names("eval_task") == ["answer-loss", "arc_challenge", "arc_easy", "gsm8k", "heldout-loss",
                                           "hellaswag", "humaneval", "math", "mbpp", "mmlu"]
    monkeypatch.setattr("bridgecli.evaluation.generate.generate",
                        lambda m, t, prompts, **kw: ["#### 7", "#### 0"][:len(prompts)])
    result = evaluate(model, tok, "gsm8k", data_file, limit=2, progress=False)
    assert result["task"] == "gsm8k" and set(result) == {"task", "summary", "items"}
    assert result["summary"]["accuracy"] == 0.5 and result["summary"]["correct"] == 1
    assert result["summary"]["settings"]["limit"] == 2

    out = tmp_path / "out" / "gsm8k.json"
    write_result(result, out)
    assert json.loads(out.read_text(encoding="utf-8")) == result
    assert [p.name for p in out.parent.iterdir()] == ["gsm8k.json"]  # no temp file left

    from rich.console import Console

    console = Console(record=True, width=80)
    console.print(render_table([result]))
    text = console.export_text()
    assert "gsm8k" in text and "50.0%" in text and "accuracy" in text

    with pytest.raises(PluginError, match="no eval task named 'nope'.*gsm8k, heldout-loss, hellaswag"):
        evaluate(model, tok, "nope", data_file, progress=False)


def test_interrupted_generation_resumes_per_item_from_the_journal(tiny, data_file, tmp_path, monkeypatch,
                                                                  only_builtin_eval_tasks):
    from bridgecli.evaluation.journal import Journal

    model, tok = tiny
    run = lambda book: evaluate(model, tok, "gsm8k", data_file, limit=4, batch_size=1,  # noqa: E731
                                max_new_tokens=6, progress=False, journal=book)
    reference = run(None)
    request = {"model": "tiny", "limit": 4}
    path = tmp_path / "eval-gsm8k.json.partial.jsonl"

    calls = []
    real = model.generate
    monkeypatch.setattr(model, "generate", interrupting(real, calls, at=3))  # Ctrl-C during the third prompt
    with pytest.raises(KeyboardInterrupt):
        run(Journal.open(path, request, resume=False))
    lines = path.read_text().splitlines()
    assert json.loads(lines[0]) == {"request": request} and len(lines) == 3  # two continuations kept

    with path.open("a") as fh:
        fh.write('{"key": "ab')  # a last line cut short by the interruption is generated again
    calls.clear()
    monkeypatch.setattr(model, "generate", interrupting(real, calls))
    book = Journal.open(path, request, resume=True)
    assert len(book.entries) == 2
    resumed = run(book)
    assert len(calls) == 2 and book.reused == 2  # only the two missing prompts were generated
    assert resumed["items"] == reference["items"]

    with pytest.raises(UsageError, match=r"limit=4.*asks for 8"):
        Journal.open(path, {**request, "limit": 8}, resume=True)
    fresh = Journal.open(path, {**request, "limit": 8}, resume=False)  # without --resume: started again
    fresh.close(remove=False)
    assert path.read_text().splitlines() == [json.dumps({"request": {**request, "limit": 8}})]
    holder = Journal.open(path, request, resume=False)  # a run still writing this journal
    with pytest.raises(UsageError, match="another process is writing this eval journal"):
        Journal.open(path, request, resume=True)
    with pytest.raises(UsageError, match="another process is writing this eval journal"):
        Journal.open(path, request, resume=False)
    assert path.read_text().splitlines() == [json.dumps({"request": request})]  # left as the holder wrote it
    holder.close(remove=False)
    path.write_text(json.dumps({"request": request}) + "\nnot json\n" + json.dumps({"key": "k", "text": "t"}) + "\n")
    with pytest.raises(UsageError, match="line 2: not a journal entry"):
        Journal.open(path, request, resume=True)
