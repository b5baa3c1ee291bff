"""A ladder with `lr_rule: mup` trains every rung at one learning rate, the parametrization
(param=mup, completep) scaling the rest from the ladder's base shape; with --lr-grid it scans the
smallest rung only, then runs every rung at each variant's pick there. Bad input (lr_rule mup with
param=sp, the width rule with mup, ladder keys that are not the ladder's) is one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from ablate.sweep.transfer_plan import TransferPlan, load_ladder
from conftest import TINY, built_once, run_ablate

SIZES = ("model.d_model", "model.n_layers", "model.n_heads")
RUN_ARGS = [o for o in TINY if not o.startswith(("train.steps", "train.eval_every", *SIZES))] + ["train.eval_every=50"]


def ladder_file(directory: Path, rungs, **keys) -> Path:
    """A ladder file of `rungs` [(name, d_model, n_layers, n_heads)] and `keys` (tokens_per_param
    1 and base_lr 0.01 unless given)."""
    head = {"tokens_per_param": 1, "base_lr": 0.01, **keys}
    if "steps" in keys:
        del head["tokens_per_param"]
    path = directory / "mup_ladder.yaml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in head.items()) + "rungs:\n" + "".join(
        f"  - {{name: {n}, d_model: {d}, n_layers: {l}, n_heads: {h}}}\n" for n, d, l, h in rungs))
    return path


RUNGS = [("a", 16, 1, 2), ("b", 32, 1, 2), ("c", 64, 2, 2)]


def dry(*args, tmp_path) -> list[dict]:
    res = run_ablate("sweep", *args, f"out_dir={tmp_path}/o", "--dry-run", "--json")
    assert res.returncode == 0, res.stderr
    return [dict(o.split("=", 1) for o in job) for job in json.loads(res.stdout)]


def test_every_rung_trains_at_base_lr_with_the_ladders_base_shape(tmp_path):
    path = ladder_file(tmp_path, RUNGS, lr_rule="mup", base_lr=0.004)
    jobs = dry("act=gelu,relu", "param=mup", "--ladder", str(path), tmp_path=tmp_path)
    assert len(jobs) == 2 * 3
    assert {j["train.lr"] for j in jobs} == {"0.004"}
    # no base in the file: the smallest rung's width and depth, on every rung
    assert {(j["model.base_width"], j["model.base_depth"]) for j in jobs} == {("16", "1")}
    assert [j["model.d_model"] for j in jobs[::2]] == ["16", "32", "64"]
    path = ladder_file(tmp_path, RUNGS, lr_rule="mup", base_width=32, base_depth=2)
    jobs = dry("act=gelu,relu", "param=completep", "--ladder", str(path), tmp_path=tmp_path)
    assert {(j["model.base_width"], j["model.base_depth"]) for j in jobs} == {("32", "2")}


def test_the_ladders_keys_can_be_set_on_the_command_line(tmp_path):
    """`ladder.lr_rule=mup` (and the base) over the cpu ladder's width rule; a param=sp variant
    beside a mup one trains without the base keys."""
    cpu = load_ladder("cpu")
    jobs = dry("param=mup,completep", "--ladder", "cpu", "ladder.lr_rule=mup", "ladder.base_width=96",
               tmp_path=tmp_path)
    assert {j["train.lr"] for j in jobs} == {f"{cpu.base_lr:g}"}
    assert {j["model.base_width"] for j in jobs} == {"96"} and "ladder.lr_rule" not in jobs[0]
    text = run_ablate("sweep", "param=mup,completep", "--ladder", "cpu", "ladder.lr_rule=mup",
                      "ladder.base_width=96", f"out_dir={tmp_path}/o", "--dry-run").stdout
    assert "param base shape: d_model 96, 2 layers" in text
    jobs = dry("param=sp,mup", "--ladder", "cpu", "ladder.lr_rule=fixed", "ladder.base_width=96",
               "ladder.steps=30", tmp_path=tmp_path)
    assert ["model.base_width" in j for j in jobs[:2]] == [False, True]
    assert {j["train.steps"] for j in jobs} == {"30"}  # in place of the file's tokens per parameter


def test_lr_grid_scans_the_smallest_rung_then_runs_every_rung_at_its_pick(tmp_path, monkeypatch):
    path = ladder_file(tmp_path, RUNGS, lr_rule="mup")
    jobs = dry("act=gelu,relu", "param=mup", "--ladder", str(path), "--lr-grid", "1e-3:1e-1:3",
               "--seeds", "2", tmp_path=tmp_path)
    assert [(j["act"], j["model.d_model"], j["train.lr"], j["seed"]) for j in jobs] == [
        (a, "16", lr, "0") for a in ("gelu", "relu") for lr in ("0.001", "0.01", "0.1")]
    text = run_ablate("sweep", "act=gelu,relu", "param=mup", "--ladder", str(path), "--lr-grid", "1e-3:1e-1:3",
                      "--seeds", "2", f"out_dir={tmp_path}/o", "--dry-run").stdout
    # variants x grid, then variants x (rungs x seeds - 1)
    assert "2 variants x 3 learning rates (0.001, 0.01, 0.1) on a, seed 0 (lr_rule mup: one scan" in text
    assert ("then: every rung, seeds 0..1 (seed 0 of a is the scan's), of each variant at its own best LR "
            "of a (lr_rule mup: one LR for every rung): 10 jobs") in text
    # the second phase, from the first's results: baseline best at 0.01, act=relu at 0.1
    plan = TransferPlan.make(["act=gelu,relu", "param=mup"], "ofat", 2, None, "1e-3:1e-1:3", str(path),
                             lambda job, rung: (100 * rung.d_model, 128), lambda job: 3e-3, lambda job: "mup")
    losses = {j.name: 3.0 - j.name.endswith("lr0.01_seed0") * (j.variant == "baseline")
              - j.name.endswith("lr0.1_seed0") * (j.variant == "act=relu") for j in plan.jobs}
    monkeypatch.setattr("ablate.sweep.progress.final_metric", lambda d, name: losses[d])
    second = plan.next_jobs([SimpleNamespace(job=j, status="completed", run_dir=j.name) for j in plan.jobs])
    assert [j.name for j in second] == [
        "baseline_a_lr0.01_seed1", "act=relu_a_lr0.1_seed1",
        "baseline_b_lr0.01_seed0", "baseline_b_lr0.01_seed1", "act=relu_b_lr0.1_seed0", "act=relu_b_lr0.1_seed1",
        "baseline_c_lr0.01_seed0", "baseline_c_lr0.01_seed1", "act=relu_c_lr0.1_seed0", "act=relu_c_lr0.1_seed1"]
    assert all(j.overrides[-1] == f"seed={j.seed}" and "model.base_width=16" in j.overrides for j in second)


@pytest.mark.parametrize("args, message", [
    (["param=sp", "act=gelu,relu", "ladder.lr_rule=mup"], "lr_rule mup trains every rung at one LR and leaves the width to "
     "the parametrization, but the baseline has param=sp"),
    (["param=mup,sp", "ladder.lr_rule=mup", "ladder.base_width=96"], "but a variant has param=sp"),
    (["param=mup", "act=gelu,relu"], "lr_rule width scales the LR by base_width / d_model, which the "
     "baseline's param=mup already does"),
    (["act=gelu,relu", "ladder.lr_rule=fixed,mup"], "ladder.lr_rule applies to the whole ladder"),
    (["act=gelu,relu", "ladder.rungs=3"], "ladder.rungs: not a ladder key that can be set here"),
    (["act=gelu,relu", "ladder.lr_rule=sometimes"], "lr_rule must be one of width, fixed, mup, got sometimes"),
    (["act=gelu,relu", "ladder.base_width=0"], "must be positive"),
    (["act=gelu,relu", "model.base_width=64"], "sets model.base_width on each rung"),
    (["param=mup,completep", "ladder.lr_rule=mup"], "model.base_width=128 is not divisible by model.n_heads=3"),
])
def test_bad_mup_ladder_input_is_one_line_and_nothing_launched(args, message, tmp_path):
    res = run_ablate("sweep", *args, "--ladder", "cpu", "logger=none", f"out_dir={tmp_path}")
    assert res.returncode == 2, res.stdout + res.stderr
    assert message in res.stderr and res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert not list(tmp_path.iterdir())


def test_ladder_keys_outside_a_ladder_and_tokens_on_a_steps_ladder_are_refused(tmp_path):
    res = run_ablate("sweep", "act=gelu,relu", "ladder.lr_rule=mup", "logger=none", f"out_dir={tmp_path}")
    assert res.returncode == 2 and "ladder.lr_rule sets the ladder of a --ladder sweep" in res.stderr
    path = ladder_file(tmp_path, RUNGS, steps=20, lr_rule="fixed")
    res = run_ablate("sweep", "ladder.tokens_per_param=1,2", "--ladder", str(path), "logger=none",
                     f"out_dir={tmp_path}/o")
    assert res.returncode == 2 and "trains 20 steps on every rung" in res.stderr and res.stderr.count("\n") == 1
    assert not (tmp_path / "o").exists()


# ---- a real sweep ---------------------------------------------------------------------------------
def _mup_sweep(out: Path) -> None:
    path = ladder_file(out, [("a", 16, 1, 2), ("b", 64, 1, 2)], steps=8, lr_rule="mup")
    res = run_ablate("sweep", "act=gelu,relu", "param=mup", "--ladder", str(path), "--lr-grid", "3e-3:3e-2:3",
                     "--seeds", "2", *RUN_ARGS, f"hydra.sweep.dir={out}/sweep")
    assert res.returncode == 0, res.stdout + res.stderr
    (out / "stdout.txt").write_text(res.stdout)


@pytest.fixture(scope="module")
def mup_sweep(tmp_path_factory) -> Path:
    return built_once(tmp_path_factory, "mup-ladder", _mup_sweep)


def _summaries(sweep_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(sweep_dir.glob("*/summary.json"))]


def _lr(summary: dict) -> float:
    return float(next(o for o in summary["overrides"] if o.startswith("train.lr=")).split("=")[1])


def test_a_real_mup_ladder_runs_every_rung_at_the_smallest_rungs_best_lr(mup_sweep):
    sweep_dir = mup_sweep / "sweep"
    runs = _summaries(sweep_dir)
    assert len(runs) == 2 * 3 + 2 * (2 * 2 - 1)
    for variant in ("baseline", "act=relu"):
        mine = [s for s in runs if s["variant"] == variant]
        scan = {_lr(s): s["val_loss"] for s in mine if "model.d_model=16" in s["overrides"] and s["seed"] == 0}
        pick = min(scan, key=scan.get)
        assert len(scan) == 3 and len(mine) == 3 + 3
        rest = [s for s in mine if not ("model.d_model=16" in s["overrides"] and s["seed"] == 0)]
        assert {_lr(s) for s in rest} == {pick}  # seed 1 on a, both seeds on b: the one pick
        assert all("model.base_width=16" in s["overrides"] for s in mine)
        row = next(r for r in json.loads(run_ablate("compare", str(sweep_dir), "--json").stdout)
                   if r["variant"] == variant)
        assert [r["best_lr"] for r in row["rungs"]] == [pytest.approx(pick)] * 2
        assert [r["n"] for r in row["rungs"]] == [2, 2] and row["lr_steps_moved"] is None
    assert "lr_rule mup: one LR scan, at a" in (mup_sweep / "stdout.txt").read_text()


def test_the_largest_rungs_hidden_lr_is_its_base_lr_times_base_width_over_width(mup_sweep):
    """The largest rung's run as trained (d_model 64, the ladder's base 16): its optimizer's
    hidden matrices (attention and FFN, in and out) take the LR x 16/64 = 1/4, every other
    parameter the LR itself (Tensor Programs V, Table 3, Adam: hidden LR x base fan-in / fan-in)."""
    import torch

    from ablate.model.roles import Role, role_of
    from ablate.run.trained import load_run_model
    from ablate.train.optimizer import build_optimizer

    run = next(d for d in sorted((mup_sweep / "sweep").iterdir()) if "_b_" in d.name and d.name.endswith("seed1"))
    loaded = load_run_model(run)
    assert (loaded.cfg.model.d_model, loaded.cfg.model.base_width) == (64, 16)
    optimizer = build_optimizer(loaded.model, loaded.cfg.train, torch.device("cpu"))
    lr = float(loaded.cfg.train.lr)
    lr_of = {id(p): g["lr"] for g in optimizer.param_groups for p in g["params"]}
    roles = {role_of(p): [] for p in loaded.model.parameters()}
    for p in loaded.model.parameters():
        roles[role_of(p)].append(lr_of[id(p)])
    assert {Role.INPUT, Role.OUTPUT, Role.EMBEDDING} <= set(roles)
    for role, lrs in roles.items():
        hidden = role in (Role.INPUT, Role.OUTPUT)
        assert lrs == [pytest.approx(lr * 16 / 64 if hidden else lr)] * len(lrs), role


def test_a_later_rung_the_model_refuses_stops_the_sweep_before_anything_runs(tmp_path):
    """With --lr-grid only the smallest rung is scanned first; the other rungs run later, at the
    pick, but their shapes are known now: one the model refuses (3 heads with a base width of 32
    under mup) is refused before the scan, naming its job."""
    path = ladder_file(tmp_path, [("a", 32, 1, 2), ("b", 48, 1, 3), ("c", 96, 2, 3)], lr_rule="mup",
                       base_width=32, base_depth=1)
    res = run_ablate("sweep", "act=gelu,relu", "param=mup", "--ladder", str(path), "--lr-grid", "1e-3:1e-1:3", "--seeds", "2",
                     f"out_dir={tmp_path}/o", *RUN_ARGS, "--dry-run")
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert res.stderr.startswith("error: job baseline_b_seed1 (after the first phase): model.base_width=32 "
                                 "is not divisible by model.n_heads=3"), res.stderr
    assert not (tmp_path / "o").exists()
