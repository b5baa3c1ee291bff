"""`ablate compare` on a terminal of 80, 100 and 120 columns: every report (the comparison, one
row per run, a study, an LR grid, a ladder, two crossed axes and their interaction) fits the
width, no line ends in spaces, no name, label or number is broken across lines, the CI sits on
its own line, and what a narrow terminal leaves out is named (--wide keeps it). Piped, the full
table whatever COLUMNS says. Also: the report is chosen from the runs and one options object,
and the transfer reports keep their public keys in csv, markdown and --json."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest

from ablate.analysis import CompareError, compare_dirs
from ablate.analysis.columns import COMPARE_HINT, comparison_table
from ablate.tables.render import to_csv, to_markdown
from ablate.analysis.report import CompareOptions, ReportKind, build_report
from ablate.tables.table import Table
from compare_fixtures import cli, make_fixture, write_grid, write_grid_sweep, write_ladder_sweep, write_lr_grid_crossed
from conftest import assert_fits, run_ablate, run_on_terminal, table_on_terminal

WIDTHS = (80, 100, 120)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = make_fixture(tmp_path_factory.mktemp("layout"))
    write_grid_sweep(root)
    write_ladder_sweep(root)
    write_grid(root)
    write_lr_grid_crossed(root)
    return root


def reports(root) -> dict[str, Table]:
    return {"comparison": comparison_table(compare_dirs([root / "ab"])),
            "per run": comparison_table(compare_dirs([root / "ab"]), per_seed=True),
            "study": comparison_table(compare_dirs([root / "study"])),
            "LR grid": build_report([root / "grid"], CompareOptions()).table,
            "ladder": build_report([root / "ladder"], CompareOptions()).table,
            **{f"crossed {i}": t for i, t in enumerate(build_report([root / "grid2"], CompareOptions()).tables)},
            "crossed LR grid": build_report([root / "lr_grid2"], CompareOptions()).interaction.table,
            **{f"lengths {i}": t for i, t in enumerate(build_report([root / "lengths"], CompareOptions()).lengths.tables)}}


def on_terminal(table: Table, width: int, wide: bool = False) -> str:
    return table_on_terminal(table, width, wide, COMPARE_HINT)


def row_name(table: Table, row) -> str:
    """What names a row: its variant, else its first cell (the interaction's level of A)."""
    return getattr(row, "variant", None) or table.columns[0].cell(row)


@pytest.mark.parametrize("width", WIDTHS)
def test_every_report_fits_the_terminal_with_nothing_broken(root, width):
    for name, table in reports(root).items():
        text = on_terminal(table, width)
        assert_fits(text, width, table)
        assert all(row_name(table, r) in text for r in table.rows), (name, text)
        assert on_terminal(table, width, wide=True)  # every column: a table or one field a line
        assert_fits(on_terminal(table, width, wide=True), width, table)


def test_the_comparison_puts_the_ci_on_its_own_line_and_names_what_it_leaves_out(root):
    cmp = compare_dirs([root / "ab"])
    rms = next(r for r in cmp if r.variant == "norm=rmsnorm")
    ci, delta = f"[{rms.vs.test.ci_low:+.4f}, {rms.vs.test.ci_high:+.4f}]", f"{rms.vs.delta:+.4f}"
    for width in WIDTHS:
        lines = on_terminal(comparison_table(cmp), width).splitlines()
        assert any(ci in line and delta not in line for line in lines)
        assert any(delta in line and ci not in line for line in lines)
    narrow = on_terminal(comparison_table(cmp), 80)
    assert "hidden to fit 80 columns: params, effect (Δ/σ), seeds needed, KV cache bytes/token, tokens/s" in " ".join(narrow.split())
    assert "--wide" in narrow and "Holm p=0.00995" in narrow and "seeds needed" not in narrow.split("note:")[0]
    wide = on_terminal(comparison_table(cmp), 80, wide=True)
    assert "hidden" not in wide and "seeds needed" in wide and "tokens/s" in wide
    assert "0.00332 (0.00995)" in wide  # one field a line: every plain cell, whole
    assert "hidden" not in on_terminal(comparison_table(cmp), 130)  # 130 columns hold it all


def test_the_length_table_keeps_every_length_and_leaves_out_the_shortest_lengths_ci_first(root):
    table = build_report([root / "lengths"], CompareOptions()).lengths.tables[0]
    rope = next(r for r in table.rows if r.variant == "pos=rope").cells[1].vs.test
    ci = f"[{rope.ci_low:+.4f}, {rope.ci_high:+.4f}]"
    for width in WIDTHS:
        text = on_terminal(table, width)
        assert all(n in text for n in ("64", "128*", "256*", "512*")) and ci in text  # 128*'s CI: the last to go
    assert "hidden to fit 80 columns: 95% CI 64 (" in " ".join(on_terminal(table, 80).split())
    assert "hidden" not in on_terminal(table, 120)


def test_piped_output_is_the_full_table_whatever_columns_says(root):
    res = run_ablate("compare", str(root / "ab"), env={"COLUMNS": "80"})
    assert res.returncode == 0, res.stderr
    assert "seeds needed (80% power, Holm p<0.05)" in res.stdout and "beyond seed noise? (Holm p<0.05)" in res.stdout
    assert "yes, better (paired t, p=0.00332, Holm p=0.00995)" in res.stdout and "hidden" not in res.stdout


@pytest.mark.parametrize("path, width", [("ab", 80), ("ab", 100), ("ab", 120), ("grid", 80), ("ladder", 100),
                                         ("lengths", 80), ("grid2", 80)])
def test_a_real_terminal_shows_every_line_whole(root, path, width):
    code, text = run_on_terminal("compare", str(root / path), columns=width)
    assert code == 0, text
    for table in build_report([root / path], CompareOptions()).tables:  # the loss at other lengths too
        assert_fits(text.replace(str(root), "<root>"), width, table)
        assert table.title in " ".join(text.split()) and row_name(table, table.rows[-1]) in text


def test_the_report_is_chosen_from_the_runs_and_the_options(root):
    assert build_report([root / "ab"], CompareOptions()).kind == ReportKind.COMPARISON
    seeds = build_report([root / "ab"], CompareOptions(per_seed=True, where=("seed=0",)))
    assert seeds.kind == ReportKind.PER_SEED and {r.seed for r in seeds.rows} == {0}
    grid = build_report([root / "grid"], CompareOptions())
    assert grid.kind == ReportKind.LR_GRID and [r.best_lr for r in grid.rows] == [0.01, 0.01]
    one_lr = build_report([root / "grid"], CompareOptions(where=("train.lr=0.1",)))
    assert one_lr.kind == ReportKind.COMPARISON and one_lr.comparison[1].mean == pytest.approx(2.505)
    assert build_report([root / "ladder"], CompareOptions()).kind == ReportKind.LADDER
    with pytest.raises(CompareError, match="^--per-seed, --plot-key: not available for an --lr-grid"):
        build_report([root / "ladder"], CompareOptions(per_seed=True, plot_keys=("lr",)))
    with pytest.raises(CompareError, match="--alpha must be between 0 and 1"):
        build_report([root / "ab"], CompareOptions(alpha=1.5))


def test_the_transfer_reports_keep_their_public_keys(root):
    ladder = build_report([root / "ladder"], CompareOptions()).table
    per_rung = [f"{k}_r{i}" for k in ("loss", "delta", "mult") for i in range(3)]
    assert next(csv.reader(io.StringIO(to_csv(ladder)))) == [
        "variant", *per_rung, "compute_multiplier", "compute_multiplier_ci", "wins_every_rung", "wins_beyond_noise"]
    assert to_markdown(ladder).startswith("| variant | loss r0 | loss r1 | loss r2 | Δ r0 |")
    row = json.loads(cli("compare", str(root / "ladder"), "--json").stdout)[1]
    assert set(row) == {"variant", "baseline", "rungs", "compute_multiplier", "compute_multiplier_ci",
                        "target_compute", "delta_at_target", "delta_at_target_ci", "projection_seeds",
                        "wins_every_rung", "wins_beyond_noise", "fit", "ranks", "rank_agreement"}
    assert set(row["fit"]) == {"l_inf", "a", "alpha"} and [r["rung"] for r in row["rungs"]] == ["r0", "r1", "r2"]
    assert set(row["rungs"][0]) == {"rung", "compute", "n", "mean", "std", "delta", "delta_ci", "beyond_noise",
                                    "compute_multiplier", "compute_multiplier_ci", "compute_multiplier_extrapolated"}
    grid = build_report([root / "grid"], CompareOptions()).table
    assert next(csv.reader(io.StringIO(to_csv(grid)))) == [
        "variant", "best_lr", "loss", "loss_ci", "tuned_delta", "tuned_delta_ci", "tuned_p_holm", "tuned_verdict",
        "shared_delta", "lr_sensitivity", "max_attn_logit"]
    md = to_markdown(grid).splitlines()
    assert md[0] == ("| variant | best LR | loss at best LR [95% CI] | tuned Δ | 95% CI | Holm p | verdict | "
                     "Δ at LR 0.01 | LR sensitivity | max attn logit (top LR) |")
    assert md[1] == "|---|" + "--:|" * 9 and md[-1].startswith("- note: tuned Δ: each variant at its own best LR")
    res = cli("compare", str(root / "ladder"), "--format", "csv")
    assert res.exit_code == 0 and re.search(r"^note: L\(C\) = L_inf", res.stderr, re.M)  # notes beside, not in, the csv
