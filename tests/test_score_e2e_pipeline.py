"""`bridge score`'s pipelined loop (GPU work of one batch queued before the results of the one
before are collected, the next window read between batches, windows written by a writer thread)
writes the same bytes as scoring and writing one batch after another, and stops on a writer error."""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

from itertools import islice

import msgspec
import numpy as np
import pytest
import torch
import zstandard

from bridgecli.artifacts.direction_file import Direction, DirectionMeta, save_direction
from bridgecli.artifacts.warmup_run import WarmupRun
from bridgecli.data.examples import DataOptions, iter_examples, with_model_limit
from bridgecli.errors import BridgeError
from bridgecli.format.records import Header, ModelInfo
from bridgecli.format.spec import PREAMBLE
from bridgecli.format.writer import StreamWriter
from bridgecli.modeling.params import tail_parameters
from bridgecli.modeling.scoring import BridgeScorer, ScoringContext, load_scoring_checkpoint
from bridgecli.steps import score as score_step
from bridgecli.modeling import score_loop
from bridgecli.runtime.resumable import ResumableOutput
from bridgecli.steps.score import ScoreOptions, run_score, score_window, windows


# integration: the run fixture's warmup, scoring runs; one_thread: tests/conftest.py
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]
SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "data" / "train.jsonl"


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_model_dir):
    """A warmup run folder made by hand: the tiny model and a random unit v over its last 4 blocks."""
    from transformers import AutoModelForCausalLM

    return _run_folder(tmp_path_factory.mktemp("e2e") / "run", tiny_model_dir,
                       AutoModelForCausalLM.from_pretrained(tiny_model_dir))


def _run_folder(d: Path, checkpoint: Path, model) -> Path:
    """A warmup run folder ``d`` over ``checkpoint`` (``model`` loaded from it): a random unit v over the
    last 4 blocks."""
    d.mkdir()
    (d / "checkpoint").symlink_to(checkpoint, target_is_directory=True)
    g = torch.Generator().manual_seed(0)
    v = {n: torch.randn(p.shape, generator=g) for n, p in tail_parameters(model, 4).items()}
    norm = float(torch.sqrt(sum((t ** 2).sum() for t in v.values())))
    save_direction(Direction({n: t / norm for n, t in v.items()}, DirectionMeta(layers=4, lam=0.2)), d)
    (d / "warmup.json").write_text(json.dumps({"base_model": str(d / "checkpoint")}))
    return d


def after_header(data: bytes) -> bytes:
    dobj = zstandard.ZstdDecompressor().decompressobj()
    dobj.decompress(data[PREAMBLE.size :])
    return dobj.unused_data


def serial(run: Path, window: int, max_tokens: int, batch_size: int, limit: int | None = None) -> bytes:
    """The loop before pipelining: score each window's batches one after another, then write the
    window in input order and end its frame."""
    import io

    ck = load_scoring_checkpoint(WarmupRun.open(run), "float32", "cpu")
    scorer = BridgeScorer(ScoringContext(model=ck.model, tokenizer=ck.tokenizer, direction=ck.direction.v))
    buf = io.BytesIO()
    w = StreamWriter(buf, Header(stage="scores", producer="test", created="", model=ModelInfo("", "", "")),
                     records_per_frame=None)
    examples = iter_examples(str(SAMPLE), ck.tokenizer, with_model_limit(DataOptions(limit=limit), ck.model))
    for win in windows(examples, window):
        for ex in score_window(scorer, win, max_tokens, batch_size):
            w.write(ex)
        w.flush()
    w.close()
    return buf.getvalue()


@pytest.fixture(scope="module")
def serial_of(run):
    """:func:`serial` over the run fixture, each combination computed once in the module (the
    window-5 bytes are the reference of a file, of stdout and of stdin)."""
    return functools.cache(functools.partial(serial, run))


@pytest.fixture(scope="module")
def scored_file(run, tmp_path_factory):
    """``bridge score`` of the sample to a file through the pipelined loop, each (window, max_tokens,
    batch_size) once in the module: (the output, the count run_score returned)."""
    folder = tmp_path_factory.mktemp("scored")

    @functools.cache
    def get(window: int, max_tokens: int, batch_size: int) -> tuple[Path, int]:
        out = folder / f"out-{window}-{max_tokens}-{batch_size}.bridge"
        n = run_score(ScoreOptions(data=str(SAMPLE), out=str(out), run=str(run), window=window,
                                   max_tokens=max_tokens, batch_size=batch_size, device="cpu"))
        return out, n

    return get


@pytest.mark.parametrize("window,max_tokens,batch_size", [(5, 300, 2), (16, 100000, 64), (7, 1, 64)])
def test_pipelined_loop_writes_the_serial_bytes(scored_file, serial_of, window, max_tokens, batch_size):
    out, n = scored_file(window, max_tokens, batch_size)
    assert n == 48
    assert after_header(out.read_bytes()) == after_header(serial_of(window, max_tokens, batch_size))


def test_pipelined_loop_to_stdout_writes_the_serial_bytes(run, serial_of, capfdbinary):
    run_score(ScoreOptions(data=str(SAMPLE), out="-", run=str(run), window=5, max_tokens=300, batch_size=2,
                           device="cpu"))
    assert after_header(capfdbinary.readouterr().out) == after_header(serial_of(5, 300, 2))


def test_a_writer_error_stops_the_run(run, tmp_path, monkeypatch):
    calls = []

    def failing_commit(self, writer, position):
        calls.append(position)
        if position > 0:
            raise OSError("disk full")
        writer.flush()

    monkeypatch.setattr(ResumableOutput, "commit", failing_commit)
    with pytest.raises(OSError, match="disk full"):
        run_score(ScoreOptions(data=str(SAMPLE), out=str(tmp_path / "o.bridge"), run=str(run), window=4,
                               max_tokens=300, batch_size=2, device="cpu"))
    assert calls[:2] == [0, 4] and len(calls) == 2  # nothing is committed after the failed window


def test_ahead_reads_at_most_its_bound():
    ahead = score_loop.Ahead(iter(range(10)), most=4)
    ahead.fill(100)
    assert list(ahead.buf) == [0, 1, 2, 3]
    assert ahead.take(3) == [0, 1, 2]
    ahead.fill(1)
    assert ahead.take(10) == [3, 4, 5, 6]  # take reads up to the bound again
    assert ahead.take(10) == [7, 8, 9] and ahead.take(10) == [] and ahead.exhausted


def test_launch_of_a_scorer_that_scores_its_own_way_is_its_score(run):
    ck = load_scoring_checkpoint(WarmupRun.open(run), "float32", "cpu")

    class Own(BridgeScorer):
        def score(self, examples):
            return ["own"] * len(examples)

    scorer = Own(ScoringContext(model=ck.model, tokenizer=ck.tokenizer, direction=ck.direction.v))
    ex = next(iter_examples(str(SAMPLE), ck.tokenizer, DataOptions()))
    assert scorer.launch([ex, ex]).result() == ["own", "own"]
    plain = BridgeScorer(ScoringContext(model=ck.model, tokenizer=ck.tokenizer, direction=ck.direction.v))
    assert msgspec.msgpack.encode(plain.launch([ex]).result()) == msgspec.msgpack.encode(plain.score([ex]))


def test_compile_cache_goes_under_the_bridge_cache_unless_set(monkeypatch, tmp_path):
    monkeypatch.setenv("BRIDGE_CACHE", str(tmp_path / "bc"))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    score_step.compile_caches()
    import os

    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "bc" / "inductor")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    score_step.compile_caches()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mine")


def test_timings_name_each_phase_in_order_and_only_when_asked(run, tmp_path, monkeypatch, capsys):
    opts = dict(data=str(SAMPLE), run=str(run), window=8, max_tokens=300, batch_size=4, device="cpu")
    monkeypatch.delenv("BRIDGE_TIMINGS", raising=False)
    run_score(ScoreOptions(out=str(tmp_path / "a.bridge"), **opts))
    assert "timing" not in capsys.readouterr().err
    monkeypatch.setenv("BRIDGE_TIMINGS", "1")
    run_score(ScoreOptions(out=str(tmp_path / "b.bridge"), **opts))
    marks = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("bridge: timing: ")]
    labels = [ln.removeprefix("bridge: timing: ").rsplit(" at ", 1)[0] for ln in marks]
    assert labels == ["start of scoring", "model loaded", "scorer ready", "scoring loop starts",
                      "first window read and tokenised", "first batch queued", "first batch done",
                      "first window scored", "last window written"]
    times = [float(ln.rsplit(" at ", 1)[1].removesuffix(" s")) for ln in marks]
    assert times == sorted(times)
    assert after_header((tmp_path / "a.bridge").read_bytes()) == after_header((tmp_path / "b.bridge").read_bytes())


def test_a_named_gpu_becomes_the_current_device(run, tmp_path, monkeypatch):
    """`--device cuda:1` in one process: the Triton kernels launch on the current device, so it is set."""
    from bridgecli.runtime import params

    chosen = []
    monkeypatch.setattr(params, "check_device", lambda device: None)  # no GPU here: take cuda:1 as present
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: chosen.append(torch.device(d)))
    monkeypatch.setattr(score_step, "_score", lambda *args: 0)
    run_score(ScoreOptions(data=str(SAMPLE), out=str(tmp_path / "o.bridge"), run=str(run), device="cuda:1"))
    assert chosen == [torch.device("cuda:1")]


def test_tokenising_in_a_child_process_writes_the_same_bytes(run, tmp_path, monkeypatch):
    outs = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("BRIDGE_TOKENIZE_PROCESS", flag)
        outs[flag] = tmp_path / f"out{flag}.bridge"
        n = run_score(ScoreOptions(data=str(SAMPLE), out=str(outs[flag]), run=str(run), window=5, max_tokens=300,
                                   batch_size=2, device="cpu", data_opts=DataOptions(limit=40, max_length=180)))
        assert 0 < n < 40  # some were too long
    assert after_header(outs["0"].read_bytes()) == after_header(outs["1"].read_bytes())


def test_resume_with_a_child_process_writes_the_uninterrupted_bytes(run, serial_of, tmp_path, monkeypatch):
    monkeypatch.setenv("BRIDGE_TOKENIZE_PROCESS", "1")
    out = tmp_path / "o.bridge"
    real_commit = ResumableOutput.commit

    def failing_commit(self, writer, position):
        if position > 8:
            raise OSError("disk full")
        real_commit(self, writer, position)

    monkeypatch.setattr(ResumableOutput, "commit", failing_commit)
    with pytest.raises(OSError, match="disk full"):
        run_score(ScoreOptions(data=str(SAMPLE), out=str(out), run=str(run), window=4, max_tokens=300, batch_size=2,
                               device="cpu"))
    monkeypatch.setattr(ResumableOutput, "commit", real_commit)
    assert run_score(ScoreOptions(data=str(SAMPLE), out=str(out), run=str(run), window=4, max_tokens=300,
                                  batch_size=2, device="cpu", resume=True)) == 48
    assert after_header(out.read_bytes()) == after_header(serial_of(4, 300, 2))


def test_data_on_stdin_scores_as_the_file_does(run, scored_file, tmp_path, monkeypatch):
    """`bridge score - ...`: the data is copied to a temporary file first (it is read twice), so the
    records are those of scoring the file itself (with the same options)."""
    import io
    import sys

    from bridgecli.format.reader import read_all

    from_file, from_stdin = scored_file(5, 300, 2)[0], tmp_path / "stdin.bridge"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(SAMPLE.read_bytes())))
    run_score(ScoreOptions(data="-", out=str(from_stdin), run=str(run), window=5, max_tokens=300,
                           batch_size=2, device="cpu"))
    assert after_header(from_stdin.read_bytes()) == after_header(from_file.read_bytes())
    assert len(read_all(from_stdin)[1]) == len(read_all(from_file)[1]) > 0
    header = read_all(from_stdin)[0]  # it names the data as the user gave it, not the temporary copy
    assert header.source == "<stdin>" and header.steps[-1].params["data"] == "<stdin>"
    from test_step_records import unrecorded

    params = header.steps[-1].params
    assert unrecorded(ScoreOptions, params) == []  # every field of its options, or marked not to be
    assert params["run"] == str(run) and params["device"] == "cpu" and "resume" not in params


def test_a_bad_record_on_stdin_is_named_stdin(run, tmp_path, monkeypatch):
    import io
    import sys

    from bridgecli.errors import BridgeError

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"not json\n")))
    with pytest.raises(BridgeError, match=r"^<stdin>, line 1: invalid JSON"):
        run_score(ScoreOptions(data="-", out=str(tmp_path / "o.bridge"), run=str(run), device="cpu"))
    assert not (tmp_path / "o.bridge").exists()


def test_a_diverged_checkpoint_stops_score_with_one_line(tmp_path, tiny_model_dir, capfdbinary):
    """A warmup checkpoint whose weights went NaN scores NaN: score refuses before writing, naming the data
    file, the record, its id and the field, as the reader would refuse the stream later."""
    from transformers import AutoModelForCausalLM

    from bridgecli.errors import ModelError

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        model.model.norm.weight[0] = float("nan")  # a diverged run: every logit NaN
    shutil.copytree(tiny_model_dir, tmp_path / "diverged")  # the tokenizer's files
    model.save_pretrained(tmp_path / "diverged")
    run = _run_folder(tmp_path / "run", tmp_path / "diverged", model)
    out = tmp_path / "o.bridge"
    with pytest.raises(ModelError) as info:
        run_score(ScoreOptions(data=str(SAMPLE), out=str(out), run=str(run), window=4, max_tokens=300,
                               batch_size=2, device="cpu"))
    text = str(info.value)
    assert "\n" not in text and info.value.exit_code != 0
    assert text.startswith(f"{SAMPLE}, record ") and " (id train-00" in text, text
    assert "field 'scores.a': holds NaN at index 0 (values must lie within +-2^48" in text, text
    assert f"the checkpoint of {run}: did its warmup diverge?" in text
    assert not out.exists() and not list(tmp_path.glob("o.bridge*"))  # nothing committed: nothing kept
    capfdbinary.readouterr()
    with pytest.raises(ModelError, match="holds NaN") as info:  # on stdout: no prefix that looks like a stream
        run_score(ScoreOptions(data=str(SAMPLE), out="-", run=str(run), window=4, max_tokens=300, batch_size=2,
                               device="cpu"))
    assert capfdbinary.readouterr().out == b"" and "incomplete" not in str(info.value)


class _Poisoned:
    """A scorer that gives the example of input index ``index`` an infinite a_0 (one bad value in a batch)."""

    def __init__(self, inner, index: int):
        self.inner, self.index = inner, index
        self.launch = None
        self.max_tokens_cuda = None
        self.startup_note = None
        self.header_params = None

    def score(self, examples):
        results = self.inner.score(examples)
        return [msgspec.structs.replace(sc, a=msgspec.structs.replace(
                    sc.a, data=np.array([np.inf], "<f4").tobytes() + sc.a.data[4:]))
                if ex.index == self.index else sc
                for ex, sc in zip(examples, results)]


def test_non_finite_scores_stop_the_run_and_the_windows_before_stay_resumable(run, serial_of, tmp_path, monkeypatch,
                                                                              capsys):
    out = tmp_path / "o.bridge"
    opts = dict(data=str(SAMPLE), out=str(out), run=str(run), window=4, max_tokens=300, batch_size=2, device="cpu",
                data_opts=DataOptions(limit=12))
    real_build = score_step._build
    monkeypatch.setattr(score_step, "_build", lambda *a: _Poisoned(real_build(*a), index=9))
    with pytest.raises(BridgeError, match=rf"^{SAMPLE}, record 9 \(id train-0010\), field 'scores.a': holds an "
                                          r"infinite value at index 0 \(values must lie within \+-2\^48"):
        run_score(ScoreOptions(**opts))
    assert not out.exists()  # the output appears only once complete; the two windows before are kept
    assert "kept 8 scored examples" in capsys.readouterr().err
    monkeypatch.setattr(score_step, "_build", real_build)
    assert run_score(ScoreOptions(**opts, resume=True)) == 12
    assert "resuming after 8 examples" in capsys.readouterr().err
    assert after_header(out.read_bytes()) == after_header(serial_of(4, 300, 2, limit=12))


def test_the_serial_loop_checks_each_batch_too(run):
    ck = load_scoring_checkpoint(WarmupRun.open(run), "float32", "cpu")
    scorer = _Poisoned(BridgeScorer(ScoringContext(model=ck.model, tokenizer=ck.tokenizer,
                                                   direction=ck.direction.v)), index=2)
    window = list(islice(iter_examples(str(SAMPLE), ck.tokenizer, DataOptions()), 4))
    with pytest.raises(BridgeError, match=r"^data.jsonl, record 2 \(id train-0003\), field 'scores.a'"):
        score_window(scorer, window, 300, 2, source="data.jsonl")


class _Opens:
    """Counts the opens of one path (an audit hook: every open by Python code, gzip's and pyarrow's
    Python side included); on only inside ``with``."""

    def __init__(self, path: Path):
        self.path, self.count, self.on = str(path), 0, False
        import sys

        sys.addaudithook(self.hook)

    def hook(self, event: str, args) -> None:
        if self.on and event == "open" and args and str(args[0]) == self.path:
            self.count += 1

    def __enter__(self):
        self.on = True
        return self

    def __exit__(self, *exc):
        self.on = False


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_score_opens_its_input_twice(run, tmp_path, suffix):
    """Issue 42: the first pass gives the digest, the count and the check that there is a record; the
    second the examples (it was four: the first record, the digest, the count, the examples)."""
    import gzip

    data = tmp_path / f"data{suffix}"
    lines = SAMPLE.read_bytes().splitlines(keepends=True)[:6]
    data.write_bytes(gzip.compress(b"".join(lines)) if suffix.endswith(".gz") else b"".join(lines))
    with _Opens(data) as opens:
        n = run_score(ScoreOptions(data=str(data), out=str(tmp_path / "o.bridge"), run=str(run), device="cpu"))
    assert n == 6 and opens.count == 2


def _payloads(path: Path) -> tuple[Header, list[bytes]]:
    """A stream's header and its example records as written (msgpack payloads)."""
    from bridgecli.format.reader import open_reader

    with open_reader(str(path)) as reader:
        return reader.header, list(reader.payloads())


def test_sigint_keeps_the_window_it_stopped_in_and_resume_writes_the_same_records(run, tmp_path, forked_bridge):
    """Ctrl-C at the default --window 256 (issue 41): score commits every example it wrote, the window it
    was in too, says how to resume, and --resume ends with the records of an uninterrupted run, each byte
    for byte (the header's timestamps are the interrupted run's; docs/cli.md). Both runs are processes of
    their own (forked children: tests/forked_cli.py), SIGINT raising KeyboardInterrupt in them."""
    import os
    import signal
    import time

    from bridgecli.runtime.resumable import header_key

    record = json.loads(SAMPLE.read_text().splitlines()[0])
    data = tmp_path / "data.jsonl"  # 64 examples of one length: batches in input order, one window
    data.write_text("".join(json.dumps({**record, "id": f"x{i:03d}"}) + "\n" for i in range(64)))
    out, ref = tmp_path / "out.bridge", tmp_path / "ref.bridge"
    args = ["score", str(data), "--from", str(run), "-o", str(out), "--device", "cpu", "--batch-size", "2"]
    env = dict(os.environ, BRIDGE_TIMINGS="1")  # its lines say when the first batch is done
    proc = forked_bridge.start(args, env=env)
    deadline = time.monotonic() + 120
    while "first batch done" not in proc.stderr.decode() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)  # the first batch is scored (and handed to the writer): interrupt soon after
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == 130, proc.stderr.decode()
    text = proc.stderr.decode()
    assert "first batch done" in text, text
    kept = int(text.split("interrupted: kept ")[1].split()[0])
    assert 0 < kept < 64 and "rerun with --resume" in text and "bridge score: interrupted" in text, text
    assert not out.exists() and Path(f"{out}.partial").exists()

    resumed = forked_bridge.run(args + ["--resume"], env=env)
    assert resumed.returncode == 0, resumed.stderr.decode()
    assert f"resuming after {kept} examples" in resumed.stderr.decode()
    assert run_score(ScoreOptions(data=str(data), out=str(ref), run=str(run), device="cpu", batch_size=2)) == 64
    (h1, got), (h2, want) = _payloads(out), _payloads(ref)
    assert got == want  # every record byte-identical
    assert header_key(h1) == header_key(h2) and h1.created != "" and h1.steps[-1].params == h2.steps[-1].params
