"""bench/results/carry_file.py: a file carried to a device machine in pieces, re-cut, and rebuilt."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("carry_file", ROOT / "bench/results/carry_file.py")
carry = importlib.util.module_from_spec(spec)
spec.loader.exec_module(carry)


def test_pieces_recut_to_another_size_rebuild_the_same_file(tmp_path):
    """A split into 1 MiB pieces, re-cut into 2 MiB pieces without the source (the 2026-11-29 session's
    pieces no longer fit beside a grown tree), stashed and assembled: the same bytes, sha256 checked."""
    src = tmp_path / "model.bin"
    src.write_bytes(os.urandom(3 << 20) + b"\0" * (1 << 20))  # random: the zstd stream stays about 3 MiB
    out, stash = tmp_path / "carry", tmp_path / "stash"
    target = tmp_path / "there" / "model.bin"
    assert carry.split(src, "m", str(target), 1, out) == 0
    assert len(list(out.glob("m-*"))) == 4
    assert carry.resplit("m", 2, out) == 0
    folders = sorted(out.glob("m-*"))
    assert [f.name for f in folders] == ["m-01", "m-02"]
    assert json.loads((folders[0] / "m.manifest.json").read_text())["pieces"] == 2
    assert carry.assemble(stash) == 0  # nothing stashed yet: no manifest, nothing to do
    carry.stash(folders[0], stash)
    assert carry.assemble(stash) == 3  # waiting for the second piece
    carry.stash(folders[1], stash)
    assert carry.assemble(stash) == 0
    assert target.read_bytes() == src.read_bytes()


def test_a_piece_fits_a_call_only_beside_a_small_enough_tree(tmp_path):
    piece = tmp_path / "m-01"
    piece.mkdir()
    (piece / "m.zst.part01").write_bytes(b"x" * 1000)
    assert carry.fits([piece], tree=carry.CAP_BYTES - 1000) == 0
    assert carry.fits([piece], tree=carry.CAP_BYTES - 999) == 1
    # the refused call of 2026-11-29: a 45 MiB piece beside 19.5 MB of tracked files
    assert carry.piece_mib(tree=19_528_935) == 38 < 45


def test_a_resplit_stopped_midway_leaves_the_old_pieces_whole(tmp_path, monkeypatch):
    src = tmp_path / "model.bin"
    src.write_bytes(os.urandom(3 << 20))
    out, stash = tmp_path / "carry", tmp_path / "stash"
    target = tmp_path / "there" / "model.bin"
    carry.split(src, "m", str(target), 1, out)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    calls = []
    real = carry.json.dumps

    def failing(obj, *args, **kwargs):  # the second new piece's manifest: as if the disk filled there
        calls.append(obj)
        if len(calls) == 2:
            raise OSError("no space left on device")
        return real(obj, *args, **kwargs)

    monkeypatch.setattr(carry.json, "dumps", failing)
    with pytest.raises(OSError):
        carry.resplit("m", 2, out)
    monkeypatch.undo()
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file() and ".m-resplit" not in str(p)}
    assert after == before
    assert carry.resplit("m", 2, out) == 0  # and a rerun finishes it
    for folder in sorted(out.glob("m-*")):
        carry.stash(folder, stash)
    assert carry.assemble(stash) == 0 and target.read_bytes() == src.read_bytes()
