"""Shared fixtures: the real SmolLM2 tokenizer, tiny random models built from configs, a fresh plugin
manager, and model loads made to fail."""

from __future__ import annotations

import os
import sys

if os.environ.get("PYTEST_XDIST_WORKER"):
    # a worker of `pytest -n 2` (the README's whole-set command): torch and every process a test starts on
    # one thread, so that the workers share the cores instead of spinning against each other (the whole set
    # on 2 cores: 7:54 with two one-thread workers, 13:08 in one process, both measured on 2026-11-29).
    # Set before torch is imported; the variable passes to the processes the tests start.
    os.environ["OMP_NUM_THREADS"] = "1"
    if "torch" in sys.modules:  # a plugin imported it first
        sys.modules["torch"].set_num_threads(1)

import pytest

from tiny import tiny_llama_config, tiny_model  # noqa: F401  (re-exported for fixtures)

os.environ.setdefault("BRIDGE_NO_PROGRESS", "1")


def _triton_interpreter_without_a_gpu() -> None:
    """With Triton installed (the test extra has it) and no GPU, run Triton kernels in Triton's CPU
    interpreter, so that the fused JVP-attention kernel's tests (tests/test_jvp_attention.py) run in
    CI too. Set before any kernel is defined; scoring on CPU never launches them (they are a CUDA path)."""
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        return
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


_triton_interpreter_without_a_gpu()


@pytest.fixture
def one_thread():
    """Torch on one thread for the test: tiny models gain nothing from two OpenMP threads, which spin
    against other processes on a busy machine (and subprocesses given OMP_NUM_THREADS=1 then do the
    same arithmetic). Modules opt in with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tokenizer():
    """The embedded default model's tokenizer (chat template included)."""
    from bridgecli.modeling.loading import load_tokenizer

    return load_tokenizer(None)


@pytest.fixture(scope="module")
def tiny(tokenizer):
    """(a two-layer tiny random model, the tokenizer), for the held-out and answer-span loss tests."""
    return tiny_model(tiny_llama_config(len(tokenizer), layers=2, hidden=32)), tokenizer


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer):
    """A tiny random Llama with the real tokenizer, saved as an HF folder (for CLI tests)."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    model = tiny_model(tiny_llama_config(len(tokenizer), layers=5, hidden=48))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def forked_bridge(tmp_path_factory):
    """`bridge ARGS` in forked children of one interpreter that imported the CLI once (tests/forked_cli.py):
    ``forked_bridge.run(args, cwd=..., env=..., stdin=..., input=...)`` answers as ``subprocess.run`` with
    ``capture_output=True`` does, without the seconds of imports a fresh interpreter spends."""
    from forked_cli import ForkedBridge

    server = ForkedBridge(tmp_path_factory.mktemp("forked-bridge"))
    yield server
    server.close()


@pytest.fixture(scope="session")
def bridge_cli(forked_bridge):
    """`bridge ARGS` with progress off, in a process of its own (:func:`forked_bridge`): ``cwd``, standard input
    from the bytes ``input`` or the file ``stdin``, ``env`` over this process's variables; with ``check`` (the
    default) an exit other than 0 fails, saying the command and its stderr."""

    def run(*args, cwd=None, input=None, stdin=None, check=True, env=None):
        proc = forked_bridge.run(args, cwd=cwd, input=input, stdin=stdin,
                                 env={**os.environ, "BRIDGE_NO_PROGRESS": "1", **(env or {})})
        if check and proc.returncode != 0:
            raise AssertionError(f"bridge {' '.join(map(str, args))} failed ({proc.returncode}):\n"
                                 f"{proc.stderr.decode()}")
        return proc

    return run


@pytest.fixture
def manager(monkeypatch):
    """A fresh plugin manager with only the built-ins; forgotten again after the test."""
    from bridgecli import plugins

    monkeypatch.setenv("BRIDGE_LOAD_PLUGINS", "")
    plugins.reset()
    try:
        yield plugins.get_manager()
    finally:
        plugins.reset()


@pytest.fixture
def no_model_loads(monkeypatch):
    """Any model or tokenizer load fails the test: what the test checks must come before."""
    import transformers

    def boom(*a, **k):
        raise AssertionError("a model or tokenizer was loaded")

    for cls in (transformers.AutoModelForCausalLM, transformers.AutoTokenizer, transformers.AutoConfig):
        monkeypatch.setattr(cls, "from_pretrained", boom)


#: seconds a test in the fast set may sleep in all (polling a thread it started for a line), no more
FAST_SET_SLEEP = 0.5


@pytest.fixture(autouse=True)
def _the_fast_set_starts_no_process_and_does_not_sleep(request, monkeypatch):
    """A test left in the fast set (not marked ``integration``) fails, saying so, when it starts a
    process (subprocess, fork, spawn: the interpreter's start alone costs a second of CPU) or sleeps more
    than FAST_SET_SLEEP in all: the fast set stays fast (issue 41), and a new slow test is marked. It runs
    torch on one thread, as :func:`one_thread` does (a second thread only spins on tensors this small)."""
    if request.node.get_closest_marker("integration") is not None:
        yield
        return
    import subprocess
    import time

    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    request.addfinalizer(lambda: torch.set_num_threads(threads))

    def refuse(what: str):
        def call(*args, **kwargs):
            pytest.fail(f"a test in the fast set {what}: mark it @pytest.mark.integration", pytrace=False)

        return call

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse("starts a process (subprocess)"))
    monkeypatch.setattr(os, "fork", refuse("forks a process"))
    monkeypatch.setattr(os, "posix_spawn", refuse("spawns a process"))
    monkeypatch.setattr(os, "posix_spawnp", refuse("spawns a process"))
    real_sleep, slept = time.sleep, [0.0]

    def sleep(seconds: float) -> None:
        slept[0] += seconds
        if slept[0] > FAST_SET_SLEEP:
            pytest.fail(f"a test in the fast set sleeps {slept[0]:.1f} s: mark it @pytest.mark.integration",
                        pytrace=False)
        real_sleep(seconds)

    monkeypatch.setattr(time, "sleep", sleep)
    yield


#: in the fast set (``-m "not integration"``) a property test runs this share of the examples it asks
#: for (at least FAST_SET_MIN_EXAMPLES); the whole set, as CI runs it, runs them all
FAST_SET_EXAMPLES = 0.25
FAST_SET_MIN_EXAMPLES = 10


def pytest_collection_modifyitems(config, items):
    """Scale the hypothesis tests' ``max_examples`` down in the fast set (see FAST_SET_EXAMPLES). The
    settings a test was given live on its function (hypothesis's own attribute; where a hypothesis
    release moves it, nothing changes and the fast set is only slower)."""
    if "not integration" not in (config.getoption("markexpr") or ""):
        return
    from hypothesis import settings

    done: set[int] = set()
    for item in items:
        fn = getattr(item, "obj", None)
        given = getattr(fn, "_hypothesis_internal_use_settings", None)
        if given is None or id(fn) in done:  # (a parametrized test: one function, scaled once)
            continue
        done.add(id(fn))
        fewer = max(FAST_SET_MIN_EXAMPLES, int(given.max_examples * FAST_SET_EXAMPLES))
        fn._hypothesis_internal_use_settings = settings(given, max_examples=min(given.max_examples, fewer))
