"""`ablate eval RUN_OR_SWEEP_DIR --lengths 256,512,1024`: finished runs' loss at other context
lengths, added to each run's length_eval.json (ablate/evaluation/lengths.py)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Optional

import typer


def check_finished(run_dir: Path) -> None:
    """A completed run; AblateError (one line) otherwise (a diverged one with its reason)."""
    from ablate.errors import RunDirError
    from ablate.run.record import live_status
    from ablate.run.directory import resume_command
    from ablate.run.trained import check_not_diverged, run_config
    from ablate.names import Status

    run_config(run_dir)  # a run directory at all
    check_not_diverged(run_dir)
    status = live_status(run_dir)
    if status == Status.RUNNING:
        raise RunDirError(f"{run_dir}: the run is being trained; evaluate it when it has finished")
    if status != Status.COMPLETED:
        raise RunDirError(f"{run_dir}: the run is {status or 'not started'}, not finished; "
                          f"finish it with `{resume_command(run_dir)}`, then evaluate it")


@contextlib.contextmanager
def locked(run_dir: Path):
    """The run's lock, held inside the block: no training and no other eval of it meanwhile."""
    from ablate.errors import RunDirError
    from ablate.run.directory import RunLock

    lock = RunLock(run_dir)
    try:
        lock.acquire()
    except RunDirError:
        raise RunDirError(f"{run_dir}: in use by another process (a training or another eval of "
                          "it); wait for it to finish") from None
    try:
        yield
    finally:
        lock.release()


def evaluate_finished(run_dir: Path, keys: list):
    """One run directory: (its RunEval, the tokens scored), from its final weights in fp32, on
    the GPU when there is one. AblateError (one line) for a run that cannot be evaluated."""
    import torch

    from ablate.errors import ConfigError
    from ablate.evaluation.lengths import EvalData, evaluate_run, has_rope
    from ablate.run.trained import load_run_model
    from ablate.train.launch import prepare_data

    check_finished(run_dir)  # before the lock: a refused run's directory is left as it was
    with locked(run_dir):
        check_finished(run_dir)  # again: a run may have been resumed meanwhile
        loaded = load_run_model(run_dir)
        if any(k.rope_scaling for k in keys) and not has_rope(loaded.model):
            raise ConfigError(f"{run_dir}: --rope-scaling needs a RoPE run, this one has "
                              f"pos={loaded.spec.pos}; leave --rope-scaling out")
        tok, tokens = prepare_data(loaded.cfg, progress=False)
        t = loaded.cfg.train
        data = EvalData(tokens.val, tok.token_byte_lengths(), t.eval_tokens, t.batch_size * t.seq_len)
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        ev = evaluate_run(Path(run_dir), loaded.model.to(device), t.seq_len, keys, data, loaded.step, device)
        return ev, data.scored_tokens


def run_dirs(path: Path) -> list[Path]:
    """The run itself, or every run (a directory holding summary.json) under a sweep directory."""
    from ablate.analysis.load import natural
    from ablate.run.directory import CONFIG, SUMMARY
    from cli.common import fail

    if not path.is_dir():
        fail(f"{path}: no such directory (give a run or sweep directory)")
    if (path / SUMMARY).is_file() or (path / CONFIG).is_file():
        return [path]
    found = sorted((s.parent for s in path.rglob(SUMMARY)), key=natural)
    if not found:
        fail(f"{path}: no runs found (a run directory holds {SUMMARY})")
    return found


def parse_keys(lengths: str, stride: Optional[int], rope_scaling: Optional[str]):
    """The keys asked for; one line and exit 2 for bad input, before anything is read."""
    from ablate.errors import ConfigError
    from ablate.evaluation.length_record import EvalKey
    from ablate.evaluation.lengths import check_stride, parse_lengths
    from ablate.model.positions import RopeScaling
    from cli.common import fail

    try:
        values = parse_lengths(lengths)
        check_stride(stride, values)
        scaling = str(RopeScaling.parse(rope_scaling)) if rope_scaling is not None else None
    except (ConfigError, ValueError) as e:
        fail(str(e))
    return [EvalKey(n, stride, scaling) for n in values]


def report(evaluated: list, skipped: list[tuple[Path, str]], json_out: bool) -> None:
    import json

    from ablate.evaluation.lengths import format_run

    if json_out:
        typer.echo(json.dumps({"runs": [ev.to_json() | {"scored_tokens": n} for ev, n in evaluated],
                               "skipped": [{"run": str(d), "reason": why} for d, why in skipped]}, indent=2))
        return
    for ev, scored in evaluated:
        typer.echo("\n".join(format_run(ev, ev.results[0].key.protocol, scored)))
    if skipped:
        typer.echo(f"skipped {len(skipped)} run{'s' if len(skipped) > 1 else ''}:", err=True)
        for d, why in skipped:
            typer.echo(f"  {d}: {why.removeprefix(f'{d}: ')}", err=True)


def register(app: typer.Typer) -> None:
    @app.command(name="eval")
    def eval_command(
        path: str = typer.Argument(..., help="A run directory, or a sweep directory: every finished run in it."),
        lengths: str = typer.Option(..., "--lengths", help="Context lengths in tokens, e.g. 256,512,1024."),
        stride: Optional[int] = typer.Option(None, "--stride", help="Sliding windows S tokens apart, each scoring its last S tokens (default: non-overlapping windows)."),
        rope_scaling: Optional[str] = typer.Option(None, "--rope-scaling", help="pi:FACTOR (position interpolation) or ntk:FACTOR (NTK-aware base), RoPE runs only."),
        json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Loss and bits per byte of finished runs at other context lengths, on the same validation
        tokens at every length; added to each run's length_eval.json (its other files never change).
        The same lengths again return the stored results."""
        from ablate.errors import AblateError
        from cli.common import fail

        keys = parse_keys(lengths, stride, rope_scaling)
        dirs = run_dirs(Path(path))
        evaluated, skipped = [], []
        for d in dirs:
            try:
                evaluated.append(evaluate_finished(d, keys))
            except AblateError as e:
                if len(dirs) == 1:
                    fail(str(e), e.exit_code)
                skipped.append((d, str(e)))
        report(evaluated, skipped, json_out)
        if not evaluated:
            fail(f"no run under {path} could be evaluated")
