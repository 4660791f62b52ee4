"""The sandbox's runner in this process: the codec between the program's process and the checker,
the messages on a pipe, and how the checker resolves the test's names and judges handles. (Running
programs in the sandbox: tests/test_sandbox.py and tests/test_eval_code.py.)"""

from __future__ import annotations

import json
import math
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridgecli.evaluation import sandbox_runner as r

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text() | st.binary()
values = st.recursive(
    scalars | st.complex_numbers(allow_nan=False),
    lambda inner: st.lists(inner, max_size=4)
    | st.tuples(inner, inner)
    | st.frozensets(scalars, max_size=4)
    | st.sets(scalars, max_size=4)
    | st.dictionaries(scalars, inner, max_size=4),
    max_leaves=20,
)


def _no_handles(value):
    raise AssertionError(f"not plain: {value!r}")


def _no_refs(tag, items):
    raise AssertionError(f"a reference: {tag} {items}")


def _same(a, b) -> bool:
    """Equal, with the same types all the way down (1 == 1.0 == True would hide a lost type)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return a == b


@settings(max_examples=300, deadline=None)
@given(values)
def test_plain_values_round_trip_through_json(value):
    wire = json.loads(json.dumps(r.encode(value, _no_handles)))
    assert _same(r.decode(wire, _no_refs), value)


def test_special_values():
    for value in (math.inf, -math.inf, 2**64, -(2**64) - 1, 2**10000, bytearray(b"x"), "\ud800", 1j):
        assert _same(r.decode(json.loads(json.dumps(r.encode(value, _no_handles))), _no_refs), value)
    nan = r.decode(json.loads(json.dumps(r.encode(math.nan, _no_handles))), _no_refs)
    assert math.isnan(nan)
    deep: list = []
    for _ in range(r.MAX_DEPTH + 5):
        deep = [deep]
    assert r.encode(deep, lambda v: ["h", 0, "list"])[1][1][1] != ["h", 0, "list"]  # cut far below
    assert r.plain(True) is True and r.plain(type("E", (int,), {})(3)) == 3 and r.plain(object()) is None


@settings(max_examples=300, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=3),
                    lambda inner: st.lists(inner, max_size=4), max_leaves=15))
def test_decode_refuses_what_is_not_a_value(data):
    # whatever the program sends, the checker gets a value or a ProtocolError, nothing else
    try:
        r.decode(data, lambda tag, items: object())
    except r.ProtocolError:
        pass


def test_messages_on_a_pipe():
    read, write = os.pipe()
    try:
        r.send(write, ["ok", r.encode({"a": [1, 2.5]}, _no_handles)])
        assert r.receive(read) == ["ok", ["d", "a", ["l", 1, 2.5]]]
        os.write(write, (10).to_bytes(8, "big") + b"not json!!")
        with pytest.raises(r.ProtocolError):
            r.receive(read)
        os.write(write, (2**62).to_bytes(8, "big"))
        with pytest.raises(r.ProtocolError, match="bytes"):
            r.receive(read)
    finally:
        os.close(write)
    with pytest.raises(EOFError):
        r.receive(read)
    os.close(read)


class _FakeLink:
    """The checker's link, answering from a dict of the program's names (no process)."""

    def __init__(self, names):
        self.names, self.asked = names, []

    def ask(self, op, *args):
        self.asked.append((op, *args))
        if args[0] in self.names:
            return self.names[args[0]]
        raise NameError(args[0])


def test_the_tests_names_resolve_in_order():
    link = _FakeLink({"sum": "the program's sum", "inc": "the program's inc", "len": "the program's len"})
    ns = r._TestNamespace(link, ["sum"])
    exec("mine = 1", ns)
    assert ns["mine"] == 1 and link.asked == []  # the test's own names stay its own
    assert ns["sum"] == "the program's sum"  # a name under test first, though it shadows a builtin
    assert ns["len"] is len  # any other builtin is the checker's: the program cannot replace it
    assert ns["inc"] == "the program's inc"  # the rest: looked up in the program
    with pytest.raises(KeyError):
        ns["nothing"]
    assert r._TestNamespace(_FakeLink({}), ["sum"])["sum"] is sum  # not defined there: the builtin


def test_a_handle_is_never_judged_by_the_program():
    link = _FakeLink({})
    link.ask = lambda op, *args: {"bool": True, "len": 3, "str": "s", "repr": 5}[op]  # type: ignore[method-assign]
    handle = r.Remote(link, 0, "Anything")  # type: ignore[arg-type]
    other = r.Remote(link, 1, "Anything")  # type: ignore[arg-type]
    assert handle == handle and handle != other and handle != 999 and not (handle == 999)
    with pytest.raises(TypeError):
        handle < 1  # noqa: B015
    assert bool(handle) is True and len(handle) == 3 and str(handle) == "s"
    assert repr(handle) == "<Anything of the program>"  # a repr that is no str falls back
    with pytest.raises(AttributeError):
        handle.__eq__self  # noqa: B018
    with pytest.raises(TypeError, match="cannot be passed"):
        r._Link(0, 0, 0).encode([lambda: 1])
    assert r._Link(0, 0, 0).encode([int, math]) == ["l", ["n", "int"], ["m", "math"]]


def test_exceptions_the_program_reports():
    assert type(r._exception("ValueError", "no")) is ValueError and str(r._exception("ValueError", "no")) == "no"
    assert type(r._exception("SystemExit", "0")) is SystemExit
    made = r._exception("MyError", "x")
    assert type(made).__name__ == "MyError" and isinstance(made, Exception)
    assert type(r._exception("not a name!", "x")).__name__ == "ProgramError"
    assert type(r._exception("print", "x")).__name__ == "print"  # a builtin that is no exception: made
