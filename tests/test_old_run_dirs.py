"""A run directory made before the `ffn` axis and the component contract (tests/golden/runs/
before_components: its config.yaml has no `ffn` group; made by main at acda4bf, as
before_components.json says) keeps working: its config builds the model with the new keys'
defaults, its checkpoint resumes to the numbers that code gave, and compare reads it beside a run
made today."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

from conftest import run_ablate

GOLDEN = Path(__file__).resolve().parent / "golden" / "runs"
FIXTURE, FROZEN = GOLDEN / "before_components", GOLDEN / "before_components.json"


def test_a_run_from_before_the_ffn_axis_builds_resumes_and_compares(tmp_path):
    from omegaconf import OmegaConf

    from ablate.model.spec import ModelSpec, count_params
    from test_frozen_values import cpu

    old = tmp_path / "old"
    shutil.copytree(FIXTURE, old)
    cfg = OmegaConf.load(old / "config.yaml")
    assert "ffn" not in cfg
    summary = json.loads((old / "summary.json").read_text())
    spec = ModelSpec.from_config(cfg)
    assert spec.ffn == "dense" and count_params(spec) == summary["params_breakdown"]
    # the checkpoint resumes (extended by a step) to what the code that made it gave
    res = run_ablate("resume", str(old), "--extend", "3")
    assert res.returncode == 0, res.stderr
    rows = [json.loads(line) for line in (old / "metrics.jsonl").read_text().splitlines()]
    got = {k: v for r in rows if r["step"] == 3 for k, v in r.items() if k in ("train_loss", "grad_norm", "val_loss")}
    frozen = json.loads(FROZEN.read_text())
    want = frozen["extended_to_3"]
    if frozen["cpu"] == cpu():
        assert got == want
    else:  # another CPU's kernels round differently
        assert all(math.isclose(got[k], want[k], rel_tol=1e-5) for k in want), (got, want)
    # compare: the old run (no ffn key) beside a new one of another norm
    overrides = [o for o in summary["overrides"] if not o.startswith("train.steps=")]
    new = tmp_path / "new"
    res = run_ablate("run", *overrides, "train.steps=3", "norm=rmsnorm", "logger=none", "train.progress=false",
                     "train.device=cpu", "train.eval_every=0", f"hydra.run.dir={new}")
    assert res.returncode == 0, res.stderr
    res = run_ablate("compare", str(old), str(new), "--json")
    assert res.returncode == 0, res.stderr
    variants = {row["variant"]: row for row in json.loads(res.stdout)}
    assert set(variants) == {"baseline", "norm=rmsnorm"}
    assert variants["baseline"]["kv_cache_bytes_per_token"] == variants["norm=rmsnorm"]["kv_cache_bytes_per_token"]
