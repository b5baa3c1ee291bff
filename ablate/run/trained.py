"""A run directory's trained model: its config.yaml, its record and one checkpoint's weights.

    loaded = load_run_model(run_dir)            # the newest usable checkpoint
    loaded = load_run_model(run_dir, step=200)  # that step's checkpoint
    loaded.model(idx).logits                    # eval mode, on the CPU, in fp32

Used by `ablate export`, `ablate sample` and `ablate eval`. What cannot be loaded is refused
with one line (CheckpointError): not a run directory, a run that kept no checkpoint, a diverged
run (its weights are the ones that diverged), a --step with no checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ablate.errors import CheckpointError
from ablate.model.spec import ModelSpec
from ablate.run.record import read_record
from ablate.run.directory import CONFIG
from ablate.names import Status


@dataclass
class LoadedRun:
    model: Any  # ablate.model.transformer.Transformer, in eval mode
    cfg: Any  # the run's composed config (an OmegaConf DictConfig of config.yaml)
    spec: ModelSpec
    tokenizer: str  # tokenizer.name: byte, gpt2, cl100k, ...
    step: int  # the step of the checkpoint the weights come from
    run_dir: Path


def run_config(run_dir) -> Any:
    """A run directory's config.yaml; CheckpointError (one line, naming the file and what to do)
    when it is not a run directory or its config cannot be read."""
    from omegaconf import DictConfig, OmegaConf

    path = Path(run_dir) / CONFIG
    if not path.is_file():
        raise CheckpointError(not_a_run(Path(run_dir)))
    try:
        cfg = OmegaConf.load(path)
        why = None if isinstance(cfg, DictConfig) and "model" in cfg and "train" in cfg else \
            "not a run's config: no model and train sections"
    except Exception as e:  # noqa: BLE001 - YAML's and OmegaConf's errors: the file is damaged
        why = " ".join(str(e).split())[:160] or type(e).__name__
    if why is None:
        return cfg
    copy = Path(run_dir) / ".hydra" / CONFIG  # Hydra's copy, written with it at the run's start
    fix = (f"restore it from Hydra's copy: `cp {copy} {path}`" if copy.is_file() and copy.read_bytes() != path.read_bytes()
           else "the run cannot be loaded without it")
    raise CheckpointError(f"{path}: unreadable ({why}); {fix}")


def not_a_run(path: Path) -> str:
    """Why `path` is no run directory, and what to give instead (a sweep's runs by name)."""
    from ablate.run.directory import SUMMARY

    if not path.is_dir():
        return f"{path}: no such directory (give a run directory)"
    runs = sorted({p.parent for p in path.rglob(CONFIG) if p.parent.name != ".hydra"} |
                  {p.parent for p in path.rglob(SUMMARY)})
    if runs:
        first = runs[0].relative_to(path)
        return (f"{path}: a directory of {len(runs)} runs (a sweep), not one run; give one of them, "
                f"e.g. {path / first}")
    return f"{path}: no {CONFIG} (not an ablate run directory)"


def tokenizer_name(cfg) -> str:
    from omegaconf import OmegaConf

    return str(OmegaConf.select(cfg, "tokenizer.name", default="byte"))


def check_not_diverged(run_dir) -> None:
    record = read_record(Path(run_dir))
    if record is not None and record.status == Status.DIVERGED:
        at = f" at step {record.step}" if record.step is not None else ""
        raise CheckpointError(f"{run_dir}: the run diverged{at} ({record.reason or 'no reason recorded'}); "
                              "its weights are not a trained model: train it again (e.g. a lower train.lr)")


def _checkpoint_state(run_dir: Path, step: Optional[int]) -> dict:
    from ablate.train import checkpoint

    found = checkpoint.list_checkpoints(run_dir)
    if not found:
        raise CheckpointError(f"{run_dir}: no checkpoint: the run kept none (train.ckpt_every / "
                              "keep_ckpts) or was stopped before its first evaluation")
    if step is None:
        return _newest_usable(run_dir, found)
    paths = dict(found)
    if step not in paths:
        raise CheckpointError(f"{run_dir}: no checkpoint of step {step}; there are: "
                              f"{', '.join(str(s) for s in paths)}")
    state = checkpoint.load_file(paths[step])
    if not isinstance(state, dict) or state.get("step") != step:
        raise CheckpointError(f"{paths[step]}: does not hold step {step}")
    return state


def _newest_usable(run_dir: Path, found: list) -> dict:
    """The newest checkpoint that loads (each one skipped said in a warning); when none does,
    CheckpointError saying what is wrong with them and what a reader of the weights can do
    (training's own message is about starting over in the directory)."""
    from ablate.train import checkpoint

    problems = []
    for step, path in reversed(found):
        try:
            state = checkpoint.load_file(path)
        except CheckpointError as e:
            problems.append(str(e))
            continue
        if isinstance(state, dict) and state.get("step") == step:
            for p in problems:
                checkpoint.warn(f"warning: skipping checkpoint: {p}")
            return state
        problems.append(f"{path}: does not hold step {step}")
    record = read_record(run_dir)
    again = f"`ablate run {' '.join(record.overrides)}`" if record is not None and record.overrides else "`ablate run ...`"
    raise CheckpointError(f"{run_dir}: no usable checkpoint ({len(found)} found; newest: {problems[0]}): the "
                          f"run's weights cannot be loaded; train the variant again into a new directory, "
                          f"e.g. {again}")


def load_run_model(run_dir, step: Optional[int] = None) -> LoadedRun:
    """The run's model with the weights of its newest usable checkpoint (or of `step`).
    Raises CheckpointError (one line) for what cannot be loaded."""
    from ablate.model.transformer import Transformer
    from ablate.plugins import load as load_plugins

    run_dir = Path(run_dir)
    cfg = run_config(run_dir)
    check_not_diverged(run_dir)
    state = _checkpoint_state(run_dir, step)
    load_plugins(cfg.get("plugins") or [])  # a plugin's option builds as it did in the run
    spec = ModelSpec.from_config(cfg)
    model = Transformer(spec)
    model.load_state_dict(state["model"])
    return LoadedRun(model.eval(), cfg, spec, tokenizer_name(cfg), int(state["step"]), run_dir)
