"""train.micro_batch (ablate/train/microbatch.py): the global batch cut into fewer, larger forward passes trains
the same model, and `auto` takes the largest pass that fits."""

from __future__ import annotations

import pytest

from conftest import completed_trainer, compose, loss_curve, scripted_trainer


def test_largest_fitting_takes_the_largest_divisor_that_fits():
    from ablate.train.microbatch import largest_fitting

    tried = []

    def fits(m):  # a memory model: 10 units per sequence, 75 free
        tried.append(m)
        return 10 * m <= 75

    assert largest_fitting(24, fits) == 6  # 8 does not fit; 7 does not divide 24
    assert tried == [24, 12, 8, 6]  # from the top: the first fit ends the search
    assert largest_fitting(16, lambda m: False) is None


def _curve(tmp_path, *overrides):
    trainer = completed_trainer(tmp_path, "train.steps=8", *overrides)
    return trainer, loss_curve(trainer, grad_norm=True)


@pytest.mark.parametrize("setting, passes, size", [("train.micro_batch=2", 4, 2),
                                                   ("train.micro_batch=8", 1, 8)])
def test_another_cut_of_the_global_batch_trains_the_same_curve(tmp_path, setting, passes, size):
    """8 sequences a step as 1 x 8 (the reference), or 2 x 4 cut into 4 x 2 or folded into 1 x 8:
    the same windows (Batches), the same gradient up to the order of a sum."""
    _, ref = _curve(tmp_path / "ref", "train.batch_size=8")
    trainer, cut = _curve(tmp_path / "cut", "train.batch_size=4", "train.grad_accum=2", setting)
    assert (trainer.grad_accum, trainer.micro_batch) == (passes, size)
    assert trainer.tokens_per_step == 8 * 32
    assert cut == pytest.approx(ref, rel=1e-5, abs=1e-6)


def test_auto_keeps_batch_size_on_cpu(tmp_path):
    trainer = scripted_trainer(tmp_path, "train.batch_size=4", "train.grad_accum=2", "train.micro_batch=auto")
    assert (trainer.micro_batch, trainer.grad_accum) == (4, 2)


@pytest.mark.parametrize("value", ["5", "0", "-2", "big", "true"])
def test_a_micro_batch_that_does_not_cut_the_batch_is_refused(value):
    from ablate.errors import ConfigError

    with pytest.raises(ConfigError, match=r"train.micro_batch must be auto, null or a divisor of "
                                          r"train.batch_size x train.grad_accum = 16"):
        compose(["train.batch_size=8", "train.grad_accum=2", f"train.micro_batch={value}"])
