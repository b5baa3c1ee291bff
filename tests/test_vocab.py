"""The shared vocabularies (ablate/names.py) and the copies that must follow them."""

import json

import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from ablate.config.axes import CONF_DIR
from ablate.names import SEED_KEYS, STOPPED, Status, metric_name, names_variant, variant_name, wandb_name


def _flat(d, prefix=""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _flat(v, f"{prefix}{k}.")
        else:
            yield prefix + k


def test_run_names_exclude_exactly_the_keys_that_never_name_a_variant():
    import ablate.run.entry  # noqa: F401  (registers the schema and the name resolver)

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
    # the objective's terms and components' statistics: a row each, a plugin's by the same rule
    for key, logged in (("loss/z", "train/loss_z"), ("loss/router_z", "train/loss_router_z"),
                        ("loss/act_l2", "train/loss_act_l2"), ("stat/imbalance", "train/stat_imbalance")):
        assert wandb_name(key) == logged and metric_name(logged) == key
    assert wandb_name("loss/") == "loss/" and metric_name("train/loss") == "train_loss"


def test_status_is_its_string_everywhere():
    assert Status.COMPLETED == "completed" and f"{Status.DIVERGED}" == "diverged"
    assert json.dumps({"status": Status.PREEMPTED}) == '{"status": "preempted"}'
    assert "interrupted" in STOPPED and "completed" not in STOPPED


# A string equal to a metric's name that does not name the metric: (file, string) -> why.
NOT_THE_METRIC = {
    ("ablate/train/optimizer.py", "lr"): "torch's param_group key, the optimizer's own API",
    ("ablate/train/optimizers/muon.py", "lr"): "torch's param_group key, the optimizer's own API",
    ("ablate/data/cache.py", "tokens"): "the token cache's meta.json: the tokens of each split",
    ("ablate/measure/bench.py", "tokens"): "a synthetic corpus's meta.json, as the token cache writes it",
    ("ablate/config/compose.py", "tokens"): "reads the token cache's meta.json",
    ("ablate/train/launch.py", "tokens"): "reads the token cache's meta.json",
    ("cli/data.py", "tokens"): "prints the token cache's meta.json",
}


def vocabulary_literals(root=None) -> list[str]:
    """`file:line: 'string'` for each string constant in ablate/, cli/ and hydra_plugins/ (outside
    ablate/names.py) equal to a run status or a metric name. Not counted: docstrings (prose) and
    the text of f-strings (`f"lr{lr:g}"` is a label, not the metric); a key inside a longer string
    (`"train.lr"`, `"val/loss"`) is not equal to a name."""
    import ast
    from pathlib import Path

    from ablate.names import METRICS

    root = Path(root or Path(__file__).resolve().parent.parent)
    names = {s.value for s in Status} | set(METRICS)
    found = []
    for path in sorted(p for d in ("ablate", "cli", "hydra_plugins") for p in (root / d).rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel == "ablate/names.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        prose = set()
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body \
                    and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                prose.add(id(body[0].value))
            if isinstance(node, ast.JoinedStr):
                prose.update(id(v) for v in node.values)
        found += [f"{rel}:{node.lineno}: {node.value!r}" for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names
                  and id(node) not in prose and (rel, node.value) not in NOT_THE_METRIC]
    return sorted(found)


def test_statuses_and_metric_names_are_written_only_in_the_vocabulary():
    found = vocabulary_literals()
    assert found == [], "use the ablate.names constants (Status, VAL_LOSS, ...):\n" + "\n".join(found)


def test_the_literal_scan_finds_a_status_and_a_metric_but_not_prose(tmp_path):
    (tmp_path / "ablate").mkdir()
    (tmp_path / "ablate" / "m.py").write_text(
        '"""A completed run."""\n'
        'def f(row, lr):\n'
        '    """Returns val_loss."""\n'
        '    key = f"lr{lr:g}"  # a label\n'
        '    return row["val_loss"] if row["status"] == "completed" else "train.lr"\n')
    assert vocabulary_literals(tmp_path) == ["ablate/m.py:5: 'completed'", "ablate/m.py:5: 'val_loss'"]
