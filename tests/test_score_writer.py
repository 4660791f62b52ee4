"""bridge score's writer hand-off (modeling/score_loop.py): a window's examples go to the writer thread as
soon as every example before them is scored, and the window is committed once it is complete."""

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridgecli.modeling.score_loop import Window, WriterThread


@settings(max_examples=200, deadline=None)
@given(st.permutations(list(range(7))), st.integers(1, 4))
def test_window_hands_over_prefixes_in_input_order(order, batch):
    win = Window(list("abcdefg"), end=7)
    sent: list[str] = []
    for k in range(0, len(order), batch):
        for i in order[k : k + batch]:
            win.scored[i] = win.examples[i].upper()
        got = win.ready()
        sent += got
        # exactly the scored prefix has been sent, nothing after a gap
        prefix = 0
        while prefix < 7 and prefix in win.scored:
            prefix += 1
        assert len(sent) == prefix
    assert sent == list("ABCDEFG") and win.complete


class FakeWriter:
    def __init__(self, fail_at=None):
        self.log: list = []
        self.fail_at = fail_at

    def write(self, ex):
        if ex == self.fail_at:
            raise OSError("disk full")
        self.log.append(ex)


def test_writer_thread_writes_and_commits_in_order():
    w = FakeWriter()
    out = WriterThread(w, lambda writer, pos: writer.log.append(("commit", pos)), window=3)
    out.put(["a", "b"])
    out.put(["c"])
    out.commit(3)
    out.put(["d"])
    out.commit(4)
    out.close()
    assert w.log == ["a", "b", "c", ("commit", 3), "d", ("commit", 4)]
    assert out.first is not None


def test_writer_thread_bounds_what_waits():
    gate = threading.Event()
    w = FakeWriter()

    def slow_commit(writer, pos):
        gate.wait(5)
        writer.log.append(("commit", pos))

    out = WriterThread(w, slow_commit, window=2, depth=1)  # at most 2 examples wait
    out.put(["a"])
    out.commit(1)  # the thread blocks here until the gate opens
    out.put(["b", "c"])
    done = threading.Event()
    threading.Thread(target=lambda: (out.put(["d"]), done.set()), daemon=True).start()
    assert not done.wait(0.3)  # 2 queued: the third waits
    gate.set()
    assert done.wait(5)
    out.close()
    assert w.log == ["a", ("commit", 1), "b", "c", "d"]


def test_writer_error_is_raised_on_the_main_thread():
    out = WriterThread(FakeWriter(fail_at="b"), lambda writer, pos: None, window=4)
    out.put(["a", "b", "c"])
    with pytest.raises(OSError, match="disk full"):
        out.close()
