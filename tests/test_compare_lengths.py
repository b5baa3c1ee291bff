"""`ablate compare` of runs with a loss at other context lengths (length_eval.json): per variant
and length the mean over seeds, the Δ vs the baseline with its CI and Holm p (the main table's
statistics, checked against scipy), every length beyond the training length marked, a baseline
without a loss at a length said, one table per protocol, runs that lack a length named, in every
format, --json's `length_eval` and the figure."""

from __future__ import annotations

import csv
import io
import json
import math
import random

import pytest
from scipy import stats

from ablate.analysis.report import CompareOptions, build_report
from ablate.tables.render import to_csv, to_markdown
from compare_fixtures import NA, TRAIN_LEN, cli, write_length_runs, write_lengths, write_run

CHANGES = [{}, {"norm": "rmsnorm"}, {"act": "swiglu"}, {"pos": "rope"}, {"pos": "alibi"}]
ENTRY_KEYS = {"length", "stride", "rope_scaling", "protocol", "beyond_train", "status", "reason", "n", "runs",
              "seeds", "missing_seeds", "mean", "std", "ci", "delta", "delta_pct", "delta_ci", "test", "t", "df",
              "p_value", "p_holm", "verdict", "test_seeds", "test_delta", "ci_low", "ci_high", "effect",
              "seeds_needed", "seeds_needed_alpha", "few_seeds"}


@pytest.fixture(scope="module")
def lengths(tmp_path_factory):
    return write_length_runs(tmp_path_factory.mktemp("lengths") / "lengths")


def report(path, **options):
    return build_report([path], CompareOptions(**options))


def entries(row, stride=None) -> dict:
    """A --json row's length_eval entries of one protocol, by length."""
    return {e["length"]: e for e in row["length_eval"] if e["stride"] == stride}


# ---- the statistics, against scipy ----------------------------------------------------------------
def holm_rejects(p_values: dict, alpha: float) -> set:
    """Holm's step-down procedure (Holm 1979) as defined: in ascending order, reject while the
    k-th smallest p is at most alpha / (m - k + 1)."""
    out, m = set(), len(p_values)
    for k, (name, p) in enumerate(sorted(p_values.items(), key=lambda kv: kv[1])):
        if p > alpha / (m - k):
            break
        out.add(name)
    return out


def expected(base: dict, mine: dict) -> tuple:
    """scipy's test of mean(mine) - mean(base): paired over the seeds both have (2 or more),
    else Welch; (delta, test name, p, CI)."""
    common = sorted(set(base) & set(mine))
    delta = sum(mine.values()) / len(mine) - sum(base.values()) / len(base)
    if len(common) >= 2:
        r = stats.ttest_rel([mine[s] for s in common], [base[s] for s in common])
        name = "paired t"
    else:
        r = stats.ttest_ind(list(mine.values()), list(base.values()), equal_var=False)
        name = "Welch t"
    ci = r.confidence_interval(0.95)
    return delta, name, r.pvalue, (ci.low, ci.high)


def write_random_study(root, rng: random.Random) -> dict:
    """Variants (some on other seeds: Welch) x seeds x lengths of random losses, some seeds not
    evaluated at some lengths; returns variant change index -> length -> {seed: loss}."""
    variants, seeds = rng.randint(2, 5), rng.randint(2, 5)
    lens = sorted(rng.sample([32, 64, 128, 256, 512], rng.randint(1, 3)))
    truth = {}
    for j in range(variants):
        shift = rng.gauss(0, 0.05)
        own = range(10, 10 + seeds) if j and rng.random() < 0.25 else range(seeds)  # other seeds: Welch
        truth[j] = {n: {} for n in lens}
        for s in own:
            d = write_run(root, f"v{j}_s{s}", CHANGES[j], s, 3.0 + rng.gauss(0, 0.05))
            losses = {n: 3.0 + 0.001 * n * shift + rng.gauss(0, 0.03) for n in lens}
            if s and rng.random() < 0.2:  # a seed not evaluated at one length
                losses.pop(rng.choice(lens))
            write_lengths(d, losses)
            for n, v in losses.items():
                truth[j][n][s] = v
    return truth


@pytest.mark.parametrize("trial", range(12))
def test_each_length_has_the_main_tables_statistics_against_scipy_and_holm_per_length(tmp_path, trial):
    rng = random.Random(trial)
    truth = write_random_study(tmp_path, rng)
    rows = json.loads(cli("compare", str(tmp_path), "--json").stdout)
    assert rows[0]["baseline"] and rows[0]["axes"]["norm"] == "layernorm"
    by_change = {j: r for r in rows for j, c in enumerate(CHANGES) if all(r["axes"][k] == v for k, v in c.items())
                 and (j == 0) == r["baseline"]}
    for length in truth[0]:
        base, p_values = truth[0][length], {}
        for j, row in by_change.items():
            got, mine = entries(row)[length], truth[j][length]
            assert got["n"] == len(mine) and got["mean"] == pytest.approx(sum(mine.values()) / len(mine))
            if len(mine) > 1:
                sem = stats.sem(list(mine.values()))
                assert got["ci"] == pytest.approx(list(stats.t.interval(0.95, len(mine) - 1, loc=got["mean"], scale=sem)))
            if j == 0 or min(len(base), len(mine)) < 2:  # no test with one seed on a side
                assert got["p_holm"] is None and (got["delta"] is None) == (j == 0)
                continue
            delta, name, p, ci = expected(base, mine)
            assert (got["delta"], got["test"], got["p_value"]) == (pytest.approx(delta), name, pytest.approx(p))
            assert got["delta_ci"] == pytest.approx(list(ci))
            p_values[j] = got["p_value"]
        for j, p in p_values.items():  # Holm p: the smallest alpha at which the procedure rejects (1: none)
            p_holm = entries(by_change[j])[length]["p_holm"]
            assert j not in holm_rejects(p_values, min(p_holm, 1) * (1 - 1e-9))
            assert p_holm == 1 or j in holm_rejects(p_values, p_holm * (1 + 1e-9))


# ---- what a length table says -----------------------------------------------------------------------
def test_every_length_beyond_the_training_length_is_marked(lengths):
    table = report(lengths).lengths.tables[0]
    md = to_markdown(table)
    assert "| variant | loss 64 | loss 128* | loss 256* | loss 512* |" in md
    assert f"* beyond the training length ({TRAIN_LEN} tokens)" in md
    beyond = {e["length"]: e["beyond_train"] for e in report(lengths).rows[1]["length_eval"]}
    assert beyond == {64: False, 128: True, 256: True, 512: True}


def test_where_the_baseline_is_na_each_variant_shows_its_loss_without_delta_and_a_note_says_why(lengths):
    rep = report(lengths)
    rope = entries(rep.rows[2])
    assert rep.rows[2].variant == "pos=rope" and entries(rep.rows[0])[256]["status"] == "n/a"
    assert rope[256]["mean"] == pytest.approx((3.60 + 3.75 + 3.66) / 3) and rope[256]["delta"] is None
    assert rope[128]["delta"] == pytest.approx((3.10 + 3.22 + 3.15 - 3.02 - 3.11 - 3.08) / 3)
    assert entries(rep.rows[0])[256]["reason"] == NA
    md = to_markdown(rep.lengths.tables[0])
    assert "| baseline | 3.0500 | 3.0700 | n/a | n/a |" in md
    assert (f"at 256*, 512* the baseline (baseline) is n/a ({NA}): each variant's loss there is shown without Δ "
            "(--baseline picks another)") in md
    other = entries(report(lengths, baseline="pos=alibi").rows[2])  # another baseline: a Δ there too
    assert other[256]["delta"] == pytest.approx((3.60 + 3.75 + 3.66 - 2.95 - 3.05 - 3.01) / 3)


def test_a_run_without_a_length_another_run_has_is_named_not_silently_mixed(lengths):
    rep = report(lengths)
    rope = entries(rep.rows[2])[512]
    assert (rope["n"], rope["runs"], rope["missing_seeds"]) == (2, 3, [2])
    assert rope["mean"] == pytest.approx((4.30 + 4.41) / 2)
    notes = rep.lengths.tables[0].notes
    assert "pos=rope: seed 2 not evaluated at 512*; its mean there is over 2 of 3 seeds" in notes
    assert f"to evaluate the runs that lack a length: ablate eval {lengths / 'rope_s2'} --lengths 512" in notes


def test_a_variant_never_evaluated_at_a_length_says_so(tmp_path):
    for s in range(2):
        write_lengths(write_run(tmp_path, f"base_s{s}", {}, s, 3.0), {64: 3.0 + s / 10, 128: 3.1 + s / 10})
        write_lengths(write_run(tmp_path, f"rope_s{s}", {"pos": "rope"}, s, 3.0), {64: 2.9 + s / 9})
    write_run(tmp_path, "alibi_s0", {"pos": "alibi"}, 0, 3.0)  # no length_eval.json at all
    rep = report(tmp_path)
    rows = {r.variant: entries(r) for r in rep.rows}
    assert rows["pos=rope"][128]["status"] == "not evaluated" and rows["pos=rope"][128]["mean"] is None
    assert rows["pos=alibi"][64]["status"] == "not evaluated"
    notes = rep.lengths.tables[0].notes
    assert "pos=rope: not evaluated at 128* (seed 0, 1)" in notes and "pos=alibi: not evaluated at 64 (seed 0)" in notes
    assert notes[-1] == f"to evaluate the runs that lack a length: ablate eval {tmp_path} --lengths 64,128"


def test_a_result_without_a_finite_loss_is_never_averaged_in(tmp_path):
    for s in range(2):
        write_lengths(write_run(tmp_path, f"base_s{s}", {}, s, 3.0), {64: 3.0 + s / 10, 128: 3.1})
        write_lengths(write_run(tmp_path, f"rope_s{s}", {"pos": "rope"}, s, 3.0), {64: [math.nan, 2.9][s], 128: math.inf})
    rep = report(tmp_path)
    rope = entries(rep.rows[1])
    assert (rope[64]["n"], rope[64]["mean"], rope[64]["p_value"]) == (1, 2.9, None)
    assert (rope[128]["status"], rope[128]["reason"], rope[128]["mean"]) == ("n/a", "no finite loss", None)


def test_a_test_on_fewer_than_three_seeds_is_said_as_in_the_main_table(tmp_path):
    for s in range(2):
        write_lengths(write_run(tmp_path, f"base_s{s}", {}, s, 3.0), {64: 3.0 + s / 10})
        write_lengths(write_run(tmp_path, f"rope_s{s}", {"pos": "rope"}, s, 3.0), {64: 2.9 + s / 9})
    rep = report(tmp_path)
    assert entries(rep.rows[1])[64]["few_seeds"] and rep.rows[1]["few_seeds"]
    assert "fewer than 3 seeds in a test: pos=rope; read the interval, not the p (run --seeds 3 or more)" in \
        rep.lengths.tables[0].notes


def test_one_table_per_protocol_titled_by_it(lengths):
    rep = report(lengths)
    assert [t.head for t in rep.lengths.tables] == [
        ["protocol: windows (non-overlapping windows of each length, every token scored)"],
        ["protocol: stride 32 (sliding windows of each length, the last 32 tokens of each scored, the first window whole)"]]
    assert to_markdown(rep.lengths.tables[1]).splitlines()[2].startswith("| variant | loss 128* | loss 256* | Δ 128*")
    alibi = entries(rep.rows[1], stride=32)
    assert alibi[128]["protocol"] == "stride 32" and set(alibi) == {128, 256}
    assert alibi[128]["mean"] == pytest.approx((2.94 + 3.02 + 2.99) / 3)


def test_rope_scaling_is_a_protocol_of_its_own(tmp_path):
    for s in range(2):
        d = write_run(tmp_path, f"rope_s{s}", {"pos": "rope"}, s, 3.0)
        write_lengths(d, {128: 3.5 + s / 10})
        write_lengths(d, {128: 3.2 + s / 10}, rope_scaling="pi:2.0")
    rep = report(tmp_path)
    assert [t.head[0].split(" (")[0] for t in rep.lengths.tables] == ["protocol: windows", "protocol: windows, rope pi:2.0"]
    header = next(csv.reader(io.StringIO(to_csv(rep.table))))
    assert "loss_128" in header and "loss_128_pi:2.0" in header


def test_a_run_without_rope_is_na_under_rope_scaling_and_no_refused_command_is_suggested(tmp_path):
    for s in range(2):
        d = write_run(tmp_path, f"learned_s{s}", {}, s, 3.0)
        write_lengths(d, {128: 3.4 + s / 10})
        d = write_run(tmp_path, f"rope_s{s}", {"pos": "rope"}, s, 3.0)
        write_lengths(d, {128: 3.5 + s / 10})
        write_lengths(d, {128: 3.2 + s / 10}, rope_scaling="pi:2.0")
    rep = report(tmp_path)
    scaled = rep.lengths.tables[1]
    assert not any("RoPE" in n for n in rep.lengths.tables[0].notes)  # the plain windows: evaluated
    notes = " ".join(scaled.notes)
    assert "pos=learned: RoPE scaling applies to pos=rope runs only" in notes
    assert "--rope-scaling" not in notes and "not evaluated" not in notes


# ---- the formats ----------------------------------------------------------------------------------
def test_json_gives_each_row_its_length_eval_entries(lengths):
    rows = json.loads(cli("compare", str(lengths), "--json").stdout)
    assert [len(r["length_eval"]) for r in rows] == [6, 6, 6]  # 4 lengths of windows, 2 of stride 32
    assert all(set(e) == ENTRY_KEYS for r in rows for e in r["length_eval"])
    rope = entries(rows[2])[128]
    assert rope["delta_ci"] == [rope["ci_low"], rope["ci_high"]] and rope["p_holm"] == pytest.approx(0.0187, abs=5e-5)


def test_csv_stays_one_table_with_a_field_per_figure_and_length(lengths):
    res = cli("compare", str(lengths), "--format", "csv")
    assert res.exit_code == 0
    table = list(csv.reader(io.StringIO(res.stdout)))
    header = table[0]
    assert len(table) == 4 and all(len(r) == len(header) for r in table)
    assert header[-14:] == [f"{f}_{n}_stride32" for f in ("status", "n", "loss", "delta", "ci_low", "ci_high", "p_holm")
                            for n in (128, 256)]
    row = dict(zip(header, table[3]))
    assert (row["variant"], row["status_512"], row["n_512"]) == ("pos=rope", "ok", "2")
    assert float(row["loss_512"]) == pytest.approx(4.355) and row["delta_512"] == ""
    assert "note: pos=rope: seed 2 not evaluated at 512*; its mean there is over 2 of 3 seeds" in res.stderr


def test_every_text_format_prints_the_length_tables_under_the_main_one(lengths):
    for fmt, marker in (("markdown", "| variant | loss 64 |"), ("latex", r"variant & loss 64 & loss 128*")):
        out = cli("compare", str(lengths), "--format", fmt).stdout
        assert out.index("val_loss (mean ± std)" if fmt == "markdown" else r"$\pm$") < out.index(marker)
        assert out.count("loss 128*") == 2  # windows and stride 32
    out = cli("compare", str(lengths), columns="120").stdout
    assert out.index("beyond seed noise?") < out.index("protocol: windows") < out.index("protocol: stride 32")


def test_runs_without_length_results_have_no_length_table_and_no_key(tmp_path):
    write_run(tmp_path, "base_s0", {}, 0, 3.0)
    rep = report(tmp_path)
    assert rep.lengths is None and rep.tables == [rep.table] and "length_eval" not in rep.rows[0]
    assert "length" not in cli("compare", str(tmp_path), "--format", "csv").stdout


def test_per_seed_rows_have_no_length_table(lengths):
    assert report(lengths, per_seed=True).lengths is None


def test_an_unreadable_length_record_is_a_warning_and_the_others_are_compared(tmp_path):
    good = write_run(tmp_path, "a_s0", {}, 0, 3.0)
    write_lengths(good, {64: 3.0})
    bad = write_run(tmp_path, "b_s0", {"pos": "rope"}, 0, 3.0)
    (bad / "length_eval.json").write_text("{not json")
    warned = []
    rep = build_report([tmp_path], CompareOptions(), warn=warned.append)
    assert len(warned) == 1 and "length_eval.json: unreadable" in warned[0]
    assert entries(rep.rows[0])[64]["mean"] == 3.0 and entries(rep.rows[1])[64]["status"] == "not evaluated"


# ---- the figure -----------------------------------------------------------------------------------
def test_the_plot_draws_loss_against_length_per_variant_with_the_training_length(lengths, tmp_path):
    from ablate.tracking.length_plots import lengths_figure

    res = cli("compare", str(lengths), "--plot", str(tmp_path / "c.png"))
    assert res.exit_code == 0 and f"plot: {tmp_path / 'c_lengths.png'}" in res.output
    assert (tmp_path / "c_lengths.png").stat().st_size > 0
    rep = report(lengths)
    fig = lengths_figure(rep.lengths)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_title() == "windows" and len(fig.axes) == 2
    marked = {line.get_label(): line for line in ax.get_lines()}
    assert list(marked["training length 64"].get_xdata()) == [TRAIN_LEN, TRAIN_LEN]
    lines = {bars.get_label(): bars.lines[0] for bars in ax.containers}  # a variant's line with its CI bars
    rope = lines["pos=rope"]
    assert list(rope.get_xdata()) == [64, 128, 256, 512]
    assert list(rope.get_ydata()) == pytest.approx([e["mean"] for e in rep.rows[2]["length_eval"][:4]])
    assert list(lines["baseline (n/a at 256, 512)"].get_xdata()) == [64, 128]
    assert not any(math.isnan(y) for line in ax.get_lines() for y in line.get_ydata())
