"""Where a benchmark result came from: the commit of the checkout that made it, the header a result
file starts with (device, commit, command, date, library versions, the settings), a command line
with the ``--out`` it is written to, and the atomic JSON write.

Not part of the package: bench scripts in every folder import it from ``bench/``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def commit() -> str | None:
    """HEAD of this checkout, with ``+dirty`` when tracked files differ from it; None outside a git checkout."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
        )
    except OSError:
        return None
    sha = head.stdout.strip()
    if not sha:
        return None
    return sha + ("+dirty" if dirty.stdout.strip() else "")


def stamp(script: str, argv: list[str] | None = None) -> dict:
    """A script's run as it starts, the first keys of what it records: the commit, the date and the
    command (``python SCRIPT ARGS``, ``argv`` the arguments, default ``sys.argv[1:]``: no path of
    this machine)."""
    return {
        "commit": commit() or "unknown",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", script, *(argv if argv is not None else sys.argv[1:])]),
    }


def result_parser(doc: str, out: str | None) -> argparse.ArgumentParser:
    """A bench script's command line: its docstring ``doc`` as the help, as written, and ``--out``
    (default ``out``; None: no file is written)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=out, help=f"write the result as JSON here (default: {out or 'none'})")
    return ap


def device_name(device: str) -> str:
    """The card for a CUDA ``device``, else the CPU, its cores and torch's threads."""
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores, {torch.get_num_threads()} threads)"


def header(device: str) -> dict:
    """What a result file records first: the device and its name, the commit, the command, the date,
    and the torch and transformers versions."""
    import torch
    import transformers

    return {
        "device": device,
        "device_name": device_name(device),
        "commit": commit() or "unknown",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),  # "python ...": no path of this machine
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def settings(args, *names: str) -> dict:
    """The parsed command-line ``args`` named, as a result records its settings."""
    return {name: getattr(args, name) for name in names}


def write_json(path: str | Path | None, result: dict, indent: int = 2) -> None:
    """``result`` as JSON indented by ``indent`` at ``path`` (its folder made), in one rename: a killed
    run leaves the earlier file or none, never half of one. Nothing when ``path`` is None."""
    if not path:
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=indent, ensure_ascii=False) + "\n")
    tmp.replace(path)
    print(f"wrote {path}")


def finish(line: str, problems: list, summary: dict, path: str | Path | None, indent: int = 2) -> dict:
    """A checking run's end: its one-line count to stdout, each of its ``problems`` as a JSON line to
    stderr, its ``summary`` at ``path`` (:func:`write_json`); returns ``summary``."""
    print(line)
    for problem in problems:
        print(json.dumps(problem), file=sys.stderr)
    write_json(path, summary, indent)
    return summary


def named_files(ap: argparse.ArgumentParser, words: list[str]) -> dict[str, Path]:
    """``NAME=FILE`` words as {name: path}, in order; ``ap.error`` names a word of another shape or a FILE
    that is not there."""
    out = {}
    for word in words:
        name, sep, file = word.partition("=")
        if not sep or not name or not Path(file).is_file():
            ap.error(f"{word!r} is not NAME=FILE with an existing FILE")
        out[name] = Path(file)
    return out


def named_files_parser(doc: str, dest: str) -> argparse.ArgumentParser:
    """A diagnostic's command line: its docstring ``doc`` as the help, ``NAME=FILE`` words into ``dest``
    (:func:`named_files` reads them), ``--json`` (into ``out``) and ``--md`` (for :func:`report`)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(dest, nargs="+", metavar="NAME=FILE")
    ap.add_argument("--json", dest="out", help="write the result as JSON here")
    ap.add_argument("--md", type=Path, help="write the table as markdown here")
    return ap


def heading(title: str, header: dict) -> list[str]:
    """The first lines of a diagnostic's markdown: ``## title``, then the commit, date and command of
    ``header`` (:func:`header`)."""
    return [f"## {title}", "", f"commit {header['commit']}, {header['date']}. `{header['command']}`", ""]


def report(text: str, result: dict, json_path: str | Path | None, md_path: str | Path | None) -> None:
    """A diagnostic's markdown ``text`` to stdout and to ``md_path``, its ``result`` to ``json_path``, each
    file written in one rename (None: not written)."""
    print(text, end="")
    write_json(json_path, result)
    if md_path:
        tmp = Path(md_path).with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(md_path)
