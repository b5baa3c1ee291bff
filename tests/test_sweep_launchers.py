"""Each launcher kind is one description (ablate/sweep/launchers.py): every `launcher=` option
of conf/launcher/ composes to its own description, the packed launchers count as their kind, and
what a sweep does with a launcher (refuse packing, the preview) reads the description; a submitit
job's result, read back in the sweep process, leaves the config schema there as it was."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ablate.config.axes import CONF_DIR
from ablate.errors import ConfigError
from ablate.sweep.launchers import LAUNCHERS, OTHER, Launcher, launcher_of, packing_launchers
from ablate.sweep.placement import check_launcher_packs, packing
from conftest import ROOT

# A job as submitit runs one: it loads what the sweep process pickled, runs ablate, and pickles
# its result (here: what it loaded) back.
SUBMITIT_JOB = ("import pickle, sys, cloudpickle, ablate.config.schema; "
                "sys.stdout.buffer.write(cloudpickle.dumps(pickle.loads(sys.stdin.buffer.read())))")


def sweep_config(*overrides):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from ablate.config.schema import register_configs

    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose("config", overrides=list(overrides), return_hydra_config=True)
    finally:
        GlobalHydra.instance().clear()


@pytest.mark.parametrize("option", sorted(p.stem for p in (CONF_DIR / "launcher").glob("*.yaml")))
def test_every_launcher_option_is_described(option):
    described = launcher_of(sweep_config(f"launcher={option}"))
    assert described is not OTHER and described.option == option


def test_packed_launchers_are_their_kind_and_a_subclass_is_not_guessed():
    from omegaconf import OmegaConf

    for d in LAUNCHERS.values():
        if d.packs == "tasks":
            cfg = OmegaConf.create({"hydra": {"launcher": {"_target_": d.packed_target}}})
            assert launcher_of(cfg) is d
    cfg = OmegaConf.create({"hydra": {"launcher": {"_target_": "my.pkg.FlakyLauncher"}}})
    assert launcher_of(cfg) is OTHER and OTHER.local and not OTHER.sequential


def test_what_a_sweep_does_with_a_launcher_comes_from_its_description():
    with pytest.raises(ConfigError, match=r"launcher=basic \(one job after another in this process\)"):
        check_launcher_packs(LAUNCHERS["basic"])
    assert packing_launchers() == "launcher=joblib, submitit_local or slurm"
    with pytest.raises(ConfigError, match=f"jobs_per_gpu works with {packing_launchers()}"):
        check_launcher_packs(LAUNCHERS["ray"])
    # a new kind that packs in tasks groups K x GPUs jobs per task, as submitit's do
    new = Launcher("mine", ("MineLauncher",), packs="tasks", packed_target="x.PackedMine")
    p = packing(2, new, "auto", 0, n_gpus=2, cores=8)
    assert (p.group, p.n_jobs, p.threads) == (4, 4, 2)
    assert [d.name for d in LAUNCHERS.values() if d.preview] == ["submitit_slurm"]
    assert [d.name for d in LAUNCHERS.values() if not d.local] == ["submitit_slurm"]


def test_the_config_schema_is_intact_after_a_submitit_job_returns():
    """Hydra's submitit launcher pickles the ConfigStore, which holds the schema's classes, into
    each job, and the job's result holds them again: cloudpickle copies them by value (make_dataclass
    builds them) and, read back in the sweep process, re-applies the copy to the live class. The
    schema built afterwards (the end-of-sweep comparison's KV-cache column) is the one before."""
    import pickle

    import cloudpickle
    from omegaconf import OmegaConf

    from ablate.config.schema import AblateConfig

    before = OmegaConf.structured(AblateConfig)
    job = subprocess.run([sys.executable, "-c", SUBMITIT_JOB], input=cloudpickle.dumps(AblateConfig),
                         cwd=ROOT, capture_output=True, check=True)
    assert pickle.loads(job.stdout) is AblateConfig  # the copy went onto the live class
    assert OmegaConf.structured(AblateConfig) == before
