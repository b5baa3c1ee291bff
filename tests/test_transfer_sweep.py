"""`ablate sweep --lr-grid` and `--ladder` plan the jobs a user expects (every variant at
every grid LR with seed 0, then the seeds at each variant's own best LR; every variant on every
rung with the ladder's steps and LR rules), and bad input is one line, exit 2, nothing launched."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from ablate.errors import ConfigError
from ablate.sweep.planning import Job
from ablate.sweep.transfer_plan import (Ladder, Rung, best_jobs, check_ladder, grid_jobs, ladder_jobs,
                                   load_ladder, seed_jobs, write_transfer)
from ablate.sweep.transfer_record import TransferRecord
from conftest import run_ablate


def dry(*args, tmp_path):
    res = run_ablate("sweep", *args, f"out_dir={tmp_path}", "--dry-run", "--json")
    assert res.returncode == 0, res.stderr
    return [dict(o.split("=", 1) for o in job) for job in json.loads(res.stdout)]


def test_lr_grid_runs_every_variant_at_every_grid_lr_with_seed_0(tmp_path):
    jobs = dry("act=gelu,swiglu", "--lr-grid", "1e-3:1e-1:3", "--seeds", "3", tmp_path=tmp_path)
    assert [(j["act"], j["train.lr"], j["seed"]) for j in jobs] == [
        ("gelu", "0.001", "0"), ("gelu", "0.01", "0"), ("gelu", "0.1", "0"),
        ("swiglu", "0.001", "0"), ("swiglu", "0.01", "0"), ("swiglu", "0.1", "0")]
    text = run_ablate("sweep", "act=gelu,swiglu", "--lr-grid", "1e-3:1e-1:3", "--seeds", "3",
                      f"out_dir={tmp_path}", "--dry-run")
    assert "then: seeds 1..2 of each variant at its own best LR of the grid: 4 jobs" in text.stdout
    assert not list(tmp_path.iterdir())


def test_second_phase_runs_the_other_seeds_at_each_variants_best_lr():
    variants = [Job(["act=gelu"], "baseline"), Job(["act=swiglu"], "act=swiglu")]
    grid = grid_jobs(variants, [1e-3, 1e-2, 1e-1])
    losses = {0: 3.0, 1: 2.5, 2: None, 3: 3.1, 4: 2.9, 5: 2.4}  # baseline best at 1e-2, swiglu at 1e-1
    results = [SimpleNamespace(job=j, status="completed" if losses[i] is not None else "diverged",
                               run_dir=i) for i, j in enumerate(grid)]
    best = best_jobs(results, lambda d: losses[d])
    assert {cell: (job.tag, loss) for cell, (job, loss) in best.items()} == {
        ("baseline", ""): ("lr0.01", 2.5), ("act=swiglu", ""): ("lr0.1", 2.4)}
    second = seed_jobs(best, seeds=3)
    assert [(j.variant, j.overrides[-2:], j.name) for j in second] == [
        ("baseline", ["train.lr=0.01", "seed=1"], "baseline_lr0.01_seed1"),
        ("baseline", ["train.lr=0.01", "seed=2"], "baseline_lr0.01_seed2"),
        ("act=swiglu", ["train.lr=0.1", "seed=1"], "act=swiglu_lr0.1_seed1"),
        ("act=swiglu", ["train.lr=0.1", "seed=2"], "act=swiglu_lr0.1_seed2")]


def test_a_ladder_with_an_lr_grid_scans_each_rung_then_seeds_each_rungs_best_lr(tmp_path, monkeypatch):
    jobs = dry("act=gelu,swiglu", "--ladder", "cpu", "--lr-grid", "1e-3:1e-1:3", "--seeds", "2",
               tmp_path=tmp_path)
    ladder = load_ladder("cpu")
    assert len(jobs) == 2 * len(ladder.rungs) * 3 and {j["seed"] for j in jobs} == {"0"}
    for rung, block in zip(ladder.rungs, [jobs[i:i + 6] for i in range(0, len(jobs), 6)]):
        assert {j["model.d_model"] for j in block} == {str(rung.d_model)}
        assert [(j["act"], j["train.lr"]) for j in block] == [
            (a, lr) for a in ("gelu", "swiglu") for lr in ("0.001", "0.01", "0.1")]
        assert len({j["train.steps"] for j in block}) == 1  # the rung's steps, whatever the LR
    text = run_ablate("sweep", "act=gelu,swiglu", "--ladder", "cpu", "--lr-grid", "1e-3:1e-1:3", "--seeds", "2",
                      f"out_dir={tmp_path}", "--dry-run").stdout
    assert "2 variants x 3 rungs x 3 learning rates (0.001, 0.01, 0.1), seed 0: 18 jobs" in text
    assert "then: seeds 1..1 of each variant at its own best LR of the grid on each rung: 6 jobs" in text
    # phase 2 from phase 1: each (variant, rung) at its own best LR
    from ablate.sweep.transfer_plan import TransferPlan

    plan = TransferPlan.make(["act=gelu,swiglu"], "ofat", 2, None, "1e-3:1e-1:3", "cpu",
                             lambda job, rung: (1000 * rung.d_model, 2048), lambda job: 3e-3, lambda job: "sp")
    losses = {j.name: 3.0 - (j.tag.endswith("lr0.1") if j.tag.startswith("r2") else j.tag.endswith("lr0.01"))
              for j in plan.jobs}
    results = [SimpleNamespace(job=j, status="completed", run_dir=j.name) for j in plan.jobs]
    monkeypatch.setattr("ablate.sweep.progress.final_metric", lambda d, name: losses[d])
    second = plan.next_jobs(results)
    assert [(j.name, j.overrides[-2:]) for j in second][:2] == [
        ("baseline_r0_lr0.01_seed1", ["train.lr=0.01", "seed=1"]),
        ("act=swiglu_r0_lr0.01_seed1", ["train.lr=0.01", "seed=1"])]
    assert {j.tag for j in second if j.tag.startswith("r2")} == {"r2_lr0.1"} and len(second) == 6


def test_ladder_runs_every_variant_on_every_rung_with_its_rules(tmp_path):
    jobs = dry("act=gelu,swiglu", "--ladder", "cpu", "--seeds", "2", tmp_path=tmp_path)
    ladder = load_ladder("cpu")
    assert len(jobs) == 2 * len(ladder.rungs) * 2
    from ablate.model.spec import ModelSpec, non_embedding_params
    from conftest import compose

    for rung, first in zip(ladder.rungs, jobs[::4]):
        assert (int(first["model.d_model"]), int(first["model.n_layers"]), int(first["model.n_heads"])) == \
            (rung.d_model, rung.n_layers, rung.n_heads)
        cfg = compose(rung.overrides())
        params = non_embedding_params(ModelSpec.from_config(cfg))
        tokens = int(first["train.steps"]) * cfg.train.batch_size * cfg.train.seq_len
        # the stated rule: tokens_per_param x the baseline's non-embedding params, rounded up a step
        assert 0 <= tokens - ladder.tokens_per_param * params < cfg.train.batch_size * cfg.train.seq_len
        assert float(first["train.lr"]) == pytest.approx(ladder.base_lr * ladder.base_width / rung.d_model, rel=1e-3)


@pytest.mark.parametrize("args, message", [
    (["--lr-grid", "1e-3:1e-1:2"], "at least 3 points"),
    (["--lr-grid", "0:1e-1:5"], "positive"),
    (["--lr-grid", "-1e-3:1e-1:5"], "positive"),
    (["--lr-grid", "1e-3-1e-1"], "LO:HI:N"),
    (["--lr-grid", "1e-3:1e-1:5", "train.lr=0.01"], "sets train.lr"),
    (["--lr-grid", "1e-3:1e-1:2", "--ladder", "cpu"], "at least 3 points"),
    (["--ladder", "nope"], "no such ladder"),
    (["--ladder", "cpu", "model.d_model=256"], "sets model.d_model"),
    (["--ladder", "cpu", "train.steps=10"], "sets train.steps"),
    (["--ladder", "cpu", "ladder.tokens_per_param=40"], "alone would set every variant's tokens"),
    (["ladder.tokens_per_param=20,40"], "variant of a --ladder sweep"),
])
def test_bad_transfer_input_is_one_line_and_nothing_launched(args, message, tmp_path):
    res = run_ablate("sweep", "act=gelu,swiglu", *args, "logger=none", f"out_dir={tmp_path}")
    assert res.returncode == 2, res.stdout + res.stderr
    assert message in res.stderr and res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert not list(tmp_path.iterdir())


def test_a_ladder_whose_rungs_do_not_grow_is_refused(tmp_path):
    bad = tmp_path / "shrink.yaml"
    bad.write_text("tokens_per_param: 10\nbase_lr: 0.003\nbase_width: 128\nrungs:\n"
                   "  - {name: a, d_model: 64, n_layers: 4, n_heads: 4}\n"
                   "  - {name: b, d_model: 48, n_layers: 4, n_heads: 4}\n")
    with pytest.raises(ConfigError, match="do not grow"):
        load_ladder(str(bad))
    res = run_ablate("sweep", "act=gelu,swiglu", "--ladder", str(bad), "logger=none", f"out_dir={tmp_path / 'o'}")
    assert res.returncode == 2 and "do not grow" in res.stderr
    with pytest.raises(ConfigError, match="do not grow"):
        check_ladder(Ladder("same", (Rung("a", 32, 2, 2), Rung("b", 32, 2, 2)), 10, 1e-3, 128))


@pytest.mark.parametrize("text, why", [
    ("tokens_per_param: 10\nbase_width: 128\nrungs:\n  - {name: a, d_model: 32, n_layers: 2, n_heads: 2}\n",
     "(no key 'base_lr')"),
    ("tokens_per_param: 10\nbase_lr: 0.003\nbase_width: 128\nrungs: 3\n", "(TypeError: "),
    ("tokens_per_param: ten\nbase_lr: 0.003\nbase_width: 128\nrungs: []\n", "(ValueError: "),
    ("rungs: [\n", "(YAML: expected the node content, but found '<stream end>' at line 2, column 1)"),
])
def test_a_file_that_is_not_a_ladder_says_what_is_wrong_and_what_a_ladder_needs(text, why, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_ladder(str(bad))
    message = str(err.value)
    assert "is not a ladder " + why in message and "tokens_per_param (or steps) and base_lr" in message
    assert "\n" not in message


def test_ladder_jobs_name_their_rung_and_share_its_steps():
    lad = Ladder("t", (Rung("r0", 32, 2, 2), Rung("r1", 64, 4, 4)), 10, 4e-3, 64)
    jobs, table = ladder_jobs([Job([], "baseline"), Job(["act=swiglu"], "act=swiglu")], lad,
                              lambda r: (1000 * r.d_model, 100), [0])
    assert [j.name for j in jobs] == ["baseline_r0_seed0", "act=swiglu_r0_seed0",
                                      "baseline_r1_seed0", "act=swiglu_r1_seed0"]
    assert [t.steps for t in table] == [3200, 6400] and [t.lr for t in table] == [8e-3, 4e-3]
    assert jobs[1].overrides[:1] == ["act=swiglu"] and "train.steps=3200" in jobs[1].overrides


def test_a_variant_with_its_own_tokens_per_param_trains_that_many_tokens_on_every_rung(tmp_path):
    lad = Ladder("t", (Rung("r0", 32, 2, 2), Rung("r1", 64, 4, 4)), 10, 4e-3, 64, warmup_fraction=0.1)
    jobs, table = ladder_jobs([Job([], "baseline"), Job(["ladder.tokens_per_param=20"], "x")], lad,
                              lambda r: (1000 * r.d_model, 100), [0])
    assert [t.steps for t in table] == [3200, 6400]  # the table is the baseline's
    twice = [j.overrides for j in jobs if j.variant == "x"]
    assert [o for o in twice[0] if o.startswith("train.")] == ["train.steps=6400", "train.warmup_steps=640",
                                                               "train.lr=0.008"]
    assert "train.steps=12800" in twice[1] and not any("ladder." in o for o in twice[0] + twice[1])
    # end to end: the plan a user sees, the baseline's own value is the ladder's
    plan = dry("ladder.tokens_per_param=20,40", "--ladder", "cpu", "--seeds", "1", tmp_path=tmp_path)
    for base, var in zip(plan[::2], plan[1::2]):
        assert 2 * int(base["train.steps"]) - int(var["train.steps"]) in (0, 1)
    text = run_ablate("sweep", "ladder.tokens_per_param=30,60", "--ladder", "cpu", f"out_dir={tmp_path}",
                      "--dry-run").stdout  # the baseline's own value is the ladder's, as run
    assert "rungs (30 tokens per non-embedding parameter of the baseline)" in text
    for bad in ("0", "x"):
        res = run_ablate("sweep", f"ladder.tokens_per_param=20,{bad}", "--ladder", "cpu", "logger=none",
                         f"out_dir={tmp_path}/o")
        assert res.returncode == 2 and "positive number of tokens per parameter" in res.stderr


def test_a_rerun_with_another_grid_into_the_same_directory_is_refused(tmp_path):
    write_transfer(tmp_path, TransferRecord.lr_grid([0.001, 0.01, 0.1], 1, 0.01))
    write_transfer(tmp_path, TransferRecord.lr_grid([0.001, 0.01, 0.1], 1, 0.01))  # the same: fine
    with pytest.raises(ConfigError, match="records another lr_grid sweep than this grid; sweep into a new"):
        write_transfer(tmp_path, TransferRecord.lr_grid([0.001, 0.1, 1.0], 1, 0.01))


def test_the_gpu_ladder_plans_up_to_gpt2_small(tmp_path):
    jobs = dry("act=gelu,swiglu", "--ladder", "gpu", "model=small", "train=gpu", tmp_path=tmp_path)
    sizes = [(j["model.d_model"], j["model.n_layers"], j["model.n_heads"]) for j in jobs[::2]]
    assert sizes == [("256", "4", "4"), ("384", "6", "6"), ("512", "8", "8"), ("768", "12", "12")]
    steps = [int(j["train.steps"]) for j in jobs[::2]]
    assert steps == sorted(steps) and float(jobs[-1]["train.lr"]) == pytest.approx(6e-4)


def test_a_dry_run_piped_into_a_reader_that_stops_early_ends_quietly():
    """`ablate sweep ... --dry-run | head -3`: the reader closes the pipe; no traceback, exit 0."""
    import subprocess
    import sys

    from conftest import ROOT

    p = subprocess.Popen([sys.executable, "-m", "cli.main", "sweep", "act=gelu,swiglu", "--ladder", "cpu",
                          "--dry-run"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # before the plan is printed: every write meets a closed pipe
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 0 and "Traceback" not in err, err


def test_the_width_ladder_grows_the_width_alone_and_scans_the_same_grid_on_every_rung(tmp_path):
    """conf/ladder/width.yaml, as docs/parametrization.md runs it: depth and heads fixed (head_dim
    grows), the same steps on every rung, the same absolute LRs (lr_rule fixed), and the mup
    variant's base the smallest rung."""
    ladder = load_ladder("width")
    assert ladder.lr_rule == "fixed" and ladder.steps and ladder.tokens_per_param is None
    assert len({(r.n_layers, r.n_heads) for r in ladder.rungs}) == 1
    widths = [r.d_model for r in ladder.rungs]
    assert widths == sorted(widths) and widths[-1] >= 8 * widths[0]
    jobs = dry("param=sp,mup", "--ladder", "width", "--lr-grid", "1e-3:1e-1:5", "--seeds", "2", tmp_path=tmp_path)
    assert len(jobs) == 2 * len(widths) * 5
    for width in widths:
        rung = [j for j in jobs if j["model.d_model"] == str(width)]
        assert [(j["param"], j["train.lr"]) for j in rung] == [
            (p, lr) for p in ("sp", "mup") for lr in ("0.001", "0.00316", "0.01", "0.0316", "0.1")]
        assert {j["train.steps"] for j in rung} == {str(ladder.steps)}
        assert [j.get("model.base_width") for j in rung] == [None] * 5 + [str(widths[0])] * 5


def test_under_original_muon_the_adamw_lr_moves_with_every_grid_and_rung_lr(tmp_path):
    """optim.adjust=original: train.lr is Muon's, optim.adam_lr the AdamW part's. Every job that
    sets train.lr sets optim.adam_lr at the variant's own ratio (here 3e-3 / 0.02 = 0.15), so the
    grid scans both together; match_rms_adamw (one train.lr) moves nothing else."""
    jobs = dry("--mode", "grid", "optim=muon", "optim.adjust=original", "optim.adam_lr=3e-3", "train.lr=0.02",
               "--lr-grid", "0.01:0.04:3", "--seeds", "2", tmp_path=tmp_path)
    assert [(j["train.lr"], j["optim.adam_lr"]) for j in jobs] == [("0.01", "0.0015"), ("0.02", "0.003"),
                                                                     ("0.04", "0.006")]
    from ablate.sweep.transfer_plan import TransferPlan

    tied = {"optim=muon": {"optim.adam_lr": 0.003}}
    plan = TransferPlan.make(["optim=adamw,muon"], "ofat", 2, None, "1e-3:1e-2:3", "cpu",
                             lambda job, rung: (1000 * rung.d_model, 2048), lambda job: 0.02, lambda job: "sp",
                             lambda job: tied.get(job.variant, {}))
    assert plan.record.tied_lrs == {"optim=muon": {"optim.adam_lr": pytest.approx(0.15)}}
    for job in plan.jobs:
        lrs = dict(o.split("=", 1) for o in job.overrides if "lr=" in o)
        if job.variant == "baseline":
            assert set(lrs) == {"train.lr"}
        else:
            assert float(lrs["optim.adam_lr"]) == pytest.approx(0.15 * float(lrs["train.lr"]))
    from ablate.analysis.transfer_report import tied_note

    assert tied_note(plan.record.tied_lrs) == [
        "optim=muon: optim.adam_lr = 0.15 x train.lr at every LR (optim.adjust=original: train.lr is "
        "Muon's, optim.adam_lr the AdamW part's)"]
