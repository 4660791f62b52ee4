"""``bridge show`` (terminal and HTML, the page checked in headless Chromium when present) and
``bridge inspect --stats``, on a synthetic closure stream (no model needed)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from bridgecli.analysis.render import build_view, render_terminal
from bridgecli.cli.app import app
from bridgecli.core.budgets import budget
from bridgecli.core.closure import project, units_from_spans
from bridgecli.core.select import Surrogate, select
from bridgecli.data.shapes import to_pair
from bridgecli.data.tokenize import tokenize_pair
from bridgecli.format.records import Array, Closure, Example, Header, ModelInfo, Scores, Selection
from bridgecli.format.writer import open_writer

from tiny import RECORDS


def synthetic(tokenizer, rho: float = 0.5, closure: bool = True) -> list[Example]:
    """Examples with random scores, a BRIDGE selection and a sentence-unit closure."""
    rng = np.random.default_rng(0)
    out = []
    for i, rec in enumerate(RECORDS):
        tok = tokenize_pair(tokenizer, to_pair(rec, i + 10, f"line {i + 1}", "test"))
        ex = Example(id=f"ex{i}", index=i + 10, text=tok.text, tokens=tok.tokens)
        prompt, resp = ex.tokens.prompt_positions(), ex.tokens.response_positions()
        m, n = len(prompt), len(resp)
        a = rng.normal(size=n).astype(np.float32)
        A = (rng.dirichlet(np.ones(m + 1), size=n)[:, :m] * 0.7).astype(np.float16)
        c = rng.uniform(0, 0.3, size=n).astype(np.float32)
        scores = Scores(scorer="bridge", a=Array.of(a), c=Array.of(c), A=Array.of(A, "float16"),
                        loss=Array.of(rng.uniform(0.1, 3, size=n)))
        b_p, b_r = budget(rho, m), budget(rho, n)
        res = select(Surrogate.from_scores(a, c, A), b_p, b_r, "bridge", 4)
        sel = Selection(method="bridge", b_p=b_p, b_r=b_r, prompt_keep=prompt[res.prompt].tolist(),
                        response_keep=resp[res.response].tolist(), response_scores=Array.of(res.response_scores),
                        u_sur=res.u_sur)
        ex = Example(id=ex.id, index=ex.index, text=ex.text, tokens=ex.tokens, scores=scores, selection=sel)
        if closure:
            spans = ex.tokens.spans()[resp]
            off = int(spans[0, 0])
            text = ex.text[off:int(spans[-1, 1])]
            sentences = [(mt.start(), mt.end()) for mt in re.finditer(r"[^\n.]+[.\n]?", text)]
            units = units_from_spans(spans - off, sentences)
            proj = project(units, res.response_scores, b_r, 0.0)
            flat = [x for u in units for x in (int(resp[u[0]]), int(resp[u[-1]]) + 1)]
            ex = Example(id=ex.id, index=ex.index, text=ex.text, tokens=ex.tokens, scores=scores, selection=sel,
                         closure=Closure(segmenter="sentence", alpha=0.0, units=flat, chosen=proj.chosen.tolist(),
                                         supervise=resp[proj.supervise].tolist()))
        out.append(ex)
    return out


def write_stream(path: Path, exs: list[Example], stage: str) -> Path:
    header = Header(stage=stage, producer="test", created="2026-01-01T00:00:00+00:00",
                    model=ModelInfo(source="test", fingerprint="sha256:0", tokenizer_fingerprint="sha256:0"))
    with open_writer(path, header) as w:
        for ex in exs:
            w.write(ex)
    return path


@pytest.fixture(scope="module")
def stream(tmp_path_factory, tokenizer):
    d = tmp_path_factory.mktemp("show")
    return write_stream(d / "closed.bridge", synthetic(tokenizer), "closure")


def test_view_marks_what_the_selection_keeps(tokenizer):
    ex = synthetic(tokenizer)[1]
    view = build_view(ex)
    by_pos = {t.pos: t for t in view.tokens}
    keep, sup = set(ex.selection.prompt_keep), set(ex.closure.supervise)
    for p in ex.tokens.prompt_positions():
        assert by_pos[int(p)].kind == "prompt" and by_pos[int(p)].kept == (int(p) in keep)
        assert "Delta_p(i|S_r)" in by_pos[int(p)].info
    for p in ex.tokens.response_positions():
        t = by_pos[int(p)]
        assert t.kept == (int(p) in sup) and t.unit is not None and 0 <= t.strength <= 1
        assert "a_j" in t.info and "Delta_r(j|S_p)" in t.info
    assert sum(t.unit_start for t in view.tokens) == len(ex.closure.units) // 2
    assert "".join(t.text for t in view.tokens) == ex.text


def test_terminal_rendering(tokenizer):
    from rich.console import Console

    ex = synthetic(tokenizer)[0]
    console = Console(record=True, width=100, color_system="truecolor", force_terminal=True)
    console.print(render_terminal(build_view(ex)))
    text = console.export_text(clear=False)
    assert "example ex0 (index 10, stage closure)" in text and "dropped prompt" in text
    assert "How many apples" in text.replace("┊", "")
    ansi = console.export_text(styles=True)
    assert re.search(r"\x1b\[[0-9;]*\b9[;m]", ansi)  # strike-through (SGR 9) is used


def test_show_command_and_html(stream, tmp_path):
    page = tmp_path / "show.html"
    result = CliRunner().invoke(app, ["show", str(stream), "--index", "11", "--html", str(page)])
    assert result.exit_code == 0, result.output
    assert "example ex1 (index 11" in result.stdout
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>") and "<script" not in html and "http" not in html  # self-contained
    assert html.count('class="tok prompt dropped"') > 0 and html.count('class="tok prompt kept"') > 0
    assert html.count('class="tok response sup"') > 0 and 'class="unit chosen"' in html
    assert re.search(r'title="position: \d+&#10;supervised: yes&#10;Delta_r\(j\|S_p\): ', html)
    bad = CliRunner().invoke(app, ["show", str(stream), "--index", "99"])
    assert bad.exit_code == 2 and "no example with index 99 (first ones: 10, 11, 12)" in bad.output
    by_id = CliRunner().invoke(app, ["show", str(stream), "--id", "ex2"])
    assert by_id.exit_code == 0 and "example ex2" in by_id.stdout


@pytest.mark.integration  # draws the plots (seconds)
def test_inspect_stats(stream, tmp_path, tokenizer):
    png = tmp_path / "stats.png"
    result = CliRunner().invoke(app, ["inspect", "--stats", "--json", str(stream), "--png", str(png)])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    d = out["distributions"]
    assert out["examples"] == 3
    assert d["prompt kept ratio"]["count"] == 3 and 0.5 <= d["prompt kept ratio"]["min"] <= 0.6
    assert d["closure unit size"]["count"] > 3 and d["U_sur relative gain over rounds"]["min"] >= 0
    assert sum(d["closure unit size"]["histogram"]["counts"]) == d["closure unit size"]["count"]
    assert len(out["u_sur_mean_trajectory"]) == 8
    tc = out["token_classes"]  # retention per token class: counts add up to the eligible tokens and the kept sets
    exs = synthetic(tokenizer)
    assert tc["response_set"] == "closure"
    assert sum(c["tokens"] for c in tc["prompt"].values()) == sum(len(e.tokens.prompt_positions()) for e in exs)
    assert sum(c["kept"] for c in tc["prompt"].values()) == sum(len(e.selection.prompt_keep) for e in exs)
    assert sum(c["kept"] for c in tc["response"].values()) == sum(len(e.closure.supervise) for e in exs)
    assert png.stat().st_size > 5000 and _variance(png) > 1.0
    table = CliRunner().invoke(app, ["inspect", "--stats", str(stream)], env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "closure unit size" in table.stdout
    assert "retention per token class" in table.stdout and "space/punct" in table.stdout
    sel_only = write_stream(tmp_path / "sel.bridge", synthetic(tokenizer, closure=False), "selection")
    plain = CliRunner().invoke(app, ["inspect", "--stats", "--json", str(sel_only)])
    assert "closure unit size" not in json.loads(plain.stdout)["distributions"]


def _variance(png: Path) -> float:
    from PIL import Image

    img = np.asarray(Image.open(png).convert("L"), dtype=np.float64)
    return float(img.var())


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.mark.integration  # starts headless Chromium
@pytest.mark.skipif(_chromium() is None, reason="no Chromium here (Debian: apt-get install -y chromium)")
def test_html_renders_in_headless_chromium(stream, tmp_path):
    page = tmp_path / "show.html"
    assert CliRunner().invoke(app, ["show", str(stream), "--index", "10", "--html", str(page)]).exit_code == 0
    shot = tmp_path / "shot.png"
    base = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--no-first-run", "--disable-extensions", f"--user-data-dir={tmp_path / 'profile'}"]
    url = page.resolve().as_uri()
    dom = subprocess.run([*base, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'id="example"' in dom.stdout and dom.stdout.count("tok prompt dropped") > 0
    assert "tok response sup" in dom.stdout and "unit chosen" in dom.stdout
    proc = subprocess.run([*base, "--hide-scrollbars", "--window-size=1000,700", f"--screenshot={shot}", url],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and shot.exists(), proc.stderr[-2000:]
    from PIL import Image

    img = np.asarray(Image.open(shot).convert("RGB"), dtype=np.float64)
    assert img.shape[:2] == (700, 1000)
    assert img.var() > 50.0  # not blank: text and highlights were drawn
    # the supervised highlights are there: some clearly green pixels
    green = (img[..., 1] > img[..., 0] + 30) & (img[..., 1] > img[..., 2] + 30)
    assert green.sum() > 100


GOLDEN = Path(__file__).resolve().parent / "golden" / "v1.3-closure.bridge"


@pytest.mark.parametrize("damage", ["two streams", "a garbage byte", "a zstd frame", "cut short"])
def test_show_refuses_what_every_other_command_refuses(tmp_path, damage):
    # issue 40: `show --html --index 0` stopped reading at the example it wanted and accepted streams with
    # something wrong after it, which every other command refuses
    import zstandard

    data = GOLDEN.read_bytes()
    bad = tmp_path / "bad.bridge"
    bad.write_bytes({
        "two streams": data + data,
        "a garbage byte": data + b"\x00",
        "a zstd frame": data + zstandard.ZstdCompressor().compress(b"more"),
        "cut short": data[: len(data) - 40],
    }[damage])
    page = tmp_path / "page.html"
    for args in (["show", str(bad), "--index", "0", "--html", str(page)], ["inspect", str(bad)]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 3, (args[0], result.output)
        assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1, result.output
    assert not page.exists()
    assert CliRunner().invoke(app, ["show", str(GOLDEN), "--index", "0", "--html", str(page)]).exit_code == 0
    assert page.exists()
