"""Which runs may share a comparison (ablate/analysis/comparable.py): runs that differ in a setting
are refused in one line naming the keys, unless --allow-mixed or --where keeps like with like;
axis sub-keys, stability keys and a sweep's own swept key are variants, not settings."""

from __future__ import annotations

import json

import pytest

from ablate.analysis import CompareError, compare_dirs
from compare_fixtures import BASE, cli, set_config, write_run
from conftest import run_ablate


def test_runs_that_differ_in_steps_are_refused_with_one_line_naming_the_keys(compare_runs):
    short = write_run(compare_runs, "short_s0", {}, 0, 3.9)  # the user's extra 10-step run
    set_config(short, "train.steps", 10)
    set_config(short, "model.d_model", 64)
    res = run_ablate("compare", str(compare_runs))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "model.d_model (32 in 9 runs, 64 in 1 run)" in lines[0]
    assert "train.steps (6 in 9 runs, 10 in 1 run)" in lines[0] and "--allow-mixed" in lines[0]
    assert res.stdout == ""
    # --allow-mixed: the table is printed and says it is mixed
    res = cli("compare", str(compare_runs), "--allow-mixed")
    assert res.exit_code == 0, res.stderr
    assert res.stdout.startswith("MIXED (--allow-mixed): the runs also differ in model.d_model")
    assert json.loads(cli("compare", str(compare_runs), "--allow-mixed", "--json").stdout)[0]["mixed"] == \
        ["model.d_model", "train.steps"]
    # or keep like with like: --where selects the 6-step runs, nothing is mixed
    res = cli("compare", str(compare_runs), "--where", "train.steps=6", "--json")
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
