"""A sweep composes each job's config once (ablate/sweep/composed.py), and the test suite's
composition memo (tests/composition_memo.py) derives a job that differs from a composed one only
in values (LR, seed, a rung's sizes) instead of composing it: every job's config must be the one
Hydra composes, hydra node included (it names the job's directory and overrides)."""

import pytest
from omegaconf import OmegaConf

import composition_memo
from conftest import TINY, in_process

STUDY = """\
# @package _global_
hydra:
  sweeper:
    jobs:
"""


def study(tmp_path, jobs: str) -> list[str]:
    """The arguments of a study sweep of `jobs` (YAML list items), from a config dir of the user's."""
    (tmp_path / "conf" / "study").mkdir(parents=True)
    (tmp_path / "conf" / "study" / "mine.yaml").write_text(STUDY + jobs)
    return ["--config-dir", str(tmp_path / "conf"), "study=mine"]


def as_hydra_composes(monkeypatch, memo) -> tuple[list, list]:
    """Every config the sweep loads, beside Hydra's own composition of the same job
    (load_sweep_config with the memo off); and the compositions Hydra ran for the sweep's jobs
    with the memo on (the others were derived)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    from ablate.sweep.composed import ComposedJobs

    pairs, composed = [], []
    sweep_config, load = ConfigLoaderImpl.load_sweep_config, ComposedJobs.load

    def job_config(self, master, overrides):
        before = len(memo.composed)
        try:
            return sweep_config(self, master, overrides)
        finally:
            composed.extend(memo.composed[before:])

    def checked(self, config_loader, master, overrides):
        config = load(self, config_loader, master, overrides)
        with composition_memo.off():  # Hydra alone: neither derived nor counted
            hydra = sweep_config(config_loader, master, list(overrides))
        pairs.append((OmegaConf.to_yaml(config), flags(config), overrides, hydra))
        return config

    monkeypatch.setattr(ConfigLoaderImpl, "load_sweep_config", job_config)
    monkeypatch.setattr(ComposedJobs, "load", checked)
    return pairs, composed


def flags(config) -> tuple:
    return (OmegaConf.is_struct(config), OmegaConf.is_readonly(config.hydra),
            OmegaConf.is_struct(config.hydra))


def assert_all_as_hydra_composes(pairs) -> None:
    for text, own_flags, overrides, hydra in pairs:
        assert text == OmegaConf.to_yaml(hydra), overrides
        assert own_flags == flags(hydra), overrides


@pytest.mark.parametrize("sweep, loads", [
    # 18 jobs (2 params x 3 rungs x 3 LRs) and the plan's own loads (each rung's size, each LR)
    (["param=sp,mup", "--ladder", "cpu", "ladder.lr_rule=fixed", "ladder.base_width=96",
      "--lr-grid", "1e-3:1e-2:3", "--seeds", "2"], 23),
    ([*TINY, "norm=layernorm,rmsnorm", "train.lr=0.003", "--seeds", "3", "train.batch_size=4"], 6),
])
def test_every_job_of_a_sweep_is_the_config_hydra_composes(tmp_path, monkeypatch, fresh_memo, sweep, loads):
    pairs, composed = as_hydra_composes(monkeypatch, fresh_memo)
    res = in_process("sweep", *sweep, "--dry-run", "logger=none",
                     f"hydra.sweep.dir={tmp_path / 's'}")
    assert res.returncode == 0, res.stderr
    assert_all_as_hydra_composes(pairs)
    assert len({tuple(o) for *_, o, _ in pairs}) == loads
    assert len(composed) == 2  # one per config-group choice; each one's other jobs derived from it


def test_a_study_with_repeated_keys_and_dict_values_is_composed_as_hydra_composes(tmp_path, monkeypatch,
                                                                                 fresh_memo):
    """A key set twice takes its last value, a dict merges: derived jobs apply every value in
    order, as Hydra does."""
    pairs, composed = as_hydra_composes(monkeypatch, fresh_memo)
    jobs = study(tmp_path, """\
      - {name: small, overrides: [model.d_model=32, train.lr=0.002]}
      - {name: wide, overrides: [model.d_model=64, train.lr=0.002]}
      - {name: wide_again, overrides: [train.lr=0.004, model.d_model=64, train.lr=0.003]}
      - {name: merged, overrides: [model.d_model=48, "+data.extra={a: 1, b: 2}"]}
      - {name: merged_again, overrides: [model.d_model=56, "+data.extra={a: 1, b: 2}"]}
""")
    res = in_process("sweep", *TINY, *jobs, "--dry-run", "logger=none", f"hydra.sweep.dir={tmp_path / 's'}")
    assert res.returncode == 0, res.stderr
    assert_all_as_hydra_composes(pairs)
    assert len(pairs) == 5 and len(composed) == 2  # one per shape: with the dict and without


def test_a_value_the_schema_refuses_is_refused_as_hydra_refuses_it(tmp_path):
    """A derived job's bad value is not set quietly: Hydra composes the job and says what is
    wrong, as it would for the first job."""
    jobs = study(tmp_path, """\
      - {name: ok, overrides: [train.lr=0.002]}
      - {name: bad, overrides: [train.lr=fast]}
""")
    res = in_process("sweep", *TINY, *jobs, "--dry-run", "logger=none", f"hydra.sweep.dir={tmp_path / 's'}")
    assert res.returncode == 2
    assert "train.lr" in res.stderr and "fast" in res.stderr and "Traceback" not in res.stderr
