"""Issue 6: `ablate run ... train.nproc=N` runs N torch.distributed ranks through torchrun.
Two-process DDP on CPU (gloo) trains exactly like one process with the same global batch, and
only rank 0 writes."""

from __future__ import annotations

import json

import pytest

from conftest import TINY, find_run_dirs, read_jsonl, run_ablate

# batch_size is per rank: 2 ranks x 2 sequences = 1 rank x 4 sequences per step
BASE = [o for o in TINY if not o.startswith("train.batch_size")] + [
    "train.threads=1", "train.eval_every=3"]
TOL = dict(rel=1e-5, abs=1e-5)  # float32 all-reduce order: the same curve up to rounding


def curve(run_dir):
    rows = read_jsonl(run_dir / "metrics.jsonl")
    return [(r["step"], r.get("train_loss"), r.get("val_loss")) for r in rows]


@pytest.mark.slow
def test_two_process_ddp_matches_one_process_and_only_rank0_writes(tmp_path):
    res = run_ablate("run", *BASE, "train.batch_size=2", "train.nproc=2", f"out_dir={tmp_path / 'ddp'}")
    assert res.returncode == 0, res.stderr
    (ddp_dir,) = find_run_dirs(tmp_path / "ddp")  # the ranks shared one pinned run dir
    one = tmp_path / "one"
    res = run_ablate("run", *BASE, "train.batch_size=4", f"hydra.run.dir={one}")
    assert res.returncode == 0, res.stderr
    a, b = curve(ddp_dir), curve(one)
    assert [s for s, _, _ in a] == [s for s, _, _ in b]  # every row once: one writer
    for (_, ta, va), (_, tb, vb) in zip(a, b):
        assert (ta is None) == (tb is None) and (va is None) == (vb is None)
        if ta is not None:
            assert ta == pytest.approx(tb, **TOL)
        if va is not None:
            assert va == pytest.approx(vb, **TOL)
    summary = json.loads((ddp_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["world_size"] == 2
    assert summary["tokens"] == json.loads((one / "summary.json").read_text())["tokens"]
    assert res.stdout.count("ablate run:") == 1


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
