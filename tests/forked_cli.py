"""`bridge ARGS` in forked children of one long-lived interpreter that imported the CLI once.

A fresh `python -m bridgecli score ...` spends 3-4 s of CPU importing torch and transformers before it reads
a line; on the two cores CI has, the CLI tests paid that dozens of times. The server here imports the CLI,
every command's module and the Llama modelling code once, then forks a child per command. The child is a real
process: its own working directory, environment, stdin, stdout and stderr files and exit status; `bridge`'s
own ``main`` runs in it, and an uncaught exception prints its traceback and exits 1 as the interpreter would.
What it does not have is an interpreter of its own: the modules are imported already (as in any process
after the first command), the hash seed is the server's, and what a library reads from the environment when
it is imported is the server's environment (:data:`IMPORT_TIME_ENV`: a job may not change those; bridgecli's
one such value, the start of BRIDGE_TIMINGS's clock, is taken again in the child).

A fork copies only the thread that calls it: where the imports leave another thread running (torch's
OpenMP pool when OMP_NUM_THREADS is not 1, as in `pytest` without `-n`), or there is no /proc to tell, every
command runs in a fresh `python -m bridgecli` instead, as ``subprocess.run`` would (slower, same checks).

So tests that need a fresh interpreter start one: the shell pipe, stdout on a terminal, torchrun, import
timings and what prints before the first line (tests/test_cli.py, tests/test_cli_build.py, ...).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

#: what the server imports before it forks: the CLI, each command's module and step, the tiny models' code
PRELOAD = ("bridgecli.cli.app", "bridgecli.cli.build", "transformers.models.llama.modeling_llama")

#: variables read when the interpreter starts or a module is imported (torch's OpenMP threads, the HF hub's
#: offline switches, Triton's interpreter): a job's value must be the server's
IMPORT_TIME_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME",
                   "TRITON_INTERPRET", "PYTHONHASHSEED", "PYTHONUNBUFFERED", "PYTHONPATH")

_SERVER = r"""
import importlib, importlib.util, json, os, signal, sys, time, traceback

requests, replies = os.fdopen(int(sys.argv[1]), "r"), os.fdopen(int(sys.argv[2]), "w")
for name in json.loads(sys.argv[3]):
    importlib.import_module(name)
from bridgecli.steps.catalog import COMMANDS
for name, _ in COMMANDS:
    importlib.import_module(f"bridgecli.cli.{name}")
    if importlib.util.find_spec(f"bridgecli.steps.{name}") is not None:
        importlib.import_module(f"bridgecli.steps.{name}")
import bridgecli.timings
from bridgecli.cli.app import main


def child(job):
    # the command in this process, ended as the interpreter ends: the exit status
    requests.close()
    replies.close()
    os.chdir(job["cwd"])
    os.environ.clear()
    os.environ.update(job["env"])
    # the one value bridgecli takes from the environment when imported: BRIDGE_TIMINGS's clock starts now
    bridgecli.timings.ORIGIN = float(os.environ.get("BRIDGE_TIMINGS_ORIGIN") or time.time())
    for fd, path, flags in ((0, job["stdin"], os.O_RDONLY),
                            (1, job["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                            (2, job["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
        f = os.open(path, flags)
        os.dup2(f, fd)
        os.close(f)
    sys.argv = ["bridge", *job["args"]]
    interrupted = False
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except KeyboardInterrupt:
        traceback.print_exc()
        code, interrupted = 1, True
    except BaseException:
        traceback.print_exc()
        code = 1
    try:  # on its way out: non-daemon threads joined, atexit handlers run, stdout and stderr flushed
        import atexit, threading
        threading._shutdown()
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            code = 120  # what the interpreter exits with when it cannot flush them
    if interrupted:  # an uncaught Ctrl-C ends the interpreter by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return code


# a fork copies one thread: a lock another thread held stays locked in the child
tasks = os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else None
replies.write(json.dumps({"fork": tasks == [str(os.getpid())], "threads": tasks and len(tasks)}) + "\n")
replies.flush()
if tasks != [str(os.getpid())]:
    sys.exit(0)
for line in requests:
    job = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = child(job)
        finally:  # never back into this loop
            os._exit(code)
    replies.write(json.dumps({"pid": pid}) + "\n")
    replies.flush()
    _, status = os.waitpid(pid, 0)
    replies.write(json.dumps({"code": os.waitstatus_to_exitcode(status)}) + "\n")
    replies.flush()
"""


class Job:
    """A command started by :meth:`ForkedBridge.start`: ``pid``, ``poll()``, ``wait()``, ``send_signal()``,
    ``kill()`` and ``returncode`` as a ``subprocess.Popen``'s; its stdout and stderr go to the files
    ``stdout_path`` and ``stderr_path`` (``stdout``/``stderr``: what they hold, as bytes)."""

    def __init__(self, server: ForkedBridge, argv: list[str], pid: int, stdout: Path, stderr: Path,
                 popen: subprocess.Popen | None = None):
        self.server, self.args, self.pid, self.popen = server, ["bridge", *argv], pid, popen
        self.stdout_path, self.stderr_path = stdout, stderr
        self.returncode: int | None = None

    @property
    def stdout(self) -> bytes:
        return self.stdout_path.read_bytes()

    @property
    def stderr(self) -> bytes:
        return self.stderr_path.read_bytes()

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if self.popen is not None:
                self.returncode = self.popen.wait(timeout)
            else:
                done = self.server._reply(timeout=3e7 if timeout is None else timeout)
                if done is None:
                    raise subprocess.TimeoutExpired(self.args, timeout or 0)
                self.returncode = done["code"]
                self.server.running = None
        return self.returncode

    def poll(self) -> int | None:
        try:
            return self.wait(timeout=0)
        except subprocess.TimeoutExpired:
            return None

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # (not a pid that may be another process's by now)
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkedBridge:
    """The server: :meth:`run` answers as ``subprocess.run([sys.executable, "-m", "bridgecli", *args],
    capture_output=True)`` would, :meth:`start` as ``subprocess.Popen`` (stdout and stderr to files), from a
    forked child. Started with this process's environment (what its imports read), SIGINT raising
    KeyboardInterrupt in it and its children wherever pytest runs (tiny.default_sigint); one command at a time."""

    def __init__(self, folder: Path, preload: tuple[str, ...] = PRELOAD):
        from tiny import default_sigint

        self.folder = Path(folder)
        self.env = dict(os.environ)
        self.jobs = 0
        self.running: Job | None = None
        self._pending = b""
        req_r, req_w = os.pipe()
        self._replies, rep_w = os.pipe()
        self.log = self.folder / "server.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _SERVER, str(req_r), str(rep_w), json.dumps(list(preload))],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, pass_fds=(req_r, rep_w), env=self.env,
                preexec_fn=default_sigint)
        os.close(req_r)
        os.close(rep_w)
        self._requests = os.fdopen(req_w, "w")
        ready = self._reply(timeout=300)  # imported
        assert ready is not None, "the bridge server did not start within 300 s"
        self.forks = bool(ready["fork"])
        if not self.forks:  # threads besides the main one (or no /proc to tell): fresh interpreters instead
            self.close()

    def _reply(self, timeout: float) -> dict | None:
        """The server's next line, or None when none came within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._pending:
            ready, _, _ = select.select([self._replies], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return None
            chunk = os.read(self._replies, 65536)
            if not chunk:
                raise RuntimeError("the bridge server ended:\n" + self.log.read_text(errors="replace")[-3000:])
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return json.loads(line)

    def start(self, args, *, cwd=None, env: dict | None = None, stdin=None, input: bytes | None = None) -> Job:
        """`bridge ARGS` started with ``cwd``, the environment ``env`` (default: this process's), stdin from the
        file ``stdin`` or the bytes ``input`` (default: nothing); stdout and stderr to files."""
        assert self.running is None, "one command at a time: wait for the one running"
        env = dict(os.environ if env is None else env)
        changed = [k for k in IMPORT_TIME_ENV if env.get(k) != self.env.get(k)]
        assert not (self.forks and changed), f"{changed} are read at import: run this command in a process of its own"
        self.jobs += 1
        base = self.folder / f"job{self.jobs}"
        if input is not None:
            stdin = base.with_suffix(".in")
            stdin.write_bytes(input)
        argv = [str(a) for a in args]
        out, err = base.with_suffix(".out"), base.with_suffix(".err")
        out.write_bytes(b"")  # there to read from the start, as a pipe would be
        err.write_bytes(b"")
        if not self.forks:
            from tiny import default_sigint

            source = stdin if stdin is not None else os.devnull
            with open(source, "rb") as i, open(out, "wb") as o, open(err, "wb") as e:
                popen = subprocess.Popen([sys.executable, "-m", "bridgecli", *argv], cwd=cwd, env=env, stdin=i,
                                         stdout=o, stderr=e, preexec_fn=default_sigint)
            return Job(self, argv, popen.pid, out, err, popen)
        job = {"args": argv, "cwd": str(Path(cwd or os.getcwd()).resolve()), "env": env,
               "stdin": str(stdin) if stdin is not None else os.devnull, "stdout": str(out), "stderr": str(err)}
        self._requests.write(json.dumps(job) + "\n")
        self._requests.flush()
        started = self._reply(timeout=60)
        assert started is not None, "the bridge server did not fork"
        self.running = Job(self, argv, started["pid"], out, err)
        return self.running

    def run(self, args, *, cwd=None, env: dict | None = None, stdin=None, input: bytes | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess:
        """:meth:`start` and wait: stdout and stderr as bytes; past ``timeout`` seconds the command is killed
        and TimeoutExpired raised, as ``subprocess.run`` does."""
        job = self.start(args, cwd=cwd, env=env, stdin=stdin, input=input)
        try:
            job.wait(timeout)
        except subprocess.TimeoutExpired:
            job.kill()
            job.wait(60)
            raise
        return subprocess.CompletedProcess(job.args, job.returncode, job.stdout, job.stderr)

    def close(self) -> None:
        """The server ends once its requests are closed (after the command it runs, if any)."""
        if self._requests.closed:
            return
        self._requests.close()
        try:
            self.proc.wait(timeout=60)
        finally:
            os.close(self._replies)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
