"""What `ablate compare` writes where a user pastes it (ablate/tables/render.py): csv, markdown and
LaTeX as they are, --where filters and --per-seed rows, and no variant name cut at 80 columns."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest

from ablate.analysis import compare_dirs
from ablate.analysis.columns import print_comparison
from compare_fixtures import BASE, LONG_NAME, PAIRED, by_name, cli
from conftest import run_ablate


def test_csv_markdown_and_latex_paste_as_they_are(compare_runs):
    rows = by_name(compare_dirs([compare_runs]))
    res = cli("compare", str(compare_runs), "--format", "csv")
    assert res.exit_code == 0, res.stderr
    table = list(csv.DictReader(io.StringIO(res.stdout)))  # stdout is CSV only
    got = {r["variant"]: r for r in table}
    assert list(got) == [r for r in rows]
    assert float(got["norm=rmsnorm"]["ci_low"]) == pytest.approx(rows["norm=rmsnorm"]["ci_low"])
    assert float(got["norm=rmsnorm"]["p_holm"]) == pytest.approx(rows["norm=rmsnorm"]["p_holm"])
    assert got["norm=rmsnorm"]["verdict"] == "better" and got["baseline"]["delta"] == ""
    assert "baseline: baseline (no axis changed)" in res.stderr

    md = cli("compare", str(compare_runs), "--format", "markdown").stdout.splitlines()
    head = next(i for i, line in enumerate(md) if line.startswith("| variant |"))
    assert md[0].startswith("baseline: baseline") and md[head + 1].startswith("|---|")
    body = [line for line in md[head + 2:] if line.startswith("| ")]
    assert len(body) == 3 and all(line.count(" | ") == md[head].count(" | ") for line in body)
    rms = next(line for line in body if line.startswith("| norm=rmsnorm |"))
    assert f"[{rows['norm=rmsnorm']['ci_low']:+.4f}, {rows['norm=rmsnorm']['ci_high']:+.4f}]" in rms
    assert "yes, better" in rms

    tex = cli("compare", str(compare_runs), "--format", "latex").stdout
    assert r"\begin{tabular}{lrrrrrrlrrrrl}" in tex and r"\bottomrule" in tex
    assert r"qk\_norm=on" in tex and r"$\Delta$ vs baseline" in tex
    body = tex[tex.index(r"\begin{tabular}"):tex.index(r"\end{tabular}")]
    plain = re.sub(r"\$\\[A-Za-z]+\$", "", body)  # $\Delta$, $\pm$ ... are meant
    assert not re.search(r"(?<!\\)[_%#$]", plain)  # every other special character escaped
    res = cli("compare", str(compare_runs), "--format", "html")
    assert res.exit_code == 2 and "--format html: choose one of table, csv, markdown, latex" in res.stderr


def test_where_filters_and_per_seed_rows(compare_runs):
    res = cli("compare", str(compare_runs), "--where", "norm=layernorm", "--where", "act=gelu", "--json")
    data = json.loads(res.stdout)
    assert len(data) == 1 and data[0]["n"] == 3 and data[0]["axes"]["norm"] == "layernorm"
    res = cli("compare", str(compare_runs), "--where", "norm=rmsnorm,layernorm", "--where", "seed=0,1", "--json")
    data = json.loads(res.stdout)
    assert [(r["variant"], r["n"]) for r in data] == [("baseline", 2), ("norm=rmsnorm", 2)]  # LONG ran seeds 3-5
    res = cli("compare", str(compare_runs), "--where", "colour=red")
    assert res.exit_code == 2 and "no run has 'colour'" in res.stderr and len(res.stderr.splitlines()) == 1
    res = cli("compare", str(compare_runs), "--where", "norm=groupnorm")
    assert res.exit_code == 2 and "no run matches --where norm=groupnorm" in res.stderr

    res = cli("compare", str(compare_runs), "--per-seed", "--json")
    seeds = json.loads(res.stdout)
    assert len(seeds) == 9 and {r["variant"] for r in seeds} == {"baseline", "norm=rmsnorm", LONG_NAME}
    rms0 = next(r for r in seeds if r["variant"] == "norm=rmsnorm" and r["seed"] == 0)
    assert rms0["delta"] == pytest.approx(PAIRED[0] - BASE[0])  # against the baseline's seed 0
    assert all(r["delta"] is None for r in seeds if r["variant"] == LONG_NAME)  # no seed in common
    out = cli("compare", str(compare_runs), "--per-seed", "--format", "csv").stdout
    assert len(list(csv.DictReader(io.StringIO(out)))) == 9


def test_names_are_never_cut_at_80_columns(compare_runs):
    # piped (not a TTY), COLUMNS=80: a wide table, every name whole
    res = run_ablate("compare", str(compare_runs), env={"COLUMNS": "80"})
    assert res.returncode == 0, res.stderr
    assert LONG_NAME in res.stdout and "…" not in res.stdout
    # a real 80-column terminal: one block per variant, nothing longer than 80, nothing cut
    from rich.console import Console

    for per_seed in (False, True):
        console = Console(width=80, force_terminal=True, record=True, color_system=None)
        print_comparison(compare_dirs([compare_runs]), console, per_seed=per_seed)
        text = console.export_text()
        assert LONG_NAME in text and "…" not in text
        assert max(len(line) for line in text.splitlines() if not line.startswith("note:")) <= 80
        if not per_seed:
            rms = by_name(compare_dirs([compare_runs]))["norm=rmsnorm"]
            assert f"[{rms['ci_low']:+.4f}, {rms['ci_high']:+.4f}]" in text.replace("\n", " ")
