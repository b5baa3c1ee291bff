"""Sweeps whose answers should transfer: each variant at its own learning rate (`--lr-grid`) and
each variant on every rung of a model ladder (`--ladder`).

--lr-grid LO:HI:N  phase 1 runs every variant at N log-spaced learning rates, seed 0; phase 2
                   runs seeds 1..K-1 of each variant at its own best LR of phase 1 (seed 0 there
                   is phase 1's run, so no job runs twice). Seeds stay paired as in any sweep.
--ladder NAME      every variant on every rung of conf/ladder/NAME.yaml (or a .yaml path): the
                   rung sets width, depth and heads together, the steps follow the ladder's
                   tokens-per-parameter rule (the baseline's non-embedding parameters at that
                   rung; or its fixed steps) and the learning rate its LR rule (width, fixed, or
                   mup: one LR, param=mup / completep scaling the rest). Every job of a variant
                   whose param has a base shape trains at the ladder's base width and depth. A
                   swept `ladder.tokens_per_param=20,40` makes the tokens a variant (e.g. the
                   twice-the-tokens check): that variant's steps follow its own value; a fixed
                   `ladder.lr_rule=mup` (SETTINGS) sets the ladder for the whole sweep.
Both together: the LR grid on every rung (the ladder's LR rule gives way), then each variant's
seeds at its own best LR of each rung; under lr_rule mup the grid on the smallest rung only,
then every rung and seed at each variant's best LR there.
The sweep directory's transfer.json (ablate/sweep/transfer_record.py) says which of the two a
sweep is; `ablate compare` reads it to report best_lr, lr_sensitivity, tuned_delta or the compute
multiplier (ablate/analysis/transfer_report.py).

Learning rates that move with train.lr: under optim=muon optim.adjust=original, train.lr is Muon's
and optim.adam_lr the AdamW part's; every job that sets train.lr (a grid point, a rung, a best LR)
sets optim.adam_lr at the variant's own ratio of the two (its composed config's: a train.lr given
beside --lr-grid is that ratio's reference, not a job's LR), so the grid scans both together
(transfer.json's `tied_lrs`; compare says so under its table). Under match_rms_adamw (the
default) one train.lr serves both parts and nothing else moves.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from ablate.errors import ConfigError
from ablate.names import LADDER_TOKENS_KEY as TOKENS_KEY
from ablate.names import VAL_LOSS, Status
from ablate.run.directory import TRANSFER
from ablate.sweep.planning import SEED_KEY, Job, Parsed, naming
from ablate.sweep.transfer_record import (BASE_KEYS, LADDER_KEYS, Ladder, LrRule, Rung, RungPlan,
                                          TransferKind, TransferRecord, read_transfer)

LR_KEY = "train.lr"
LADDER_PREFIX = "ladder."
# the ladder's keys that `ladder.KEY=VALUE` sets for the whole sweep (ladder.lr_rule=mup)
SETTINGS = ("lr_rule", "base_lr", "base_width", "base_depth", "steps", "warmup_fraction")


def lr_tag(lr: float) -> str:
    return f"lr{lr:g}"


# ---- --lr-grid ----------------------------------------------------------------------------------
Ratios = Mapping[str, Mapping[str, float]]  # variant -> {key: its value / train.lr} (tied_lrs)


def with_lr(overrides: Sequence[str], lr: float, tied: Mapping[str, float]) -> list[str]:
    """`overrides` without their train.lr and tied keys, then train.lr=lr and each tied key at
    its ratio of it (optim.adam_lr under optim.adjust=original)."""
    drop = {LR_KEY, *tied}
    rest = [o for o in overrides if o.lstrip("+").split("=", 1)[0] not in drop]
    return rest + [f"{LR_KEY}={lr:g}"] + [f"{key}={lr * ratio:.6g}" for key, ratio in tied.items()]


def grid_jobs(variants: Sequence[Job], grid: Sequence[float], ratios: Optional[Ratios] = None) -> list[Job]:
    """Phase 1: every variant at every grid LR, seed 0 (the LR is the last override but the seed,
    so it wins over a fixed train.lr; the variant's tied LRs follow it)."""
    ratios = ratios or {}
    return [dataclasses.replace(v, overrides=with_lr(v.overrides, lr, ratios.get(v.variant, {})) + [f"{SEED_KEY}=0"],
                                seed=0, tag=lr_tag(lr))
            for v in variants for lr in grid]


def cell_of(job: Job) -> tuple[str, str]:
    """(variant, rung) of a grid job: its tag is `lr0.01`, or `r0_lr0.01` on a ladder."""
    rung, _, _ = job.tag.rpartition("_")
    return job.variant, rung


def best_jobs(results: Sequence[Any], read_loss: Callable[[Optional[str]], Optional[float]]) -> dict[tuple[str, str], tuple[Job, float]]:
    """(variant, rung) -> phase 1's job at its best grid LR and the loss there (JobResult: a job and
    its run dir). A cell whose grid runs all diverged or failed is left out."""
    best: dict[tuple[str, str], tuple[Job, float]] = {}
    for r in results:
        loss = read_loss(r.run_dir) if r.status == Status.COMPLETED else None
        if loss is None or not math.isfinite(loss):
            continue
        cell = cell_of(r.job)
        if cell not in best or loss < best[cell][1]:
            best[cell] = (r.job, loss)
    return best


def seed_jobs(best: dict[tuple[str, str], tuple[Job, float]], seeds: int) -> list[Job]:
    """Phase 2: seeds 1..seeds-1 of each cell's best job (seed 0 ran there in phase 1), in the
    order of phase 1."""
    out = []
    for job, _ in best.values():
        rest = [o for o in job.overrides if o.split("=", 1)[0] != SEED_KEY]
        out += [dataclasses.replace(job, overrides=rest + [f"{SEED_KEY}={s}"], seed=s) for s in range(1, seeds)]
    return out


# ---- --ladder -----------------------------------------------------------------------------------
def load_ladder(name: str, settings: Optional[dict[str, str]] = None) -> Ladder:
    """conf/ladder/NAME.yaml, or a .yaml file, with `settings` ({key: value} of `ladder.KEY=VALUE`
    on the command line) over the file's; the rungs must grow (width, depth and heads never
    shrink, and each rung is larger than the one before)."""
    import yaml

    from ablate.config.axes import CONF_DIR

    path = Path(name) if name.endswith((".yaml", ".yml")) else CONF_DIR / "ladder" / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in (CONF_DIR / "ladder").glob("*.yaml"))
        raise ConfigError(f"--ladder {name}: no such ladder; choose one of {', '.join(known)} "
                          "or give a .yaml file")
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        if "steps" in (settings or {}):  # the same steps on every rung, in place of the tokens rule
            doc.pop("tokens_per_param", None)
        doc.update({k: yaml.safe_load(v) for k, v in (settings or {}).items()})
        rule = str(doc.get("lr_rule", "width"))
        if rule not in {r.value for r in LrRule}:
            raise ConfigError(f"ladder {path.stem}: lr_rule must be one of "
                              f"{', '.join(r.value for r in LrRule)}, got {rule}")
        ladder = Ladder.from_dict(path.stem, doc)
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError) as e:
        mark = getattr(e, "problem_mark", None)  # a YAML syntax error: its several lines in one
        why = (f"no key {e}" if isinstance(e, KeyError) else
               f"YAML: {e.problem} at line {mark.line + 1}, column {mark.column + 1}" if mark else
               f"{type(e).__name__}: {e}")
        raise ConfigError(f"--ladder {name}: {path} is not a ladder ({why}); it "
                          "needs rungs [{name, d_model, n_layers, n_heads}], tokens_per_param "
                          "(or steps) and base_lr") from None
    check_ladder(ladder)
    return ladder


def check_ladder(ladder: Ladder) -> None:
    if len(ladder.rungs) < 2:
        raise ConfigError(f"ladder {ladder.name}: a ladder needs at least 2 rungs")
    if (ladder.tokens_per_param is None) == (ladder.steps is None):
        raise ConfigError(f"ladder {ladder.name}: give tokens_per_param (tokens per non-embedding "
                          "parameter) or steps (the same on every rung), one of the two")
    sizes = (ladder.tokens_per_param, ladder.base_lr, ladder.steps, ladder.base_width, ladder.base_depth)
    if any(v is not None and not v > 0 for v in sizes) or not 0 <= ladder.warmup_fraction < 1:
        raise ConfigError(f"ladder {ladder.name}: tokens_per_param, steps, base_lr, base_width and "
                          "base_depth must be positive and warmup_fraction in [0, 1)")
    for a, b in zip(ladder.rungs, ladder.rungs[1:]):
        size_a, size_b = (a.d_model, a.n_layers, a.n_heads), (b.d_model, b.n_layers, b.n_heads)
        if any(y < x for x, y in zip(size_a, size_b)) or size_a == size_b:
            raise ConfigError(f"ladder {ladder.name}: its rungs do not grow ({a.name} {size_a} -> "
                              f"{b.name} {size_b} as d_model, n_layers, n_heads); order them "
                              "smallest first, each larger than the last")


def ladder_settings(p: Parsed) -> dict[str, str]:
    """The ladder's keys set on the command line, `ladder.lr_rule=mup` as {"lr_rule": "mup"}
    (ladder.tokens_per_param is a variant, not one of them); swept or unknown: refused."""
    for key, _ in p.swept:
        key = key.lstrip("+")
        if key.startswith(LADDER_PREFIX) and key != TOKENS_KEY:
            raise ConfigError(f"{key} applies to the whole ladder: give it one value (only "
                              f"{TOKENS_KEY} is swept, as a variant)")
    out = {}
    for o in p.fixed:
        key, _, value = o.lstrip("+").partition("=")
        if not key.startswith(LADDER_PREFIX) or key == TOKENS_KEY:
            continue
        if key[len(LADDER_PREFIX):] not in SETTINGS:
            raise ConfigError(f"{key}: not a ladder key that can be set here; choose one of "
                              f"{', '.join(LADDER_PREFIX + k for k in SETTINGS)}")
        out[key[len(LADDER_PREFIX):]] = value
    return out


def as_added_keys(arguments: Sequence[str]) -> list[str]:
    """The command line with each ladder setting `ladder.lr_rule=mup` as `+ladder.lr_rule=mup`:
    Hydra composes the sweep's own config with the fixed overrides, where a key of the ladder is
    not a key of the config but may be added; every job's overrides leave it out (variant_tokens)."""
    def added(a: str) -> str:
        key = a.split("=", 1)[0]
        return "+" + a if "=" in a and key.startswith(LADDER_PREFIX) and key != TOKENS_KEY else a

    return [added(a) for a in arguments]


def rung_size(rung: Rung, load: Callable[[], Any]) -> tuple[int, int]:
    """(the non-embedding parameters a token uses, tokens per step) of the config `load()`
    composes at `rung`: a ladder sizes an MoE's tokens by its active parameters, as its FLOPs
    count them. A config the rung cannot have (ffn.dense_first at or above its layers) is
    refused in one line naming the rung."""
    from ablate.model.spec import ModelSpec, active_non_embedding_params

    with naming(f"ladder rung {rung.name} ({' '.join(rung.overrides())})"):
        cfg = load()
        return active_non_embedding_params(ModelSpec.from_config(cfg)), int(cfg.train.batch_size) * int(cfg.train.seq_len)


def ladder_jobs(variants: Sequence[Job], ladder: Ladder, plan_rung: Callable[[Rung], tuple[int, int]],
                seeds: Sequence[int], based: Sequence[bool] = (),
                ratios: Optional[Ratios] = None) -> tuple[list[Job], list[RungPlan]]:
    """Every variant on every rung (smallest first) with every seed. plan_rung(rung) -> (the
    baseline's non-embedding params there, tokens per step); based[i]: variant i trains with the
    ladder's base shape (its param has one); ratios: each variant's LRs tied to train.lr. Returns
    (jobs, the rung table)."""
    table, jobs = [], []
    for rung in ladder.rungs:
        params, per_step = plan_rung(rung)  # a rung's config it cannot have is refused naming it (rung_size)
        steps, lr = ladder.rung_steps(params, per_step), ladder.lr(rung)
        table.append(RungPlan(rung.name, rung.d_model, rung.n_layers, rung.n_heads, params, steps,
                              steps * per_step, lr))
        for i, v in enumerate(variants):
            own, rest = variant_tokens(v.overrides)
            n = steps if own is None else ladder.rung_steps(params, per_step, own)  # the tokens as a variant
            rest += rung.overrides() + (ladder.base_overrides() if i < len(based) and based[i] else []) + [
                f"train.steps={n}", f"train.warmup_steps={ladder.warmup(n)}"]
            rest = with_lr(rest, lr, (ratios or {}).get(v.variant, {}))
            for s in seeds or [None]:
                jobs.append(dataclasses.replace(
                    v, overrides=rest + ([f"{SEED_KEY}={s}"] if s is not None else []),
                    seed=s, tag=rung.name))
    return jobs, table


def variant_tokens(overrides: Sequence[str]) -> tuple[Optional[float], list[str]]:
    """(the variant's ladder.tokens_per_param or None, its overrides but the ladder's keys)."""
    own, rest = None, []
    for o in overrides:
        key, _, value = o.lstrip("+").partition("=")
        if not key.startswith(LADDER_PREFIX):
            rest.append(o)
            continue
        if key != TOKENS_KEY:  # a setting of the whole ladder (ladder_settings)
            continue
        try:
            own = float(value)
        except ValueError:
            own = math.nan
        if not own > 0 or not math.isfinite(own):
            raise ConfigError(f"{TOKENS_KEY}={value}: give a positive number of tokens per parameter")
    return own, rest


# ---- the sweep's record -------------------------------------------------------------------------
def write_transfer(sweep_dir: Path, record: TransferRecord) -> None:
    """transfer.json, written before the first job: a re-run with another grid or ladder into the
    same directory is refused (its jobs would be other experiments)."""
    path = Path(sweep_dir) / TRANSFER
    old = read_transfer(path.parent)
    if old is not None and old != record:
        what = "grid" if record.kind is TransferKind.LR_GRID else "ladder"
        raise ConfigError(f"{path} records another {old.kind} sweep than this {what}; "
                          "sweep into a new hydra.sweep.dir")
    path.parent.mkdir(parents=True, exist_ok=True)
    record.write(path.parent)


def check_transfer(lr_grid: Optional[str], ladder: Optional[str],
                   settings: Optional[dict[str, str]] = None) -> tuple[list[float], Optional[Ladder]]:
    """--lr-grid and --ladder as given (with the ladder's `settings` from the command line):
    (the grid, the ladder); one line on bad input."""
    lad = load_ladder(ladder, settings) if ladder is not None else None
    if lr_grid is None:
        return [], lad
    from ablate.analysis.transfer_stats import parse_lr_grid

    return parse_lr_grid(lr_grid), lad


# ---- the plan the sweeper runs ------------------------------------------------------------------
def tied_ratios(variants: Sequence[Job], base_lr: Callable[[Job], float],
                tied_lrs: Callable[[Job], Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """variant -> {key: its LR / its train.lr} for the variants with LRs tied to train.lr."""
    out = {}
    for v in variants:
        with naming(f"variant {v.variant}"):  # composed without the ladder's own keys
            config = dataclasses.replace(v, overrides=variant_tokens(v.overrides)[1])
            tied = dict(tied_lrs(config))
            if tied:
                lr = base_lr(config)
                out[v.variant] = {key: float(value) / lr for key, value in tied.items()}
    return out


def _set_keys(p: Parsed) -> set[str]:
    return {o.lstrip("+~").split("=", 1)[0] for o in p.fixed} | {k.lstrip("+~") for k, _ in p.swept}


def at_lr(job: Job, lr: float, ratios: Optional[Ratios] = None) -> Job:
    """A ladder job at grid LR `lr`, its rung's LR (and tied LRs) replaced (the seed override
    stays last) and its tag `r0_lr0.01`."""
    *rest, seed = job.overrides
    rest = with_lr(rest, lr, (ratios or {}).get(job.variant, {}))
    return dataclasses.replace(job, overrides=rest + [seed], tag=f"{job.tag}_{lr_tag(lr)}")


def lr_of(job: Job) -> float:
    return float(next(o for o in reversed(job.overrides) if o.startswith(f"{LR_KEY}=")).split("=", 1)[1])


def check_rule(lad: Ladder, params: Sequence[str], grid: bool) -> list[bool]:
    """Whether each variant (its `param` option, the baseline first) trains with the ladder's base
    shape (its param has width or depth rules). Refused: lr_rule mup with a param that scales
    nothing (sp); lr_rule width, without a grid, with one that scales the hidden LRs by the width
    already (they would take base_width / d_model twice)."""
    from ablate.model import options

    based = []
    for i, name in enumerate(params):
        option = options.get("param", name)
        who = "the baseline" if i == 0 else "a variant"
        if lad.lr_rule is LrRule.MUP and not option.width:
            raise ConfigError(f"ladder {lad.name}: lr_rule mup trains every rung at one LR and leaves the "
                              f"width to the parametrization, but {who} has param={name}, which does not "
                              "scale with the width: give it param=mup or param=completep, or set "
                              "ladder.lr_rule=fixed")
        if lad.lr_rule is LrRule.WIDTH and option.width and not grid:
            raise ConfigError(f"ladder {lad.name}: lr_rule width scales the LR by base_width / d_model, "
                              f"which {who}'s param={name} already does for its hidden layers: set "
                              "ladder.lr_rule=mup (one LR for every rung)")
        based.append(option.width or option.depth_alpha is not None)
    return based


@dataclass
class TransferPlan:
    """jobs: what runs first; later: how many jobs a second phase adds (the LR grid's seeds at
    each variant's best LR; on an lr_rule mup ladder, `pending`: every rung's jobs at each
    variant's best LR of the smallest rung); record: transfer.json."""

    jobs: list
    variants: list
    record: TransferRecord
    seeds: int
    later: int = 0
    pending: list = dataclasses.field(default_factory=list)
    base: Optional[tuple] = None  # (width, depth): the ladder's base shape, where a variant trains with it

    @property
    def ratios(self) -> Ratios:
        """variant -> {key: ratio to train.lr}: the LRs its jobs move with train.lr (the record's)."""
        return self.record.tied_lrs

    @classmethod
    def make(cls, arguments: Sequence[str], mode: str, seeds: int, explicit: Any,
             lr_grid: Optional[str], ladder: Optional[str],
             plan_rung: Callable[[Job, Rung], tuple[int, int]],
             base_lr: Callable[[Job], float], param_of: Callable[[Job], str],
             tied_lrs: Callable[[Job], Mapping[str, float]] = lambda job: {}) -> "TransferPlan":
        """plan_rung(job, rung): the job's non-embedding params and tokens per step at the rung;
        base_lr(job), param_of(job): its train.lr and param option; tied_lrs(job): the LRs of its
        config that move with train.lr ({"optim.adam_lr": 0.003}; each from its composed config)."""
        from ablate.sweep.planning import parse, plan

        p = parse(arguments)
        grid, lad = check_transfer(lr_grid, ladder, ladder_settings(p))
        if p.seeds:
            raise ConfigError("with --lr-grid or --ladder give seeds as --seeds N, not seed=...")
        variants = plan(arguments, mode, 0, explicit)
        k = max(seeds, 1)
        ratios = tied_ratios(variants, base_lr, tied_lrs)
        if grid and LR_KEY in _set_keys(p) and not ratios:  # with tied LRs: the reference of their ratio
            raise ConfigError(f"--lr-grid sets {LR_KEY} for every job; do not set it too")
        if lad is None:
            record = TransferRecord.lr_grid(grid, k, base_lr(variants[0]), ratios)
            return cls(grid_jobs(variants, grid, ratios), variants, record, k, len(variants) * (k - 1))
        params = []
        for v in variants:  # composed without the ladder's own keys
            with naming(f"variant {v.variant}"):
                params.append(param_of(dataclasses.replace(v, overrides=variant_tokens(v.overrides)[1])))
        return cls._ladder(p, variants, lad, grid, seeds, plan_rung, params, ratios)

    @classmethod
    def _ladder(cls, p: Parsed, variants: list, lad: Ladder, grid: list, seeds: int,
                plan_rung: Callable[[Job, Rung], tuple[int, int]], params: list,
                ratios: Optional[Ratios] = None) -> "TransferPlan":
        clash = _set_keys(p) & {*LADDER_KEYS, *BASE_KEYS, "train.steps", "train.warmup_steps", LR_KEY}
        if clash:
            raise ConfigError(f"--ladder {lad.name} sets {', '.join(sorted(clash))} on each rung; "
                              f"do not set {'it' if len(clash) == 1 else 'them'} too "
                              "(edit the ladder file, or give ladder.KEY=VALUE)")
        own, rest = variant_tokens(variants[0].overrides)
        if lad.steps is not None and any(variant_tokens(v.overrides)[0] is not None for v in variants):
            raise ConfigError(f"ladder {lad.name} trains {lad.steps} steps on every rung; {TOKENS_KEY} "
                              "needs a ladder with tokens_per_param")
        base = dataclasses.replace(variants[0], overrides=rest)
        if own is not None:  # the baseline's own tokens per parameter are the ladder's, as run
            lad = dataclasses.replace(lad, tokens_per_param=own)
        based = check_rule(lad, params, bool(grid))
        shape = lad.base if any(based) else None
        k, one_scan = max(seeds, 1), bool(grid) and lad.lr_rule is LrRule.MUP
        jobs, table = ladder_jobs(variants, lad, lambda rung: plan_rung(base, rung),
                                  list(range(k)) if one_scan else [0] if grid else list(range(seeds)), based,
                                  ratios)
        record = TransferRecord.of_ladder(lad, table, seeds, tied_lrs=ratios)
        if not grid:
            return cls(jobs, variants, record, seeds, base=shape)
        record = record.with_grid(grid, k)
        if not one_scan:  # a scan per rung (seed 0), then the seeds at the best LR of each rung
            return cls([at_lr(j, lr, ratios) for j in jobs for lr in grid], variants, record, k,
                       len(jobs) * (k - 1), base=shape)
        # one scan, at the smallest rung (seed 0); every other job waits for its variant's pick
        first = lad.rungs[0].name
        scan = [at_lr(j, lr, ratios) for j in jobs if (j.tag, j.seed) == (first, 0) for lr in grid]
        pending = [j for j in jobs if (j.tag, j.seed) != (first, 0)]
        return cls(scan, variants, record, k, len(pending), pending, shape)

    def header(self, n: int, sweep_dir: Path) -> str:
        from ablate.analysis.transfer_report import tied_note

        r = self.record
        grid = ", ".join(f"{x:g}" for x in r.grid)
        tied = "".join(f"\n  {line}" for line in tied_note(r.tied_lrs))
        if r.kind is TransferKind.LR_GRID:
            return (f"lr-grid sweep: {len(self.variants)} variants x {len(r.grid)} learning rates "
                    f"({grid}), seed 0: {n} jobs -> {sweep_dir}{tied}")
        lad, first = r.ladder, r.rungs[0].name
        rungs = "".join(f"\n  {t.name}: d_model {t.d_model}, {t.n_layers} layers, "
                        f"{t.n_heads} heads, {t.params:,} non-embedding params, {t.steps} steps "
                        f"({t.tokens:,} tokens)" + ("" if grid else f", lr {t.lr:g}") for t in r.rungs)
        size = (f"{len(r.grid)} learning rates ({grid}) on {first}, seed 0 (lr_rule mup: one scan, "
                "at the smallest rung)" if self.pending else
                f"{len(r.rungs)} rungs x {len(r.grid)} learning rates ({grid}), seed 0" if grid else
                f"{len(r.rungs)} rungs x {max(self.seeds, 1)} seeds")
        rule = (f"{lad.steps} steps each" if lad.steps else
                f"{lad.tokens_per_param:g} tokens per non-embedding parameter of the baseline")
        base = f"; param base shape: d_model {self.base[0]}, {self.base[1]} layers" if self.base else ""
        return (f"ladder {lad.name} sweep: {len(self.variants)} variants x {size}: {n} jobs -> "
                f"{sweep_dir}\nrungs ({rule}{base}):{rungs}{tied}")

    def then(self) -> str:
        if self.pending:
            first = self.record.rungs[0].name
            return (f"then: every rung, seeds 0..{self.seeds - 1} (seed 0 of {first} is the scan's), of "
                    f"each variant at its own best LR of {first} (lr_rule mup: one LR for every rung): "
                    f"{self.later} jobs")
        where = " on each rung" if self.record.kind is TransferKind.LADDER else ""
        return (f"then: seeds 1..{self.seeds - 1} of each variant at its own best LR of the grid{where}: "
                f"{self.later} jobs")

    def record_in(self, sweep_dir: Path) -> None:
        write_transfer(sweep_dir, self.record)

    def later_shapes(self) -> list[Job]:
        """One job of the second phase per variant and rung, at the grid's first LR (its LR is
        picked later; everything else about it is known now, so the sweep checks it first), named
        without the LR."""
        if not self.pending:  # the second phase repeats the first's configs with other seeds
            return []
        shapes = {(j.variant, j.tag): j for j in self.pending}
        return [dataclasses.replace(at_lr(j, self.record.grid[0], self.ratios), tag=j.tag) for j in shapes.values()]

    def next_jobs(self, results: Sequence[Any]) -> list[Job]:
        """The second phase, from the first phase's results."""
        import sys

        from ablate.sweep.progress import final_metric

        best = best_jobs(results, lambda d: final_metric(d, VAL_LOSS))
        lost = [f"{v} ({r})" if r else v for v, r in dict.fromkeys(cell_of(j) for j in self.jobs)
                if (v, r) not in best]
        if lost:
            print(f"warning: no grid LR finished for {', '.join(lost)}: nothing runs at a best LR for it",
                  file=sys.stderr)
        if self.pending:  # the smallest rung's pick, on every rung
            picks = {variant: lr_of(job) for (variant, _), (job, _) in best.items()}
            return [at_lr(j, picks[j.variant], self.ratios) for j in self.pending if j.variant in picks]
        return seed_jobs(best, self.seeds)
