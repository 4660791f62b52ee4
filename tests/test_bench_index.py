"""The benchmark record keeps its provenance: every file under bench/FOLDER/results/ is listed in that
folder's results/INDEX.json with what it measures, the card, the commit, the date and the command; every
listed file exists; every bench folder has a README; and every results file the docs name exists."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
#: folders whose results are not indexed yet (none)
PENDING: set[str] = set()
FIELDS = ("measures", "card", "commit", "date", "command")
FOLDERS = sorted(p.name for p in BENCH.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))


@pytest.mark.parametrize("folder", FOLDERS)
def test_each_folder_has_a_readme(folder):
    if folder in PENDING and not (BENCH / folder / "README.md").exists():
        pytest.skip(f"bench/{folder} has no README yet")
    assert (BENCH / folder / "README.md").is_file()


@pytest.mark.parametrize("folder", [f for f in FOLDERS if (BENCH / f / "results").is_dir()])
def test_every_result_file_has_its_provenance(folder):
    results = BENCH / folder / "results"
    index = results / "INDEX.json"
    if folder in PENDING and not index.exists():
        pytest.skip(f"bench/{folder}/results is not indexed yet")
    files = json.loads(index.read_text())["files"]
    on_disk = {p.relative_to(results).as_posix() for p in results.rglob("*") if p.is_file()} - {"INDEX.json"}
    assert sorted(on_disk - set(files)) == [], "results files missing from INDEX.json"
    assert sorted(set(files) - on_disk) == [], "INDEX.json lists files that are not there"
    for name, entry in files.items():
        assert all(isinstance(entry.get(k), str) and entry[k].strip() for k in FIELDS), (name, entry)
        assert re.fullmatch(r"[0-9a-f]{7,40}", entry["commit"]), (name, entry["commit"])
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", entry["date"]), (name, entry["date"])


def test_the_docs_name_only_results_files_that_exist():
    named = set()
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(BENCH.glob("*/README.md"))]:
        for m in re.finditer(r"bench/[\w.-]+/results/[\w./-]*[\w-]\.(?:json|txt|log|md)", doc.read_text()):
            named.add((doc.relative_to(ROOT).as_posix(), m.group()))
    assert named  # the pattern still finds what the docs cite
    assert sorted((doc, path) for doc, path in named if not (ROOT / path).is_file()) == []
