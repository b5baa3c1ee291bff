"""ablate/train/allocator.py: CPU training keeps freed memory (glibc malloc thresholds), so a
training step's tensors are not page-faulted in again at every step."""

from __future__ import annotations

import subprocess
import sys
from statistics import mean

import pytest

from conftest import ROOT

# Steps of the default tiny model through the trainer (its activations are large enough for
# glibc to serve them with mmap); prints the page faults per step of each of WINDOWS windows.
WINDOWS, STEPS = 5, 3
CODE = f"""
import resource, sys, torch
import ablate.train.allocator as allocator
if sys.argv[1] == "off":
    allocator.keep_freed_memory = lambda: False
from ablate.measure.bench import build_trainer, trainer_contender
from ablate.config.compose import compose_config
torch.set_num_threads(1)
trainer, _, params = build_trainer(compose_config(["train.threads=1", "logger=none", "train.device=cpu"]))
c = trainer_contender("x", trainer, params)
c.run(0, {STEPS})
for w in range(1, {WINDOWS} + 1):
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    c.run(w * {STEPS}, {STEPS})
    print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / {STEPS})
"""


def faults_per_step(mode: str) -> list[float]:
    """The page faults per step in each window of one process (warmed up by a first window)."""
    res = subprocess.run([sys.executable, "-c", CODE, mode], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    return [float(x) for x in res.stdout.split()[-WINDOWS:]]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc tuning is Linux-only")
def test_training_steps_reuse_freed_memory():
    from ablate.train.allocator import keep_freed_memory

    # The kernel may reclaim idle pages behind our back (e.g. DAMON on a shared host), which
    # adds faults to any one tuned run (0 to ~1k per step on the shared dev VM), and glibc's
    # dynamic mmap threshold sometimes spares an untuned run most of its faults (~200 to ~10k),
    # both in bursts of a few steps: the mean over several windows of one run each shows what the
    # tuning keeps (an untuned run's mean varied 2x between runs, a tuned one's was < 5% of it).
    tuned = mean(faults_per_step("on"))
    untuned = mean(faults_per_step("off"))
    if not keep_freed_memory():
        pytest.skip("not glibc")
    assert tuned < untuned / 3, (tuned, untuned)
