"""Sweeps whose answers should transfer: each variant at its own learning rate (`--lr-grid`) and
each variant on every rung of a model ladder (`--ladder`).

--lr-grid LO:HI:N  phase 1 runs every variant at N log-spaced learning rates, seed 0; phase 2
                   runs seeds 1..K-1 of each variant at its own best LR of phase 1 (seed 0 there
                   is phase 1's run, so no job runs twice). Seeds stay paired as in any sweep.
--ladder NAME      every variant on every rung of conf/ladder/NAME.yaml (or a .yaml path): the
                   rung sets width, depth and heads together, the steps follow the ladder's
                   tokens-per-parameter rule (the baseline's non-embedding parameters at that
                   rung) and the learning rate its width rule. A swept
                   `ladder.tokens_per_param=20,40` makes the tokens a variant (e.g. the
                   twice-the-tokens check): that variant's steps follow its own value.
Both together: the LR grid on every rung (the ladder's LR rule gives way), then each variant's
seeds at its own best LR of each rung.
The sweep directory's transfer.json says which of the two a sweep is; `ablate compare` reads it
to report best_lr, lr_sensitivity, tuned_delta or the compute multiplier
(ablate/analysis/transfer_report.py).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ablate.errors import ConfigError
from ablate.rundir import TRANSFER, read_transfer
from ablate.sweep.planning import SEED_KEY, Job, Parsed
from ablate.vocab import LADDER_TOKENS_KEY as TOKENS_KEY
from ablate.vocab import LR, TOKENS, VAL_LOSS, Status

LR_KEY = "train.lr"
LADDER_KEYS = ("model.d_model", "model.n_layers", "model.n_heads")


def lr_tag(lr: float) -> str:
    return f"lr{lr:g}"


# ---- --lr-grid ----------------------------------------------------------------------------------
def grid_jobs(variants: Sequence[Job], grid: Sequence[float]) -> list[Job]:
    """Phase 1: every variant at every grid LR, seed 0 (the LR is the last override but the seed,
    so it wins over a fixed train.lr)."""
    return [dataclasses.replace(v, overrides=v.overrides + [f"{LR_KEY}={lr:g}", f"{SEED_KEY}=0"],
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
@dataclass(frozen=True)
class Rung:
    name: str
    d_model: int
    n_layers: int
    n_heads: int

    def overrides(self) -> list[str]:
        return [f"{k}={v}" for k, v in zip(LADDER_KEYS, (self.d_model, self.n_layers, self.n_heads))]


@dataclass(frozen=True)
class Ladder:
    """A named model ladder. tokens_per_param: training tokens per non-embedding parameter of
    the baseline at each rung (every variant trains on the same tokens). lr_rule "width": the
    LR scales as base_lr * base_width / d_model (wider models take smaller steps, as muP's
    hidden-layer rule for Adam); "fixed": base_lr on every rung."""

    name: str
    rungs: tuple
    tokens_per_param: float
    base_lr: float
    base_width: int
    lr_rule: str = "width"
    warmup_fraction: float = 0.1  # of each rung's steps

    def warmup(self, steps: int) -> int:
        return math.ceil(self.warmup_fraction * steps)

    def lr(self, rung: Rung) -> float:
        lr = self.base_lr * self.base_width / rung.d_model if self.lr_rule == "width" else self.base_lr
        return float(f"{lr:.3g}")

    def steps(self, params: int, tokens_per_step: int, tokens_per_param: Optional[float] = None) -> int:
        return max(1, math.ceil((tokens_per_param or self.tokens_per_param) * params / tokens_per_step))

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["rungs"] = [dataclasses.asdict(r) for r in self.rungs]
        return d


def load_ladder(name: str) -> Ladder:
    """conf/ladder/NAME.yaml, or a .yaml file; the rungs must grow (width, depth and heads never
    shrink, and each rung is larger than the one before)."""
    import yaml

    from ablate.axes import CONF_DIR

    path = Path(name) if name.endswith((".yaml", ".yml")) else CONF_DIR / "ladder" / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in (CONF_DIR / "ladder").glob("*.yaml"))
        raise ConfigError(f"--ladder {name}: no such ladder; choose one of {', '.join(known)} "
                          "or give a .yaml file")
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        rungs = tuple(Rung(str(r["name"]), int(r["d_model"]), int(r["n_layers"]), int(r["n_heads"]))
                      for r in doc["rungs"])
        ladder = Ladder(path.stem, rungs, float(doc["tokens_per_param"]), float(doc["base_lr"]),
                        int(doc["base_width"]), str(doc.get("lr_rule", "width")),
                        float(doc.get("warmup_fraction", 0.1)))
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError) as e:
        mark = getattr(e, "problem_mark", None)  # a YAML syntax error: its several lines in one
        why = (f"no key {e}" if isinstance(e, KeyError) else
               f"YAML: {e.problem} at line {mark.line + 1}, column {mark.column + 1}" if mark else
               f"{type(e).__name__}: {e}")
        raise ConfigError(f"--ladder {name}: {path} is not a ladder ({why}); it "
                          "needs rungs [{name, d_model, n_layers, n_heads}], tokens_per_param, "
                          "base_lr and base_width") from None
    check_ladder(ladder)
    return ladder


def check_ladder(ladder: Ladder) -> None:
    if ladder.lr_rule not in ("width", "fixed"):
        raise ConfigError(f"ladder {ladder.name}: lr_rule must be width or fixed, got {ladder.lr_rule}")
    if len(ladder.rungs) < 2:
        raise ConfigError(f"ladder {ladder.name}: a ladder needs at least 2 rungs")
    if ladder.tokens_per_param <= 0 or ladder.base_lr <= 0 or not 0 <= ladder.warmup_fraction < 1:
        raise ConfigError(f"ladder {ladder.name}: tokens_per_param and base_lr must be positive and "
                          "warmup_fraction in [0, 1)")
    for a, b in zip(ladder.rungs, ladder.rungs[1:]):
        size_a, size_b = (a.d_model, a.n_layers, a.n_heads), (b.d_model, b.n_layers, b.n_heads)
        if any(y < x for x, y in zip(size_a, size_b)) or size_a == size_b:
            raise ConfigError(f"ladder {ladder.name}: its rungs do not grow ({a.name} {size_a} -> "
                              f"{b.name} {size_b} as d_model, n_layers, n_heads); order them "
                              "smallest first, each larger than the last")


def ladder_jobs(variants: Sequence[Job], ladder: Ladder, plan_rung: Callable[[Rung], tuple[int, int]],
                seeds: Sequence[int]) -> tuple[list[Job], list[dict]]:
    """Every variant on every rung (smallest first) with every seed. plan_rung(rung) -> (the
    baseline's non-embedding params there, tokens per step). Returns (jobs, the rung table)."""
    table, jobs = [], []
    for rung in ladder.rungs:
        params, per_step = plan_rung(rung)
        steps, lr = ladder.steps(params, per_step), ladder.lr(rung)
        table.append({**dataclasses.asdict(rung), "params": params, "steps": steps,
                      TOKENS: steps * per_step, LR: lr})
        for v in variants:
            own, rest = variant_tokens(v.overrides)
            n = steps if own is None else ladder.steps(params, per_step, own)  # the tokens as a variant
            rest += rung.overrides() + [f"train.steps={n}", f"train.warmup_steps={ladder.warmup(n)}",
                                        f"{LR_KEY}={lr:g}"]
            for s in seeds or [None]:
                jobs.append(dataclasses.replace(
                    v, overrides=rest + ([f"{SEED_KEY}={s}"] if s is not None else []),
                    seed=s, tag=rung.name))
    return jobs, table


def variant_tokens(overrides: Sequence[str]) -> tuple[Optional[float], list[str]]:
    """(the variant's ladder.tokens_per_param or None, its other overrides)."""
    own, rest = None, []
    for o in overrides:
        key, _, value = o.lstrip("+").partition("=")
        if key != TOKENS_KEY:
            rest.append(o)
            continue
        try:
            own = float(value)
        except ValueError:
            own = math.nan
        if not own > 0 or not math.isfinite(own):
            raise ConfigError(f"{TOKENS_KEY}={value}: give a positive number of tokens per parameter")
    return own, rest


# ---- the sweep's record -------------------------------------------------------------------------
def write_transfer(sweep_dir: Path, record: dict) -> None:
    """transfer.json, written before the first job: a re-run with another grid or ladder into the
    same directory is refused (its jobs would be other experiments)."""
    from ablate.rundir import write_json

    path = Path(sweep_dir) / TRANSFER
    old = read_transfer(path.parent)
    if old is not None and old != json.loads(json.dumps(record)):
        what = "grid" if record.get("kind") == "lr_grid" else "ladder"
        raise ConfigError(f"{path} records another {old.get('kind')} sweep than this {what}; "
                          "sweep into a new hydra.sweep.dir")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, record)



def check_transfer(lr_grid: Optional[str], ladder: Optional[str]) -> tuple[list[float], Optional[Ladder]]:
    """--lr-grid and --ladder as given: (the grid, the ladder); one line on bad input."""
    lad = load_ladder(ladder) if ladder is not None else None
    if lr_grid is None:
        return [], lad
    from ablate.analysis.transfer import parse_lr_grid

    return parse_lr_grid(lr_grid), lad


# ---- the plan the sweeper runs ------------------------------------------------------------------
def _set_keys(p: Parsed) -> set[str]:
    return {o.lstrip("+~").split("=", 1)[0] for o in p.fixed} | {k.lstrip("+~") for k, _ in p.swept}


@dataclass
class TransferPlan:
    """jobs: what runs first; later: how many jobs a second phase adds (the LR grid's seeds at
    each variant's best LR); record: transfer.json."""

    jobs: list
    variants: list
    record: dict
    seeds: int
    later: int = 0

    @classmethod
    def make(cls, arguments: Sequence[str], mode: str, seeds: int, explicit: Any,
             lr_grid: Optional[str], ladder: Optional[str],
             plan_rung: Callable[[Job, Rung], tuple[int, int]],
             base_lr: Callable[[Job], float]) -> "TransferPlan":
        from ablate.sweep.planning import parse, plan

        grid, lad = check_transfer(lr_grid, ladder)
        p = parse(arguments)
        if p.seeds:
            raise ConfigError("with --lr-grid or --ladder give seeds as --seeds N, not seed=...")
        if grid and LR_KEY in _set_keys(p):
            raise ConfigError(f"--lr-grid sets {LR_KEY} for every job; do not set it too")
        variants = plan(arguments, mode, 0, explicit)
        k = max(seeds, 1)
        if lad is None:
            record = {"kind": "lr_grid", "grid": grid, "seeds": k, "shared_lr": base_lr(variants[0])}
            return cls(grid_jobs(variants, grid), variants, record, k, len(variants) * (k - 1))
        clash = _set_keys(p) & {*LADDER_KEYS, "train.steps", "train.warmup_steps", LR_KEY}
        if clash:
            raise ConfigError(f"--ladder {lad.name} sets {', '.join(sorted(clash))} on each rung; "
                              f"do not set {'it' if len(clash) == 1 else 'them'} too "
                              "(edit the ladder file instead)")
        own, rest = variant_tokens(variants[0].overrides)
        base = dataclasses.replace(variants[0], overrides=rest)
        if own is not None:  # the baseline's own tokens per parameter are the ladder's, as run
            lad = dataclasses.replace(lad, tokens_per_param=own)
        jobs, table = ladder_jobs(variants, lad, lambda rung: plan_rung(base, rung),
                                  [0] if grid else list(range(seeds)))
        record = {"kind": "ladder", "ladder": lad.as_dict(), "rungs": table, "seeds": seeds}
        if not grid:
            return cls(jobs, variants, record, seeds)
        # a scan per rung: each variant's seed 0 on each rung at every grid LR, then its seeds at
        # the best LR of that rung
        record.update(grid=grid, seeds=k)
        # the grid LR replaces the rung's; the seed override stays last
        scan = [dataclasses.replace(j, overrides=[o for o in j.overrides[:-1] if not o.startswith(f"{LR_KEY}=")]
                                    + [f"{LR_KEY}={lr:g}", j.overrides[-1]], tag=f"{j.tag}_{lr_tag(lr)}")
                for j in jobs for lr in grid]
        return cls(scan, variants, record, k, len(jobs) * (k - 1))

    def header(self, n: int, sweep_dir: Path) -> str:
        r = self.record
        grid = ", ".join(f"{x:g}" for x in r.get("grid", []))
        if r["kind"] == "lr_grid":
            return (f"lr-grid sweep: {len(self.variants)} variants x {len(r['grid'])} learning rates "
                    f"({grid}), seed 0: {n} jobs -> {sweep_dir}")
        rungs = "".join(f"\n  {t['name']}: d_model {t['d_model']}, {t['n_layers']} layers, "
                        f"{t['n_heads']} heads, {t['params']:,} non-embedding params, {t['steps']} steps "
                        f"({t[TOKENS]:,} tokens)" + ("" if grid else f", lr {t[LR]:g}") for t in r["rungs"])
        size = f"{len(r['grid'])} learning rates ({grid}), seed 0" if grid else f"{max(self.seeds, 1)} seeds"
        return (f"ladder {r['ladder']['name']} sweep: {len(self.variants)} variants x "
                f"{len(r['rungs'])} rungs x {size}: {n} jobs -> {sweep_dir}\n"
                f"rungs ({r['ladder']['tokens_per_param']:g} tokens per non-embedding parameter of "
                f"the baseline):{rungs}")

    def then(self) -> str:
        where = " on each rung" if self.record["kind"] == "ladder" else ""
        return (f"then: seeds 1..{self.seeds - 1} of each variant at its own best LR of the grid{where}: "
                f"{self.later} jobs")

    def record_in(self, sweep_dir: Path) -> None:
        write_transfer(sweep_dir, self.record)

    def next_jobs(self, results: Sequence[Any]) -> list[Job]:
        """The second phase, from the first phase's results."""
        import sys

        from ablate.sweep.report import final_metric

        best = best_jobs(results, lambda d: final_metric(d, VAL_LOSS))
        lost = [f"{v} ({r})" if r else v for v, r in dict.fromkeys(cell_of(j) for j in self.jobs)
                if (v, r) not in best]
        if lost:
            print(f"warning: no grid LR finished for {', '.join(lost)}: no seeds at a best LR for it",
                  file=sys.stderr)
        return seed_jobs(best, self.seeds)
