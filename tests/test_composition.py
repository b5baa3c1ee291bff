"""Within derived_compositions (compose_config, a run, a sweep), Hydra composes a config once per
set of config groups and the next one that differs only in values is derived from it
(ablate/config/derivation.py): every derived config must be the one Hydra composes, hydra node
included, a value Hydra refuses must be refused with Hydra's message, and a change to what
composition reads (an option registered again, a ConfigStore entry) must not serve a stale
config."""

import pytest
from omegaconf import OmegaConf

from conftest import TINY, in_process, record_calls

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


def hydra_composes(overrides):
    """Hydra's own composition (the compose API, hydra node kept), no memo involved."""
    from hydra import compose, initialize_config_dir

    from ablate.config.axes import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=True)


def memo_composes(overrides):
    from ablate.config.compose import derived_compositions

    with derived_compositions():
        return hydra_composes(overrides)


def flags(config) -> tuple:
    return OmegaConf.is_struct(config), OmegaConf.is_readonly(config.hydra), OmegaConf.is_struct(config.hydra)


@pytest.fixture
def fresh_memo(monkeypatch):
    """An empty memo for this test; Hydra's compositions counted."""
    import ablate.config.compose
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    from ablate.config.schema import register_configs

    register_configs()
    monkeypatch.setattr(ablate.config.compose, "_BASES", None)
    return record_calls(monkeypatch, ConfigLoaderImpl, "load_configuration")


def test_every_derived_config_is_the_one_hydra_composes(fresh_memo):
    for overrides in SEQUENCE:
        mine = memo_composes(overrides)
        before = len(fresh_memo)
        theirs = hydra_composes(overrides)
        del fresh_memo[before:]  # the check's own composition
        assert OmegaConf.to_yaml(mine) == OmegaConf.to_yaml(theirs), overrides
        assert flags(mine) == flags(theirs), overrides
    assert len(fresh_memo) == 2  # one per set of config groups: the default's and rmsnorm's


def test_compose_config_returns_a_copy_without_the_hydra_node(fresh_memo):
    from ablate.config.compose import compose_config

    first = compose_config([*TINY, "train.lr=0.01"])
    first.train.lr = 0.5  # what a caller does to its config stays in its config
    second = compose_config([*TINY, "train.lr=0.02"])
    again = compose_config([*TINY, "train.lr=0.01"])
    assert "hydra" not in first and "hydra" not in second
    assert (second.train.lr, again.train.lr) == (0.02, 0.01)
    assert len(fresh_memo) == 1


@pytest.mark.parametrize("bad", [
    ["train.lr=fast"],  # the schema refuses the value
    ["+train.steps=5"],  # + on a key the config holds
    ["+hydra.job.env_set.ABLATE_X=a", "+hydra.job.env_set.ABLATE_X=b"],  # + twice on one key
    ["train.nope=1"],  # no such key
])
def test_a_value_hydra_refuses_is_refused_with_hydras_message(fresh_memo, bad):
    from ablate.config.compose import compose_config
    from ablate.errors import ConfigError

    with pytest.raises(ConfigError) as first:
        compose_config([*TINY, *bad])  # nothing to derive from: Hydra's own message
    compose_config([*TINY, "train.lr=0.01", "+hydra.job.env_set.ABLATE_X=c"])
    compose_config([*TINY, "train.lr=0.01"])
    with pytest.raises(ConfigError) as derived:
        compose_config([*TINY, *bad])
    assert str(derived.value) == str(first.value)


def test_an_option_registered_again_is_composed_again(fresh_memo):
    from torch import nn

    from ablate.config.compose import compose_config
    from ablate.model import options
    from conftest import registry_state

    for seed, alpha0 in enumerate((0.5, 0.7)):  # a plugin changed between two commands
        with registry_state():
            options.register_option("norm", "mine", nn.Identity, params=lambda spec, d: 0,
                                    settings={"alpha0": alpha0})
            assert compose_config([*TINY, "norm=mine", f"seed={seed}"]).norm.alpha0 == alpha0


def test_a_replaced_config_store_entry_is_composed_again(fresh_memo):
    from hydra.core.config_store import ConfigStore

    from ablate.config.compose import compose_config

    store = ConfigStore.instance()
    try:
        for seed, width in enumerate((48, 64)):
            store.store(group="model", name="probe", node={"d_model": width, "n_heads": 2, "n_layers": 2})
            assert compose_config(["model=probe", f"seed={seed}"], validate=False).model.d_model == width
    finally:
        store.repo["model"].pop("probe.yaml", None)


def test_a_second_command_of_the_same_shape_composes_nothing(fresh_memo, tmp_path):
    """`ablate run --cfg job` composes twice (the check, then Hydra's own); the same command
    with other values after it derives both, and prints its own values."""
    first = in_process("run", *TINY, "seed=1", "--cfg", "job")
    composed = len(fresh_memo)
    second = in_process("run", *TINY, "seed=2", "train.lr=0.004", "--cfg", "job")
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert composed == 2 and len(fresh_memo) == composed
    expected = OmegaConf.create(first.stdout)
    expected.seed, expected.train.lr = 2, 0.004
    assert OmegaConf.create(second.stdout) == expected


DISTINCT = [["norm=rmsnorm", "attn=gqa"], ["arch=llama"], ["act=swiglu", "pos=rope", "qk_norm=on"],
            ["norm=rmsnorm", "attn=mqa", "model=small"], ["arch=llama", "norm=layernorm"]]


def test_a_composition_of_other_groups_is_the_one_hydra_composes(fresh_memo):
    """Not derived, but read from the configs the command read before (each one once)."""
    for overrides in DISTINCT:
        mine = memo_composes(overrides)
        theirs = hydra_composes(overrides)
        assert OmegaConf.to_yaml(mine) == OmegaConf.to_yaml(theirs), overrides
        assert flags(mine) == flags(theirs), overrides


def test_a_config_file_changed_between_compositions_is_read_again(tmp_path):
    """A config dir of the user's, edited between two commands of one process."""
    from hydra import compose, initialize_config_dir

    from ablate.config.compose import derived_compositions

    (tmp_path / "size").mkdir()
    (tmp_path / "config.yaml").write_text("defaults:\n  - size: small\n  - _self_\nseed: 0\n")
    for width in (32, 48):
        (tmp_path / "size" / "small.yaml").write_text(f"width: {width}\n")
        with derived_compositions(), initialize_config_dir(config_dir=str(tmp_path), version_base="1.3"):
            assert compose(config_name="config", overrides=[f"seed={width}"]).size.width == width
