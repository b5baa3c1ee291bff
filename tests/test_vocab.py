"""The shared vocabularies (ablate/vocab.py) and the copies that must follow them."""

import json

import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from ablate.axes import CONF_DIR
from ablate.vocab import SEED_KEYS, STOPPED, Status, metric_name, names_variant, variant_name, wandb_name


def _flat(d, prefix=""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _flat(v, f"{prefix}{k}.")
        else:
            yield prefix + k


def test_run_names_exclude_exactly_the_keys_that_never_name_a_variant():
    import ablate.run  # noqa: F401  (registers the schema and the name resolver)

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("config")
    keys = set(_flat(OmegaConf.to_container(cfg, resolve=False)))
    keys |= {g.name for g in CONF_DIR.iterdir() if g.is_dir()}
    expected = {k for k in keys if not names_variant(k) and k not in SEED_KEYS}
    expected |= {"hydra.run.dir", "hydra.sweep.dir"}
    conf = yaml.safe_load((CONF_DIR / "config.yaml").read_text())
    exclude = conf["hydra"]["job"]["config"]["override_dirname"]["exclude_keys"]
    assert sorted(exclude) == sorted(expected)


def test_variant_names_skip_outputs_seeds_and_ways_of_computing():
    overrides = ["norm=rmsnorm", "seed=2", "train.fused_ce=true", "train.nproc=2", "logger=none",
                 "+model.z_loss=1e-4", "hydra.run.dir=x", "train.lr=0.003"]
    assert variant_name(overrides) == "model.z_loss=1e-4,norm=rmsnorm,train.lr=0.003"
    assert variant_name(["seed=1", "train.compile=true"]) == "baseline"


def test_metric_names_round_trip_through_wandb():
    assert wandb_name("val_loss") == "val/loss" and metric_name("val/loss") == "val_loss"
    assert metric_name("train/mfu") == "mfu"  # was missing from compare's hand-written inverse
    assert wandb_name("my_metric") == "my_metric" == metric_name("my_metric")


def test_status_is_its_string_everywhere():
    assert Status.COMPLETED == "completed" and f"{Status.DIVERGED}" == "diverged"
    assert json.dumps({"status": Status.PREEMPTED}) == '{"status": "preempted"}'
    assert "interrupted" in STOPPED and "completed" not in STOPPED
