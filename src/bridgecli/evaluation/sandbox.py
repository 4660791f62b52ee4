"""Run untrusted Python (model-written code plus its tests) in a separate, limited process.

Nothing generated ever runs in the calling process. Each program gets:

- its own interpreter: ``sys.executable -I -B`` (isolated mode: no user site, no PYTHON* variables,
  no script folder on ``sys.path``), stdin closed, an environment of just PATH/LANG/HOME/TMPDIR;
- a fresh temporary folder as working directory (and HOME/TMPDIR), deleted afterwards;
- a wall-clock timeout (default 10 s) after which its whole process group is SIGKILLed;
- ``resource`` limits: address space (default 1 GiB), CPU seconds (timeout + 1), file size
  (16 MiB, stdout/stderr included), no core files;
- when ``unshare`` works here (root, or unprivileged user namespaces): new PID and network
  namespaces, so it has no network and cannot see or signal any process outside (the runner is
  its PID 1);
- an in-process guard, in the spirit of OpenAI human-eval's ``reliability_guard``: destructive
  or escaping functions (``os.kill``, ``os.fork``, ``os.system``, ``subprocess.Popen``,
  ``shutil.rmtree``, ``os.remove``, ...) are set to None, and ``open``/``os.open`` refuse to write
  outside the working folder.

This is damage control for buggy or confused model output, not a security boundary: the guard is
Python-level and a determined program can undo it (ctypes, reloading modules), and without
namespaces a program runs with the evaluator's user and file permissions (root, on a root shell).
For code you do not trust at all, run the evaluation in a container or VM.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

# Statuses of an execution
PASSED, FAILED, TIMEOUT, MEMORY, KILLED = "passed", "failed", "timeout", "memory", "killed"

# The runner: PID 1 of the namespace when there is one. It forks; the child sets the limits,
# installs the guard and executes the program; the runner waits and reports through its exit code:
# 0 passed, 1 exception (traceback on stderr), 3 SystemExit, 128+N killed by signal N.
_RUNNER = r'''
import os, sys
program, work, mem, cpu, fsize = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
pid = os.fork()
if pid:
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
_exit = os._exit
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
try:
    exec(compile(source, "program.py", "exec"), {"__name__": "__main__", "__builtins__": builtins})
except SystemExit:
    traceback.print_exc()
    sys.stderr.flush()
    _exit(3)
except BaseException:
    traceback.print_exc()
    sys.stderr.flush()
    _exit(1)
sys.stdout.flush()
sys.stderr.flush()
_exit(0)
'''


@dataclass(frozen=True)
class Limits:
    timeout: float = 10.0  # wall-clock seconds
    memory_mb: int = 1024  # address space
    file_size_mb: int = 16  # largest file it may write (stdout/stderr included)


@dataclass(frozen=True)
class Outcome:
    status: str  # passed, failed, timeout, memory, killed
    returncode: int | None
    seconds: float
    error: str  # last line of the traceback (or what happened), "" when passed
    stderr: str  # its tail
    isolation: str  # "pid+net namespaces" or "process"

    @property
    def passed(self) -> bool:
        return self.status == PASSED

    def to_dict(self) -> dict:
        return asdict(self)


@functools.lru_cache(maxsize=None)
def namespace_prefix() -> tuple[str, ...]:
    """The ``unshare`` command line that gives a program new PID and network namespaces, or ``()``
    when that does not work here (or ``BRIDGE_SANDBOX_NAMESPACES=0``)."""
    if os.environ.get("BRIDGE_SANDBOX_NAMESPACES", "1") == "0":
        return ()
    exe = shutil.which("unshare")
    if exe is None:
        return ()
    candidates = [(exe, "--pid", "--net", "--fork", "--kill-child")]
    if os.geteuid() != 0:
        candidates.insert(0, (exe, "--user", "--map-root-user", "--pid", "--net", "--fork", "--kill-child"))
    for prefix in candidates:
        try:
            done = subprocess.run([*prefix, "true"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, timeout=10)
        except (OSError, subprocess.SubprocessError):
            continue
        if done.returncode == 0:
            return prefix
    return ()


def isolation() -> str:
    return "pid+net namespaces" if namespace_prefix() else "process"


def _tail(path: Path, limit: int = 2000) -> str:
    try:
        with open(path, "rb") as fh:
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


def run_program(source: str, limits: Limits = Limits()) -> Outcome:
    """Execute ``source`` as a script under the limits above; never raises for what the program does."""
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
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(work), "TMPDIR": str(work),
               "PYTHONHASHSEED": "0"}
        cmd = [*prefix, sys.executable, "-I", "-B", "-c", _RUNNER, str(program), str(work), str(mem), str(cpu),
               str(fsize)]
        timed_out = False
        start = time.monotonic()
        with open(root / "stdout", "wb") as out, open(root / "stderr", "wb") as err:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=work, env=env,
                                    start_new_session=True, close_fds=True)
            try:
                rc = proc.wait(timeout=limits.timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc.pid)
                rc = proc.wait()
            finally:
                _kill_group(proc.pid)  # anything it left behind in its group
        seconds = time.monotonic() - start
        stderr = _tail(root / "stderr")
    error = _last_error(stderr)
    if timed_out:
        status, error = TIMEOUT, f"timed out after {limits.timeout:g} s"
    elif rc == 0:
        status, error = PASSED, ""
    elif "MemoryError" in error:
        status = MEMORY
    elif rc in (1, 3):
        status = FAILED
    else:
        signum = rc - 128 if rc > 128 else -rc if rc < 0 else None
        name = signal.Signals(signum).name if signum and signum in signal.Signals._value2member_map_ else None
        if name == "SIGXCPU" or (name == "SIGKILL" and seconds >= cpu - 0.5):
            status, error = TIMEOUT, f"CPU time limit ({cpu} s) exceeded"
        elif name == "SIGXFSZ":
            status, error = KILLED, f"file size limit ({limits.file_size_mb} MiB) exceeded"
        elif name is not None:
            status, error = (MEMORY if name in ("SIGSEGV", "SIGBUS") and not error else KILLED), f"killed by {name}"
        else:
            status, error = FAILED, error or f"exit status {rc}"
    return Outcome(status, rc, round(seconds, 3), error, stderr, isolation())


def run_programs(sources: Sequence[str], limits: Limits = Limits(), workers: int | None = None) -> list[Outcome]:
    """:func:`run_program` for each source, ``workers`` at a time (default: the CPU count); in order."""
    if not sources:
        return []
    workers = max(1, min(workers or os.cpu_count() or 1, len(sources)))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda s: run_program(s, limits), sources))
