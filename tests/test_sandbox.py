"""The bubblewrap sandbox for generated code: hostile programs, each checked to be contained.

Every test here needs a working bwrap (user namespaces allowed); they are skipped where it is not
available. The opt-in checks at the end run everywhere."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest

from bridgecli.errors import UsageError
from bridgecli.evaluation import sandbox
from bridgecli.evaluation.sandbox import Limits, bwrap_problem, run_program

needs_bwrap = pytest.mark.skipif(bwrap_problem() is not None, reason=f"no bwrap sandbox here: {bwrap_problem()}")
FAST = Limits(timeout=5, memory_mb=512)
pytestmark = pytest.mark.integration  # runs programs in the sandbox (bwrap) as processes


def run(source: str, limits: Limits = FAST) -> sandbox.Outcome:
    return run_program(textwrap.dedent(source), limits)


def _marked(marker: str) -> list[int]:
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


@needs_bwrap
def test_plain_programs_still_work():
    ok = run("""
        import os, subprocess, tempfile
        os.mkdir("sub"); open("sub/a.txt", "w").write("x")
        assert open("/work/sub/a.txt").read() == "x"
        with tempfile.NamedTemporaryFile() as fh:
            fh.write(b"y")
        assert subprocess.run(["true"]).returncode == 0
        print("fine")
    """)
    assert ok.passed, ok.stderr
    assert ok.stdout.strip() == "fine" and ok.isolation == "bwrap"


@needs_bwrap
def test_reloaded_subprocess_runs_as_an_unprivileged_user():
    out = run("""
        import importlib, subprocess
        importlib.reload(subprocess)
        print(subprocess.run(["sh", "-c", "id -u; id -g"], capture_output=True, text=True, check=True).stdout)
    """)
    assert out.passed, out.stderr
    uid, gid = out.stdout.split()
    assert uid == gid == str(sandbox.SANDBOX_UID)


@needs_bwrap
def test_host_uid_of_the_program_is_not_root():
    marker = f"bridge-uid-{uuid.uuid4().hex}"
    thread = threading.Thread(target=run, args=(f"import os\nos.execv('/bin/sleep', [{marker!r}, '3'])\n",))
    thread.start()
    try:
        for _ in range(200):
            pids = _marked(marker)
            if pids:
                break
            time.sleep(0.02)
        assert pids, "the program never started"
        with open(f"/proc/{pids[0]}/status") as fh:
            uids = next(line for line in fh if line.startswith("Uid:")).split()[1:]
        assert "0" not in uids
        if os.geteuid() == 0:
            assert set(uids) == {str(sandbox.SANDBOX_UID)}
    finally:
        thread.join()


@needs_bwrap
def test_writes_outside_the_work_folder_fail(tmp_path):
    targets = {kind: tmp_path / f"{kind}-{uuid.uuid4().hex}" for kind in ("fileio", "posix", "mkdir", "sqlite")}
    out = run(f"""
        import _io, os, posix, sqlite3
        targets = {({k: str(v) for k, v in targets.items()})!r}
        blocked = []
        attempts = [
            ("fileio", lambda p: _io.FileIO(p, "w").write(b"x")),
            ("posix", lambda p: posix.write(posix.open(p, posix.O_WRONLY | posix.O_CREAT), b"x")),
            ("mkdir", lambda p: os.mkdir(p)),
            ("sqlite", lambda p: sqlite3.connect(p).execute("create table t (x)")),
        ]
        for kind, attempt in attempts:
            for path in (targets[kind], "/" + kind, "/usr/" + kind, "/etc/" + kind, "/dev/" + kind):
                try:
                    attempt(path)
                except (OSError, sqlite3.Error):
                    blocked.append(path)
                else:
                    print("ESCAPED", path)
        print(len(blocked))
    """)
    assert out.passed, out.stderr
    assert "ESCAPED" not in out.stdout and out.stdout.split()[-1] == "20"
    assert not any(p.exists() for p in targets.values())


@needs_bwrap
def test_evaluator_process_and_its_secrets_are_invisible(monkeypatch):
    secret = f"s3cret-{uuid.uuid4().hex}"
    monkeypatch.setenv("BRIDGE_TEST_SECRET", secret)
    me = os.getpid()
    out = run(f"""
        import os
        assert not os.path.exists("/proc/{me}"), "evaluator visible"
        for path in ("/proc/{me}/environ", "/proc/{me}/mem"):
            try:
                open(path, "rb").read(1)
            except OSError:
                pass
            else:
                raise AssertionError("opened " + path)
        pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
        assert pids[0] == 1 and len(pids) <= 3, pids  # bwrap's reaper and this program
        seen = repr(dict(os.environ))
        for pid in pids:
            try:
                seen += open(f"/proc/{{pid}}/environ", "rb").read().decode("latin-1")
                seen += open(f"/proc/{{pid}}/cmdline", "rb").read().decode("latin-1")
            except OSError:
                pass
        assert {secret!r} not in seen
        assert "BRIDGE_TEST_SECRET" not in seen
        print(sorted(os.environ))
    """)
    assert out.passed, out.stderr
    assert out.stdout.strip() == repr(sorted(["HOME", "LANG", "PATH", "PWD", "PYTHONHASHSEED", "TMPDIR"]))


@needs_bwrap
def test_host_unix_sockets_and_network_are_unreachable(tmp_path):
    path = str(tmp_path / "s.sock")
    abstract = f"\0bridge-test-{uuid.uuid4().hex}"
    servers = []
    for address in (path, abstract):
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(address)
        server.listen(1)
        servers.append(server)
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(1)
    port = tcp.getsockname()[1]
    try:
        out = run(f"""
            import socket
            reached = []
            for address in ({path!r}, {abstract!r}):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    s.connect(address)
                    reached.append(address)
                except OSError:
                    pass
            for host, port in (("127.0.0.1", {port}), ("192.0.2.1", 80), ("1.1.1.1", 53)):
                try:
                    socket.create_connection((host, port), timeout=1)
                    reached.append(host)
                except OSError:
                    pass
            assert not reached, reached
        """)
    finally:
        for s in (*servers, tcp):
            s.close()
    assert out.passed, out.stderr


@needs_bwrap
def test_fork_bomb_is_capped_and_nothing_survives():
    marker = f"bridge-bomb-{uuid.uuid4().hex}"
    limits = Limits(timeout=10, memory_mb=512, processes=16)
    out = run(f"""
        import os
        children = 0
        while True:
            try:
                pid = os.fork()
            except OSError:
                break
            if pid == 0:
                os.execv("/bin/sleep", [{marker!r}, "60"])
            children += 1
            assert children < 1000
        print(children)
    """, limits)
    assert out.passed, out.stderr
    assert 0 < int(out.stdout.split()[-1]) < limits.processes
    time.sleep(0.2)
    assert _marked(marker) == []  # the whole box went with its PID 1


@needs_bwrap
def test_timeout_kills_every_process_of_the_box():
    marker = f"bridge-left-{uuid.uuid4().hex}"
    out = run(f"""
        import subprocess
        subprocess.Popen(["sh", "-c", "exec -a {marker} sleep 60"], start_new_session=True)
        while True:
            pass
    """, Limits(timeout=1.5))
    assert out.status == "timeout"
    time.sleep(0.2)
    assert _marked(marker) == []


@needs_bwrap
def test_memory_of_all_children_together_is_capped():
    # each child stays under the per-process limit; together they pass the limit of the tree
    out = run("""
        import os, time
        for _ in range(4):
            if os.fork() == 0:
                block = b"x" * (120 << 20)
                time.sleep(30)
                os._exit(0)
        time.sleep(30)
    """, Limits(timeout=20, memory_mb=256))
    assert out.status == "memory" and "all its processes" in out.error
    assert out.seconds < 15


@needs_bwrap
def test_ctypes_gets_nothing_more():
    me = os.getpid()
    out = run(f"""
        import ctypes, ctypes.util, errno, os
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.setuid(0) == -1 and os.getuid() == {sandbox.SANDBOX_UID}
        assert libc.kill({me}, 9) == -1 and ctypes.get_errno() == errno.ESRCH
        assert libc.unshare(0x10000000) == -1  # CLONE_NEWUSER
        assert libc.mount(b"none", b"/usr", b"tmpfs", 0, None) == -1
        assert libc.chroot(b"/tmp") == -1
        print("contained")
    """)
    assert out.passed, out.stderr
    assert out.stdout.strip() == "contained"


@needs_bwrap
def test_hash_seed_is_honoured():
    expected = subprocess.run([sys.executable, "-c", "print(hash('bridge'))"], capture_output=True, text=True,
                              env={**os.environ, "PYTHONHASHSEED": "0"}).stdout.strip()
    first, second = (run("print(hash('bridge'))") for _ in range(2))
    assert first.stdout.strip() == second.stdout.strip() == expected


# -- opt-in --------------------------------------------------------------------------------------


def test_running_code_needs_an_opt_in(monkeypatch):
    monkeypatch.delenv(sandbox.ALLOW_ENV, raising=False)
    with pytest.raises(UsageError, match="--allow-code-execution") as info:
        sandbox.code_execution_mode()
    assert info.value.exit_code == 2 and "\n" not in str(info.value)
    monkeypatch.setattr(sandbox, "_probe", lambda: (None, "bubblewrap (bwrap) is not installed"))
    monkeypatch.setenv(sandbox.ALLOW_ENV, "1")
    with pytest.raises(UsageError, match="bwrap.*--unsafe-code-execution"):
        sandbox.code_execution_mode()
    with pytest.raises(UsageError, match="not installed"):
        run_program("pass")
    assert sandbox.code_execution_mode(unsafe=True) == "unsafe"
    monkeypatch.setattr(sandbox, "_probe", lambda: ("box", ""))
    assert sandbox.code_execution_mode() == "bwrap"


def test_unsafe_runner_still_limits(monkeypatch):
    monkeypatch.setattr(sandbox, "_probe", lambda: (None, "bubblewrap (bwrap) is not installed"))
    passed = run_program("assert sorted({3, 1, 2}) == [1, 2, 3]\n", FAST, unsafe=True)
    assert passed.passed and passed.isolation.startswith("unsafe: ")
    loop = run_program("while True:\n    pass\n", Limits(timeout=1), unsafe=True)
    assert loop.status == "timeout"


def test_missing_features_are_said(monkeypatch):
    box = sandbox._Box("/usr/bin/bwrap", "/usr/bin/python3", (), frozenset({"--perms"}), "3.11.2", monitor=False)
    monkeypatch.setattr(sandbox, "_probe", lambda: (box, ""))
    warnings = sandbox.sandbox_warnings()
    assert any("--size" in w and "not size-limited" in w for w in warnings)
    assert any("memory is limited per process only" in w for w in warnings)
    assert set(sandbox.sandbox_info()["missing"]) == {"--disable-userns", "--size", "--remount-ro",
                                                      "tree memory monitor"}
