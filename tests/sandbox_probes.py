"""Probes of the code sandbox that tests/test_sandbox.py asserts on and bench/eval/sandbox_limits.py
counts (it imports this file by path): the processes a program left running, found by a marker in
their command line, and a program that fills the box's tmpfs folders. Standard library and the
``bridgecli`` on the path only."""

from __future__ import annotations

import os
import secrets
import textwrap
import time
import uuid
from collections.abc import Sequence

from bridgecli.evaluation.sandbox import Limits, run_program


def marked(marker: str) -> list[int]:
    """Host processes whose command line holds ``marker``."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as fh:
                    if marker.encode() in fh.read():
                        found.append(int(name))
            except OSError:
                pass
    return found


def short_timeout_runs(timeouts: Sequence[float], *, unsafe: bool, settle: float) -> tuple[int, int]:
    """One program per value in ``timeouts``, each execing a marked ``sleep`` and run with that
    ``--code-timeout``; ``settle`` seconds later, how many marked processes were left running
    (they are then killed) and how many runs ended in a timeout."""
    marker = f"bridge-short-{uuid.uuid4().hex}"
    program = f"import os\nos.execv('/bin/sleep', [{marker!r}, '30'])\n"
    statuses = [run_program(program, Limits(timeout=t), unsafe=unsafe).status for t in timeouts]
    time.sleep(settle)
    left = marked(marker)
    for pid in left:
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    return len(left), statuses.count("timeout")


def tmpfs_filler(files: int) -> str:
    """A program that writes ``files`` files of 15 MiB into each tmpfs folder of the box (/work, /tmp
    and /dev/shm), each folder until it is full."""
    return textwrap.dedent(f"""
        for folder in ("/work", "/tmp", "/dev/shm"):
            try:
                for n in range({files}):
                    with open(f"{{folder}}/fill{{n}}", "wb") as fh:
                        for _ in range(15):
                            fh.write(b"x" * (1 << 20))
            except OSError:  # full
                pass
    """)


# -- forging a pass (issue 40) ---------------------------------------------------------------------

# What a forging solution takes from wherever it looks: a 32-byte hex string (the run's token, as
# the runner made it) and a regular file open for writing (the result file); it writes the first
# into the second and ends the process with status 0, before the test's asserts.
_STEAL = '''
import os, re, stat, sys
HEX = re.compile(rb"^[0-9a-f]{32}$")

def _is_result(fd):
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and fd > 2
    except OSError:
        return False

def _steal(values):
    tokens = [v for v in values if isinstance(v, bytes) and HEX.match(v)]
    fds = [v for v in values if type(v) is int and 2 < v < 1024 and _is_result(v)]
    for fd in fds:
        for token in tokens:
            os.pwrite(fd, token, 0)
    if tokens and fds:
        os._exit(0)

def _frames(frame):
    out = []
    while frame is not None:
        out.append(frame)
        frame = frame.f_back
    return out

def _locals(frames):
    return [v for f in frames for v in list(f.f_locals.values())]
'''

#: what :data:`FORGED_TEST` expects of ``inc(1)``: a number of this test process's own, so that a
#: forgery that finds another process's test (a parallel test run's, which an unsafe runner's program
#: can read) does not pass by its number
EXPECT = 1000 + secrets.randbelow(10**6)

#: solutions of ``inc`` (whose test asserts ``candidate(1) == EXPECT``) that forge a pass, each in its
#: own way; every one must be reported failed
FORGERIES = {
    # the runner's frames, from the one calling the solution
    "frame": _STEAL + "def inc(x):\n    _steal(_locals(_frames(sys._getframe(1))))\n    return x\n",
    # the same frames, reached through a traceback
    "traceback": _STEAL + (
        "def inc(x):\n"
        "    try:\n"
        "        raise RuntimeError\n"
        "    except RuntimeError as exc:\n"
        "        frame = exc.__traceback__.tb_frame\n"
        "    _steal(_locals(_frames(frame)))\n"
        "    return x\n"
    ),
    # what the garbage collector tracks (containers), and what they and the live frames refer to
    "gc": _STEAL + (
        "import gc\n"
        "def inc(x):\n"
        "    frames = _frames(sys._getframe(1))\n"
        "    objects = gc.get_objects() + frames\n"
        "    _steal([r for o in objects for r in gc.get_referents(o)] + _locals(frames))\n"
        "    return x\n"
    ),
    # another thread of the program, watching the main thread's frames until the test runs
    "thread": _STEAL + (
        "import threading, time\n"
        "def _spy():\n"
        "    main = threading.main_thread().ident\n"
        "    while True:\n"
        "        frame = sys._current_frames().get(main)\n"
        "        if frame is not None and any(f.f_code.co_name == 'check' for f in _frames(frame)):\n"
        "            _steal(_locals(_frames(frame)))\n"
        "        time.sleep(0.001)\n"
        "threading.Thread(target=_spy, daemon=True).start()\n"
        "def inc(x):\n"
        "    time.sleep(0.5)\n"
        "    return x\n"
    ),
    # the process's own memory and descriptors: every hex string of 32 bytes, into every regular file
    "proc": _STEAL + (
        "def inc(x):\n"
        "    found = []\n"
        "    with open('/proc/self/maps') as maps, open('/proc/self/mem', 'rb', 0) as mem:\n"
        "        for line in maps:\n"
        "            span, perms = line.split()[:2]\n"
        "            if 'r' not in perms:\n"
        "                continue\n"
        "            lo, hi = (int(v, 16) for v in span.split('-'))\n"
        "            try:\n"
        "                mem.seek(lo)\n"
        "                found += re.findall(rb'(?<![0-9a-f])[0-9a-f]{32}(?![0-9a-f])', mem.read(min(hi - lo, 1 << 26)))\n"
        "            except (OSError, ValueError, OverflowError):\n"
        "                pass\n"
        "    fds = [int(fd) for fd in os.listdir('/proc/self/fd')]\n"
        "    _steal(list(dict.fromkeys(found))[:1] + fds)\n"
        "    return x\n"
    ),
    # the checker from outside: its memory, descriptors and a ptrace of its parent
    "parent": _STEAL + (
        "import ctypes\n"
        "def inc(x):\n"
        "    parent = os.getppid()\n"
        "    for path in (f'/proc/{parent}/mem', f'/proc/{parent}/environ'):\n"
        "        try:\n"
        "            open(path, 'rb').read(1)\n"
        "            print('READ', path)\n"
        "        except OSError:\n"
        "            pass\n"
        "    for fd in range(64):\n"
        "        try:\n"
        "            with open(f'/proc/{parent}/fd/{fd}', 'r+b') as fh:\n"
        "                print('OPENED', fd)\n"
        "        except OSError:\n"
        "            pass\n"
        "    if ctypes.CDLL(None).ptrace(16, parent, 0, 0) == 0:  # PTRACE_ATTACH\n"
        "        print('ATTACHED')\n"
        "    return x\n"
    ),
    # the test itself, to answer what it expects: anywhere the program can read. A pipe is peeked
    # (tee(2): its data stays for its reader) and only files and pipes are read, so that the other
    # sandboxes of a parallel test run, whose pipes an unsafe runner's program can open, lose nothing
    "read the test": (
        "import ctypes, os, re, stat\n"
        "_libc = ctypes.CDLL(None, use_errno=True)\n"
        "def _texts():\n"
        "    for folder in ('/work', '/tmp', '/dev/shm'):\n"
        "        for name in os.listdir(folder):\n"
        "            yield os.path.join(folder, name)\n"
        "    for pid in (p for p in os.listdir('/proc') if p.isdigit()):\n"
        "        for part in ('cmdline', 'environ'):\n"
        "            yield f'/proc/{pid}/{part}'\n"
        "        try:\n"
        "            for fd in os.listdir(f'/proc/{pid}/fd'):\n"
        "                yield f'/proc/{pid}/fd/{fd}'\n"
        "        except OSError:\n"
        "            pass\n"
        "def _read(fd):\n"
        "    mode = os.fstat(fd).st_mode\n"
        "    if stat.S_ISFIFO(mode):\n"
        "        r, w = os.pipe()\n"
        "        try:\n"
        "            n = _libc.tee(fd, w, 1 << 16, 2)  # SPLICE_F_NONBLOCK\n"
        "            return os.read(r, n) if n > 0 else b''\n"
        "        finally:\n"
        "            os.close(r)\n"
        "            os.close(w)\n"
        "    return os.read(fd, 1 << 20) if stat.S_ISREG(mode) else b''\n"
        "def inc(x):\n"
        "    for path in _texts():\n"
        "        try:\n"
        "            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)\n"
        "            try:\n"
        "                m = re.search(rb'candidate\\(1\\) == (\\d+)', _read(fd))\n"
        "            finally:\n"
        "                os.close(fd)\n"
        "        except OSError:\n"
        "            continue\n"
        "        if m:\n"
        "            return int(m.group(1))\n"
        "    return x\n"
    ),
    # an answer equal to anything
    "equal to anything": (
        "class Anything:\n"
        "    def __eq__(self, other):\n"
        "        return True\n"
        "    __hash__ = object.__hash__\n"
        "def inc(x):\n"
        "    return Anything()\n"
    ),
    # a trace function that swaps the test's candidate for one that gives what it expects
    "trace": (
        "import ctypes, sys\n"
        "def _tracer(frame, event, arg):\n"
        "    if event == 'call' and frame.f_code.co_name == 'check':\n"
        f"        frame.f_locals['candidate'] = lambda *a: {EXPECT}\n"
        "        ctypes.pythonapi.PyFrame_LocalsToFast(ctypes.py_object(frame), ctypes.c_int(0))\n"
        "sys.settrace(_tracer)\n"
        "def inc(x):\n"
        "    return x\n"
    ),
}

#: the test every forgery is run against: it must fail
FORGED_TEST = f"def check(candidate):\n    assert candidate(1) == {EXPECT}\n\ncheck(inc)\n"


# -- killing the evaluator (issue 40) ------------------------------------------------------------------

# Runs in a process of its own: a child subreaper (so that whatever the evaluator leaves is
# reparented to it, where it can be counted, and not to PID 1), it starts an evaluator running short
# programs two at a time, SIGKILLs it ``delay`` seconds after it started its first sandbox, and
# prints, as JSON, the command lines of the processes of its that are still alive ``settle`` seconds
# later (then kills them).
_HARNESS = r'''
import ctypes, json, os, signal, subprocess, sys, time
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
delay, settle, evaluator = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]

def living_descendants(root):
    parents, states = {}, {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as fh:
                    stat = fh.read()
            except OSError:
                continue
            fields = stat[stat.rfind(b")") + 2:].split()
            parents[int(name)], states[int(name)] = int(fields[1]), fields[0]
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        for child, parent in parents.items():
            if parent == pid:
                todo.append(child)
                if states[child] != b"Z":
                    out.append(child)
    return out

def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode("utf-8", "replace")[:160]
    except OSError:
        return "?"

proc = subprocess.Popen([sys.executable, "-c", evaluator], stdout=subprocess.PIPE)
proc.stdout.readline()  # it is about to start its first sandbox
time.sleep(delay)
os.kill(proc.pid, signal.SIGKILL)
proc.wait()
deadline = time.monotonic() + settle
while True:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
    left = living_descendants(os.getpid())
    if not left or time.monotonic() > deadline:
        break
    time.sleep(0.05)
print(json.dumps([cmdline(p) for p in left]))
for pid in left:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
'''

_EVALUATOR = r'''
import sys
from bridgecli.evaluation import sandbox
from bridgecli.evaluation.sandbox import Limits, run_programs
unsafe = sys.argv[1] == "unsafe"
if unsafe:
    sandbox._probe = lambda: (None, "switched off")
else:
    assert sandbox.bwrap_problem() is None, sandbox.bwrap_problem()
programs = ["import time\ntime.sleep(0.05)\n", "import os\nos.execv('/bin/sleep', ['sleep', '30'])\n"] * 100
print("ready", flush=True)
run_programs(programs, Limits(timeout=0.3), workers=2, unsafe=unsafe)
'''


def left_after_sigkill(delays: Sequence[float], *, unsafe: bool, settle: float = 3.0) -> list[list[str]]:
    """For each of ``delays``: an evaluator running programs in the sandbox (``unsafe``: the unsafe
    runner), SIGKILLed that many seconds after it started, and the command lines of what it left
    running ``settle`` seconds later (all of it killed then)."""
    import json
    import subprocess
    import sys

    evaluator = _EVALUATOR.replace("sys.argv[1]", repr("unsafe" if unsafe else "bwrap"))
    out = []
    for delay in delays:
        done = subprocess.run(
            [sys.executable, "-c", _HARNESS, str(delay), str(settle), evaluator],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise RuntimeError(f"the harness failed: {done.stderr.strip()[-500:]}")
        out.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return out
