"""Run untrusted Python (model-written code plus its tests) in a sandbox built on bubblewrap.

Nothing generated ever runs in the calling process, and by default nothing runs at all: the code
tasks need a stated opt-in (``--allow-code-execution`` or ``BRIDGE_ALLOW_CODE_EXECUTION=1``, see
:func:`code_execution_mode`). Each program then runs under ``bwrap`` (bubblewrap) with:

- a new user namespace in which it is uid/gid 65534 with no capabilities; when the evaluator is
  root, ``bwrap`` itself is started as the host's uid/gid 65534 (nobody), so the program is
  unprivileged on the host as well, and never root;
- new PID, network, IPC, UTS and cgroup namespaces: a fresh ``/proc`` that shows only its own
  processes, no network but its own loopback (no abstract Unix sockets of the host either), and
  ``--disable-userns`` (when bwrap has it) so it cannot make further user namespaces;
- a root file system built from nothing: ``/usr`` (with the ``/bin``, ``/lib*`` links), the Python
  installation, ``/etc/ld.so.cache`` and ``/etc/localtime``, all read-only, then ``/`` remounted
  read-only; a minimal ``/dev``; private size-limited tmpfs folders ``/work`` (its working folder,
  HOME and TMPDIR, holding ``program.py``), ``/tmp`` and ``/dev/shm``; nothing of the host's ``/home``, ``/root``,
  ``/work``, ``/tmp``, ``/run`` or ``/sys``;
- ``--die-with-parent`` and ``--new-session``; an environment of only PATH, LANG, HOME, TMPDIR and
  PYTHONHASHSEED (the evaluator's own value when it is a number, else 0; honoured, as the
  interpreter runs without ``-I``/``-E`` in that clean environment);
- limits set inside the box, after the user namespace is made: address space per process, CPU
  seconds, file size, open files, no core files, and ``RLIMIT_NPROC``, which the kernel counts per
  user namespace and uid, so it caps the number of processes and threads of this program's whole
  tree (a fork bomb stops there);
- a seccomp filter (:func:`.containment.seccomp_filter`) that refuses ``memfd_create``,
  ``memfd_secret`` and SysV ``shmget``: memory that no process maps and no file system counts;
- a memory limit for all of the program's processes together. Where the evaluator can make a
  cgroup (root, or a delegated cgroup: :func:`.containment.cgroup_parent`), each program gets its
  own, and bwrap waits (``--block-fd``) until its first process is in it: the kernel counts
  everything (resident memory, tmpfs pages, kernel memory such as inodes and socket buffers) and
  kills past the limit. Elsewhere a monitor in the evaluator polls the resident memory of every
  process in the sandbox's PID namespace, what its tmpfs folders hold (pages and inodes), and each
  open socket at the most its buffers can hold, and kills the sandbox past the limit;
- a wall-clock timeout after which the sandbox is SIGKILLed: its whole process tree, stopped first
  so that none forks meanwhile (:func:`.containment.kill_tree`), which also reaches a sandbox still
  being set up (in a session of its own, before ``--die-with-parent`` applies), and its cgroup.

A program passes only on the runner's success signal: a random token made for the run, which the
runner reads from a pipe before the program starts and writes to a file of its own after the
program's last statement (the test's check) has returned. Exit status 0 alone (``os._exit(0)``
before the asserts) is a failure.

Where bwrap is missing or cannot make namespaces here, :func:`run_program` refuses unless the
caller passes ``unsafe=True`` (``--unsafe-code-execution``); then the old damage-control runner is
used: a separate ``python`` process with rlimits, ``unshare`` PID/network namespaces where that
works, and a Python-level guard, which is not a security boundary. See docs/security.md.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Sequence

from ..errors import BridgeError, UsageError
from . import containment

# Statuses of an execution
PASSED, FAILED, TIMEOUT, MEMORY, KILLED = "passed", "failed", "timeout", "memory", "killed"

ALLOW_ENV = "BRIDGE_ALLOW_CODE_EXECUTION"
SANDBOX_UID = 65534  # nobody
BWRAP = "bwrap"
UNSAFE_PREFIX = "unsafe: "


class SandboxError(BridgeError):
    """The sandbox itself failed (not the program in it)."""

    exit_code = 1


# The runner inside the box: it reads the run's token from a pipe (then closes it), sets the limits
# on itself (inside the new user namespace, so that RLIMIT_NPROC counts only this box's processes),
# executes the program and, only when the program's last statement (the test's check) has returned,
# writes the token to the result file: the success signal. Its exit status says the rest: 0 done,
# 1 exception (traceback on stderr), 3 SystemExit, 70 the setup failed (the program did not run).
# The token is not in the program's text, files, arguments or environment; it is a local of main().
_BOX_RUNNER = r"""
import os, resource, sys, traceback
def main():
    mem, cpu, fsize, nproc, nofile, token_fd, result_fd = (int(v) for v in sys.argv[1:8])
    try:
        token = os.read(token_fd, 64)
        os.close(token_fd)
        for limit, value in ((resource.RLIMIT_AS, mem), (resource.RLIMIT_CPU, cpu), (resource.RLIMIT_FSIZE, fsize),
                             (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NPROC, nproc), (resource.RLIMIT_NOFILE, nofile)):
            if value >= 0:
                resource.setrlimit(limit, (value, value))
        with open("/work/program.py", encoding="utf-8") as fh:
            source = fh.read()
    except BaseException as exc:
        sys.stderr.write(f"bridge sandbox setup failed: {exc!r}\n")
        sys.stderr.flush()
        os._exit(70)
    sys.argv = ["program.py"]
    _exit, _write = os._exit, os.write
    status = 0
    try:
        exec(compile(source, "program.py", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit:
        traceback.print_exc()
        status = 3
    except BaseException:
        traceback.print_exc()
        status = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    if status == 0:
        _write(result_fd, token)
    _exit(status)
main()
"""

# The unsafe runner (no bwrap, --unsafe-code-execution): PID 1 of the namespace when there is one.
# It forks and closes the token pipe and the result file; the child reads the token, sets the
# limits, installs the guard, executes the program and writes the token to the result file when
# the program's last statement has returned (as the box runner does). The runner waits and
# reports through its exit code: 0 done, 1 exception (traceback on stderr), 3 SystemExit, 128+N
# killed by signal N.
_UNSAFE_RUNNER = r"""
import os, sys
program, work, mem, cpu, fsize = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
token_fd, result_fd = int(sys.argv[6]), int(sys.argv[7])
pid = os.fork()
if pid:
    os.close(token_fd)
    os.close(result_fd)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except ChildProcessError:
            os._exit(70)
        except InterruptedError:
            continue
    os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))

import builtins, io, resource, traceback
_exit, _write, _read, _close = os._exit, os.write, os.read, os.close
for limit, value in ((resource.RLIMIT_AS, mem), (resource.RLIMIT_CPU, cpu), (resource.RLIMIT_FSIZE, fsize),
                     (resource.RLIMIT_CORE, 0)):
    if value >= 0:
        try:
            resource.setrlimit(limit, (value, value))
        except (ValueError, OSError):
            pass
os.chdir(work)
with open(program, encoding="utf-8") as fh:
    source = fh.read()
work = os.path.realpath(work)
_open, _os_open = builtins.open, os.open
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

def _inside(path):
    if isinstance(path, int):
        return True
    real = os.path.realpath(os.fsdecode(path))
    return real == work or real.startswith(work + os.sep)

def guarded_open(file, mode="r", *args, **kwargs):
    if any(c in mode for c in "wax+") and not _inside(file):
        raise PermissionError(f"sandbox: writing outside the working folder is blocked: {file!r}")
    return _open(file, mode, *args, **kwargs)

def guarded_os_open(path, flags, *args, **kwargs):
    if flags & _WRITE_FLAGS and not _inside(path):
        raise PermissionError(f"sandbox: writing outside the working folder is blocked: {path!r}")
    return _os_open(path, flags, *args, **kwargs)

builtins.open = io.open = guarded_open
os.open = guarded_os_open
import posix, shutil, signal, subprocess
for name in ("kill", "killpg", "system", "popen", "putenv", "unsetenv", "remove", "removedirs", "rmdir", "unlink",
             "rename", "renames", "replace", "truncate", "chmod", "fchmod", "lchmod", "chown", "fchown", "lchown",
             "chroot", "fchdir", "chdir", "setuid", "setgid", "seteuid", "setegid", "setsid", "setpgid", "fork",
             "forkpty", "vfork", "execv", "execve", "execvp", "execvpe", "execl", "execle", "execlp", "execlpe",
             "spawnv", "spawnve", "spawnvp", "spawnvpe", "spawnl", "spawnle", "spawnlp", "spawnlpe",
             "posix_spawn", "posix_spawnp", "_exit", "abort", "link", "symlink", "mkfifo", "mknod"):
    for module in (os, posix):
        if hasattr(module, name):
            setattr(module, name, None)
for module, names in ((shutil, ("rmtree", "move", "chown", "copyfile", "copy", "copy2", "copytree")),
                      (subprocess, ("Popen", "run", "call", "check_call", "check_output", "getoutput",
                                    "getstatusoutput")),
                      (signal, ("pthread_kill", "pidfd_send_signal")),
                      (builtins, ("exit", "quit", "help"))):
    for name in names:
        if hasattr(module, name):
            setattr(module, name, None)
del module, names, name
def _run(source):
    token = _read(token_fd, 64)
    _close(token_fd)
    status = 0
    try:
        exec(compile(source, "program.py", "exec"), {"__name__": "__main__", "__builtins__": builtins})
    except SystemExit:
        traceback.print_exc()
        status = 3
    except BaseException:
        traceback.print_exc()
        status = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    if status == 0:
        _write(result_fd, token)
    _exit(status)
_run(source)
"""


@dataclass(frozen=True)
class Limits:
    timeout: float = 10.0  # wall-clock seconds
    memory_mb: int = 1024  # address space of each process, and resident memory of all of them together
    file_size_mb: int = 16  # largest file it may write (stdout/stderr included)
    processes: int = 64  # processes and threads of the program's whole tree
    disk_mb: int = 64  # size of each private tmpfs folder (/work, /tmp, /dev/shm)
    open_files: int = 256  # per process


@dataclass(frozen=True)
class Outcome:
    status: str  # passed, failed, timeout, memory, killed
    returncode: int | None
    seconds: float
    error: str  # last line of the traceback (or what happened), "" when passed
    stderr: str  # its tail
    isolation: str  # "bwrap", or "unsafe: pid+net namespaces" / "unsafe: process"
    stdout: str = ""  # its tail

    @property
    def passed(self) -> bool:
        return self.status == PASSED

    def to_dict(self) -> dict:
        return asdict(self)


# -- opt-in and the probe -----------------------------------------------------------------------


def _env_allows() -> bool:
    return os.environ.get(ALLOW_ENV, "").strip().lower() in ("1", "true", "yes")


def code_execution_mode(allow: bool = False, unsafe: bool = False) -> str:
    """``"bwrap"`` or ``"unsafe"``: how generated code will run; :class:`UsageError` (exit 2) when
    running it was not asked for, or when no sandbox works here and ``unsafe`` is not given.

    Asking is ``allow`` (``--allow-code-execution``), the environment variable
    ``BRIDGE_ALLOW_CODE_EXECUTION=1``, or ``unsafe`` (``--unsafe-code-execution``, a stronger
    statement of the same)."""
    if not (allow or unsafe or _env_allows()):
        raise UsageError(
            "this task runs model-written code on this machine; pass --allow-code-execution "
            f"(or set {ALLOW_ENV}=1) to allow it (it runs in a bubblewrap sandbox, see docs/security.md)"
        )
    problem = bwrap_problem()
    if problem is None:
        return "bwrap"
    if unsafe:
        return "unsafe"
    raise UsageError(
        f"no sandbox for model-written code here: {problem}",
        hint="install bubblewrap where user namespaces are allowed (apt-get install bubblewrap), "
        "or pass --unsafe-code-execution to run it with process limits only",
    )


def _hash_seed() -> str:
    """The evaluator's PYTHONHASHSEED when it is a number the interpreter accepts, else 0."""
    value = os.environ.get("PYTHONHASHSEED", "").strip()
    return value if value.isdigit() and int(value) <= 4294967295 else "0"


@dataclass(frozen=True)
class _Box:
    bwrap: str
    python: str  # interpreter inside the box
    binds: tuple[str, ...]  # extra read-only folders (the interpreter's installation)
    options: frozenset[str]  # optional bwrap options this version has
    version: str  # the interpreter's version
    monitor: bool = False  # whether the evaluator can see the box's processes (the tree-wide memory limit)


def _python_candidates() -> list[str]:
    """Interpreters to try in the box: $BRIDGE_SANDBOX_PYTHON, this one's base installation, then
    the system's python3 (this one may live where the box's user cannot reach, like /root)."""
    found = []
    explicit = os.environ.get("BRIDGE_SANDBOX_PYTHON")
    if explicit:
        return [os.path.realpath(explicit)]
    for exe in (getattr(sys, "_base_executable", None), sys.executable):
        if exe:
            found.append(os.path.realpath(exe))
    for folder in ("/usr/bin", "/usr/local/bin"):
        for name in (f"python{sys.version_info.major}.{sys.version_info.minor}", "python3"):
            path = os.path.join(folder, name)
            if os.path.exists(path):
                found.append(os.path.realpath(path))
    return list(dict.fromkeys(found))


def _installation(python: str) -> tuple[str, ...]:
    """The folder to bind for an interpreter outside /usr: its prefix (``bin/..``)."""
    if python.startswith("/usr/"):
        return ()
    return (os.path.dirname(os.path.dirname(python)),)


def _drop_privileges() -> dict:
    """Popen arguments that start bwrap as nobody when the evaluator is root."""
    if os.geteuid() != 0:
        return {}
    return {"user": SANDBOX_UID, "group": SANDBOX_UID, "extra_groups": []}


_WANTED = ("--disable-userns", "--size", "--perms", "--remount-ro", "--seccomp")  # optional bwrap features we use
_SETUP = ("--info-fd", "--block-fd")  # what putting the box in a cgroup before it runs needs
_SECCOMP = containment.seccomp_filter()


def _cgroup(box: _Box) -> containment.CgroupParent | None:
    """Where this box's programs get their cgroups, or None (then the polling monitor)."""
    if not all(option in box.options for option in _SETUP):
        return None
    return containment.cgroup_parent()[0]


def _seccomp(box: _Box) -> bytes | None:
    return _SECCOMP if "--seccomp" in box.options else None


def _memory_limit(box: _Box) -> str:
    """How the memory limit for all of a program's processes is kept: ``cgroup v1``/``cgroup v2``
    (the kernel counts everything), ``monitor`` (resident memory and tmpfs use, polled) or ``none``."""
    parent = _cgroup(box)
    if parent is not None:
        return f"cgroup v{parent.version}"
    return "monitor" if box.monitor else "none"


def sandbox_warnings() -> list[str]:
    """What of the sandbox does not work here (one line each), for the user to know."""
    box, _ = _probe()
    if box is None:
        return []
    out = [
        f"bwrap {box.bwrap} lacks {option} (older version): "
        + {
            "--disable-userns": "a program may create user namespaces of its own",
            "--size": "its tmpfs folders are not size-limited",
            "--perms": "program.py is writable inside",
            "--remount-ro": "the sandbox's root and /dev stay writable (in memory)",
            "--seccomp": "memfd_create and SysV shared memory are not refused",
        }[option]
        for option in _WANTED
        if option not in box.options
    ]
    if "--seccomp" in box.options and _SECCOMP is None:
        out.append(f"no seccomp filter for {platform.machine()}: memfd_create and SysV shared memory are not refused")
    mode = _memory_limit(box)
    if mode == "none":
        out.append("the evaluator cannot see the sandbox's processes here: memory is limited per process only")
    elif mode == "monitor":
        why = containment.cgroup_parent()[1] if all(o in box.options for o in _SETUP) else "bwrap lacks --block-fd"
        out.append(
            f"no cgroup for the sandbox here ({why}): the memory limit for all of a program's processes "
            "is a poll of their resident memory, tmpfs use and open sockets, which misses pipe buffers "
            "and sockets passed in flight (see docs/security.md)"
        )
    return out


@functools.lru_cache(maxsize=None)
def _probe() -> tuple[_Box | None, str]:
    """Find bwrap and an interpreter that runs in the box here: ``(box, "")`` or ``(None, why not)``."""
    exe = shutil.which(BWRAP)
    if exe is None:
        return None, "bubblewrap (bwrap) is not installed"
    try:
        help_text = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"bwrap does not run: {exc}"
    options = frozenset(o for o in _WANTED + _SETUP if o in help_text)
    problem = "no Python interpreter found for the sandbox"
    for python in _python_candidates():
        # with the seccomp filter first; where it does not load or does not hold, without it
        for opts in [options] + ([options - {"--seccomp"}] if "--seccomp" in options else []):
            box = _Box(exe, python, _installation(python), opts, "")
            try:
                done = _run_probe(box)
            except (OSError, subprocess.SubprocessError) as exc:
                problem = f"bwrap does not run: {exc}"
                break
            if done.returncode == 0:
                version, uid, _, memfd = done.stdout.split()
                if int(uid) != SANDBOX_UID:
                    return None, f"bwrap ran the probe as uid {uid}, not {SANDBOX_UID}"
                if "--seccomp" in opts and _SECCOMP is not None and memfd != "refused":
                    continue
                found = _Box(exe, python, box.binds, opts, version)
                return _Box(exe, python, box.binds, opts, version, _monitor_works(found)), ""
            lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
            problem = (
                f"bwrap cannot start a sandbox here ({lines[-1].strip() if lines else f'exit {done.returncode}'}; "
                f"tried {python}; BRIDGE_SANDBOX_PYTHON names another interpreter)"
            )
    return None, problem


_PROBE = """import sys, os
try:
    os.close(os.memfd_create("probe"))
    memfd = "open"
except (AttributeError, OSError):
    memfd = "refused"
print(sys.version.split()[0], os.getuid(), hash('bridge'), memfd)
"""


def _run_probe(box: _Box) -> subprocess.CompletedProcess:
    with tempfile.TemporaryFile() as program, _seccomp_file(box) as seccomp:
        argv = _bwrap_argv(box, Limits(), program.fileno(), runner=None, code=_PROBE, fds=_Fds(seccomp=seccomp))
        return subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=30,
            pass_fds=(program.fileno(), *_Fds(seccomp=seccomp).passed()),
            stdin=subprocess.DEVNULL,
            **_drop_privileges(),
        )


@contextlib.contextmanager
def _seccomp_file(box: _Box) -> Iterator[int]:
    """An open file holding the box's seccomp filter (bwrap reads it), or -1 when there is none."""
    data = _seccomp(box)
    if data is None:
        yield -1
        return
    with tempfile.TemporaryFile() as fh:
        fh.write(data)
        fh.flush()
        fh.seek(0)
        yield fh.fileno()


def _monitor_works(box: _Box) -> bool:
    """Whether the evaluator sees the resident memory of a process inside the box (it needs to read
    /proc/PID/ns/pid of the box's processes); without it only the per-process limits hold."""
    with tempfile.TemporaryFile() as program:
        argv = _bwrap_argv(box, Limits(), program.fileno(), runner=None, code="import time; time.sleep(5)")
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(program.fileno(),),
                start_new_session=True,
                **_drop_privileges(),
            )
        except OSError:
            return False
        try:
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline and proc.poll() is None:
                outer = _namespace(proc.pid)
                for child in _children(proc.pid):
                    ns = _namespace(child)
                    if ns is not None and ns != outer and _resident_bytes(ns) > 0:
                        return True
                time.sleep(0.02)
            return False
        finally:
            _end(proc)


def bwrap_problem() -> str | None:
    """None when bubblewrap sandboxes work here, else why not (one line)."""
    return _probe()[1] or None


def sandbox_info() -> dict:
    """What results record about the sandbox."""
    box, problem = _probe()
    if box is None:
        return {"isolation": UNSAFE_PREFIX + _unsafe_isolation(), "bwrap_problem": problem}
    mode = _memory_limit(box)
    return {
        "isolation": BWRAP,
        "python": box.python,
        "python_version": box.version,
        "hash_seed": _hash_seed(),
        "bwrap_options": sorted(box.options),
        "memory_limit": mode,
        "seccomp": _seccomp(box) is not None,
        "missing": sorted(set(_WANTED) - box.options)
        + ([] if mode.startswith("cgroup") else ["cgroup"])
        + ([] if box.monitor else ["tree memory monitor"]),
    }


@dataclass(frozen=True)
class _Fds:
    """File descriptors the box gets besides its program (-1: none)."""

    token: int = -1  # the run's token, read and closed by the runner
    result: int = -1  # where the runner writes the token when the program has run to its end
    seccomp: int = -1  # the seccomp filter (bwrap reads it)
    info: int = -1  # bwrap writes the sandbox's PID there (--info-fd)
    block: int = -1  # bwrap waits for a byte there before it starts anything (--block-fd)

    def passed(self) -> tuple[int, ...]:
        return tuple(fd for fd in (self.token, self.result, self.seccomp, self.info, self.block) if fd >= 0)


def _bwrap_argv(
    box: _Box,
    limits: Limits,
    program_fd: int,
    *,
    runner: str | None = _BOX_RUNNER,
    code: str | None = None,
    fds: _Fds = _Fds(),
) -> list[str]:
    disk = str(max(1, limits.disk_mb) * 2**20)
    argv = [
        box.bwrap,
        "--unshare-user",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_UID),
        "--hostname",
        "sandbox",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--ro-bind",
        "/usr",
        "/usr",
    ]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    for path in ("/etc/ld.so.cache", "/etc/localtime"):
        argv += ["--ro-bind-try", path, path]
    for folder in box.binds:
        argv += ["--ro-bind", folder, folder]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    for folder in ("/work", "/tmp", "/dev/shm"):
        argv += (["--size", disk] if "--size" in box.options else []) + ["--tmpfs", folder]
    argv += (["--perms", "0444"] if "--perms" in box.options else []) + ["--file", str(program_fd), "/work/program.py"]
    if "--remount-ro" in box.options:
        argv += ["--remount-ro", "/dev", "--remount-ro", "/"]
    if "--disable-userns" in box.options:
        argv += ["--disable-userns"]
    for option, fd in (("--seccomp", fds.seccomp), ("--info-fd", fds.info), ("--block-fd", fds.block)):
        if fd >= 0:
            argv += [option, str(fd)]
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": "/work",
        "TMPDIR": "/work",
        "PYTHONHASHSEED": _hash_seed(),
    }
    for key, value in env.items():
        argv += ["--setenv", key, value]
    argv += ["--chdir", "/work", "--", box.python, "-s", "-B"]
    if box.version and tuple(map(int, box.version.split(".")[:2])) >= (3, 11):
        argv += ["-P"]
    if code is not None:
        return argv + ["-c", code]
    mem = limits.memory_mb * 2**20 if limits.memory_mb > 0 else -1
    cpu = int(limits.timeout) + 1
    fsize = limits.file_size_mb * 2**20 if limits.file_size_mb > 0 else -1
    return argv + [
        "-c",
        runner or _BOX_RUNNER,
        str(mem),
        str(cpu),
        str(fsize),
        str(limits.processes),
        str(limits.open_files),
        str(fds.token),
        str(fds.result),
    ]


# -- the memory monitor -------------------------------------------------------------------------

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as fh:
                    stat = fh.read()
            except OSError:
                continue
            fields = stat[stat.rfind(b")") + 2 :].split()
            if len(fields) > 1 and int(fields[1]) == pid:
                out.append(int(entry.name))
    return out


def _namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _resident_bytes(namespace: str) -> int:
    """What the processes of the PID namespace ``namespace`` hold, as the host sees it: their
    resident memory, what the box's tmpfs folders hold (:func:`_tmpfs_bytes`, seen through one of
    them), and each socket they have open at the most its buffers can hold (:data:`SOCKET_BYTES`)."""
    total, member, sockets = 0, None, set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry.name}/ns/pid") != namespace:
                continue
            with open(f"/proc/{entry.name}/statm", "rb") as fh:
                total += int(fh.read().split()[1]) * _PAGE
            member = member or entry.name
            sockets.update(_sockets(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return total + (_tmpfs_bytes(member) if member else 0) + len(sockets) * SOCKET_BYTES


def _sysctl(name: str, field: int = 0, default: int = 0) -> int:
    try:
        with open(f"/proc/sys/{name}", encoding="ascii") as fh:
            return max(default, int(fh.read().split()[field]))
    except (OSError, ValueError, IndexError):
        return default


# The most one socket's buffers can hold: a send buffer of up to twice net.core.wmem_max (SO_SNDBUF)
# or tcp_wmem's maximum (autotuning), and a receive buffer likewise (the kernel's defaults at least:
# a sandbox's own network namespace starts with them)
SOCKET_BYTES = max(2 * _sysctl("net/core/wmem_max", default=212992), _sysctl("net/ipv4/tcp_wmem", 2, 4 << 20)) + max(
    2 * _sysctl("net/core/rmem_max", default=212992), _sysctl("net/ipv4/tcp_rmem", 2, 6 << 20)
)


def _sockets(pid: str) -> set[str]:
    """The sockets process ``pid`` has open (``socket:[inode]``)."""
    out: set[str] = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:"):
            out.add(target)
    return out


_INODE_BYTES = 1024  # what tmpfs charges an inode (and xattrs) in its inode count; ~960 B of kernel memory measured
_BOX_MOUNTS = ("/", "/dev", "/work", "/tmp", "/dev/shm")


def _tmpfs_bytes(pid: str) -> int:
    """What the box's in-memory file systems hold (pages and inodes; files deleted but still open
    included), seen through ``/proc/PID/root``: 0 until the box has its own root."""
    root = f"/proc/{pid}/root"
    try:
        mine, theirs = os.stat("/"), os.stat(root)
    except OSError:
        return 0
    if (mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino):
        return 0  # still being set up: its root is the host's
    total, seen = 0, set()
    for mount in _BOX_MOUNTS:
        try:
            path = root + mount
            device = os.stat(path).st_dev
            if device in seen:
                continue
            seen.add(device)
            fs = os.statvfs(path)
        except OSError:
            continue
        total += (fs.f_blocks - fs.f_bfree) * fs.f_frsize + (fs.f_files - fs.f_ffree) * _INODE_BYTES
    return total


# -- running --------------------------------------------------------------------------------------


def _tail(path_or_file, limit: int = 2000) -> str:
    try:
        if isinstance(path_or_file, (str, Path)):
            with open(path_or_file, "rb") as fh:
                return _tail(fh, limit)
        fh = path_or_file
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        fh.seek(max(0, size - limit))
        return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _last_error(stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else ""


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _end(proc: subprocess.Popen, cgroup: containment.Cgroup | None = None) -> int:
    """Kill what is left of a run (its whole tree, wherever its setup had got to; its process group;
    its cgroup) and reap it: the exit status."""
    if proc.poll() is None:
        containment.kill_tree(proc.pid)
    _kill_group(proc.pid)
    if cgroup is not None:
        cgroup.kill()
    return proc.wait()


def _classify(
    rc: int | None,
    stderr: str,
    seconds: float,
    limits: Limits,
    timed_out: bool,
    over_memory: bool,
    isolation: str,
    stdout: str,
    signalled: bool = True,
) -> Outcome:
    """``signalled``: the runner wrote the run's token, i.e. the program ran to its end."""
    error = _last_error(stderr)
    cpu = int(limits.timeout) + 1
    if over_memory:
        status, error = MEMORY, f"memory limit ({limits.memory_mb} MiB for all its processes) exceeded"
    elif timed_out:
        status, error = TIMEOUT, f"timed out after {limits.timeout:g} s"
    elif rc == 0 and signalled:
        status, error = PASSED, ""
    elif rc == 0:
        status, error = FAILED, "exited with status 0 before its end (no success signal from the test harness)"
    elif "MemoryError" in error:
        status = MEMORY
    elif rc in (1, 3):
        status = FAILED
    else:
        signum = rc - 128 if rc is not None and rc > 128 else -rc if rc is not None and rc < 0 else None
        name = signal.Signals(signum).name if signum and signum in signal.Signals._value2member_map_ else None
        if name == "SIGXCPU" or (name == "SIGKILL" and seconds >= cpu - 0.5):
            status, error = TIMEOUT, f"CPU time limit ({cpu} s) exceeded"
        elif name == "SIGXFSZ":
            status, error = KILLED, f"file size limit ({limits.file_size_mb} MiB) exceeded"
        elif name is not None:
            status, error = (MEMORY if name in ("SIGSEGV", "SIGBUS") and not error else KILLED), f"killed by {name}"
        else:
            status, error = FAILED, error or f"exit status {rc}"
    return Outcome(status, rc, round(seconds, 3), error, stderr, isolation, stdout)


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _token_pipe(token: bytes) -> int:
    """The read end of a pipe that holds ``token`` and nothing more (the write end is closed)."""
    read, write = os.pipe()
    try:
        os.write(write, token)
    finally:
        os.close(write)
    return read


def _signalled(result, token: bytes) -> bool:
    """Whether the result file holds exactly the run's token."""
    try:
        result.seek(0)
        return result.read(len(token) + 1) == token
    except OSError:
        return False


def _sandbox_pid(info: int, deadline: float) -> int | None:
    """The host PID of the sandbox's first process, which bwrap writes to ``info`` (--info-fd) once
    it has made it; None when bwrap ended without (it failed: its stderr says why). Raises
    TimeoutError at ``deadline``."""
    data = b""
    poller = select.poll()  # not select(): descriptors past 1023 are fine
    poller.register(info, select.POLLIN)
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(left * 1000):
            raise TimeoutError("bwrap did not report its sandbox in time")
        chunk = os.read(info, 4096)
        if not chunk:
            break
        data += chunk
    try:
        return int(json.loads(data.decode("utf-8", "replace"))["child-pid"])
    except (ValueError, KeyError, TypeError):
        return None


def run_program(source: str, limits: Limits = Limits(), *, unsafe: bool = False) -> Outcome:
    """Execute ``source`` as a script in the sandbox under ``limits``; never raises for what the
    program does. Without a working bwrap this raises :class:`UsageError` unless ``unsafe``.

    It passes only on the runner's success signal: a random token, made for this run, that the
    runner writes to a file of its own after the program's last statement returned."""
    box, problem = _probe()
    if box is None:
        if not unsafe:
            raise UsageError(
                f"no sandbox for model-written code here: {problem}",
                hint="install bubblewrap, or pass --unsafe-code-execution",
            )
        return _run_unsafe(source, limits)
    token = secrets.token_hex(16).encode()
    budget = limits.memory_mb * 2**20 if limits.memory_mb > 0 else None
    parent = _cgroup(box)
    with contextlib.ExitStack() as stack:
        program, out, err, result = (stack.enter_context(tempfile.TemporaryFile()) for _ in range(4))
        program.write(source.encode("utf-8", "surrogatepass"))
        program.flush()
        program.seek(0)
        seccomp = stack.enter_context(_seccomp_file(box))
        pipes: list[int] = []
        stack.callback(_close_all, pipes)
        token_fd = _token_pipe(token)
        pipes.append(token_fd)
        cgroup = info = block = None
        if parent is not None:
            try:
                cgroup = containment.Cgroup(parent, budget)
            except OSError as exc:
                raise SandboxError(f"cannot create the sandbox's cgroup in {parent.path}: {exc}") from None
            stack.callback(cgroup.remove)
            info, info_w = os.pipe()
            block_r, block = os.pipe()
            pipes += [info, info_w, block_r, block]
        fds = _Fds(
            token=token_fd,
            result=result.fileno(),
            seccomp=seccomp,
            info=-1 if cgroup is None else info_w,
            block=-1 if cgroup is None else block_r,
        )
        argv = _bwrap_argv(box, limits, program.fileno(), fds=fds)
        timed_out = over_memory = False
        start = time.monotonic()
        deadline = start + limits.timeout
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env={},
            pass_fds=(program.fileno(), *fds.passed()),
            start_new_session=True,
            close_fds=True,
            **_drop_privileges(),
        )
        for fd in (token_fd, fds.info, fds.block):  # the box's ends: only bwrap holds them now
            if fd >= 0:
                os.close(fd)
                pipes.remove(fd)
        namespace = None
        try:
            if cgroup is not None:
                assert info is not None and block is not None
                # bwrap has made the sandbox's first process and waits (--block-fd) before it
                # sets anything up: put it in the cgroup, where all it starts will be born, then
                # let it go on
                try:
                    child = _sandbox_pid(info, deadline)
                except TimeoutError:
                    timed_out = True
                else:
                    if child is not None:
                        try:
                            cgroup.add(child)
                        except OSError as exc:
                            raise SandboxError(f"cannot put the sandbox in its cgroup {cgroup.path}: {exc}") from None
                        os.write(block, b"x")
            interval = 0.01
            while not timed_out:
                try:
                    rc = proc.wait(timeout=max(0.0, min(interval, deadline - time.monotonic())))
                    break
                except subprocess.TimeoutExpired:
                    pass
                if time.monotonic() >= deadline:
                    timed_out = True
                    break
                if cgroup is not None:
                    if cgroup.oom_kills():
                        over_memory = True
                        break
                elif budget is not None and box.monitor:
                    if namespace is None:
                        for child in _children(proc.pid):
                            ns = _namespace(child)
                            if ns is not None and ns != _namespace(proc.pid):
                                namespace = ns
                    if namespace is not None and _resident_bytes(namespace) > budget:
                        over_memory = True
                        break
                interval = min(0.05, interval * 1.5)
        finally:
            rc = _end(proc, cgroup)
        if cgroup is not None and cgroup.oom_kills():
            over_memory = True
        seconds = time.monotonic() - start
        stderr, stdout = _tail(err), _tail(out)
        signalled = _signalled(result, token)
    if rc == 70 and "bridge sandbox setup failed" in stderr:
        raise SandboxError(_last_error(stderr))
    return _classify(rc, stderr, seconds, limits, timed_out, over_memory, BWRAP, stdout, signalled)


def run_programs(
    sources: Sequence[str], limits: Limits = Limits(), workers: int | None = None, *, unsafe: bool = False
) -> list[Outcome]:
    """:func:`run_program` for each source, ``workers`` at a time (default: the CPU count); in order."""
    if not sources:
        return []
    workers = max(1, min(workers or os.cpu_count() or 1, len(sources)))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda s: run_program(s, limits, unsafe=unsafe), sources))


def isolation() -> str:
    """``bwrap`` when the sandbox works here, else what the unsafe runner would have."""
    return BWRAP if _probe()[0] is not None else UNSAFE_PREFIX + _unsafe_isolation()


# -- the unsafe runner (--unsafe-code-execution where bwrap is not available) --------------------


@functools.lru_cache(maxsize=None)
def namespace_prefix() -> tuple[str, ...]:
    """The ``unshare`` command line that gives a program new PID and network namespaces, or ``()``
    when that does not work here (or ``BRIDGE_SANDBOX_NAMESPACES=0``)."""
    if os.environ.get("BRIDGE_SANDBOX_NAMESPACES", "1") == "0":
        return ()
    exe = shutil.which("unshare")
    if exe is None:
        return ()
    candidates: list[tuple[str, ...]] = [(exe, "--pid", "--net", "--fork", "--kill-child")]
    if os.geteuid() != 0:
        candidates.insert(0, (exe, "--user", "--map-root-user", "--pid", "--net", "--fork", "--kill-child"))
    for prefix in candidates:
        try:
            done = subprocess.run(
                [*prefix, "true"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=10,
            )
        except (OSError, subprocess.SubprocessError):
            continue
        if done.returncode == 0:
            return prefix
    return ()


def _unsafe_isolation() -> str:
    return "pid+net namespaces" if namespace_prefix() else "process"


def _run_unsafe(source: str, limits: Limits) -> Outcome:
    """The damage-control runner: a separate interpreter with rlimits, unshare namespaces where they
    work and a Python-level guard. Not a security boundary (see docs/security.md)."""
    mem = limits.memory_mb * 2**20 if limits.memory_mb > 0 else -1
    cpu = int(limits.timeout) + 1
    fsize = limits.file_size_mb * 2**20 if limits.file_size_mb > 0 else -1
    prefix = namespace_prefix()
    with tempfile.TemporaryDirectory(prefix="bridge-exec-") as tmp:
        root = Path(tmp)
        program = root / "program.py"
        program.write_text(source, encoding="utf-8")
        work = root / "work"
        work.mkdir()
        env = {
            "PATH": "/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "HOME": str(work),
            "TMPDIR": str(work),
            "PYTHONHASHSEED": _hash_seed(),
        }
        # no -I/-E: the environment is ours alone, and PYTHONHASHSEED must take effect
        cmd = [
            *prefix,
            sys.executable,
            "-s",
            "-B",
            *(["-P"] if sys.version_info >= (3, 11) else []),
            "-c",
            _UNSAFE_RUNNER,
            str(program),
            str(work),
            str(mem),
            str(cpu),
            str(fsize),
        ]
        token = secrets.token_hex(16).encode()
        token_fd = _token_pipe(token)
        timed_out = False
        start = time.monotonic()
        with (
            open(root / "stdout", "wb") as out,
            open(root / "stderr", "wb") as err,
            tempfile.TemporaryFile() as result,
        ):
            try:
                proc = subprocess.Popen(
                    [*cmd, str(token_fd), str(result.fileno())],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    cwd=work,
                    env=env,
                    start_new_session=True,
                    close_fds=True,
                    pass_fds=(token_fd, result.fileno()),
                )
            finally:
                os.close(token_fd)
            try:
                rc = proc.wait(timeout=limits.timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                rc = _end(proc)  # its whole tree on a timeout; anything it left behind in its group
            signalled = _signalled(result, token)
        seconds = time.monotonic() - start
        stderr, stdout = _tail(root / "stderr"), _tail(root / "stdout")
    isolation = UNSAFE_PREFIX + _unsafe_isolation()
    return _classify(rc, stderr, seconds, limits, timed_out, False, isolation, stdout, signalled)
