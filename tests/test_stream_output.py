"""runtime/stream_output.py: one object for where a step writes. Standard output holds nothing back that
could look valid after a failure, and a failure once bytes went out says the output is incomplete; a
file appears whole or not at all; a resumable file keeps its committed windows after an error and,
interrupted, every record written, as a commit a resumed run continues from."""

from __future__ import annotations

import pytest

from bridgecli.errors import FormatError, UsageError
from bridgecli.format.reader import open_reader
from bridgecli.format.records import Example, Header, ModelInfo, Tokens
from bridgecli.runtime.stream_output import HOLD, StreamOutput

HEADER = Header(stage="tokens", producer="test", created="", model=ModelInfo("m", "f", "t"))


def example(i: int) -> Example:
    return Example(id=f"x{i}", index=i, text="", tokens=Tokens(input_ids=[1, 2], kinds=bytes([2, 3]), offsets=[0] * 4))


def test_stdout_holds_back_until_the_first_commit(capsysbinary):
    out = StreamOutput("-")
    with pytest.raises(FormatError) as info:
        with out.writing(HEADER) as writer:
            writer.write(example(0))
            raise FormatError("bad record", record=1)
    assert capsysbinary.readouterr().out == b""  # nothing that looks like a stream went out
    assert "incomplete" not in str(info.value)


def test_a_failure_after_bytes_went_out_says_the_output_is_incomplete(capsysbinary):
    out = StreamOutput("-", resumable=True)  # stdout: frames at commits, as score writes them
    with pytest.raises(FormatError) as info:
        with out.writing(HEADER) as writer:
            writer.write(example(0))
            out.commit(writer, 1)
            writer.write(example(1))
            raise FormatError("bad record", record=1)
    sent = capsysbinary.readouterr().out
    assert sent and str(info.value).endswith(f"the output on stdout is incomplete ({len(sent):,} bytes went out before this)")
    assert "\n" not in str(info.value)


def test_a_stream_on_stdout_that_ends_is_whole(capsysbinary, tmp_path):
    with StreamOutput("-").writing(HEADER) as writer:
        for i in range(3):
            writer.write(example(i))
    (tmp_path / "s.bridge").write_bytes(capsysbinary.readouterr().out)
    with open_reader(str(tmp_path / "s.bridge")) as reader:
        assert [ex.index for ex in reader] == [0, 1, 2]


def test_a_long_stream_goes_out_after_the_hold(capsysbinary):
    """Without commits (select, close), the stream is held back for its first HOLD bytes only."""
    import os

    sent = b""
    with pytest.raises(KeyboardInterrupt):
        with StreamOutput("-").writing(HEADER) as writer:
            for i in range(100_000):  # records that hardly compress: about 2 KB each
                writer.write(Example(id=f"x{i}", index=i, text=os.urandom(1000).hex(), tokens=example(i).tokens))
                sent = capsysbinary.readouterr().out
                if sent:
                    raise KeyboardInterrupt
    assert len(sent) >= HOLD and writer.count < 2 * HOLD // 2000
    assert b"the output on stdout is incomplete" in capsysbinary.readouterr().err


def test_a_file_appears_only_whole(tmp_path):
    out = tmp_path / "o.bridge"
    with pytest.raises(FormatError):
        with StreamOutput(str(out)).writing(HEADER) as writer:
            writer.write(example(0))
            raise FormatError("bad")
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_the_checks_come_before_anything_is_written(tmp_path):
    with pytest.raises(UsageError, match="--resume needs an output file"):
        StreamOutput("-", resumable=True, resume=True)
    with pytest.raises(UsageError, match="a folder"):
        StreamOutput(str(tmp_path))


@pytest.mark.parametrize("stop, kept", [(KeyboardInterrupt, 5), (SystemExit(143), 5), (FormatError("bad"), 3)])
def test_an_interrupt_keeps_every_record_written_an_error_the_committed_windows(tmp_path, capsys, stop, kept):
    out = tmp_path / "o.bridge"
    first = StreamOutput(str(out), resumable=True, inputs_one_for_one=True)
    with pytest.raises(type(stop) if isinstance(stop, BaseException) else stop):
        with first.writing(HEADER) as writer:
            for i in range(3):
                writer.write(example(i))
            first.commit(writer, 3)  # a window of three
            writer.write(example(3))
            writer.write(example(4))  # two of the next window
            raise stop
    err = capsys.readouterr().err
    assert f"kept {kept} scored examples ({kept} inputs done)" in err and "--resume" in err
    assert err.startswith("interrupted: ") == (kept == 5)
    again = StreamOutput(str(out), resumable=True, resume=True, inputs_one_for_one=True)
    with again.writing(HEADER) as writer:
        assert again.skip == kept and writer.count == kept
        for i in range(kept, 7):
            writer.write(example(i))
        again.commit(writer, 7)
    with open_reader(str(out)) as reader:
        assert [ex.index for ex in reader] == list(range(7))


def test_an_interrupt_before_any_record_keeps_nothing(tmp_path, capsys):
    out = tmp_path / "o.bridge"
    with pytest.raises(KeyboardInterrupt):
        with StreamOutput(str(out), resumable=True, inputs_one_for_one=True).writing(HEADER):
            raise KeyboardInterrupt
    assert "interrupted before any example was written" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
