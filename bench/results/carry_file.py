"""Carry a large file to a lent GPU machine in pieces, and rebuild it there (the tree a device call
carries is capped at 64 MiB (64 MB in practice), the project's own files included, so a 491 MB GGUF goes in about ten calls
to one warm machine).

Here (split):
    python3 bench/results/carry_file.py split FILE --name qwen --target /tmp/models/qwen.gguf [--mib N]
        -> .carry/qwen-01/ .. .carry/qwen-NN/, each one zstd piece plus the manifest (name, sha256 of
           FILE, pieces, target); carry one folder per device call. Without --mib a piece is as large
           as the 64 MiB cap allows beside the files every call carries (the git tree: tracked files and
           untracked ones git does not ignore), less 4 MB of headroom; the tree grows as results are
           committed, so check before a session and re-cut when a piece no longer fits:
    python3 bench/results/carry_file.py fits .carry/qwen-01           # exit 1: tree + piece over the cap
    python3 bench/results/carry_file.py resplit --name qwen [--mib N]  # the pieces re-cut to fit (no source
                                                                        file needed; the manifest's sha256 stays)
There (after each call, keep the piece; once all are there, rebuild):
    python3 bench/results/carry_file.py stash .carry/qwen-03          # copies it to /tmp/stash
    python3 bench/results/carry_file.py assemble [/tmp/stash]         # every complete file: target
                                                                        written, sha256 checked
Needs only the standard library and ``zstandard`` (a carried wheel on the device).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

STASH = Path("/tmp/stash")
ROOT = Path(__file__).resolve().parents[2]  # the checkout whose tree every device call carries
# The device tool says 64 MiB, but refused a tree of 66.7 MB (2026-11-29: a 45 MiB piece beside 19.5 MB of
# tracked files; 67.1 MB would be 64 MiB): take the cap as 64 MB
CAP_BYTES = 64_000_000
HEADROOM_BYTES = 4_000_000  # the tree grows with committed results between a split and the calls carrying it


def tree_bytes() -> int:
    """Bytes of what every device call carries: tracked files and untracked ones git does not ignore."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=True,
        capture_output=True,
        cwd=ROOT,
    ).stdout
    files = (ROOT / f for f in out.decode().split("\0") if f)
    return sum(f.stat().st_size for f in files if f.is_file())


def piece_mib(tree: int | None = None) -> int:
    """The largest whole-MiB piece that fits one call beside the tree, with HEADROOM_BYTES to spare."""
    tree = tree_bytes() if tree is None else tree
    mib = (CAP_BYTES - HEADROOM_BYTES - tree) >> 20
    if mib < 8:
        raise SystemExit(
            f"carry_file.py: the tree takes {tree / 1e6:.1f} MB of the {CAP_BYTES / 1e6:.0f} MB a call carries"
        )
    return mib


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def fits(folders: list[Path], tree: int | None = None) -> int:
    """0 when each folder fits one call beside the tree (the cap, no headroom), else 1, with a line each."""
    tree = tree_bytes() if tree is None else tree
    status = 0
    for folder in folders:
        total = tree + folder_bytes(folder)
        ok = total <= CAP_BYTES
        status |= not ok
        verdict = "fits" if ok else "too large: resplit"
        print(f"{folder}: {total / 1e6:.1f} MB with the tree ({tree / 1e6:.1f} MB): {verdict}", file=sys.stderr)
    return status


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def split(src: Path, name: str, target: str, mib: int | None, out: Path) -> int:
    import zstandard

    mib = mib or piece_mib()
    packed = out / f".{name}.zst"
    out.mkdir(parents=True, exist_ok=True)
    with open(src, "rb") as fin, open(packed, "wb") as fout:
        zstandard.ZstdCompressor(level=3, threads=-1).copy_stream(fin, fout)
    size, step = packed.stat().st_size, mib << 20
    count = (size + step - 1) // step
    manifest = {"name": name, "sha256": sha256(src), "bytes": src.stat().st_size, "pieces": count, "target": target}
    with open(packed, "rb") as fh:
        for k in range(1, count + 1):
            folder = out / f"{name}-{k:02d}"
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            (folder / f"{name}.zst.part{k:02d}").write_bytes(fh.read(step))
            (folder / f"{name}.manifest.json").write_text(json.dumps(manifest))
    packed.unlink()
    print(f"{src} ({manifest['bytes']:,} bytes) -> {count} pieces of <= {mib} MiB in {out}/{name}-NN/", file=sys.stderr)
    return 0


def resplit(name: str, mib: int | None, out: Path) -> int:
    """Re-cut the pieces out/NAME-NN/ (all of them, as their manifest counts) into pieces of ``mib`` MiB:
    the compressed stream and the manifest's sha256 of the source are unchanged, only ``pieces`` changes."""
    mib = mib or piece_mib()
    manifests = sorted(out.glob(f"{name}-[0-9][0-9]/{name}.manifest.json"))
    if not manifests:
        raise SystemExit(f"carry_file.py: no {out}/{name}-NN/{name}.manifest.json")
    manifest = json.loads(manifests[0].read_text())
    old = [out / f"{name}-{k:02d}" / f"{name}.zst.part{k:02d}" for k in range(1, manifest["pieces"] + 1)]
    missing = [str(p) for p in old if not p.is_file()]
    if missing:
        raise SystemExit(f"carry_file.py: pieces missing: {', '.join(missing)}")
    # the new pieces are written beside the old ones first, then take their place: stopped anywhere before
    # that, the old pieces are all still there
    staging = out / f".{name}-resplit"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    step = mib << 20
    manifest["pieces"] = count = (sum(p.stat().st_size for p in old) + step - 1) // step
    written = 0

    def write_piece(data: bytes) -> None:
        nonlocal written
        written += 1
        folder = staging / f"{name}-{written:02d}"
        folder.mkdir()
        (folder / f"{name}.zst.part{written:02d}").write_bytes(data)
        (folder / f"{name}.manifest.json").write_text(json.dumps(manifest))

    buf = bytearray()
    for p in old:
        with open(p, "rb") as fin:
            while block := fin.read(1 << 22):
                buf += block
                while len(buf) >= step:
                    write_piece(bytes(buf[:step]))
                    del buf[:step]
    if buf:
        write_piece(bytes(buf))
    assert written == count
    for folder in out.glob(f"{name}-[0-9][0-9]"):
        shutil.rmtree(folder)
    for folder in sorted(staging.iterdir()):
        folder.rename(out / folder.name)
    staging.rmdir()
    print(f"{name}: {len(old)} pieces -> {count} pieces of <= {mib} MiB in {out}/{name}-NN/", file=sys.stderr)
    return 0


def stash(folder: Path, into: Path = STASH) -> int:
    into.mkdir(parents=True, exist_ok=True)
    for f in folder.iterdir():
        shutil.copy2(f, into / f.name)
    print(f"stashed {', '.join(sorted(f.name for f in folder.iterdir()))}", file=sys.stderr)
    return 0


def assemble(into: Path = STASH) -> int:
    import zstandard

    status = 0
    for man in sorted(into.glob("*.manifest.json")):
        m = json.loads(man.read_text())
        parts = [into / f"{m['name']}.zst.part{k:02d}" for k in range(1, m["pieces"] + 1)]
        missing = [p.name for p in parts if not p.is_file()]
        target = Path(m["target"])
        if target.is_file() and target.stat().st_size == m["bytes"] and sha256(target) == m["sha256"]:
            print(f"{m['name']}: {target} already in place", file=sys.stderr)
            continue
        if missing:
            print(
                f"{m['name']}: waiting for {len(missing)} of {m['pieces']} pieces ({', '.join(missing)})",
                file=sys.stderr,
            )
            status = 3
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        dec = zstandard.ZstdDecompressor().decompressobj()
        with open(tmp, "wb") as out:
            for p in parts:
                out.write(dec.decompress(p.read_bytes()))
        got = sha256(tmp)
        if got != m["sha256"]:
            tmp.unlink()
            print(f"{m['name']}: sha256 {got} != {m['sha256']}: pieces damaged", file=sys.stderr)
            status = 4
            continue
        os.replace(tmp, target)
        print(f"{m['name']}: {target} ({m['bytes']:,} bytes, sha256 ok)", file=sys.stderr)
    return status


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("split")
    s.add_argument("file", type=Path)
    s.add_argument("--name", required=True)
    s.add_argument("--target", required=True, help="where the device writes the rebuilt file")
    s.add_argument("--mib", type=int, default=None, help="piece size (default: what fits beside the git tree)")
    s.add_argument("--out", type=Path, default=Path(".carry"))
    f = sub.add_parser("fits", help="does each folder fit one device call beside the tree?")
    f.add_argument("folders", type=Path, nargs="+")
    r = sub.add_parser("resplit", help="re-cut the pieces out/NAME-NN/ to a new size")
    r.add_argument("--name", required=True)
    r.add_argument("--mib", type=int, default=None, help="piece size (default: what fits beside the git tree)")
    r.add_argument("--out", type=Path, default=Path(".carry"))
    st = sub.add_parser("stash")
    st.add_argument("folders", type=Path, nargs="+")
    a = sub.add_parser("assemble")
    a.add_argument("stash", type=Path, nargs="?", default=STASH)
    args = ap.parse_args(argv)
    if args.cmd == "split":
        return split(args.file, args.name, args.target, args.mib, args.out)
    if args.cmd == "fits":
        return fits(args.folders)
    if args.cmd == "resplit":
        return resplit(args.name, args.mib, args.out)
    if args.cmd == "stash":
        return max(stash(f) for f in args.folders)
    return assemble(args.stash)


if __name__ == "__main__":
    sys.exit(main())
