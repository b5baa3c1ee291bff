"""LR grids and ladders end to end on CPU: a real --lr-grid sweep runs the grid, then the seeds at each
variant's own best LR (no job twice), and `compare --json` of it carries the public keys; a
real --ladder sweep gives the compute multiplier; compares that mix grids are refused."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest

from conftest import TINY, built_once, invoke_ablate, no_login_env, run_ablate

GRID_ARGS = [o for o in TINY if not o.startswith(("train.steps", "train.eval_every"))] + [
    "train.steps=12", "train.eval_every=12", "train.diagnostics_every=6"]  # eval at 0: loss_init


def _grid(out: Path) -> None:
    res = run_ablate("sweep", "qk_norm=off,on", "--lr-grid", "1e-3:1e-1:3", "--seeds", "2",
                     *GRID_ARGS, f"hydra.sweep.dir={out}/sweep")
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.fixture(scope="module")
def grid_sweep(tmp_path_factory) -> Path:
    """One real --lr-grid sweep for the whole session (read, never changed, by its tests)."""
    return built_once(tmp_path_factory, "grid", _grid) / "sweep"


def test_the_grid_then_the_seeds_at_each_variants_best_lr(grid_sweep):
    sweep_dir = grid_sweep
    record = json.loads((sweep_dir / "sweep.json").read_text())
    names = [j["name"] for j in record["jobs"]]
    assert names[:6] == ["baseline_lr0.001_seed0", "baseline_lr0.01_seed0", "baseline_lr0.1_seed0",
                         "qk_norm=on_lr0.001_seed0", "qk_norm=on_lr0.01_seed0", "qk_norm=on_lr0.1_seed0"]
    assert len(names) == 8 and all(n.endswith("_seed1") for n in names[6:])
    cmp = json.loads(invoke_ablate("compare", str(sweep_dir), "--json").stdout)
    for row in cmp:
        loss = {float(k): v for k, v in row["curve"].items()}
        finished = {k: v for k, v in loss.items() if v is not None}
        assert row["best_lr"] == min(finished, key=finished.get)  # the phase-2 seed ran there
        assert f"{row['variant']}_lr{row['best_lr']:g}_seed1" in names
        assert row["n"] == 2 and row["loss_ci"] is not None
        assert row["max_attn_logit"] is not None and row["max_attn_logit_lr"] == 0.1
    base, on = cmp
    assert base["baseline"] and base["tuned_delta"] is None
    assert on["tuned_delta"] == pytest.approx(on["loss"] - base["loss"])  # paired over seeds 0 and 1
    assert 0 <= on["lr_sensitivity"] and math.isfinite(on["lr_sensitivity"])
    for key in ("best_lr", "lr_sensitivity", "tuned_delta", "tuned_delta_ci", "tuned_p_holm",
                "shared_delta", "verdict_differs", "best_lr_on_edge"):
        assert key in on


def test_every_format_carries_the_tuned_columns(grid_sweep, tmp_path):
    sweep_dir = grid_sweep
    for fmt, needle in (("table", "LR sensitivity"), ("markdown", "| best LR |"),
                        ("latex", r"\toprule"), ("csv", "best_lr,")):
        res = invoke_ablate("compare", str(sweep_dir), "--format", fmt)
        assert res.returncode == 0 and needle in res.stdout, res.stderr
    res = invoke_ablate("compare", str(sweep_dir), "--plot", str(tmp_path / "lr.png"))
    assert res.returncode == 0 and (tmp_path / "lr.png").stat().st_size > 10_000


def test_a_compare_mixing_two_grids_is_refused(grid_sweep, tmp_path):
    """The sweep beside a copy of itself whose record (transfer.json) names another grid, as a
    sweep of `--lr-grid 1e-3:1e-2:3` would write it."""
    sweep_dir = grid_sweep
    other = tmp_path / "other"
    shutil.copytree(sweep_dir, other)
    record = json.loads((other / "transfer.json").read_text())
    assert record["grid"] == pytest.approx([1e-3, 1e-2, 1e-1])
    record["grid"] = [1e-3, 10 ** -2.5, 1e-2]
    (other / "transfer.json").write_text(json.dumps(record))
    assert invoke_ablate("compare", str(other), "--json").returncode == 0  # alone, the copy compares
    res = invoke_ablate("compare", str(sweep_dir), str(other))
    assert res.returncode == 2 and "mix sweeps of different LR grids" in res.stderr
    assert res.stderr.count("\n") == 1


def test_the_sweep_logs_its_report_to_wandb_offline(tmp_path):
    from ablate.tracking.wandb_file import find_run_file, read_run

    sweep_dir = tmp_path / "sweep"
    args = [o for o in GRID_ARGS if not o.startswith("logger=")] + ["logger=wandb", "logger.group=grid-w"]
    res = run_ablate("sweep", "qk_norm=off,on", "--lr-grid", "1e-3:1e-1:3", *args,
                     f"hydra.sweep.dir={sweep_dir}", env=no_login_env(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "LR sensitivity" in res.stdout and (sweep_dir / "transfer.png").is_file()
    report = read_run(find_run_file(sweep_dir))  # the sweep dir's own W&B run: the report
    assert report.job_type == "transfer-report" and report.group == "grid-w"
    row = report.history[0]
    assert row["lr_grid/table/_type"] == "table-file" and row["lr_grid/table/nrows"] == 2
    assert row["lr_grid/plot/_type"] == "image-file"
    table = json.loads((find_run_file(sweep_dir).parent / "files" / row["lr_grid/table/path"]).read_text())
    assert {"variant", "best_lr", "lr_sensitivity", "tuned_delta"} <= set(table["columns"])
    assert report.summary["qk_norm=on/best_lr"] in (0.001, 0.01, 0.1)


LADDER_ARGS = [o for o in TINY if not o.startswith(("train.steps", "train.warmup_steps", "train.eval_every", "train.batch_size", "model.d_model", "model.n_layers", "model.n_heads"))] + [
    "train.eval_every=50"]


def _ladder(tmp_path, rungs, tokens_per_param=1.0):
    """A ladder file. Half a token per parameter trains each rung half as long: enough where a
    test reads ranks or the table, not the fitted projection (which needs the longer runs)."""
    path = tmp_path / "tiny_ladder.yaml"
    head = f"tokens_per_param: {tokens_per_param:g}\nbase_lr: 0.01\nbase_width: 16\nrungs:\n"
    path.write_text(head + "".join(
        f"  - {{name: {n}, d_model: {d}, n_layers: {l}, n_heads: {h}}}\n" for n, d, l, h in rungs))
    return path


@pytest.fixture(scope="module")
def ladder_sweep(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ladder")
    path = _ladder(tmp, [("a", 16, 1, 1), ("b", 24, 2, 2), ("c", 32, 2, 2)])
    res = run_ablate("sweep", "ladder.tokens_per_param=1,2", "--ladder", str(path), "--seeds", "2",
                     *LADDER_ARGS, "train.batch_size=4", f"hydra.sweep.dir={tmp}/sweep")
    assert res.returncode == 0, res.stdout + res.stderr
    return tmp / "sweep", res


def test_a_ladder_sweep_reports_the_compute_multiplier(ladder_sweep):
    sweep_dir, res = ladder_sweep
    assert "x projected" in res.stdout and (sweep_dir / "transfer.png").is_file()
    base, twice = json.loads(invoke_ablate("compare", str(sweep_dir), "--json").stdout)
    assert base["baseline"] and base["compute_multiplier"] is None
    assert [r["rung"] for r in twice["rungs"]] == ["a", "b", "c"]
    computes = [r["compute"] for r in base["rungs"]]
    assert computes == sorted(computes) and twice["target_compute"] == pytest.approx(10 * computes[-1])
    lo, hi = twice["compute_multiplier_ci"]
    assert lo <= twice["compute_multiplier"] <= hi
    for r in twice["rungs"]:  # twice the tokens (steps): the baseline needs more compute
        assert r["n"] == 2 and r["compute_multiplier"] > 1
        assert r["compute_multiplier_ci"][0] <= r["compute_multiplier"] <= r["compute_multiplier_ci"][1]
    # below the baseline's lowest loss (its largest rung, at least): read off its fitted curve, and said
    lowest = min(r["mean"] for r in base["rungs"])
    beyond = [r["rung"] for r in twice["rungs"] if r["mean"] < lowest]
    assert beyond and [r["rung"] for r in twice["rungs"] if r["compute_multiplier_extrapolated"]] == beyond
    assert f"x at {', '.join(beyond)} lies beyond the baseline's measured losses" in res.stdout
    assert twice["fit"]["l_inf"] == base["fit"]["l_inf"]  # one L_inf shared


def test_fewer_than_three_rungs_show_the_table_and_refuse_to_project_and_a_resume_changes_nothing(tmp_path):
    path = _ladder(tmp_path, [("a", 16, 1, 1), ("b", 24, 2, 2)], tokens_per_param=0.5)
    res = run_ablate("sweep", "ladder.tokens_per_param=0.5,1", "--ladder", str(path), *LADDER_ARGS,
                     "train.batch_size=4", f"hydra.sweep.dir={tmp_path}/sweep")
    assert res.returncode == 0, res.stderr
    assert "fewer than 3 rungs" in res.stdout and re.search(r"┃\s+b\s+┃", res.stdout)  # rung b's column
    before = invoke_ablate("compare", str(tmp_path / "sweep"), "--json").stdout
    rows = json.loads(before)
    assert rows[1]["compute_multiplier"] is None and rows[1]["rungs"][1]["delta"] is not None
    # a ladder sweep resumed (its variant's own tokens per parameter included): nothing runs again
    again = run_ablate("resume", str(tmp_path / "sweep"))
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.count("done earlier") == 4 and "ladder.tokens_per_param=1_b" in again.stdout
    assert invoke_ablate("compare", str(tmp_path / "sweep"), "--json").stdout == before


def test_one_lr_of_a_grid_is_an_ordinary_comparison_and_other_flags_are_refused(grid_sweep):
    sweep_dir = grid_sweep
    one = invoke_ablate("compare", str(sweep_dir), "--where", "train.lr=0.1", "--json")
    rows = json.loads(one.stdout)
    assert [r["variant"] for r in rows] == ["baseline", "qk_norm=on"]
    assert rows[1]["n"] == 1 and rows[1]["delta"] is not None and "best_lr" not in rows[1]
    for flag in (["--per-seed"], ["--metric", "val_bpb"]):
        res = invoke_ablate("compare", str(sweep_dir), *flag)
        assert res.returncode == 2 and "not available for an --lr-grid or --ladder sweep" in res.stderr


def test_three_variants_on_a_ladder_report_ranks_and_their_agreement(tmp_path):
    path = _ladder(tmp_path, [("a", 16, 1, 1), ("b", 24, 2, 2), ("c", 32, 2, 2)], tokens_per_param=0.5)
    res = run_ablate("sweep", "act=gelu,swiglu,relu", "--ladder", str(path), *LADDER_ARGS,
                     "train.batch_size=4", f"hydra.sweep.dir={tmp_path}/sweep")
    assert res.returncode == 0, res.stderr
    rows = json.loads(invoke_ablate("compare", str(tmp_path / "sweep"), "--json").stdout)
    assert len(rows) == 3 and "rank agreement" in res.stdout
    for i in range(3):  # each rung's ranks are 1..3, by mean loss
        by_rank = sorted(rows, key=lambda r: r["ranks"][i])
        assert [r["ranks"][i] for r in by_rank] == [1, 2, 3]
        losses = [r["rungs"][i]["mean"] for r in by_rank]
        assert losses == sorted(losses)
    first, last = [{r["variant"]: r["ranks"][k] for r in rows} for k in (0, 2)]
    pairs = [(x, y) for x in first for y in first if x < y]
    held = sum((first[x] < first[y]) == (last[x] < last[y]) for x, y in pairs) / len(pairs)
    assert rows[0]["rank_agreement"] == pytest.approx(held)


def test_a_ladder_with_an_lr_grid_compares_each_variant_at_its_best_lr_on_each_rung(tmp_path):
    path = _ladder(tmp_path, [("a", 16, 1, 1), ("b", 24, 2, 2), ("c", 32, 2, 2)])
    res = run_ablate("sweep", "qk_norm=off,on", "--ladder", str(path), "--lr-grid", "3e-3:3e-2:3",
                     "--seeds", "2", *LADDER_ARGS, "train.batch_size=4", f"hydra.sweep.dir={tmp_path}/sweep")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "[24/24]" in res.stdout and "│ LR " in res.stdout  # each rung's best LR, a line of its own
    assert "sweep: jobs 1-18 of 24 -> " in res.stdout and "sweep: jobs 19-24 of 24 -> " in res.stdout
    rows = json.loads(invoke_ablate("compare", str(tmp_path / "sweep"), "--json").stdout)
    runs = [(p.parent.name, json.loads(p.read_text())) for p in (tmp_path / "sweep").glob("*/summary.json")]
    lr_of = lambda s: float(next(o for o in s["overrides"] if o.startswith("train.lr=")).split("=")[1])  # noqa: E731
    for row in rows:
        for rung in row["rungs"]:
            mine = [s for name, s in runs if s["variant"] == row["variant"] and f"_{rung['rung']}_lr" in name]
            scan = {lr_of(s): s["val_loss"] for s in mine if s["seed"] == 0}
            assert len(scan) == 3 and rung["best_lr"] == pytest.approx(min(scan, key=scan.get), rel=1e-3)
            there = [s["val_loss"] for s in mine if math.isclose(lr_of(s), rung["best_lr"], rel_tol=1e-3)]
            assert rung["n"] == len(there) == 2 and rung["mean"] == pytest.approx(sum(there) / 2)
        # grid steps (x sqrt(10) each) from a's best LR to c's, negative: smaller at c
        first, last = row["rungs"][0]["best_lr"], row["rungs"][-1]["best_lr"]
        assert row["lr_steps_moved"] == round(math.log(last / first) / math.log(10 ** 0.5))
    assert rows[1]["compute_multiplier"] is not None and rows[1]["compute_multiplier_ci"] is not None
    assert "LR moved a→c" in invoke_ablate("compare", str(tmp_path / "sweep"), "--format", "markdown").stdout
