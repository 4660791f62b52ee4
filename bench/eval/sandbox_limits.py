"""What the code sandbox (``bridge eval --task humaneval|mbpp``) holds a hostile program to, measured.

Three parts, each a table of hostile programs and what became of them:

- **memory**: programs that try to hold more memory than the limit for all of a program's processes
  (``--limit-mb``, default 128 MiB), in each way a memory limit can be missed: memfd files, SysV
  shared memory, shared anonymous memory in several children, files in the tmpfs folders, empty
  files (inodes), pipe buffers and Unix socket buffers. Each runs with the memory limit kept by a
  cgroup (where the evaluator can make one) and by the polling monitor (the cgroup switched off, as
  on a machine without one). Per run: the outcome and the most memory the program held (the peak
  of what the kernel charged to a cgroup the bench puts the evaluator in, less that of a program
  that does nothing), so the numbers hold however busy the machine is. This part needs a cgroup
  the bench can write (root, or a delegated cgroup); without one it says so and is skipped.
- **early exits**: programs that end with exit status 0 before the test's asserts run (the asserts
  would fail), in the bubblewrap runner and the unsafe one: how many were graded passed.
- **short timeouts**: ``--runs`` programs at each of a few very short ``--code-timeout`` values,
  each execing a marked ``sleep``; how many marked processes were left running afterwards.
- **forgeries**: solutions that forge their pass (``tests/sandbox_probes.py``'s ``FORGERIES``: the
  runner's frames, a traceback, gc, another thread, its own memory, its parent, the test's text, an
  answer equal to anything, a trace function), against a test they fail, in both runners: how many
  were graded passed. A sandbox without a separate checker (before issue 40) runs each as one script.
- **evaluator killed**: ``--kills`` evaluators running short programs, each SIGKILLed at a random
  moment (uniform in 0-0.5 s after its first sandbox starts, ``--seed``), in both runners: how many
  left a process of a sandbox running 3 s later (counted under a subreaper, so nothing escapes the
  count).

    python bench/eval/sandbox_limits.py [--json bench/eval/results/sandbox_limits.json] [--parts ...]

The sandbox under test is the one ``bridgecli`` imports; to measure an older one (commit 18edb0e,
before memfd and SysV shared memory were refused, cgroups used and tmpfs counted):

    git archive 18edb0e src | tar -x -C /tmp/bridge-18edb0e
    PYTHONPATH=/tmp/bridge-18edb0e/src python bench/eval/sandbox_limits.py

Needs bubblewrap (``bwrap``); the memory part also needs a cgroup it can write. About 2 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from load_code import REPO, import_file

from bridgecli.evaluation import sandbox
from bridgecli.evaluation.sandbox import Limits, run_program

try:  # the sandbox under test: an older one (see above) has no cgroups and is measured as it is
    from bridgecli.evaluation import containment as tested_containment
except ImportError:
    tested_containment = None


# what tests/test_sandbox.py asserts on, measured here too
probes = import_file(REPO / "tests" / "sandbox_probes.py", "sandbox_probes")


def _measuring():
    """The cgroup helpers of this checkout, which the bench measures with (whatever sandbox it tests)."""
    return import_file(REPO / "src" / "bridgecli" / "evaluation" / "containment.py", "bench_containment")


PARTS = ("memory", "early", "timeouts", "forgeries", "kills")
HOLD = 3  # seconds each memory attack holds what it got

# What the attacks below share, put before each (and before the baseline program that does nothing)
ATTACK_HELPERS = """
    import os, socket, time

    HELD = []  # what an attack got, kept until its process ends


    def fill(send):
        \"\"\"Send until the (non-blocking) buffer is full.\"\"\"
        try:
            while True:
                send(b"x" * 65536)
        except BlockingIOError:
            pass


    def in_children(n, attack):
        \"\"\"``attack`` in ``n`` forked children, each holding what it got for HOLD s (an OSError:
        refused or full, ends its attack there).\"\"\"
        for _ in range(n):
            if os.fork() == 0:
                try:
                    attack()
                except OSError:
                    pass
                finally:
                    time.sleep(HOLD)
                    os._exit(0)


    def socket_pairs(n, sndbuf=None):
        \"\"\"``n`` Unix socket pairs, both ends filled (send buffers first raised to ``sndbuf``).\"\"\"
        for _ in range(n):
            a, b = socket.socketpair()
            HELD.append((a, b))
            for s in (a, b):
                if sndbuf:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
                s.setblocking(False)
                fill(s.send)
"""

MEMORY_ATTACKS = {
    "nothing": "pass\n",
    "memfd files, 3 children x 1 GiB": """
        def attack():
            for _ in range(64):
                fd = os.memfd_create("hold")
                os.write(fd, b"x" * (16 << 20))
        in_children(3, attack)
        time.sleep(HOLD + 1)
    """,
    "SysV shared memory, 16 segments x 64 MiB": """
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.shmat.restype = ctypes.c_void_p
        for _ in range(16):
            shmid = libc.shmget(0, 64 << 20, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
            if shmid < 0:
                raise OSError(ctypes.get_errno(), "shmget refused")
            address = libc.shmat(shmid, None, 0)
            ctypes.memset(address, 1, 64 << 20)
            libc.shmdt(ctypes.c_void_p(address))
        time.sleep(HOLD)
    """,
    "shared anonymous memory, 4 children x 60 MiB": """
        import mmap
        def attack():
            block = mmap.mmap(-1, 60 << 20, flags=mmap.MAP_SHARED)
            HELD.append(block)
            for _ in range(60):
                block.write(b"x" * (1 << 20))
        in_children(4, attack)
        time.sleep(HOLD + 1)
    """,
    "tmpfs files: /work, /tmp and /dev/shm filled": probes.tmpfs_filler(100) + "time.sleep(HOLD)\n",
    "empty files (inodes) in /work, for 6 s": """
        end = time.monotonic() + 6
        n = 0
        while time.monotonic() < end:
            for _ in range(1000):
                open(f"/work/{n}", "w").close()
                n += 1
        time.sleep(HOLD)
    """,
    "pipe buffers, 8 children x 120 pipes": """
        def attack():
            for _ in range(120):
                r, w = os.pipe()
                os.set_blocking(w, False)
                HELD.append((r, w))
                fill(lambda data: os.write(w, data))
        in_children(8, attack)
        time.sleep(HOLD + 2)
    """,
    "Unix socket buffers, 8 children x 120 socket pairs": """
        in_children(8, lambda: socket_pairs(120))
        time.sleep(HOLD + 2)
    """,
    "Unix socket buffers raised to the maximum, 2 children x 30 socket pairs": """
        in_children(2, lambda: socket_pairs(30, sndbuf=1 << 30))
        time.sleep(HOLD + 2)
    """,
    "Unix sockets filled, then sent in flight and closed, 1 process, limit 1 GiB": """
        carrier, keeper = socket.socketpair()
        carrier.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 30)
        try:
            for _ in range(300):
                a, b = socket.socketpair()
                a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 30)
                a.setblocking(False)
                fill(a.send)
                socket.send_fds(carrier, [b"."], [b.fileno()])  # b's queue holds what a sent
                a.close()
                b.close()
        except OSError:
            pass
        time.sleep(HOLD)
    """,
    "TCP loopback buffers, 2 children x 30 connections": """
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 30)  # the accepted ones inherit it
        server.bind(("127.0.0.1", 0))
        server.listen(100)
        port = server.getsockname()[1]
        def attack():
            for _ in range(30):
                c = socket.socket()
                c.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 30)
                c.connect(("127.0.0.1", port))
                HELD.append(c)
                c.setblocking(False)
                fill(c.send)
        in_children(2, attack)
        accepted = []
        end = time.monotonic() + HOLD + 2
        server.settimeout(0.2)
        while time.monotonic() < end:
            try:
                accepted.append(server.accept()[0])
            except OSError:
                pass
    """,
}

EARLY_EXITS = {
    "os._exit(0)": "import os\nos._exit(0)\n",
    "ctypes _exit(0)": "import ctypes\nctypes.CDLL(None)._exit(0)\n",
    "exec /bin/true": "import os\nos.execv('/bin/true', ['true'])\n",
    "os._exit(0) from a thread": "import os, threading, time\nthreading.Thread(target=os._exit, args=(0,)).start()\ntime.sleep(1)\n",
    "sys.exit(0)": "import sys\nsys.exit(0)\n",
    "kill -9 itself": "import os\nos.kill(os.getpid(), 9)\n",
}
FAILING_TEST = "\n\ndef check(candidate):\n    assert candidate(1) == 999\n\ncheck(inc)\n"
SOLUTION = "def inc(x):\n    return x + 1\n"


# -- memory ---------------------------------------------------------------------------------------


def _peak(group: str, version: int) -> int:
    """The most memory charged to ``group``; on cgroup v1, TCP buffers (a counter of their own) added."""
    if version == 2:
        names = ["memory.peak"]
    else:
        names = ["memory.max_usage_in_bytes", "memory.kmem.tcp.max_usage_in_bytes"]
    total = 0
    for name in names:
        with open(os.path.join(group, name)) as fh:
            total += int(fh.read())
    return total


def _measuring_group(measure, parent):
    group = measure.Cgroup(parent, None)  # no limit: it only measures
    if parent.version == 1:  # v1 charges TCP buffers only to groups with a TCP limit
        with open(os.path.join(group.path, "memory.kmem.tcp.limit_in_bytes"), "w") as fh:
            fh.write("-1")
    return group


def memory_part(limit_mb: int, only: str | None = None) -> dict:
    measure = _measuring()
    parent, why = measure.cgroup_parent()
    if parent is None:
        print(f"skipped: no cgroup the bench can write here ({why})")
        return {"skipped": f"no cgroup the bench can write here ({why})"}
    modes = ["as is"] if tested_containment is None else ["cgroup", "monitor"]
    rows = []
    for mode in modes:
        baseline = None
        for name in MEMORY_ATTACKS:
            if only and name != "nothing" and only not in name:
                continue
            group = _measuring_group(measure, parent)
            try:
                done = subprocess.run(
                    [sys.executable, __file__, "--one", mode, name, str(limit_mb), group.path],
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
                peak = _peak(group.path, parent.version)
            finally:
                group.remove()
            if done.returncode != 0:
                raise SystemExit(f"{mode} / {name}: the bench's child failed:\n{done.stderr}")
            outcome = json.loads(done.stdout.splitlines()[-1])
            if name == "nothing":
                baseline = peak
                continue
            held = (peak - (baseline or 0)) / 2**20
            rows.append({"mode": mode, "attack": name, **outcome, "held_mib": round(held, 1)})
            print(f"{mode:8} {name:50} {outcome['status']:8} held {held:7.1f} MiB  {outcome['error'][:70]}")
    return {"limit_mib": limit_mb, "hold_s": HOLD, "cgroup_version": parent.version, "rows": rows}


def one(mode: str, name: str, limit_mb: int, group: str) -> None:
    """The child: join ``group`` (so that everything it and its sandboxes hold is charged there),
    run one attack, print its outcome."""
    with open(os.path.join(group, "cgroup.procs"), "w") as fh:
        fh.write(str(os.getpid()))
    if mode == "monitor":
        assert tested_containment is not None
        tested_containment.cgroup_parent = lambda: (None, "switched off by the bench")
    source = textwrap.dedent(ATTACK_HELPERS) + textwrap.dedent(MEMORY_ATTACKS[name])
    source = source.replace("HOLD", str(HOLD))
    if name.endswith("limit 1 GiB"):
        limit_mb = 1024
    outcome = run_program(source, Limits(timeout=30, memory_mb=limit_mb))
    print(json.dumps({"status": outcome.status, "error": outcome.error, "seconds": outcome.seconds}))


# -- early exits and short timeouts -------------------------------------------------------------


def _runners():
    """The two runners in turn: "bwrap", then "unsafe" (bubblewrap switched off, as where it is missing)."""
    real_probe = sandbox._probe
    try:
        yield "bwrap"
        sandbox._probe = lambda: (None, "switched off by the bench")  # type: ignore[assignment]
        yield "unsafe"
    finally:
        sandbox._probe = real_probe


def early_exit_part() -> dict:
    rows = []
    for runner in _runners():
        for name, exit_code in EARLY_EXITS.items():
            program = SOLUTION + exit_code + FAILING_TEST
            outcome = run_program(program, Limits(timeout=5), unsafe=True)
            rows.append({"runner": runner, "program": name, "status": outcome.status, "rc": outcome.returncode})
            print(f"{runner:7} {name:28} rc {outcome.returncode!s:5} {outcome.status}")
    return {"graded_passed": sum(r["status"] == "passed" for r in rows), "n": len(rows), "rows": rows}


def forgery_part() -> dict:
    rows = []
    for runner in _runners():
        for name, solution in probes.FORGERIES.items():
            if hasattr(sandbox, "Program"):
                program = sandbox.Program(solution, probes.FORGED_TEST, "", ("inc",))
            else:  # a sandbox without a checker of its own runs the whole
                program = solution + "\n" + probes.FORGED_TEST
            outcome = run_program(program, Limits(timeout=10), unsafe=True)
            rows.append({"runner": runner, "program": name, "status": outcome.status, "error": outcome.error})
            print(f"{runner:7} {name:20} {outcome.status:8} {outcome.error[:80]}")
    return {"graded_passed": sum(r["status"] == "passed" for r in rows), "n": len(rows), "rows": rows}


def kill_part(kills: int, seed: int) -> dict:
    import random

    rng = random.Random(seed)
    rows = []
    for runner in ("bwrap", "unsafe"):
        delays = [round(rng.uniform(0, 0.5), 3) for _ in range(kills)]
        left = probes.left_after_sigkill(delays, unsafe=runner == "unsafe")
        rows.append(
            {
                "runner": runner,
                "kills": kills,
                "left_something": sum(map(bool, left)),
                "left": [(d, found) for d, found in zip(delays, left) if found],
            }
        )
        print(f"{runner:7} {kills} evaluators SIGKILLed: {rows[-1]['left_something']} left a process running")
    return {"seed": seed, "rows": rows}


def timeout_part(runs: int) -> dict:
    rows = []
    for runner in _runners():
        for timeout in (0.005, 0.01, 0.02, 0.05):
            left, timeouts = probes.short_timeout_runs([timeout] * runs, unsafe=True, settle=1.0)
            rows.append(
                {"runner": runner, "timeout_s": timeout, "runs": runs, "left_running": left, "timeouts": timeouts}
            )
            print(f"{runner:7} timeout {timeout:5} s: {left} of {runs} left running")
    return {"rows": rows}


def _sysctls() -> dict:
    """The settings the socket and pipe numbers depend on."""
    out = {}
    for name in (
        "net/core/wmem_max",
        "net/core/rmem_max",
        "net/ipv4/tcp_wmem",
        "net/ipv4/tcp_rmem",
        "fs/pipe-user-pages-soft",
    ):
        try:
            with open(f"/proc/sys/{name}") as fh:
                out[name.replace("/", ".")] = fh.read().split()
        except OSError:
            pass
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, help="write the results there")
    parser.add_argument("--limit-mb", type=int, default=128, help="memory limit of the memory attacks")
    parser.add_argument("--runs", type=int, default=20, help="programs per short timeout")
    parser.add_argument("--one", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--only", help="run only the memory attacks whose name holds this text")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"which parts, of {','.join(PARTS)}")
    parser.add_argument("--kills", type=int, default=40, help="evaluators SIGKILLed per runner")
    parser.add_argument("--seed", type=int, default=0, help="of the moments the evaluators are killed")
    args = parser.parse_args()
    if args.one:
        mode, name, limit_mb, group = args.one
        one(mode, name, int(limit_mb), group)
        return
    problem = sandbox.bwrap_problem()
    if problem:
        raise SystemExit(f"no bwrap sandbox here: {problem}")
    results = {"sandbox": sandbox.sandbox_info(), "kernel": os.uname().release, "sysctl": _sysctls()}
    parts = set(args.parts.split(","))
    if "memory" in parts:
        print("## memory")
        results["memory"] = memory_part(args.limit_mb, args.only)
    if "early" in parts:
        print("## early exits (the test asserts inc(1) == 999)")
        results["early_exits"] = early_exit_part()
    if "timeouts" in parts:
        print("## short timeouts")
        results["short_timeouts"] = timeout_part(args.runs)
    if "forgeries" in parts:
        print("## forgeries (the test asserts inc(1) == 999)")
        results["forgeries"] = forgery_part()
    if "kills" in parts:
        print("## evaluator killed")
        results["evaluator_killed"] = kill_part(args.kills, args.seed)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
