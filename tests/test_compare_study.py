"""`ablate compare` of a study sweep (a cumulative ladder, `ablate sweep study=gpt2_to_llama`):
rows in ladder order, and each rung's own step against the rung before it, with its own seed
test. Synthetic sweep directories: a multirun.yaml with the job list plus run dirs with known
numbers."""

from __future__ import annotations

import json
import math

import pytest
import yaml
from rich.console import Console
from scipy import stats

from ablate.analysis import compare_dirs
from ablate.analysis.columns import print_comparison
from conftest import invoke_ablate
from compare_fixtures import LADDER, SWEEP, VALUES, write_run, write_study  # noqa: F401

def paired_by_hand(after: dict, before: dict) -> tuple[float, float]:
    d = [after[s] - before[s] for s in sorted(set(after) & set(before))]
    mean = sum(d) / len(d)
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1))
    t = mean / (sd / math.sqrt(len(d)))
    return t, 2 * stats.t.sf(abs(t), len(d) - 1)


def mean(values: dict) -> float:
    vs = [v for v in values.values() if v is not None]
    return sum(vs) / len(vs)


def test_study_rows_follow_the_ladder_with_each_steps_gain(tmp_path):
    rows = compare_dirs([write_study(tmp_path)])
    assert [r["variant"] for r in rows] == ["gpt2", "+rmsnorm", "+swiglu", "+rope"]
    assert rows.baseline == "gpt2" and rows[0]["baseline"]
    first, rms, swiglu, rope = rows
    assert first["prev"] is None and first["delta_prev"] is None and first["test_prev"] is None
    assert [r["prev"] for r in rows[1:]] == ["gpt2", "+rmsnorm", "+swiglu"]
    for row, (after, before) in zip(rows[1:], [("+rmsnorm", "gpt2"), ("+swiglu", "+rmsnorm"),
                                               ("+rope", "+swiglu")]):
        t, p = paired_by_hand(VALUES[after], VALUES[before])
        assert row["test_prev"] == "paired t" and row["df_prev"] == 2
        assert row["delta_prev"] == pytest.approx(mean(VALUES[after]) - mean(VALUES[before]))
        assert row["t_prev"] == pytest.approx(t, rel=1e-6) and row["p_prev"] == pytest.approx(p, rel=1e-6)
    # +rope's step is real on its own, +swiglu's is not, whatever their total vs gpt2 says
    assert rope["verdict_prev"] == "better" and swiglu["verdict_prev"] == "noise"
    assert swiglu["verdict"] == "better"  # vs gpt2 it rides on +rmsnorm's gain
    # the vs-baseline columns are kept
    assert rope["delta"] == pytest.approx(mean(VALUES["+rope"]) - mean(VALUES["gpt2"]))
    assert rope["p_value"] == pytest.approx(paired_by_hand(VALUES["+rope"], VALUES["gpt2"])[1], rel=1e-6)

    console = Console(width=330, record=True)
    print_comparison(rows, console)
    text = console.export_text()
    assert "Δ vs previous rung" in text and "step beyond seed noise?" in text
    line = next(ln for ln in text.splitlines() if "+swiglu" in ln)
    assert f"{swiglu['delta_prev']:+.4f}" in line and f"no (paired t, p={swiglu['p_prev']:.3g}, Holm p=" in line


def test_study_step_with_a_diverged_seed_and_a_missing_rung(tmp_path):
    values = {**VALUES, "+rmsnorm": {0: 2.90, 1: 3.01, 2: None}}  # seed 2 diverged
    rows = {r["variant"]: r for r in compare_dirs([write_study(tmp_path, values=values, skip=("+swiglu",))])}
    assert list(rows) == ["gpt2", "+rmsnorm", "+rope"]
    rms = rows["+rmsnorm"]
    t, p = paired_by_hand({0: 2.90, 1: 3.01}, VALUES["gpt2"])  # paired on seeds 0, 1
    assert rms["test_prev"] == "paired t" and rms["test_seeds_prev"] == [0, 1]
    assert rms["p_prev"] == pytest.approx(p, rel=1e-6) and rms["coverage"] == "2 of 3 seeds; 1 diverged"
    # +swiglu has no runs: +rope's step is measured from +rmsnorm, and the notes say so
    rope = rows["+rope"]
    assert rope["prev"] == "+rmsnorm"
    assert rope["p_prev"] == pytest.approx(paired_by_hand(VALUES["+rope"], {0: 2.90, 1: 3.01})[1], rel=1e-6)
    cmp = compare_dirs([tmp_path / SWEEP])
    assert "+rope: the rung before it has no runs; its step is measured from +rmsnorm" in cmp.notes


def test_welch_step_when_a_rung_ran_other_seeds_and_baseline_override(tmp_path):
    values = {**VALUES, "+swiglu": {3: 2.88, 4: 3.03, 5: 2.91}}
    sweep = write_study(tmp_path, values=values)
    rows = {r["variant"]: r for r in compare_dirs([sweep], baseline="+rmsnorm")}
    assert list(rows) == ["gpt2", "+rmsnorm", "+swiglu", "+rope"]  # still the ladder's order
    assert rows["+rmsnorm"]["baseline"] and rows["gpt2"]["delta"] == pytest.approx(
        mean(VALUES["gpt2"]) - mean(VALUES["+rmsnorm"]))
    sw = rows["+swiglu"]
    expected = stats.ttest_ind(list(values["+swiglu"].values()), list(VALUES["+rmsnorm"].values()),
                               equal_var=False)
    assert sw["test_prev"] == "Welch t" and sw["p_prev"] == pytest.approx(expected.pvalue)
    assert rows["+rope"]["test_prev"] == "Welch t"  # its seeds {0,1,2} vs {3,4,5}


def test_a_plain_sweep_has_no_ladder_columns_and_the_cli_json_has_them(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"sweeper": {"jobs": None}}}))
    for s, v in VALUES["gpt2"].items():
        write_run(plain, f"0_baseline_seed{s}", {}, s, v, sweep="plain", variant="baseline")
    rows = compare_dirs([plain])
    assert "delta_prev" not in rows[0] and "prev" not in rows[0]
    console = Console(width=300, record=True)
    print_comparison(rows, console)
    assert "previous rung" not in console.export_text()

    res = invoke_ablate("compare", str(write_study(tmp_path / "s")), "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert [r["variant"] for r in data] == ["gpt2", "+rmsnorm", "+swiglu", "+rope"]
    assert data[3]["verdict_prev"] == "better" and data[3]["test_prev"] == "paired t"
    assert data[3]["p_prev"] == pytest.approx(paired_by_hand(VALUES["+rope"], VALUES["+swiglu"])[1], rel=1e-6)
