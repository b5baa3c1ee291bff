"""Run directories with known numbers, as `ablate run` and `ablate sweep` leave them (the
fields compare reads), for the tests of `ablate compare`: single runs, a study sweep, the
golden outputs' tree, LR-grid and ladder sweeps (transfer.json beside their jobs), and grid
sweeps of two crossed axes with known Δs and a known interaction."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence

import yaml

from ablate.names import Status

DEFAULT_AXES = {"norm": "layernorm", "norm_pos": "pre", "act": "gelu", "pos": "learned", "attn": "mha",
                "tie": "tied", "bias": "on", "dropout": "off", "qk_norm": "off"}
COMMON = ["model.d_model=32", "train.steps=6"]  # shared by every run: not part of the names

BASE = {0: 3.00, 1: 3.10, 2: 3.05}
PAIRED = {0: 2.90, 1: 3.01, 2: 2.94}  # same seeds: paired
WELCH = {3: 3.20, 4: 3.26, 5: 3.17}  # other seeds: Welch
NOISY = {0: 3.02, 1: 3.07, 2: 3.08}  # within seed noise


def write_run(root: Path, name: str, change: dict, seed: int, val_loss, status=Status.COMPLETED.value,
              params=1000, sweep=None, variant=None, rows=None, tokens_per_s=100.0):
    """A run directory as `ablate run` leaves it (the fields compare reads)."""
    d = root / name
    d.mkdir(parents=True)
    axes = {**DEFAULT_AXES, **change}
    overrides = sorted(COMMON + [f"{k}={v}" for k, v in change.items()])
    config = {axis: {"name": v} for axis, v in axes.items()}
    config.update(model={"d_model": 32}, train={"steps": 6, "progress": False}, seed=seed, data_seed=0,
                  logger={"name": "none"})
    (d / "config.yaml").write_text(yaml.safe_dump(config))
    summary = {"status": status, "variant": variant or ",".join(overrides), "axes": axes, "seed": seed,
               "data_seed": 0, "overrides": overrides, "sweep": sweep, "params": params,
               "flops_per_token": 6 * params, "precision": "fp32", "tokens_per_s": tokens_per_s,
               "val_loss": val_loss}
    (d / "summary.json").write_text(json.dumps(summary))
    rows = rows if rows is not None else [
        {"step": s, "tokens": 128 * s, "train_loss": 5.0 - 0.1 * s, "grad_norm": 1.0 + 0.1 * s,
         "lr": 1e-3, "tokens_per_s": tokens_per_s} for s in range(1, 4)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def set_config(run_dir, key: str, value) -> None:
    """Change one config.yaml key (dotted) of a written run."""
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    *parents, last = key.split(".")
    node = cfg
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg))


LONG = {"pos": "rope", "attn": "gqa", "qk_norm": "on", "act": "swiglu"}  # a long variant name
LONG_NAME = "act=swiglu,attn=gqa,pos=rope,qk_norm=on"


def write_three_variants(root: Path) -> Path:
    """The baseline and norm=rmsnorm on seeds 0-2 (paired), and a long-named variant on seeds 3-5
    (Welch), 0.4% bigger than the baseline (under the size note's threshold)."""
    for s, v in BASE.items():
        write_run(root, f"base_s{s}", {}, s, v)
    for s, v in PAIRED.items():
        write_run(root, f"rms_s{s}", {"norm": "rmsnorm"}, s, v)
    for s, v in WELCH.items():
        write_run(root, f"long_s{s}", LONG, s, v, params=1004)
    return root


def by_name(rows):
    """Rows (compare_dirs' or --json's) by variant, as the JSON keys."""
    rows = [r.as_dict() if hasattr(r, "as_dict") else r for r in rows]
    return {r["variant"]: r for r in rows}


def cli(*args: str, columns: str = ""):
    """`ablate ...` in this process (a subprocess costs seconds of imports on a loaded machine);
    the subprocess tests check what only a real process shows (exit code, stderr, COLUMNS)."""
    from typer.testing import CliRunner

    from cli.main import app

    return CliRunner().invoke(app, list(args), env={"COLUMNS": columns} if columns else {})


# ---- a study sweep ------------------------------------------------------------------------------
SWEEP = "2026-01-02_03-04-05_gpt2_to_llama"
LADDER = [("gpt2", {}), ("+rmsnorm", {"norm": "rmsnorm"}),
          ("+swiglu", {"norm": "rmsnorm", "act": "swiglu"}),
          ("+rope", {"norm": "rmsnorm", "act": "swiglu", "pos": "rope"})]
VALUES = {  # rung -> seed -> final val_loss
    "gpt2": {0: 3.00, 1: 3.10, 2: 3.05},
    "+rmsnorm": {0: 2.90, 1: 3.01, 2: 2.94},  # steps -0.10, -0.09, -0.11 vs gpt2
    "+swiglu": {0: 2.88, 1: 3.03, 2: 2.91},  # steps -0.02, +0.02, -0.03: noise
    "+rope": {0: 2.78, 1: 2.92, 2: 2.82},  # steps -0.10, -0.11, -0.09
}


def write_study(root, ladder=LADDER, values=VALUES, skip=()):
    """A study's sweep dir as the sweeper leaves it. Job numbers run against the ladder so
    that directory order cannot be what puts the rows in ladder order."""
    sweep = root / SWEEP
    sweep.mkdir(parents=True)
    jobs = [{"name": name, "overrides": [f"{k}={v}" for k, v in change.items()]} for name, change in ladder]
    (sweep / "multirun.yaml").write_text(yaml.safe_dump(
        {"hydra": {"sweeper": {"mode": "ofat", "seeds": 3, "jobs": jobs}}, "seed": 0}))
    job = 0
    for name, change in reversed(ladder):
        for seed, v in values[name].items():
            if name not in skip:
                status = Status.COMPLETED.value if v is not None else Status.DIVERGED.value
                write_run(sweep, f"{job}_{name}_seed{seed}", change, seed, v, status=status,
                          sweep=SWEEP, variant=name)
            job += 1
    return sweep


# ---- the golden outputs' tree -------------------------------------------------------------------
def make_fixture(root: Path) -> Path:
    """Variants x seeds with a diverged and a failed run (ab), a study ladder (study), a pair
    that differs in train.steps (mixed), variants with a loss at other lengths (lengths)."""
    ab = root / "ab"
    for s, v in BASE.items():
        write_run(ab, f"base_s{s}", {}, s, v)
    for s, v in PAIRED.items():
        write_run(ab, f"rms_s{s}", {"norm": "rmsnorm"}, s, v)
    write_run(ab, "rms_s9", {"norm": "rmsnorm"}, 9, None, status=Status.DIVERGED.value)
    for s, v in WELCH.items():
        write_run(ab, f"swiglu_s{s}", {"act": "swiglu"}, s, v, params=1100)
    for s, v in NOISY.items():
        write_run(ab, f"rope_s{s}", {"pos": "rope"}, s, v)
    write_run(ab, "rope_s7", {"pos": "rope"}, 7, None, status=Status.FAILED.value)
    write_study(root / "study")
    write_length_runs(root / "lengths")
    for name, steps in (("a", 6), ("b", 8)):
        d = write_run(root / "mixed", name, {}, 0, 3.0 + steps / 100)
        for record in ("config.yaml", "summary.json"):  # its config and its override, as `ablate run` writes them
            text = (d / record).read_text().replace("steps: 6", f"steps: {steps}")
            (d / record).write_text(text.replace("train.steps=6", f"train.steps={steps}"))
    return root


# ---- --lr-grid and --ladder sweeps --------------------------------------------------------------
GRID = [1e-3, 1e-2, 1e-1]
GRID_LOSS = {"baseline": [2.9, 2.5, 2.8], "qk_norm=on": [2.85, 2.45, 2.5]}  # seed 0; seed s adds 0.01 s
RUNGS = [("r0", 16, 1, 1e9), ("r1", 24, 2, 1e10), ("r2", 32, 2, 1e11)]  # name, d_model, n_layers, compute
RUNG_LOSS = {"baseline": [3.0, 2.6, 2.4], "pos=rope": [2.9, 2.55, 2.38]}


def _sweep_job(sweep: Path, name: str, variant: str, seed: int, loss: float, config: dict) -> None:
    change = {"qk_norm": "on"} if variant == "qk_norm=on" else {"pos": "rope"} if variant == "pos=rope" else {}
    d = write_run(sweep, name, change, seed, loss, sweep=sweep.name, variant=variant,
                  rows=[{"step": 0, "val_loss": 5.0}, {"step": 6, "val_loss": loss}])
    for key, value in config.items():
        set_config(d, key, value)


def ladder_record(rungs: Sequence[tuple[str, int, int]], grid: Sequence[float] = (), lr_rule: str = "fixed",
                  seeds: int = 2, tokens_per_param: Optional[float] = 20):
    """A ladder sweep's TransferRecord over `rungs` [(name, d_model, n_layers)], as the sweep would
    write it (heads 1, a nominal base LR, params and steps)."""
    from ablate.sweep.transfer_record import Ladder, Rung, RungPlan, TransferRecord

    shapes = [Rung(n, d, layers, 1) for n, d, layers in rungs]
    ladder = Ladder("t", tuple(shapes), tokens_per_param, 1e-2, None, lr_rule, steps=None if tokens_per_param else 10)
    plans = [RungPlan(r.name, r.d_model, r.n_layers, 1, 1000 * r.d_model, 10, 10 * 256, ladder.lr(r)) for r in shapes]
    return TransferRecord.of_ladder(ladder, plans, seeds, grid)


def write_grid_sweep(root: Path, seeds: int = 2) -> Path:
    """An --lr-grid sweep: two variants, every grid LR, `seeds` seeds each."""
    from ablate.sweep.transfer_record import TransferRecord

    sweep = root / "grid"
    sweep.mkdir(parents=True)
    TransferRecord.lr_grid(GRID, seeds, 1e-2).write(sweep)
    for variant, losses in GRID_LOSS.items():
        for lr, loss in zip(GRID, losses):
            for s in range(seeds):
                _sweep_job(sweep, f"{variant}_lr{lr:g}_s{s}", variant, s, loss + 0.01 * s, {"train.lr": lr})
    return sweep


def write_ladder_sweep(root: Path, seeds: int = 2) -> Path:
    """A --ladder sweep: two variants on three rungs, `seeds` seeds each."""
    sweep = root / "ladder"
    sweep.mkdir(parents=True)
    ladder_record([r[:3] for r in RUNGS], seeds=seeds).write(sweep)
    for variant, losses in RUNG_LOSS.items():
        for (rung, d_model, layers, compute), loss in zip(RUNGS, losses):
            for s in range(seeds):
                name = f"{variant}_{rung}_s{s}"
                _sweep_job(sweep, name, variant, s, loss + 0.01 * s * (1 if variant == "baseline" else 1.2),
                           {"model.d_model": d_model, "model.n_layers": layers})
                summary = json.loads((sweep / name / "summary.json").read_text())
                summary.update(flops_per_token=compute / 1e6, tokens=1e6)
                (sweep / name / "summary.json").write_text(json.dumps(summary))
    return sweep


# ---- the loss at other context lengths ----------------------------------------------------------
TRAIN_LEN = 64
NA = "a learned position table has 128 rows (model.max_seq_len=128)"  # what `ablate eval` says
# variant change -> protocol (stride) -> length -> loss per seed 0, 1, 2 (None: not evaluated;
# NA: n/a). The learned baseline cannot reach 256; rope grows past its training length, alibi not.
LENGTH_LOSS = {
    (): {None: {64: [3.00, 3.10, 3.05], 128: [3.02, 3.11, 3.08], 256: [NA] * 3, 512: [NA] * 3},
         32: {128: [2.98, 3.07, 3.04], 256: [NA] * 3}},
    (("pos", "rope"),): {None: {64: [2.95, 3.04, 3.01], 128: [3.10, 3.22, 3.15], 256: [3.60, 3.75, 3.66],
                                512: [4.30, 4.41, None]},
                         32: {128: [3.05, 3.15, 3.10], 256: [3.50, 3.62, 3.55]}},
    (("pos", "alibi"),): {None: {64: [2.97, 3.08, 3.02], 128: [2.96, 3.05, 3.03], 256: [2.95, 3.05, 3.01],
                                 512: [2.95, 3.04, 3.02]},
                          32: {128: [2.94, 3.02, 2.99], 256: [2.91, 3.00, 2.97]}},
}


def write_lengths(run_dir: Path, losses: dict, train_seq_len: int = TRAIN_LEN, stride=None,
                  rope_scaling=None) -> None:
    """Add results to a run's length_eval.json as `ablate eval` writes them: length -> loss (a
    str: n/a with that reason)."""
    from ablate.evaluation.length_record import EvalKey, EvalStatus, LengthRecord, LengthResult, read_lengths
    from ablate.evaluation.length_record import write_lengths as write

    record = read_lengths(run_dir) or LengthRecord(train_seq_len)
    for length, v in losses.items():
        key = EvalKey(length, stride, rope_scaling)
        record.add(LengthResult(key, EvalStatus.NOT_AVAILABLE, reason=v) if isinstance(v, str) else
                   LengthResult(key, EvalStatus.OK, loss=v, scored_tokens=4096, step=6))
    write(run_dir, record)


def write_length_runs(root: Path, table: dict = LENGTH_LOSS) -> Path:
    """Variants x 3 seeds trained at TRAIN_LEN, each with its length_eval.json (`table`)."""
    for change, protocols in table.items():
        name = "_".join(v for _, v in change) or "base"
        for seed in range(3):
            d = write_run(root, f"{name}_s{seed}", dict(change), seed, protocols[None][TRAIN_LEN][seed])
            for stride, by_length in protocols.items():
                write_lengths(d, {n: v[seed] for n, v in by_length.items() if v[seed] is not None}, stride=stride)
    return root


# ---- two crossed axes (a --mode grid sweep) -------------------------------------------------------
# (qk_norm, norm) -> per-seed change from X_BASE: qk_norm=on gains 0.040 under layernorm and 0.011
# under rmsnorm, so the interaction is +0.0297 (per seed +0.029, +0.030, +0.030): beyond noise.
X_BASE = {0: 3.00, 1: 3.10, 2: 3.05}
X_CELLS = {("off", "layernorm"): [0.0, 0.0, 0.0], ("off", "rmsnorm"): [-0.020, -0.022, -0.018],
           ("on", "layernorm"): [-0.040, -0.043, -0.038], ("on", "rmsnorm"): [-0.031, -0.035, -0.026]}
X_DELTA = {"layernorm": -0.0403333, "rmsnorm": -0.0106667}
X_INTERACTION = 0.0296667
# the same gain under both norms (per-seed interaction -0.002, +0.003, -0.001: noise)
X_HOLDS = {("off", "layernorm"): [0.0, 0.0, 0.0], ("off", "rmsnorm"): [-0.020, -0.022, -0.018],
           ("on", "layernorm"): [-0.040, -0.043, -0.038], ("on", "rmsnorm"): [-0.062, -0.062, -0.057]}


def write_grid(root: Path, cells: dict = X_CELLS, a: str = "qk_norm", b: str = "norm", base: dict = X_BASE,
               name: str = "grid2", skip=(), more: tuple = ()) -> Path:
    """A `--mode grid` sweep of a x b as the sweeper leaves it: multirun.yaml (its mode and the
    overrides in the order given), jobs numbered in Hydra's order (a slowest), seed s of cell
    (x, y) at base[s] + cells[x, y][s]. `skip`: cells left out; `more`: (key, value) overrides of
    every job (a third axis held at one level)."""
    sweep = root / name
    sweep.mkdir(parents=True)
    a_levels = list(dict.fromkeys(x for x, _ in cells))
    b_levels = list(dict.fromkeys(y for _, y in cells))
    seeds = len(base)
    task = [f"{a}={','.join(a_levels)}", f"{b}={','.join(b_levels)}", *(f"{k}={v}" for k, v in more), *COMMON]
    (sweep / "multirun.yaml").write_text(yaml.safe_dump(
        {"hydra": {"sweeper": {"mode": "grid", "seeds": seeds, "jobs": None, "lr_grid": None, "ladder": None},
                   "overrides": {"task": task}}, "seed": 0}))
    job = 0
    for x in a_levels:
        for y in b_levels:
            for s, v in base.items():
                variant = ",".join([f"{a}={x}", f"{b}={y}", *(f"{k}={w}" for k, w in more)])
                if (x, y) not in skip:
                    write_run(sweep, f"{job}_{variant}_seed{s}", {a: x, b: y, **dict(more)}, s,
                              round(v + cells[x, y][s], 6), sweep=sweep.name, variant=variant)
                job += 1
    return sweep


# an --lr-grid sweep of two crossed axes: each cell's loss is X_BASE[s] + X_CELLS[cell][s] at its own
# best LR (qk_norm=on's is 0.1, the others' 0.01) and LR_PENALTY more at every other grid LR
LR_BEST = {"off": 1e-2, "on": 1e-1}
LR_PENALTY = 0.05


def write_lr_grid_crossed(root: Path, cells: dict = X_CELLS, base: dict = X_BASE) -> Path:
    """A `--mode grid --lr-grid` sweep of qk_norm x norm: phase 1 every cell at every GRID LR
    (seed 0), phase 2 seeds 1.. at each cell's best LR, as the sweeper runs it."""
    from ablate.sweep.transfer_record import TransferRecord

    sweep = root / "lr_grid2"
    sweep.mkdir(parents=True)
    TransferRecord.lr_grid(GRID, len(base), 1e-2).write(sweep)
    (sweep / "multirun.yaml").write_text(yaml.safe_dump(
        {"hydra": {"sweeper": {"mode": "grid", "seeds": len(base), "jobs": None, "lr_grid": "1e-3:1e-1:3",
                               "ladder": None},
                   "overrides": {"task": ["qk_norm=off,on", "norm=layernorm,rmsnorm", *COMMON]}}}))
    job = 0
    for (qk, norm), change in cells.items():
        variant = f"qk_norm={qk},norm={norm}"
        for s in base:
            for lr in GRID if s == 0 else [LR_BEST[qk]]:
                loss = base[s] + change[s] + (0.0 if lr == LR_BEST[qk] else LR_PENALTY)
                d = write_run(sweep, f"{job}_{variant}_lr{lr:g}_seed{s}", {"qk_norm": qk, "norm": norm}, s,
                              round(loss, 6), sweep=sweep.name, variant=variant,
                              rows=[{"step": 0, "val_loss": 5.0}, {"step": 6, "val_loss": loss}])
                set_config(d, "train.lr", lr)
                job += 1
    return sweep
