"""Diagnostics through the real CLI: the init gradient profile of a 12-layer model, the rows a
training run logs, and the guarantee that diagnostics do not change training."""

from __future__ import annotations

import json
import math

import pytest
from conftest import TINY, invoke_ablate, read_jsonl, run_ablate


def diag(rows):
    return [r for r in rows if any(k.startswith("diag/") for k in r)]


@pytest.mark.slow  # a few CLI runs: ~10 s alone, more on a busy machine
def test_init_profile_of_a_12_layer_model_covers_every_layer(tmp_path):
    run_dir = tmp_path / "run"
    res = run_ablate("run", *TINY, "model.n_layers=12", "train.steps=0", "train.diagnostics_every=1",
                     f"hydra.run.dir={run_dir}")
    assert res.returncode == 0, res.stderr
    (row,) = diag(read_jsonl(run_dir / "metrics.jsonl"))
    assert row["step"] == 0  # at initialization: no update was made
    for i in range(12):
        for key in (f"block{i}", f"block{i}.attn", f"block{i}.ffn"):
            v = row[f"diag/grad_norm/{key}"]
            assert isinstance(v, float) and math.isfinite(v) and v > 0, key
        assert math.isfinite(row[f"diag/resid_rms/block{i}"])
        assert math.isfinite(row[f"diag/max_attn_logit/block{i}"])
    assert "diag/grad_norm/block12" not in row
    assert math.isfinite(row["diag/grad_norm/embedding"])
    assert not any(k.startswith("diag/update_ratio/") for k in row)  # nothing was updated
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert "gradient norm by layer at initialization" in res.stdout  # printed, not only logged
    # The same model and batch without a run: `ablate inspect --grad-profile --json`.
    res = invoke_ablate("inspect", *TINY, "model.n_layers=12", "--grad-profile", "--json")
    assert res.returncode == 0, res.stderr
    prof = json.loads(res.stdout)
    assert list(prof) == ["layers"]
    assert [sorted(r) for r in prof["layers"]] == [["grad_norm", "layer"]] * 12
    assert [r["layer"] for r in prof["layers"]] == list(range(12))  # first block to last
    for r in prof["layers"]:
        assert r["grad_norm"] == pytest.approx(row[f"diag/grad_norm/block{r['layer']}"], rel=1e-4)


@pytest.mark.slow  # a few CLI runs: ~10 s alone, more on a busy machine
def test_diagnostics_do_not_change_training(tmp_path):
    # dropout on: if the diagnostics pass drew random numbers, the losses would differ.
    common = [*TINY, "dropout=on", "dropout.rate=0.1", "act=relu", "train.steps=6",
              "train.eval_every=3"]
    on, off = tmp_path / "on", tmp_path / "off"
    r1 = run_ablate("run", *common, "train.diagnostics_every=2", f"hydra.run.dir={on}")
    r2 = run_ablate("run", *common, "train.diagnostics_every=0", f"hydra.run.dir={off}")
    assert r1.returncode == 0, r1.stderr
    assert r2.returncode == 0, r2.stderr
    rows_on, rows_off = read_jsonl(on / "metrics.jsonl"), read_jsonl(off / "metrics.jsonl")

    def losses(rows):
        return [(r["step"], r.get("train_loss"), r.get("grad_norm"), r.get("val_loss"))
                for r in rows if "train_loss" in r or "val_loss" in r]

    assert losses(rows_on) == losses(rows_off)  # bit-identical
    assert not diag(rows_off)
    d = diag(rows_on)
    assert [r["step"] for r in d] == [2, 4, 6]
    for r in d:
        assert r["tokens"] == r["step"] * 4 * 32
        for i in range(2):
            assert 0.0 <= r[f"diag/dead_ffn_frac/block{i}"] <= 1.0  # relu: dead units are reported
        assert r["diag/update_ratio/input"] > 0 and r["diag/update_ratio/output"] > 0
        assert r["diag/loss_spikes"] >= 0
    # compare --plot adds a diagnostics figure beside the curves, from the run that logged them
    res = invoke_ablate("compare", str(on), str(off), "--plot", str(tmp_path / "cmp.png"))
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "cmp.png").is_file()
    assert (tmp_path / "cmp_diag.png").read_bytes()[:4] == b"\x89PNG"
    assert f"plot: {tmp_path / 'cmp_diag.png'}" in res.stdout


def test_negative_diagnostics_every_is_refused(tmp_path):
    res = invoke_ablate("run", *TINY, "train.diagnostics_every=-1", f"out_dir={tmp_path}")  # refused before Hydra
    assert res.returncode != 0
    assert "train.diagnostics_every" in res.stderr and "Traceback" not in res.stderr
    assert not any(tmp_path.iterdir())
