"""The loss-spike count of a real training loop: a loss far above its recent window counts once
(and is logged in the diagnostics rows), ordinary noise does not, and nothing stops the run when
the spike is below the divergence threshold."""

from __future__ import annotations

import torch

from conftest import TINY, compose


class Rows:
    def __init__(self):
        self.rows = []

    def log(self, row):
        self.rows.append(row)


def test_one_injected_spike_is_counted_once_and_logged(monkeypatch, tmp_path):
    from ablate.bench import build_trainer
    from ablate.train.trainer import Trainer

    cfg = compose([*TINY, "train.steps=30", "train.diagnostics_every=1", "train.diverge_threshold=0"])
    trainer, _, _ = build_trainer(cfg)
    trainer.sinks, trainer.run_dir = Rows(), tmp_path  # fit checkpoints at the end
    noise = [2.0 + 0.01 * ((7 * s) % 5) for s in range(30)]  # a flat curve with small noise
    noise[20] = 2.6  # one spike: far above mean + 4 std of the window, below any divergence
    real_step = Trainer.train_step

    def step_with_losses(self, step):
        _, grad_norm, lr = real_step(self, step)  # real gradients, real diagnostics
        return torch.tensor(noise[step]), grad_norm, lr

    monkeypatch.setattr(Trainer, "train_step", step_with_losses)
    outcome = trainer.fit(0)
    assert outcome.status == "completed" and trainer.loss_spikes == 1
    spikes = {r["step"]: r["diag/loss_spikes"] for r in trainer.sinks.rows if "diag/loss_spikes" in r}
    assert spikes[20] == 0 and spikes[21] == 1 and spikes[30] == 1  # row step = steps done
