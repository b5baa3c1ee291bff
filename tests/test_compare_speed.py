"""Compare's tokens/s column under load: the median of a variant's seeds, marked `~` with a note
pointing to `ablate bench` when the seeds' figures differ by more than 1.5x, in every format."""

from __future__ import annotations

import csv
import io
import json
import random

import numpy as np
import pytest

from ablate.analysis import compare_dirs
from ablate.analysis.columns import comparison_table
from ablate.analysis.columns import print_comparison
from ablate.tables.render import to_csv, to_latex, to_markdown
from compare_fixtures import BASE, PAIRED, by_name, cli, write_run

# Measured on a loaded host: the baseline's three seeds, and act=swiglu's (steady) figure. Their
# means read 3,168 against 6,336: "SwiGLU is 2x faster".
LOADED = [1882.0, 1304.0, 6318.0]
STEADY = [6300.0, 6336.0, 6372.0]


@pytest.fixture
def loaded(tmp_path):
    for (s, v), t in zip(BASE.items(), LOADED):
        write_run(tmp_path, f"base_s{s}", {}, s, v, tokens_per_s=t)
    for (s, v), t in zip(PAIRED.items(), STEADY):
        write_run(tmp_path, f"swiglu_s{s}", {"act": "swiglu"}, s, v, tokens_per_s=t)
    return tmp_path


def test_tokens_per_s_is_the_median_of_the_seeds_and_marked_when_they_disagree(loaded):
    rows = by_name(compare_dirs([loaded]))
    base, swiglu = rows["baseline"], rows["act=swiglu"]
    assert base["tokens_per_s"] == np.median(LOADED) == 1882  # not the mean, 3,168
    assert base["tokens_per_s_unsteady"] is True  # 6,318 / 1,304 = 4.8x
    assert swiglu["tokens_per_s"] == np.median(STEADY) and swiglu["tokens_per_s_unsteady"] is False


def test_the_mark_and_the_note_in_every_format(loaded):
    from rich.console import Console

    cmp = compare_dirs([loaded])
    note = next(n for n in cmp.notes if n.startswith("~ tokens/s"))
    assert "more than 1.5x" in note and "in baseline," in note and "act=swiglu" not in note
    assert "median" in note and "ablate bench" in note and "alternating rounds" in note
    for width in (250, 80):  # the table; a narrow terminal with every column (--wide)
        console = Console(width=width, record=True)
        print_comparison(cmp, console, wide=True)
        text = console.export_text()
        assert "~1,882" in text and "~6,336" not in text and "6,336" in text, text
        assert "note: ~ tokens/s" in text
    table = comparison_table(cmp)
    md = to_markdown(table)
    assert "| ~1,882 | ok |" in md and "| 6,336 | ok |" in md and "- note: ~ tokens/s" in md
    tex = to_latex(table)
    assert r"\textasciitilde{}1,882 & ok \\" in tex and "% note: ~ tokens/s" in tex
    got = {r["variant"]: r for r in csv.DictReader(io.StringIO(to_csv(table)))}
    assert float(got["baseline"]["tokens_per_s"]) == 1882 and got["baseline"]["tokens_per_s_unsteady"] == "True"
    assert got["act=swiglu"]["tokens_per_s_unsteady"] == "False"
    res = cli("compare", str(loaded), "--json")
    assert res.exit_code == 0, res.output
    data = by_name(json.loads(res.output))
    assert data["baseline"]["tokens_per_s"] == 1882 and data["baseline"]["tokens_per_s_unsteady"] is True
    assert data["act=swiglu"]["tokens_per_s_unsteady"] is False


def test_steady_seeds_have_no_mark_and_no_note(tmp_path):
    for (s, v), t in zip(BASE.items(), STEADY):
        write_run(tmp_path, f"base_s{s}", {}, s, v, tokens_per_s=t)
    cmp = compare_dirs([tmp_path])
    assert not cmp[0]["tokens_per_s_unsteady"] and not any("tokens/s" in n for n in cmp.notes)
    assert "~" not in to_markdown(comparison_table(cmp))


@pytest.mark.parametrize("figures, unsteady", [
    ([1000.0], False),  # one seed: nothing to disagree with
    ([1000.0, 1500.0], False),  # exactly 1.5x is within the bound
    ([1000.0, 1501.0], True),
    ([1000.0, 1200.0, 1400.0, 5000.0], True),  # an even count: the mean of the middle two
])
def test_the_bound_and_the_median_at_the_edges(tmp_path, figures, unsteady):
    for s, t in enumerate(figures):
        write_run(tmp_path, f"base_s{s}", {}, s, 3.0 + s / 100, tokens_per_s=t)
    write_run(tmp_path, "base_failed", {}, 9, None, status="failed", tokens_per_s=1.0)  # not counted
    row = compare_dirs([tmp_path])[0]
    assert row["tokens_per_s"] == np.median(figures) and row["tokens_per_s_unsteady"] is unsteady


def test_median_and_spread_match_numpy_over_random_loads(tmp_path):
    """Random seed counts (1-6) and figures spanning 100x: numpy's median, and max/min > 1.5."""
    rng = random.Random(0)
    for case in range(25):
        figures = [round(10 ** rng.uniform(2, 4), 1) for _ in range(rng.randint(1, 6))]
        root = tmp_path / str(case)
        for s, t in enumerate(figures):
            write_run(root, f"base_s{s}", {}, s, 3.0, tokens_per_s=t)
        row = compare_dirs([root])[0]
        assert row["tokens_per_s"] == pytest.approx(np.median(figures), rel=1e-12)
        assert row["tokens_per_s_unsteady"] is bool(np.max(figures) / np.min(figures) > 1.5)
