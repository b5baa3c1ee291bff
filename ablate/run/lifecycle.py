"""A run directory's state, and the one rule for re-entering it.

Every way into a directory asks `plan` what to do: `ablate run ... hydra.run.dir=DIR`,
`ablate resume DIR`, a sweep re-run into its directory (its preflight calls `check_reentry` for
every job first), a submitit requeue and each torchrun rank. The rule:

| the directory holds                               | the new config              | what happens                     |
|---------------------------------------------------|-----------------------------|----------------------------------|
| no run (fresh)                                    | -                           | start                            |
| a finished run (completed or diverged)            | the same experiment         | its recorded outcome is returned; nothing is written |
| a completed run                                   | more train.steps, and       | extend: continue from its final  |
|                                                   | train.extend=true           | checkpoint, recorded in the summary |
| a finished run                                    | another experiment          | refused in one line naming the key; nothing touched |
| an unfinished run (stopped, killed, failed) with  | the same experiment         | resume from its newest valid checkpoint |
| a checkpoint                                      | another experiment          | refused, as above                |
| an unfinished run without a checkpoint            | any                         | start over at step 0, saying so  |

"The same experiment": equal in every config key but those that never change what is trained
or only how it is computed (ablate.names NOT_TRAINING, HOW_COMPUTED), so a run can be resumed
with `logger=none` or another kernel. `train.resume=never` starts over whatever the directory
holds (its checkpoints are removed): asking for it by name is the way to discard a result.

Extending keeps the learning-rate schedule the run was started with (lr_at with the original
train.steps): the extra steps train at the rate the schedule ended with (min_lr_ratio x lr for
cosine and linear). The run is then neither the original experiment nor the longer one trained
from scratch, which is why it must be asked for and why summary.json records `extended_from`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from ablate.errors import RunDirError
from ablate.run.record import RunRecord, read_record
from ablate.run.directory import CONFIG, METRICS, resume_command
from ablate.names import FINISHED, HOW_COMPUTED, Status, is_not_training

START, RESUME, EXTEND, RETURN = "start", "resume", "extend", "return"


@dataclass
class RunDir:
    """What a run directory holds."""

    run_dir: Path
    record: Optional[RunRecord]  # summary.json; None when there is none (or it is unreadable)
    config: Optional[dict]  # the stored config.yaml, resolved; None when there is none
    checkpoints: list = field(default_factory=list)  # [(step, path)], oldest first

    @property
    def status(self) -> Optional[Status]:
        """The record's, KILLED for a running record whose process is gone."""
        return self.record.live_status() if self.record is not None else None

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    @property
    def has_run(self) -> bool:
        return self.config is not None or self.record is not None or bool(self.checkpoints)

    def last_logged_step(self) -> Optional[int]:
        """The last step metrics.jsonl holds (a torn last line is skipped)."""
        import json

        step = None
        try:
            lines = (self.run_dir / METRICS).read_text(encoding="utf-8").splitlines()
        except OSError:
            return None
        for line in lines:
            try:
                step = int(json.loads(line)["step"])
            except (ValueError, KeyError, TypeError):
                continue
        return step


def read(run_dir: Path) -> RunDir:
    import yaml

    from ablate.train.checkpoint import list_checkpoints

    run_dir = Path(run_dir)
    try:
        config = yaml.safe_load((run_dir / CONFIG).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        config = None
    return RunDir(run_dir, read_record(run_dir), config if isinstance(config, dict) else None,
                  list_checkpoints(run_dir))


def _flat(tree: Any, prefix: str = "") -> dict:
    if not isinstance(tree, dict):
        return {prefix: tree}
    out = {}
    for k, v in tree.items():
        out.update(_flat(v, f"{prefix}{k}."))
    return {k.rstrip("."): v for k, v in out.items()}


def _experiment(tree: dict) -> dict:
    return {k: v for k, v in _flat(tree).items()
            if not is_not_training(k) and not k.startswith(HOW_COMPUTED)}


@functools.lru_cache(maxsize=1)
def _schema_defaults() -> dict:
    from omegaconf import OmegaConf

    from ablate.config.schema import AblateConfig

    return _experiment(OmegaConf.to_container(OmegaConf.structured(AblateConfig)))


def _resolved(cfg: Any) -> dict:
    """The experiment's keys of a composed config, resolved key by key: a sweep job's config
    carries a hydra node whose ${hydra:...} values resolve only inside a job."""
    from omegaconf import OmegaConf

    if isinstance(cfg, dict):
        return _experiment(cfg)
    out = {}
    for key in _experiment(OmegaConf.to_container(cfg, resolve=False)):
        value = OmegaConf.select(cfg, key)
        out[key] = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    return out


WARMUP, WARMUP_RULE = "train.warmup_steps", ("train.warmup_fraction", "train.warmup_max_steps")


def _same_warmup_terms(old: dict, new: dict) -> None:
    """Puts two flat configs' warmups in the same terms. Two automatic ones (null) compare as
    their rule, so a run extended to more steps keeps its identity (and its warmup: the
    checkpoint holds it). Against a count (set by hand, or recorded before the rule existed) the
    rule counts as the warmup it gives at the recorded run's steps; the rule's keys then change nothing."""
    if old.get(WARMUP) is None and new.get(WARMUP) is None:
        return
    from ablate.train.schedule import auto_warmup

    for flat in (old, new):
        if flat.get(WARMUP) is None:
            flat[WARMUP] = auto_warmup(old["train.steps"], *(flat[k] for k in WARMUP_RULE))
        for k in WARMUP_RULE:
            flat.pop(k, None)


def differences(stored: dict, cfg: Any) -> list[tuple[str, Any, Any]]:
    """(key, recorded value, new value) for every key in which `cfg` is another experiment. A
    key the recorded config lacks (saved before the key existed: `param`, `model.base_width`)
    counts as its schema default, what that run trained."""
    old, new = _experiment(stored), _resolved(cfg)
    if set(new) - set(old):
        old = {**{k: v for k, v in _schema_defaults().items() if k in set(new) - set(old)}, **old}
    _same_warmup_terms(old, new)
    return [(k, old.get(k), new.get(k)) for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]


@dataclass
class Plan:
    action: str  # START | RESUME | EXTEND | RETURN
    found: RunDir
    state: Optional[dict] = None  # the checkpoint to continue (RESUME, EXTEND), loaded and checked
    notice: Optional[str] = None  # one line for the console
    extended_from: Optional[int] = None  # EXTEND: the steps the run had finished


def _refusal(found: RunDir, key: str, old: Any, new: Any, extend_dir: Optional[Path] = None) -> RunDirError:
    what = (f"a {found.status} run" if found.finished else
            f"a checkpoint of a {found.status or 'started'} run")
    hint = "use another directory (hydra.run.dir / hydra.sweep.dir)"
    if key == "train.steps" and found.status == Status.COMPLETED and isinstance(new, int) and new > (old or 0):
        hint = (f"to train it further, extend it by name: {resume_command(extend_dir or found.run_dir)} "
                f"--extend {new}; "
                "or " + hint)
    return RunDirError(f"{found.run_dir} holds {what} with {key}={old}; this config has {key}={new}: "
                       f"{hint}, or start it over with train.resume=never")


def check_reentry(run_dir: Path, cfg: Any, extend_dir: Optional[Path] = None) -> Optional[Plan]:
    """The checks of `plan` that need no checkpoint loaded: a sweep's preflight calls it for
    every job directory that exists, so a re-run that would change a finished job is refused
    before anything is launched (`extend_dir`: the sweep, which a refusal says to extend).
    None for a fresh directory."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return None
    found = read(run_dir)
    if not found.has_run or cfg.train.resume == "never":
        return None
    diff = differences(found.config, cfg) if found.config is not None else []
    extending = bool(cfg.train.get("extend", False))
    if found.finished:
        if not diff:
            return Plan(RETURN, found, notice=_finished_line(found))
        if extending and [k for k, _, _ in diff] == ["train.steps"] and found.status == Status.COMPLETED:
            old, new = diff[0][1], diff[0][2]
            if new > old:
                return Plan(EXTEND, found, extended_from=old,
                            notice=f"extending {run_dir} from step {old} to {new} (train.extend=true); "
                                   "the extra steps keep the learning rate the schedule ended with")
        # an extension refused: name the key that is not train.steps
        raise _refusal(found, *next((d for d in diff if extending and d[0] != "train.steps"), diff[0]), extend_dir)
    if not found.checkpoints:
        return Plan(START, found, notice=_no_checkpoint_line(found))
    if diff:
        raise _refusal(found, *diff[0])
    return Plan(RESUME, found)


def plan(run_dir: Path, cfg: Any, world: int, warn: Callable[[str], None]) -> Plan:
    """What entering `run_dir` with `cfg` does (the table in this module's docstring); raises
    RunDirError or CheckpointError (one line) before anything in the directory is written."""
    from ablate.train import checkpoint
    from ablate.train.schedule import resolved_warmup

    decision = check_reentry(run_dir, cfg) or Plan(START, read(run_dir))
    if decision.action in (RESUME, EXTEND):
        decision.state = checkpoint.latest_valid(Path(run_dir), warn=warn)
        if decision.state is None:  # every checkpoint vanished in between
            return Plan(START, decision.found, notice=_no_checkpoint_line(decision.found))
        checkpoint.check_continues(decision.state, Path(run_dir), world, cfg.train.strategy, cfg.train.steps)
        if decision.action == EXTEND:  # a checkpoint older than the keys: its run's own schedule
            decision.state.setdefault("schedule_steps", decision.extended_from)
            decision.state.setdefault("warmup_steps", resolved_warmup(decision.found.config["train"]))
    return decision


def _finished_line(found: RunDir) -> str:
    s = found.record
    step = f"step {_or(s.step, '?')}/{_or(s.steps, '?')}"
    if found.status == Status.DIVERGED:  # training it again would diverge again
        return (f"{found.run_dir} already diverged at step {s.step} ({s.reason}); returning "
                "that outcome without training (train.resume=never trains it again)")
    return (f"{found.run_dir} already completed ({step}); returning its result "
            f"(to train further: {resume_command(found.run_dir)} --extend STEPS)")


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


def _no_checkpoint_line(found: RunDir) -> str:
    last = found.last_logged_step()
    logged = f"it had logged up to step {last}" if last else "it had logged no step"
    was = found.status or "unfinished"
    return f"{found.run_dir} ({was}) has no checkpoint: starting from step 0 ({logged})"
