"""What a process learns from its environment (ablate/run/context.py): read in one place, and what a
run hands its torchrun ranks reads back as the same identity."""

from __future__ import annotations

from ablate.run.context import JOB_ENV, SWEEP_ENV, VARIANT_ENV, ProcessEnv


def test_a_plain_process_is_rank_0_of_1_with_no_identity(monkeypatch):
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", VARIANT_ENV, SWEEP_ENV, "SLURM_JOB_ID", "SUBMITIT_EXECUTOR"):
        monkeypatch.delenv(key, raising=False)
    env = ProcessEnv.read()
    assert env == ProcessEnv() and not env.distributed


def test_a_torchrun_rank_reads_its_place_and_the_identity_its_run_passed(monkeypatch):
    for key, value in {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "SLURM_JOB_ID": "77",
                       **ProcessEnv.for_ranks("norm=rmsnorm", "sweep-0922")}.items():
        monkeypatch.setenv(key, value)
    env = ProcessEnv.read()
    assert (env.rank, env.local_rank, env.world, env.distributed) == (1, 1, 2, True)
    assert (env.variant, env.sweep, env.slurm_job) == ("norm=rmsnorm", "sweep-0922", "77")


def test_a_run_outside_a_sweep_passes_no_sweep_and_empty_values_count_as_unset(monkeypatch):
    assert ProcessEnv.for_ranks("baseline", None) == {VARIANT_ENV: "baseline"}
    monkeypatch.setenv(SWEEP_ENV, "")
    assert ProcessEnv.read().sweep is None

def test_the_sweep_job_directory_is_named_by_the_variable_the_sweeper_sets():
    from ablate.config.axes import CONF_DIR

    assert f"hydra.job.env_set.{JOB_ENV}" in (CONF_DIR / "config.yaml").read_text()
