"""The loss-spike count of a real training loop: a loss far above its recent window counts once
(and is logged in the diagnostics rows), ordinary noise does not, and nothing stops the run when
the spike is below the divergence threshold."""

from __future__ import annotations

from conftest import scripted_trainer


def test_one_injected_spike_is_counted_once_and_logged(tmp_path):
    noise = [2.0 + 0.01 * ((7 * s) % 5) for s in range(30)]  # a flat curve with small noise
    noise[20] = 2.6  # one spike: far above mean + 4 std of the window, below any divergence
    trainer = scripted_trainer(tmp_path, "train.diagnostics_every=1", "train.diverge_threshold=0",
                               losses=lambda step: noise[step], diagnostics=True)
    outcome = trainer.fit(0)
    assert outcome.status == "completed" and trainer.loss_spikes == 1
    spikes = {r["step"]: r["diag/loss_spikes"] for r in trainer.sinks.rows if "diag/loss_spikes" in r}
    assert spikes[20] == 0 and spikes[21] == 1 and spikes[30] == 1  # row step = steps done
