"""A sweep re-run that would change its finished jobs is refused with the command that does what
was meant: extending the sweep as a whole (`ablate resume <sweep dir> --extend N`), which then
trains every job to N steps."""

from __future__ import annotations

import json
import re
import shlex

from conftest import TINY, find_run_dirs, run_ablate

BASE = [o for o in TINY if not o.startswith("train.steps")] + ["train.threads=1", "train.steps=6"]


def test_a_refused_sweep_rerun_suggests_extending_the_sweep_and_that_works(tmp_path):
    sweep_dir = tmp_path / "sw"
    args = ["sweep", *BASE, "norm=layernorm,rmsnorm", f"hydra.sweep.dir={sweep_dir}"]
    assert run_ablate(*args).returncode == 0
    res = run_ablate(*args, "train.steps=8")
    assert res.returncode == 2
    (line,) = res.stderr.strip().splitlines()
    suggested = re.search(r"extend it by name: (ablate resume \S+ --extend 8);", line)
    assert suggested and suggested.group(1) == f"ablate resume {sweep_dir} --extend 8", line
    extended = run_ablate(*shlex.split(suggested.group(1))[1:])
    assert extended.returncode == 0, extended.stderr
    steps = {d.name: json.loads((d / "summary.json").read_text())["step"] for d in find_run_dirs(sweep_dir)}
    assert steps == {"0_baseline": 8, "1_norm=rmsnorm": 8}
