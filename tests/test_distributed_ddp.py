"""`ablate run ... train.nproc=N` runs N torch.distributed ranks through torchrun.
Two-process DDP on CPU (gloo) trains exactly like one process with the same global batch, and
only rank 0 writes; so does FSDP2 on the CPU mesh."""

from __future__ import annotations

import json

import pytest

from conftest import TINY, built_once, find_run_dirs, read_jsonl, run_ablate, trained_run

# batch_size is per rank: 2 ranks x 2 sequences = 1 rank x 4 sequences per step
# The model: a dense FFN layer, then an MoE layer (ffn.dense_first=1 of TINY's 2), so the ranks
# also reduce the experts' gradients and the routing counts, and FSDP2 shards the expert banks.
BASE = [o for o in TINY if not o.startswith("train.batch_size")] + [
    "train.threads=1", "train.eval_every=3", "ffn=moe", "ffn.experts=4", "ffn.dense_first=1"]
TOL = dict(rel=1e-5, abs=1e-5)  # float32 all-reduce order: the same curve up to rounding


def curve(run_dir):
    rows = read_jsonl(run_dir / "metrics.jsonl")
    return [(r["step"], r.get("train_loss"), r.get("val_loss")) for r in rows]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The one-process reference run, once for the session's workers (its tests only read it). Its
    forward passes take 2 sequences each, the ranks' (Batches: micro-step m of one process reads
    what rank m reads), so the MoE's balancing loss, a function of each forward's tokens, is
    the same objective."""
    def build(d):
        trained_run(d / "run", *BASE, "train.batch_size=4", "train.micro_batch=2")

    return built_once(tmp_path_factory, "one-process", build) / "run"


def assert_same_training(run_dir, reference):
    a, b = curve(run_dir), curve(reference)
    assert [s for s, _, _ in a] == [s for s, _, _ in b]  # every row once: one writer
    for (_, ta, va), (_, tb, vb) in zip(a, b):
        assert (ta is None) == (tb is None) and (va is None) == (vb is None)
        if ta is not None:
            assert ta == pytest.approx(tb, **TOL)
        if va is not None:
            assert va == pytest.approx(vb, **TOL)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["world_size"] == 2
    assert summary["tokens"] == json.loads((reference / "summary.json").read_text())["tokens"]


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_processes_train_like_one_and_only_rank0_writes(tmp_path, one_process, strategy):
    args = [*BASE, "train.batch_size=2", "train.nproc=2", f"train.strategy={strategy}"]
    res = run_ablate("run", *args, f"out_dir={tmp_path}")
    assert res.returncode == 0, res.stderr
    (run_dir,) = find_run_dirs(tmp_path)  # the ranks shared the run dir Hydra made
    assert_same_training(run_dir, one_process)
    assert res.stdout.count("ablate run:") == 1  # rank 0 reports
    # one file per checkpoint, by rank 0 (at each evaluation, train.ckpt_every=null, and the end)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_00000003.pt", "step_00000006.pt"]
    # Hydra's files are the parent's: a rank's copy would record the run dir pinned for it
    assert "hydra.run.dir=" not in (run_dir / ".hydra" / "hydra.yaml").read_text()
    if strategy == "fsdp":  # the sharded model was gathered into one checkpoint: it resumes
        from ablate.config.overrides import quote  # the auto-named dir holds '=' and ','

        res = run_ablate("run", *args, "train.steps=9", "train.extend=true", f"hydra.run.dir={quote(str(run_dir))}")
        assert res.returncode == 0, res.stderr
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["resumed_from"] == 6 and summary["step"] == 9


@pytest.mark.slow
def test_ranks_from_submitit_tasks_train_like_one_process(tmp_path, one_process):
    """launcher=slurm with tasks_per_node=2 runs the job twice; submitit_local does the same on
    this machine, so the ranks come from submitit's environment exactly as under SLURM."""
    res = run_ablate("sweep", *BASE, "train.batch_size=2", "launcher=submitit_local",
                     "hydra.launcher.tasks_per_node=2", "--seeds", "1", f"out_dir={tmp_path}")
    assert res.returncode == 0, res.stderr
    (run_dir,) = find_run_dirs(tmp_path)
    assert_same_training(run_dir, one_process)


def test_nproc_larger_than_the_machine_is_refused_before_launch(tmp_path):
    import os

    n = (os.cpu_count() or 1) + 1
    res = run_ablate("run", *BASE, f"train.nproc={n}", "train.device=cpu", f"out_dir={tmp_path}")
    assert res.returncode != 0
    assert f"error: train.nproc={n} needs {n} devices" in res.stderr and "Traceback" not in res.stderr
    assert not find_run_dirs(tmp_path) and not any(tmp_path.rglob("metrics.jsonl"))


def test_nproc_too_large_in_a_sweep_is_refused_before_any_job(tmp_path):
    import os

    n = (os.cpu_count() or 1) + 1
    res = run_ablate("sweep", *BASE, "train.device=cpu", f"train.nproc={n}", "norm=layernorm,rmsnorm",
                     f"out_dir={tmp_path}")
    assert res.returncode != 0 and f"train.nproc={n} needs" in res.stderr
    assert "nothing was launched" in res.stderr and not find_run_dirs(tmp_path)
