"""The Python programs the code sandbox (:mod:`.sandbox`) starts: the runner inside the bubblewrap
box, the unsafe runner, and the probe that checks a box works. Each is passed to the interpreter
with ``-c``; the program under test is never part of them (the runners read it from a file).

Both runners end the same way (:data:`_EXECUTE`): execute the program with fresh globals, print a
traceback for an exception, flush stdout and stderr, and write the run's token to the result file
only when the program's last statement (the test's check) has returned: the success signal. Their
exit status says the rest: 0 done, 1 exception (traceback on stderr), 3 SystemExit. The token is a
local of the runner's function, never in the program's text, files, arguments or environment."""

from __future__ import annotations

import os

# The shared end of both runners, inside a function that holds ``source``, ``token``,
# ``result_fd`` and the ``_exit``/``_write`` it saved before anything could replace them.
# ``__builtins__`` is the builtins module here (a ``-c`` program's ``__main__``): the unsafe
# runner's guarded one.
_EXECUTE = r"""
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
"""

# The runner inside the box: it reads the run's token from a pipe (then closes it), sets the limits
# on itself (inside the new user namespace, so that RLIMIT_NPROC counts only this box's processes),
# and executes the program. Exit status 70: the setup failed (the program did not run).
BOX_RUNNER = (
    r"""
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
    _exit, _write = os._exit, os.write"""
    + _EXECUTE
    + "main()\n"
)

# The unsafe runner (no bwrap, --unsafe-code-execution): PID 1 of the namespace when there is one.
# It forks and closes the token pipe and the result file; the child reads the token, sets the
# limits, installs the guard (a Python-level one, not a security boundary) and executes the
# program. The runner waits and reports through its exit code: the child's, or 128+N when it was
# killed by signal N.
UNSAFE_RUNNER = (
    r"""
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
    _close(token_fd)"""
    + _EXECUTE
    + "_run(source)\n"
)

# What the probe prints from inside a box: the interpreter's version, the uid it runs as, a string
# hash (PYTHONHASHSEED honoured) and whether memfd_create is refused (the seccomp filter holds).
PROBE = """import sys, os
try:
    os.close(os.memfd_create("probe"))
    memfd = "open"
except (AttributeError, OSError):
    memfd = "refused"
print(sys.version.split()[0], os.getuid(), hash('bridge'), memfd)
"""


def hash_seed() -> str:
    """The PYTHONHASHSEED a program runs with: the evaluator's when it is a number the interpreter
    accepts, else 0."""
    value = os.environ.get("PYTHONHASHSEED", "").strip()
    return value if value.isdigit() and int(value) <= 4294967295 else "0"
