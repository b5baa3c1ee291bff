"""`ablate compare` on synthetic run directories with known numbers (ablate/analysis/compare.py):
grouping, the baseline and why it was chosen, means, deltas, the paired/Welch choice, its
p-values and confidence intervals against scipy, Holm's verdict and the seeds needed beside it,
few seeds and size changes flagged, statuses, bad input."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import yaml
from scipy import stats

from ablate.analysis import CompareError, compare_dirs
from ablate.analysis.columns import print_comparison
from ablate.tables.render import to_json
from ablate.analysis.stats import holm, seed_test, seeds_needed
from compare_fixtures import BASE, LONG_NAME, NOISY, PAIRED, WELCH, by_name, cli, write_run, write_study
from conftest import invoke_ablate


@pytest.fixture
def runs(tmp_path):
    for s, v in BASE.items():
        write_run(tmp_path, f"base_s{s}", {}, s, v)
    for s, v in PAIRED.items():
        write_run(tmp_path, f"rms_s{s}", {"norm": "rmsnorm"}, s, v)
    write_run(tmp_path, "rms_s9", {"norm": "rmsnorm"}, 9, None, status="diverged")
    for s, v in WELCH.items():
        write_run(tmp_path, f"swiglu_s{s}", {"act": "swiglu"}, s, v, params=1100)
    for s, v in NOISY.items():
        write_run(tmp_path, f"rope_s{s}", {"pos": "rope"}, s, v)
    write_run(tmp_path, "gqa_s0", {"attn": "gqa"}, 0, 2.5)
    return tmp_path


def test_means_deltas_and_the_paired_test(runs):
    rows = compare_dirs([runs])
    assert rows[0]["variant"] == "baseline" and rows[0]["baseline"]
    assert rows.baseline == "baseline"
    base, rms = by_name(rows)["baseline"], by_name(rows)["norm=rmsnorm"]
    assert base["n"] == 3 and base["mean"] == pytest.approx(3.05)
    assert base["std"] == pytest.approx(0.05)
    assert rms["mean"] == pytest.approx(sum(PAIRED.values()) / 3)
    assert rms["delta"] == pytest.approx(rms["mean"] - 3.05)
    # by hand: differences -0.10, -0.09, -0.11 -> mean -0.1, sd 0.01, t = -0.1 / (0.01 / sqrt 3)
    t = -0.1 / (0.01 / math.sqrt(3))
    assert rms["test"] == "paired t" and rms["df"] == 2
    assert rms["t"] == pytest.approx(t, rel=1e-6)
    assert rms["p_value"] == pytest.approx(2 * stats.t.sf(abs(t), 2), rel=1e-6)
    assert rms["verdict"] == "better"  # lower val_loss, p ~ 0.003
    # the diverged seed is shown, not averaged in and not dropped
    assert rms["runs"] == 4 and rms["n"] == 3
    assert rms["status"] == {"completed": 3, "diverged": 1}


def test_welch_when_the_seeds_differ_and_no_test_with_one_seed(runs):
    rows = by_name(compare_dirs([runs]))
    sw = rows["act=swiglu"]
    a, b = list(WELCH.values()), list(BASE.values())
    va, vb = stats.tvar(a) / 3, stats.tvar(b) / 3  # Welch by hand
    t = (sum(a) / 3 - sum(b) / 3) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / 2 + vb ** 2 / 2)
    assert sw["test"] == "Welch t"
    assert sw["t"] == pytest.approx(t, rel=1e-6) and sw["df"] == pytest.approx(df, rel=1e-6)
    assert sw["p_value"] == pytest.approx(2 * stats.t.sf(abs(t), df), rel=1e-6)
    assert sw["verdict"] == "worse"
    assert sw["params_delta"] == 100 and sw["params_delta_pct"] == pytest.approx(10.0)
    noisy = rows["pos=rope"]
    assert noisy["test"] == "paired t" and noisy["p_value"] > 0.05 and noisy["verdict"] == "noise"
    one = rows["attn=gqa"]
    assert one["n"] == 1 and one["std"] is None and one["delta"] == pytest.approx(2.5 - 3.05)
    assert one["test"] is None and one["verdict"] is None


def test_table_names_the_test_the_size_change_and_the_divergence(runs):
    from rich.console import Console

    rows = compare_dirs([runs])
    console = Console(width=280, record=True)
    print_comparison(rows, console)
    text = console.export_text()
    assert "paired t, p=0.00" in text and "Welch t, p=" in text
    assert "1 diverged" in text and "+10.00%" in text
    assert "no test" in text  # one seed
    assert "act=swiglu (+100 params, +10.00%)" in text  # the note under the table
    data = json.loads(to_json(rows))
    assert [r["variant"] for r in data] == [r["variant"] for r in rows]


def test_seed_test_edge_cases():
    same = seed_test({0: 1.0, 1: 2.0}, {0: 1.0, 1: 2.0})  # deterministic reruns: no difference
    assert same.test == "paired t" and same.p_value == 1.0
    shifted = seed_test({0: 1.0, 1: 2.0}, {0: 1.5, 1: 2.5})  # the same shift on every seed
    assert shifted.p_value == 0.0
    assert seed_test({0: 1.0}, {0: 2.0, 1: 3.0}).test is None
    # one seed in common is no pairing: Welch over all values
    one_common = seed_test({0: 1.0, 1: 2.0, 2: 1.5}, {2: 1.2, 3: 1.9, 4: 1.4})
    assert one_common.test == "Welch t" and one_common.test_seeds == [2, 3, 4]


def test_a_diverged_seed_leaves_the_pairing_not_the_paired_test(tmp_path):
    """Seed 2 of the variant diverged: the paired t-test runs on seeds {0, 1}, the row says
    that its mean is over 2 of 3 seeds, and Welch is not used."""
    base, var = {0: 3.00, 1: 3.10, 2: 3.05}, {0: 2.93, 1: 3.01}
    for s, v in base.items():
        write_run(tmp_path, f"base_s{s}", {}, s, v)
    for s, v in var.items():
        write_run(tmp_path, f"rms_s{s}", {"norm": "rmsnorm"}, s, v)
    write_run(tmp_path, "rms_s2", {"norm": "rmsnorm"}, 2, None, status="diverged")
    rows = compare_dirs([tmp_path])
    rms = by_name(rows)["norm=rmsnorm"]
    # by hand: differences -0.07, -0.09 -> mean -0.08, sd 0.01*sqrt(2), t = -0.08 / (sd / sqrt 2) = -8
    t = -8.0
    assert rms["test"] == "paired t" and rms["df"] == 1 and rms["test_seeds"] == [0, 1]
    assert rms["t"] == pytest.approx(t, rel=1e-6)
    assert rms["p_value"] == pytest.approx(2 * stats.t.sf(abs(t), 1), rel=1e-6)  # 0.0792
    assert rms["verdict"] == "noise"  # two pairs cannot beat p<0.05 here
    # mean +- std over the survivors; delta against the baseline's three seeds
    assert rms["mean"] == pytest.approx(2.97) and rms["std"] == pytest.approx(0.08 / math.sqrt(2))
    assert rms["delta"] == pytest.approx(2.97 - 3.05)
    assert rms["n"] == 2 and rms["runs"] == 3 and rms["coverage"] == "2 of 3 seeds; 1 diverged"
    assert by_name(rows)["baseline"]["coverage"] is None
    data = by_name(json.loads(to_json(rows)))["norm=rmsnorm"]
    assert data["coverage"] == "2 of 3 seeds; 1 diverged" and data["test_seeds"] == [0, 1]
    from rich.console import Console

    console = Console(width=250, record=True)
    print_comparison(rows, console)
    text = console.export_text()
    assert "no (paired t, p=0.0792, Holm p=0.0792)" in text and "Welch" not in text  # one test: Holm = raw
    assert "2 of 3" in text
    assert "note: norm=rmsnorm: 2 of 3 seeds; 1 diverged; its mean is over the completed seeds only" in text


def test_a_baseline_seed_that_failed_pairs_the_variant_on_the_rest(tmp_path):
    base, var = {0: 3.00, 1: 3.10}, {0: 2.90, 1: 3.02, 2: 2.97}
    for s, v in base.items():
        write_run(tmp_path, f"base_s{s}", {}, s, v)
    write_run(tmp_path, "base_s2", {}, 2, None, status="failed")
    for s, v in var.items():
        write_run(tmp_path, f"rms_s{s}", {"norm": "rmsnorm"}, s, v)
    rows = compare_dirs([tmp_path])
    rms = by_name(rows)["norm=rmsnorm"]
    expected = stats.ttest_rel([2.90, 3.02], [3.00, 3.10])  # seed 2 has no partner
    assert rms["test"] == "paired t" and rms["test_seeds"] == [0, 1]
    assert rms["p_value"] == pytest.approx(expected.pvalue) and rms["t"] == pytest.approx(expected.statistic)
    assert rms["mean"] == pytest.approx(sum(var.values()) / 3)  # all three of its seeds
    assert rms["coverage"] is None and by_name(rows)["baseline"]["coverage"] == "2 of 3 seeds; 1 failed"
    from rich.console import Console

    console = Console(width=280, record=True)
    print_comparison(rows, console)
    assert "paired t on seeds 0,1, p=" in console.export_text()


def test_baseline_by_variant_name_or_directory(runs):
    rows = compare_dirs([runs], baseline="norm=rmsnorm")
    assert rows[0]["variant"] == "norm=rmsnorm"
    assert by_name(rows)["baseline"]["delta"] == pytest.approx(3.05 - sum(PAIRED.values()) / 3)
    rows = compare_dirs([runs], baseline=str(runs / "rope_s1"))
    assert rows[0]["variant"] == "pos=rope"
    with pytest.raises(CompareError, match="matches no variant; variants: baseline"):
        compare_dirs([runs], baseline="norm=nope")
    with pytest.raises(CompareError, match="runs of 5 variants"):
        compare_dirs([runs], baseline=str(runs))


def test_sweep_names_and_two_sweeps_kept_apart(tmp_path):
    for sweep in ("s1", "s2"):
        lr = {"s1": 0.0, "s2": 0.5}[sweep]
        for s in (0, 1):
            d = write_run(tmp_path / sweep, f"0_baseline_seed{s}", {}, s, 3.0 + lr + 0.01 * s,
                          sweep=sweep, variant="baseline")
            cfg = yaml.safe_load((d / "config.yaml").read_text())
            cfg["train"]["lr"] = lr  # a different config: a different variant, same name
            (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    rows = compare_dirs([tmp_path / "s1"])
    assert [r["variant"] for r in rows] == ["baseline"] and rows[0]["n"] == 2
    # the two sweeps differ in train.lr, which neither swept: refused, unless asked for
    with pytest.raises(CompareError, match=r"differ in more than axis options and seed.*train\.lr \(0\.0 in 2 runs, 0\.5 in 2 runs\)"):
        compare_dirs([tmp_path])
    rows = compare_dirs([tmp_path], allow_mixed=True)
    assert {r["variant"] for r in rows} == {"baseline", "baseline [s2]"}
    assert rows[0]["variant"] == "baseline" and rows[0]["mixed"] == ["train.lr"]


def test_metric_missing_in_some_runs_and_in_all(runs):
    d = runs / "rope_s2"
    s = json.loads((d / "summary.json").read_text())
    s.pop("val_loss")
    (d / "summary.json").write_text(json.dumps(s))
    rows = compare_dirs([runs])
    rope = by_name(rows)["pos=rope"]
    assert rope["n"] == 2 and rope["status"] == {"completed": 2, "no val_loss": 1}
    # seeds {0, 1} vs {0, 1, 2}: still paired, on the two seeds both have
    assert rope["test"] == "paired t" and rope["test_seeds"] == [0, 1] and rope["df"] == 1
    assert rope["p_value"] == pytest.approx(stats.ttest_rel([3.02, 3.07], [3.00, 3.10]).pvalue)
    assert rope["coverage"] == "2 of 3 seeds; 1 no val_loss"
    assert any("no final val_loss" in n for n in rows.notes)
    # a metrics.jsonl key works too (the last logged value); W&B names are accepted
    rows = compare_dirs([runs], metric="train/grad_norm")
    assert rows.metric == "grad_norm" and rows[0]["mean"] == pytest.approx(1.3)
    with pytest.raises(CompareError, match="no run has the metric 'val_ppl'; available: .*grad_norm"):
        compare_dirs([runs], metric="val_ppl")


def test_truncated_last_line_is_skipped_with_one_warning(tmp_path):
    d = write_run(tmp_path, "base_s0", {}, 0, 3.0)
    with (d / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "tokens": 512, "train_lo')
    warnings = []
    rows = compare_dirs([tmp_path], warn=warnings.append)
    assert len(warnings) == 1 and "truncated last line" in warnings[0]
    assert rows[0]["mean"] == 3.0
    assert [r["step"] for r in rows.groups[0].runs[0].rows] == [1, 2, 3]


def test_empty_and_missing_paths(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CompareError, match="no runs found"):
        compare_dirs([tmp_path / "empty"])
    with pytest.raises(CompareError, match="no such file or directory"):
        compare_dirs([tmp_path / "nope"])


def test_cli_json_and_clear_errors(runs, tmp_path):
    res = invoke_ablate("compare", str(runs), "--json")  # the CLI's entry point, in this process
    assert res.returncode == 0, res.stderr
    data = {r["variant"]: r for r in json.loads(res.stdout)}
    assert data["norm=rmsnorm"]["verdict"] == "better" and data["norm=rmsnorm"]["test"] == "paired t"
    (tmp_path / "empty").mkdir()
    for args, msg in ((["compare", str(tmp_path / "empty")], "no runs found"),
                      (["compare", str(tmp_path / "nope")], "no such file or directory"),
                      (["compare", str(runs), "--plot", str(tmp_path / "no" / "x.png")], "does not exist")):
        res = invoke_ablate(*args)
        assert res.returncode == 2 and res.stderr.startswith("error: ") and msg in res.stderr, res.stderr
        assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_the_baseline_is_named_with_its_reason(compare_runs, tmp_path):
    res = cli("compare", str(compare_runs))
    assert res.stdout.splitlines()[0] == "baseline: baseline (no axis changed)"
    res = cli("compare", str(compare_runs), "--baseline", "norm=rmsnorm")
    assert res.stdout.splitlines()[0] == "baseline: norm=rmsnorm (--baseline)"
    data = json.loads(cli("compare", str(compare_runs), "--json").stdout)
    assert data[0]["baseline_reason"] == "no axis changed" and data[1]["baseline_reason"] is None

    cmp = compare_dirs([write_study(tmp_path / "study")])
    assert (cmp.baseline, cmp.baseline_reason) == ("gpt2", "the study's first rung")


def test_confidence_intervals_match_scipy_and_holm_decides_the_verdict(compare_runs):
    rows = by_name(compare_dirs([compare_runs]))
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
