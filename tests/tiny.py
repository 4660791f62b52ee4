"""Shared test helpers: tiny random models built from configs (fast, deterministic), three
GSM8K-shaped records and their tokenized examples, the first lines of the sample data in a folder, the
zstd frames of a stream, a callable that stops with Ctrl-C on its Nth call, ``bridge`` run in this
process, and a bench/results script as a module."""

from __future__ import annotations

from pathlib import Path

RECORDS = [
    {"question": "Tom has 3 apples and buys 4 more. How many apples does he have?",
     "answer": "Tom has 3 + 4 = <<3+4=7>>7 apples.\n#### 7"},
    {"question": "A box holds 12 eggs. How many eggs are in 5 boxes?",
     "answer": "There are 12 * 5 = <<12*5=60>>60 eggs in 5 boxes.\nSo the answer is 60.\n#### 60"},
    {"question": "Sam reads 10 pages a day for a week. How many pages?",
     "answer": "A week has 7 days, so 10 * 7 = <<10*7=70>>70 pages.\n#### 70"},
]


def record_examples(tokenizer, chat_template: bool = True) -> list:
    """:data:`RECORDS` tokenized by ``tokenizer`` (with its chat template or not), as tokens-stage
    Examples: id and index k, read from ``line k+1`` of a file ``test``."""
    from bridgecli.data.shapes import to_pair
    from bridgecli.data.tokenize import tokenize_pair
    from bridgecli.format.records import Example

    out = []
    for i, rec in enumerate(RECORDS):
        pair = to_pair(rec, i, f"line {i + 1}", "test")
        tok = tokenize_pair(tokenizer, pair, chat_template=chat_template)
        out.append(Example(id=str(i), index=i, text=tok.text, tokens=tok.tokens))
    return out


def results_script(name: str):
    """bench/results/NAME.py as a module (a script beside grid.sh, not part of the package)."""
    import importlib
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench" / "results"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


def sample_module():
    """examples/make_sample.py, the generator of the example data (outside the package)."""
    import importlib.util
    import sys

    if "make_sample" not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "examples" / "make_sample.py"
        spec = importlib.util.spec_from_file_location("make_sample", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["make_sample"] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
    return sys.modules["make_sample"]


SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "data"


def head(src: Path, dst: Path, n: int) -> Path:
    """The first ``n`` lines of ``src`` written to ``dst``."""
    dst.write_text("".join(src.read_text().splitlines(keepends=True)[:n]))
    return dst


def sample_inputs(folder: Path, *, warm: int, val: int, data: int, test: int = 0) -> Path:
    """The first lines of the bundled sample (examples/data) in ``folder``: ``warm`` of warm.jsonl,
    ``val`` of val.jsonl, ``data`` of train.jsonl as data.jsonl and ``test`` of test.jsonl (if any)."""
    for name, source, n in (("warm.jsonl", "warm.jsonl", warm), ("val.jsonl", "val.jsonl", val),
                            ("data.jsonl", "train.jsonl", data), ("test.jsonl", "test.jsonl", test)):
        if n:
            head(SAMPLE / source, folder / name, n)
    return folder


def tiny_llama_config(vocab_size: int, layers: int = 6, hidden: int = 32, heads: int = 4, kv_heads: int = 2):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                       num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                       max_position_embeddings=1024, tie_word_embeddings=False)


def tiny_model(config, seed: int = 0, dtype=None):
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()


def frame_lengths(body: bytes) -> list[int]:
    """The compressed length of every zstd frame in ``body``, as zstd itself finds them."""
    import zstandard

    out = []
    while body:
        d = zstandard.ZstdDecompressor().decompressobj()
        d.decompress(body)
        out.append(len(body) - len(d.unused_data))
        body = d.unused_data
    return out


def interrupting(real, calls: list, at: int | None = None):
    """``real`` wrapped to append to ``calls`` once a call and, on call number ``at`` (counted in
    ``calls``), to raise KeyboardInterrupt as Ctrl-C would instead of calling it; ``at=None`` only counts."""

    def wrapper(*args, **kwargs):
        calls.append(1)
        if len(calls) == at:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    return wrapper


def default_sigint() -> None:
    """``preexec_fn`` of a process a test interrupts with SIGINT: Ctrl-C's default action in it, also where
    the test run ignores SIGINT (a shell starts a background job so, and a child inherits the ignoring;
    Python then installs no KeyboardInterrupt handler and the process runs on)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_bridge(argv: list, stdout=None) -> tuple[int, str]:
    """`bridge ARGV` in this process with ``stdout`` (default: a text buffer) as sys.stdout; (exit code,
    what went to stderr). A command that ends without an exit code counts as exit 0."""
    import io
    import sys

    from bridgecli.cli.app import app

    err = io.StringIO()
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = stdout if stdout is not None else io.StringIO(), err
    try:
        code = app([str(a) for a in argv], prog_name="bridge", standalone_mode=False)
    except SystemExit as exc:
        code = exc.code
    finally:
        sys.stdout, sys.stderr = saved
    return (code if isinstance(code, int) else 0), err.getvalue()
