"""`ablate compare` must not overstate: mixed runs are refused, the baseline is named with its
reason, every delta has a confidence interval, a Holm-corrected p, an effect size and the seeds
80% power would need (checked against scipy's own intervals, textbook sample sizes and a Monte
Carlo power estimate), few seeds and size changes are flagged; and the results leave the
terminal (csv / markdown / latex, --where, --per-seed) with no name cut at 80 columns."""

from __future__ import annotations

import csv
import io
import json
import math
import re
import struct

import numpy as np
import pytest
import yaml
from scipy import stats

from ablate.analysis import CompareError, compare_dirs
from ablate.analysis.render import print_comparison
from ablate.analysis.stats import holm, seed_test, seeds_needed
from tests.conftest import run_ablate
from tests.compare_fixtures import BASE, PAIRED, WELCH, cli, set_config, write_run, write_study  # noqa: F401

LONG = {"pos": "rope", "attn": "gqa", "qk_norm": "on", "act": "swiglu"}  # a long variant name
LONG_NAME = "act=swiglu,attn=gqa,pos=rope,qk_norm=on"


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "runs"
    for s, v in BASE.items():
        write_run(root, f"base_s{s}", {}, s, v)
    for s, v in PAIRED.items():
        write_run(root, f"rms_s{s}", {"norm": "rmsnorm"}, s, v)
    for s, v in WELCH.items():
        write_run(root, f"long_s{s}", LONG, s, v, params=1004)  # +0.4%: under the threshold
    return root


def by_name(rows):
    """Rows (compare_dirs' or --json's) by variant, as the JSON keys."""
    rows = [r.as_dict() if hasattr(r, "as_dict") else r for r in rows]
    return {r["variant"]: r for r in rows}


# ---- which runs may share a table --------------------------------------------------------------
def test_runs_that_differ_in_steps_are_refused_with_one_line_naming_the_keys(runs):
    short = write_run(runs, "short_s0", {}, 0, 3.9)  # the user's extra 10-step run
    set_config(short, "train.steps", 10)
    set_config(short, "model.d_model", 64)
    res = run_ablate("compare", str(runs))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "model.d_model (32 in 9 runs, 64 in 1 run)" in lines[0]
    assert "train.steps (6 in 9 runs, 10 in 1 run)" in lines[0] and "--allow-mixed" in lines[0]
    assert res.stdout == ""
    # --allow-mixed: the table is printed and says it is mixed
    res = cli("compare", str(runs), "--allow-mixed")
    assert res.exit_code == 0, res.stderr
    assert res.stdout.startswith("MIXED (--allow-mixed): the runs also differ in model.d_model")
    assert json.loads(cli("compare", str(runs), "--allow-mixed", "--json").stdout)[0]["mixed"] == \
        ["model.d_model", "train.steps"]
    # or keep like with like: --where selects the 6-step runs, nothing is mixed
    res = cli("compare", str(runs), "--where", "train.steps=6", "--json")
    assert res.exit_code == 0, res.stderr
    data = json.loads(res.stdout)
    assert data[0]["mixed"] == [] and data[0]["n"] == 3 and len(data) == 3


def test_variant_keys_and_swept_keys_may_differ(tmp_path):
    """Axis sub-keys (pos.base) and stability keys (model.z_loss) are variants, not settings;
    a key one sweep swept (train.lr=1e-3,3e-3) is what that sweep compares."""
    root = tmp_path / "a"
    for s, v in BASE.items():
        write_run(root, f"base_s{s}", {}, s, v)
        set_config(write_run(root, f"z_s{s}", {}, s, v - 0.01), "model.z_loss", 1e-4)
        set_config(write_run(root, f"theta_s{s}", {"pos": "rope"}, s, v - 0.02), "pos.base", 500000.0)
    rows = compare_dirs([root])
    assert len(rows) == 3 and rows.mixed == {}
    sweep = tmp_path / "sweeps" / "lr"
    for s, v in BASE.items():
        write_run(sweep, f"0_baseline_seed{s}", {}, s, v, sweep="lr", variant="baseline")
        d = write_run(sweep, f"1_lr_seed{s}", {}, s, v + 0.05, sweep="lr", variant="train.lr=0.01")
        set_config(d, "train.lr", 0.01)
    rows = compare_dirs([sweep])
    assert [r["variant"] for r in rows] == ["baseline", "train.lr=0.01"] and rows.mixed == {}
    # the same lr difference between two loose runs is not a sweep: refused
    loose = tmp_path / "loose"
    write_run(loose, "a", {}, 0, 3.0)
    set_config(write_run(loose, "b", {}, 0, 3.1), "train.lr", 0.01)
    with pytest.raises(CompareError, match=r"train\.lr \(\(absent\) in 1 run, 0\.01 in 1 run\)"):
        compare_dirs([loose])


def test_the_baseline_is_named_with_its_reason(runs, tmp_path):
    res = cli("compare", str(runs))
    assert res.stdout.splitlines()[0] == "baseline: baseline (no axis changed)"
    res = cli("compare", str(runs), "--baseline", "norm=rmsnorm")
    assert res.stdout.splitlines()[0] == "baseline: norm=rmsnorm (--baseline)"
    data = json.loads(cli("compare", str(runs), "--json").stdout)
    assert data[0]["baseline_reason"] == "no axis changed" and data[1]["baseline_reason"] is None

    cmp = compare_dirs([write_study(tmp_path / "study")])
    assert (cmp.baseline, cmp.baseline_reason) == ("gpt2", "the study's first rung")


# ---- statistics --------------------------------------------------------------------------------
def test_confidence_intervals_match_scipy_and_holm_decides_the_verdict(runs):
    rows = by_name(compare_dirs([runs]))
    rms, long = rows["norm=rmsnorm"], rows[LONG_NAME]
    a, b = [PAIRED[s] for s in (0, 1, 2)], [BASE[s] for s in (0, 1, 2)]
    ci = stats.ttest_rel(a, b).confidence_interval(0.95)  # scipy's own interval
    assert (rms["ci_low"], rms["ci_high"]) == pytest.approx((ci.low, ci.high), rel=1e-9)
    ci = stats.ttest_ind(list(WELCH.values()), list(BASE.values()), equal_var=False).confidence_interval(0.95)
    assert (long["ci_low"], long["ci_high"]) == pytest.approx((ci.low, ci.high), rel=1e-9)
    # Holm by hand over the two tests: smallest p x 2, the other x 1, kept monotone
    p1, p2 = sorted([rms["p_value"], long["p_value"]])
    assert sorted([rms["p_holm"], long["p_holm"]]) == pytest.approx([min(1, 2 * p1), max(2 * p1, p2)])
    assert holm([0.01, None, 0.04, 0.03]) == pytest.approx([0.03, None, 0.06, 0.06])
    # a p below alpha that Holm lifts above it is noise, not "better"
    r = seed_test({0: 3.0, 1: 3.1, 2: 3.05}, {0: 2.97, 1: 3.08, 2: 3.01})
    assert 0.01 < r.p_value < 0.05
    assert holm([r.p_value] * 3)[0] > 0.05
    # effect sizes: paired d_z = mean diff / sd diff; Welch: Cohen's d with the pooled sd
    d = np.array(a) - np.array(b)
    assert rms["effect"] == pytest.approx(d.mean() / d.std(ddof=1))
    w, bb = np.array(list(WELCH.values())), np.array(b)
    pooled = math.sqrt((2 * w.var(ddof=1) + 2 * bb.var(ddof=1)) / 4)
    assert long["effect"] == pytest.approx((w.mean() - bb.mean()) / pooled)


def test_seeds_needed_matches_textbook_sample_sizes_and_a_monte_carlo_power():
    # G*Power / Cohen's tables: paired dz=0.5 -> 34 pairs; dz=1.0 -> 10; two groups d=1.0 -> 17, d=0.5 -> 64
    assert seeds_needed(0.5) == 34 and seeds_needed(-1.0) == 10
    assert seeds_needed(1.0, paired=False) == 17 and seeds_needed(0.5, paired=False) == 64
    assert seeds_needed(0.0) is None and seeds_needed(math.inf) == 2
    assert seeds_needed(0.01) is None  # beyond the limit: said, not invented
    # Monte Carlo: simulate paired differences with that effect; a two-sided t-test at n seeds
    # rejects >= 80% of the time, at n - 1 seeds less often
    rng = np.random.default_rng(0)
    effect = 1.3
    n = seeds_needed(effect)

    def power(k, trials=40_000):
        x = rng.normal(effect, 1.0, size=(trials, k))
        t = x.mean(1) / (x.std(1, ddof=1) / math.sqrt(k))
        return float(np.mean(np.abs(t) > stats.t.ppf(0.975, k - 1)))

    assert power(n) >= 0.8 - 0.01 and power(n - 1) < 0.8 + 0.01
    assert power(n) - power(n - 1) > 0.02


def test_seeds_needed_are_the_seeds_that_pass_the_holm_verdict_beside_them(tmp_path):
    """Three variants tested against the baseline: each one's seeds needed are at alpha / 3
    (Bonferroni: what Holm asks of the smallest p, so the verdict shown passes whatever the
    others' p-values), and the header says for which verdict; one variant alone gets alpha."""
    base = {0: 3.00, 1: 3.04, 2: 2.98, 3: 3.02}
    offsets = {"norm=rmsnorm": (-0.030, -0.020, -0.045, -0.025), "act=relu": (0.02, 0.00, 0.03, 0.01),
               "pos=rope": (-0.01, 0.012, -0.02, 0.0)}
    for s, v in base.items():
        write_run(tmp_path / "baseline", f"s{s}", {}, s, v)
    for name, deltas in offsets.items():
        key, value = name.split("=")
        for s, d in enumerate(deltas):
            write_run(tmp_path / name, f"s{s}", {key: value}, s, base[s] + d)
    rows = by_name(compare_dirs([tmp_path]))
    effects = {name: np.mean(d) / np.std(d, ddof=1) for name, d in offsets.items()}
    for name, effect in effects.items():
        assert rows[name]["effect"] == pytest.approx(effect)
        assert rows[name]["seeds_needed_alpha"] == pytest.approx(0.05 / 3)
        assert rows[name]["seeds_needed"] == seeds_needed(effect, 0.05 / 3)
    alone = by_name(compare_dirs([tmp_path / "baseline", tmp_path / "norm=rmsnorm"]))["norm=rmsnorm"]
    assert alone["seeds_needed_alpha"] == 0.05 and alone["seeds_needed"] == seeds_needed(effects["norm=rmsnorm"])
    assert alone["seeds_needed"] < rows["norm=rmsnorm"]["seeds_needed"]  # a stricter bar takes more seeds
    from rich.console import Console

    console = Console(width=400, record=True)
    print_comparison(compare_dirs([tmp_path]), console)
    assert "seeds needed (80% power, Holm p<0.05)" in console.export_text()


def test_seeds_needed_fewer_than_three_seeds_and_the_size_threshold(tmp_path):
    for s in (0, 1):
        write_run(tmp_path, f"base_s{s}", {}, s, 3.0 + 0.1 * s, params=100_000)
        write_run(tmp_path, f"rms_s{s}", {"norm": "rmsnorm"}, s, 2.93 + 0.1 * s + 0.01 * s, params=100_400)
        write_run(tmp_path, f"sw_s{s}", {"act": "swiglu"}, s, 3.0 + 0.1 * s + 0.002 * (1 - 2 * s),
                  params=100_600)
    cmp = compare_dirs([tmp_path])
    rows = by_name(cmp)
    rms = rows["norm=rmsnorm"]
    d = [-0.07, -0.06]
    eff = (sum(d) / 2) / stats.tstd(d)
    # two variants tested: the seeds that pass Holm whatever the other's p, at 0.05 / 2
    assert rms["effect"] == pytest.approx(eff) and rms["seeds_needed"] == seeds_needed(eff, 0.025)
    assert rms["seeds_needed_alpha"] == 0.025
    assert rms["few_seeds"] and any("fewer than 3 seeds in the test: norm=rmsnorm (2)" in n for n in cmp.notes)
    # 0.4% bigger: no size note; 0.6%: noted
    assert not rms["size_differs"] and rows["act=swiglu"]["size_differs"]
    size_note = next(n for n in cmp.notes if "differs in size" in n)
    assert "more than 0.5%" in size_note and "act=swiglu (+600 params, +0.60%)" in size_note
    assert "norm=rmsnorm" not in size_note
    from rich.console import Console

    console = Console(width=300, record=True)
    print_comparison(cmp, console)
    text = console.export_text()
    assert "only 2 seeds" in text and "seeds needed" in text and f"{rms['ci_low']:+.4f}" in text
    data = by_name(json.loads(cli("compare", str(tmp_path), "--json").stdout))
    for key in ("ci_low", "ci_high", "p_holm", "effect", "seeds_needed", "seeds_needed_alpha", "few_seeds",
                "size_differs"):
        assert data["norm=rmsnorm"][key] == pytest.approx(rms[key])


# ---- formats, filters, per-seed rows -----------------------------------------------------------
def test_csv_markdown_and_latex_paste_as_they_are(runs):
    rows = by_name(compare_dirs([runs]))
    res = cli("compare", str(runs), "--format", "csv")
    assert res.exit_code == 0, res.stderr
    table = list(csv.DictReader(io.StringIO(res.stdout)))  # stdout is CSV only
    got = {r["variant"]: r for r in table}
    assert list(got) == [r for r in rows]
    assert float(got["norm=rmsnorm"]["ci_low"]) == pytest.approx(rows["norm=rmsnorm"]["ci_low"])
    assert float(got["norm=rmsnorm"]["p_holm"]) == pytest.approx(rows["norm=rmsnorm"]["p_holm"])
    assert got["norm=rmsnorm"]["verdict"] == "better" and got["baseline"]["delta"] == ""
    assert "baseline: baseline (no axis changed)" in res.stderr

    md = cli("compare", str(runs), "--format", "markdown").stdout.splitlines()
    head = next(i for i, line in enumerate(md) if line.startswith("| variant |"))
    assert md[0].startswith("baseline: baseline") and md[head + 1].startswith("|---|")
    body = [line for line in md[head + 2:] if line.startswith("| ")]
    assert len(body) == 3 and all(line.count(" | ") == md[head].count(" | ") for line in body)
    rms = next(line for line in body if line.startswith("| norm=rmsnorm |"))
    assert f"[{rows['norm=rmsnorm']['ci_low']:+.4f}, {rows['norm=rmsnorm']['ci_high']:+.4f}]" in rms
    assert "yes, better" in rms

    tex = cli("compare", str(runs), "--format", "latex").stdout
    assert r"\begin{tabular}{lrrrrrrlrrrrl}" in tex and r"\bottomrule" in tex
    assert r"qk\_norm=on" in tex and r"$\Delta$ vs baseline" in tex
    body = tex[tex.index(r"\begin{tabular}"):tex.index(r"\end{tabular}")]
    plain = re.sub(r"\$\\[A-Za-z]+\$", "", body)  # $\Delta$, $\pm$ ... are meant
    assert not re.search(r"(?<!\\)[_%#$]", plain)  # every other special character escaped
    res = cli("compare", str(runs), "--format", "html")
    assert res.exit_code == 2 and "--format html: choose one of table, csv, markdown, latex" in res.stderr


def test_where_filters_and_per_seed_rows(runs):
    res = cli("compare", str(runs), "--where", "norm=layernorm", "--where", "act=gelu", "--json")
    data = json.loads(res.stdout)
    assert len(data) == 1 and data[0]["n"] == 3 and data[0]["axes"]["norm"] == "layernorm"
    res = cli("compare", str(runs), "--where", "norm=rmsnorm,layernorm", "--where", "seed=0,1", "--json")
    data = json.loads(res.stdout)
    assert [(r["variant"], r["n"]) for r in data] == [("baseline", 2), ("norm=rmsnorm", 2)]  # LONG ran seeds 3-5
    res = cli("compare", str(runs), "--where", "colour=red")
    assert res.exit_code == 2 and "no run has 'colour'" in res.stderr and len(res.stderr.splitlines()) == 1
    res = cli("compare", str(runs), "--where", "norm=groupnorm")
    assert res.exit_code == 2 and "no run matches --where norm=groupnorm" in res.stderr

    res = cli("compare", str(runs), "--per-seed", "--json")
    seeds = json.loads(res.stdout)
    assert len(seeds) == 9 and {r["variant"] for r in seeds} == {"baseline", "norm=rmsnorm", LONG_NAME}
    rms0 = next(r for r in seeds if r["variant"] == "norm=rmsnorm" and r["seed"] == 0)
    assert rms0["delta"] == pytest.approx(PAIRED[0] - BASE[0])  # against the baseline's seed 0
    assert all(r["delta"] is None for r in seeds if r["variant"] == LONG_NAME)  # no seed in common
    out = cli("compare", str(runs), "--per-seed", "--format", "csv").stdout
    assert len(list(csv.DictReader(io.StringIO(out)))) == 9


def test_names_are_never_cut_at_80_columns(runs):
    # piped (not a TTY), COLUMNS=80: a wide table, every name whole
    res = run_ablate("compare", str(runs), env={"COLUMNS": "80"})
    assert res.returncode == 0, res.stderr
    assert LONG_NAME in res.stdout and "…" not in res.stdout
    # a real 80-column terminal: one block per variant, nothing longer than 80, nothing cut
    from rich.console import Console

    for per_seed in (False, True):
        console = Console(width=80, force_terminal=True, record=True, color_system=None)
        print_comparison(compare_dirs([runs]), console, per_seed=per_seed)
        text = console.export_text()
        assert LONG_NAME in text and "…" not in text
        assert max(len(line) for line in text.splitlines() if not line.startswith("note:")) <= 80
        if not per_seed:
            rms = by_name(compare_dirs([runs]))["norm=rmsnorm"]
            assert f"[{rms['ci_low']:+.4f}, {rms['ci_high']:+.4f}]" in text.replace("\n", " ")


# ---- plot ---------------------------------------------------------------------------------------
def png_size(path) -> tuple[int, int]:
    return struct.unpack(">II", path.read_bytes()[16:24])


def test_plot_grid_delta_panel_and_plain_log_ticks(runs, tmp_path):
    from ablate.tracking.plots import _delta_series, plain_ticks, plot_comparison

    cmp = compare_dirs([runs])
    # the Δ panel's numbers: rmsnorm's curves are the baseline's (same synthetic rows) -> 0
    base, rms = cmp.groups[0], next(g for g, r in zip(cmp.groups, cmp) if r["variant"] == "norm=rmsnorm")
    for r in rms.runs:
        rows = [json.loads(line) for line in (r.dir / "metrics.jsonl").read_text().splitlines()]
        for row in rows:
            row["train_loss"] -= 0.01 * (1 + r.seed[0])  # seed s: 0.01 * (s + 1) lower
        r.rows = rows
    xs, mean, lo, hi = _delta_series(rms, base, "train_loss")
    assert xs == [128.0, 256.0, 384.0]
    assert mean == pytest.approx([-0.02] * 3) and lo == pytest.approx([-0.03] * 3) and hi == pytest.approx([-0.01] * 3)

    one = plot_comparison(cmp, tmp_path / "one.png", keys=["train_loss"])
    four = plot_comparison(cmp, tmp_path / "four.png", keys=["train_loss", "grad_norm", "lr", "tokens_per_s"])
    (w1, h1), (w4, h4) = png_size(one), png_size(four)
    assert h1 == pytest.approx(4.6 * 110, abs=2)  # one row
    assert w1 == pytest.approx(2 * 6.0 * 110, abs=2)  # the key + its Δ panel, side by side
    assert w4 == pytest.approx(3 * 6.0 * 110, abs=2) and h4 == pytest.approx(2 * 4.6 * 110, abs=2)  # a grid

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([1, 2, 3], [2.42, 2.5, 2.61])
    ax.set_yscale("log")
    plain_ticks(ax)
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_yticklabels(minor=True) + ax.get_yticklabels()
              if t.get_text() and ax.get_ylim()[0] <= t.get_position()[1] <= ax.get_ylim()[1]]
    assert labels and all(float(t) > 0 for t in labels)  # "2.5", not "2.5×10^0" / "$\\mathdefault{...}$"
    plt.close(fig)
