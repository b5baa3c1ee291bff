"""The test suite's composition memo (tests/composition_memo.py; the product composes with Hydra
alone): Hydra composes a config once per set of config groups and the next one that differs only
in values is derived from it. Every derived config must be the one Hydra composes, hydra node
included, its `${now:...}` resolved afresh; a value Hydra refuses must be refused with Hydra's
message; a change to what composition reads (an option registered again, a ConfigStore entry, a
file) must not serve a stale config; and the memo must be on where the suite's commands run."""

import sys

import pytest
from omegaconf import OmegaConf

import composition_memo
import forkserver
from conftest import TINY, in_process

# Compositions with the same config groups in one process, in order: most are derived.
SEQUENCE = [
    [*TINY],
    [*TINY, "train.lr=0.01", "seed=3"],
    [*TINY, "seed=4", "train.lr=0.02", "train.lr=0.03"],  # a key set twice: the last value
    [*TINY, "++train.weight_decay=0.2", "seed=5"],
    [*TINY, "+hydra.job.env_set.ABLATE_X=a", "hydra.run.dir=/tmp/x"],
    [*TINY, "+hydra.job.env_set.ABLATE_X=b", "hydra.run.dir=/tmp/y", "train.steps=9"],
    [*TINY, "norm=rmsnorm", "train.lr=0.01"],
    [*TINY, "norm=rmsnorm", "train.lr=0.05", "model.d_model=48"],
    [*TINY, "logger.entity=null", "train.lr=0.05"],
]


def memo_composes(overrides):
    """The compose API's composition (hydra node kept), through the memo."""
    from hydra import compose, initialize_config_dir

    from ablate.config.axes import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=True)


def hydra_composes(overrides):
    """Hydra's own composition, no memo involved."""
    with composition_memo.off():
        return memo_composes(overrides)


def flags(config) -> tuple:
    return OmegaConf.is_struct(config), OmegaConf.is_readonly(config.hydra), OmegaConf.is_struct(config.hydra)


@pytest.fixture
def memo(fresh_memo):
    """An empty memo for this test (conftest.fresh_memo), with ablate's options in the ConfigStore."""
    from ablate.config.schema import register_configs

    register_configs()
    return fresh_memo


def test_every_derived_config_is_the_one_hydra_composes(memo):
    for overrides in SEQUENCE:
        mine = memo_composes(overrides)
        theirs = hydra_composes(overrides)
        assert OmegaConf.to_yaml(mine) == OmegaConf.to_yaml(theirs), overrides
        assert flags(mine) == flags(theirs), overrides
    assert len(memo.composed) == 2  # one per set of config groups: the default's and rmsnorm's
    assert len(memo.derived) == len(SEQUENCE) - 2


def test_now_resolves_afresh_in_each_derived_composition(memo, tmp_path):
    """Hydra resolves a `${now:...}` that a later config writes over as it composes, so each
    composition holds its own time (a run directory named by the time: ablate's conf writes
    over Hydra's); a derived config is composed again, and holds its own time too."""
    from hydra import compose, initialize_config_dir

    run_dir = "hydra:\n  run:\n    dir: runs/${now:%H-%M-%S-%f}"
    (tmp_path / "place").mkdir()
    (tmp_path / "config.yaml").write_text(f"defaults:\n  - _self_\n  - place: here\nseed: 0\n{run_dir}\n")
    (tmp_path / "place" / "here.yaml").write_text(f"# @package _global_\n{run_dir}/here\n")
    dirs = []
    for seed in (1, 2):
        with initialize_config_dir(config_dir=str(tmp_path), version_base="1.3"):
            config = compose(config_name="config", overrides=[f"seed={seed}"], return_hydra_config=True)
        dirs.append(config.hydra.run.dir)
    assert memo.derived == [["seed=2"]]  # the second composition is the memo's, not Hydra's
    assert dirs[0] != dirs[1], "the derived composition kept the first one's time"


def test_hydra_reads_no_mode_from_ablates_config(memo):
    """The memo's get_mode answers None (the command's mode) for ablate's own config without
    composing it; Hydra's get_mode composes it in multirun mode and reads hydra.mode, which
    ablate's config leaves unset. With hydra.mode on the command line, Hydra's get_mode answers."""
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    from ablate.config.axes import CONF_DIR

    search_path = create_config_search_path(f"file://{CONF_DIR}")  # as @hydra.main makes it
    hydra = Hydra.create_main_hydra2(task_name="entry", config_search_path=search_path)
    try:
        for overrides in ([*TINY, "seed=1"], ["norm=layernorm,rmsnorm", "train.lr=0.01"]):
            assert hydra.get_mode("config", list(overrides)) is None
            assert memo.composed == []  # answered without composing
            cfg = hydra.compose_config("config", list(overrides), run_mode=RunMode.MULTIRUN,
                                       with_log_configuration=False, validate_sweep_overrides=False)
            assert cfg.hydra.mode is None  # what Hydra's get_mode reads
            memo.composed.clear()
        assert hydra.get_mode("config", ["hydra.mode=RUN"]) == RunMode.RUN
        assert len(memo.composed) == 1  # Hydra's get_mode composed
    finally:
        GlobalHydra.instance().clear()


def test_compose_config_returns_a_copy_without_the_hydra_node(memo):
    from ablate.config.compose import compose_config

    first = compose_config([*TINY, "train.lr=0.01"])
    first.train.lr = 0.5  # what a caller does to its config stays in its config
    second = compose_config([*TINY, "train.lr=0.02"])
    again = compose_config([*TINY, "train.lr=0.01"])
    assert "hydra" not in first and "hydra" not in second
    assert (second.train.lr, again.train.lr) == (0.02, 0.01)
    assert len(memo.composed) == 1


@pytest.mark.parametrize("bad", [
    ["train.lr=fast"],  # the schema refuses the value
    ["+train.steps=5"],  # + on a key the config holds
    ["+hydra.job.env_set.ABLATE_X=a", "+hydra.job.env_set.ABLATE_X=b"],  # + twice on one key
    ["train.nope=1"],  # no such key
])
def test_a_value_hydra_refuses_is_refused_with_hydras_message(memo, bad):
    from ablate.config.compose import compose_config
    from ablate.errors import ConfigError

    with pytest.raises(ConfigError) as first:
        compose_config([*TINY, *bad])  # nothing to derive from: Hydra's own message
    compose_config([*TINY, "train.lr=0.01", "+hydra.job.env_set.ABLATE_X=c"])
    compose_config([*TINY, "train.lr=0.01"])
    with pytest.raises(ConfigError) as derived:
        compose_config([*TINY, *bad])
    assert str(derived.value) == str(first.value)


def test_an_option_registered_again_is_composed_again(memo):
    from torch import nn

    from ablate.config.compose import compose_config
    from ablate.model import options
    from conftest import registry_state

    for seed, alpha0 in enumerate((0.5, 0.7)):  # a plugin changed between two commands
        with registry_state():
            options.register_option("norm", "mine", nn.Identity, params=lambda spec, d: 0,
                                    settings={"alpha0": alpha0})
            assert compose_config([*TINY, "norm=mine", f"seed={seed}"]).norm.alpha0 == alpha0


def test_a_replaced_config_store_entry_is_composed_again(memo):
    from hydra.core.config_store import ConfigStore

    from ablate.config.compose import compose_config

    store = ConfigStore.instance()
    try:
        for seed, width in enumerate((48, 64)):
            store.store(group="model", name="probe", node={"d_model": width, "n_heads": 2, "n_layers": 2})
            assert compose_config(["model=probe", f"seed={seed}"], validate=False).model.d_model == width
    finally:
        store.repo["model"].pop("probe.yaml", None)


def test_a_second_command_of_the_same_shape_composes_nothing(memo, tmp_path):
    """`ablate run --cfg job` composes twice (the check, then Hydra's own); the same command
    with other values after it derives both, and prints its own values."""
    first = in_process("run", *TINY, "seed=1", "--cfg", "job")
    composed = len(memo.composed)
    second = in_process("run", *TINY, "seed=2", "train.lr=0.004", "--cfg", "job")
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert composed == 2 and len(memo.composed) == composed and len(memo.derived) == 2
    expected = OmegaConf.create(first.stdout)
    expected.seed, expected.train.lr = 2, 0.004
    assert OmegaConf.create(second.stdout) == expected


DISTINCT = [["norm=rmsnorm", "attn=gqa"], ["arch=llama"], ["act=swiglu", "pos=rope", "qk_norm=on"],
            ["norm=rmsnorm", "attn=mqa", "model=small"], ["arch=llama", "norm=layernorm"]]


def test_a_composition_of_other_groups_is_the_one_hydra_composes(memo):
    """Not derived, but read from the configs the command read before (each one once)."""
    for overrides in DISTINCT:
        mine = memo_composes(overrides)
        theirs = hydra_composes(overrides)
        assert OmegaConf.to_yaml(mine) == OmegaConf.to_yaml(theirs), overrides
        assert flags(mine) == flags(theirs), overrides


def test_a_config_file_changed_between_compositions_is_read_again(memo, tmp_path):
    """A config dir of the user's, edited between two commands of one process."""
    from hydra import compose, initialize_config_dir

    (tmp_path / "size").mkdir()
    (tmp_path / "config.yaml").write_text("defaults:\n  - size: small\n  - _self_\nseed: 0\n")
    for width in (32, 48):
        (tmp_path / "size" / "small.yaml").write_text(f"width: {width}\n")
        with initialize_config_dir(config_dir=str(tmp_path), version_base="1.3"):
            assert compose(config_name="config", overrides=[f"seed={width}"]).size.width == width
    assert len(memo.composed) == 2


MEMO_IN_COMMAND = """
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.hydra import Hydra
import composition_memo
print("memo:", composition_memo.installed(), ConfigLoaderImpl.load_configuration.__module__,
      Hydra.get_mode.__module__)
"""


def test_the_memo_is_on_in_the_commands_the_zygote_forks(tmp_path):
    """A command forked from the zygote (tests/forkserver.py) derives its compositions as one in
    the worker's process does; where ABLATE_TEST_MEMO=0 it is no longer forked (the zygote's
    memo is on)."""
    import os

    if not composition_memo.installed():
        pytest.skip("the composition memo is off (ABLATE_TEST_MEMO=0)")
    (tmp_path / "probe.py").write_text(MEMO_IN_COMMAND)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(tmp_path)}
    cmd = [sys.executable, "-m", "cli.main", "axes", "plugins=[probe]"]
    res = forkserver.run(cmd, tuple(cmd[3:]), cwd=tmp_path, env=env, timeout=120)
    assert res is not None and res.returncode == 0, res and res.stderr
    assert "memo: True composition_memo composition_memo" in res.stdout
    assert forkserver.run(cmd, tuple(cmd[3:]), cwd=tmp_path, env={**env, composition_memo.ENV: "0"},
                          timeout=120) is None
