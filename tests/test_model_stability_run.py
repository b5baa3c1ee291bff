"""Stability options through the real CLI: the reported losses stay next-token losses, so a
variant with z-loss and multi-token prediction is compared on the same footing as the plain one."""

from __future__ import annotations

import pytest

from conftest import TINY, invoke_ablate, read_jsonl, run_ablate


@pytest.mark.slow  # two CLI runs: ~8 s alone, more on a busy machine
def test_mtp_and_z_loss_runs_report_the_next_token_loss(tmp_path):
    # One step, evaluated at initialization: before any update the trunk is the plain model's
    # (same seed; MTP heads initialize after it), so the logged next-token losses are equal.
    common = [*TINY, "train.steps=1", "train.eval_every=1"]
    plain, extra = tmp_path / "plain", tmp_path / "extra"
    r1 = run_ablate("run", *common, f"hydra.run.dir={plain}")
    r2 = run_ablate("run", *common, "model.mtp_heads=2", "model.mtp_weight=0.5", "model.z_loss=0.01",
                    f"hydra.run.dir={extra}")
    assert r1.returncode == 0, r1.stderr
    assert r2.returncode == 0, r2.stderr
    a, b = read_jsonl(plain / "metrics.jsonl"), read_jsonl(extra / "metrics.jsonl")
    first = lambda rows, key: next(r for r in rows if key in r)  # noqa: E731
    assert first(a, "val_loss")["step"] == 0
    assert first(b, "val_loss")["val_loss"] == first(a, "val_loss")["val_loss"]
    assert first(b, "train_loss")["train_loss"] == first(a, "train_loss")["train_loss"]
    # ...while the objective really differs: the extra heads and z-loss change the gradient.
    assert first(b, "train_loss")["grad_norm"] != first(a, "train_loss")["grad_norm"]


def test_stability_options_are_checked_before_anything_runs(tmp_path):
    for bad, key in (("model.act_clamp=5", "model.act_clamp"),  # default act=gelu is not gated
                     ("model.mtp_heads=40", "model.mtp_heads"),  # TINY seq_len is 32
                     ("model.logit_softcap=-1", "model.logit_softcap")):
        res = invoke_ablate("run", *TINY, bad, f"out_dir={tmp_path}")  # refused before Hydra starts a job
        assert res.returncode != 0, bad
        assert key in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert not any(tmp_path.iterdir())
