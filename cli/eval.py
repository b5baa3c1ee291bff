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
    from ablate.names import Status
    from ablate.run.directory import SUMMARY, resume_command
    from ablate.run.record import read_record_or_why
    from ablate.run.trained import check_not_diverged, run_config

    run_config(run_dir)  # a run directory at all
    record, why = read_record_or_why(run_dir)
    if why is not None:
        raise RunDirError(f"{run_dir / SUMMARY}: unreadable ({why}); rewrite it from the run's last checkpoint "
                          f"with `{resume_command(run_dir)}`, then evaluate it")
    if record is None:
        raise RunDirError(f"{run_dir}: no {SUMMARY}: the run has not started, or its process was killed before "
                          f"it wrote one; train it with `{resume_command(run_dir)}`, then evaluate it")
    check_not_diverged(run_dir)
    status = record.live_status()
    if status == Status.RUNNING:
        raise RunDirError(f"{run_dir}: the run is being trained; evaluate it when it has finished")
    if status != Status.COMPLETED:
        raise RunDirError(f"{run_dir}: the run is {status}, not finished; "
                          f"finish it with `{resume_command(run_dir)}`, then evaluate it")


_said: set = set()


def say_once(line: str) -> None:
    """A notice on stderr, once per command (the thread notice, for each run of a sweep)."""
    if line not in _said:
        _said.add(line)
        typer.echo(line, err=True)


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


def evaluate_finished(run_dir: Path, keys: list, threads: int = 0):
    """One run directory: (its RunEval, the tokens scored), from its final weights in fp32, on
    the GPU when there is one, with `threads` CPU threads (0: chosen from the free cores, the
    notice said once). AblateError (one line) for a run that cannot be evaluated."""
    import torch

    from ablate.errors import ConfigError
    from ablate.evaluation.lengths import EvalData, evaluate_run, has_rope
    from ablate.run.trained import load_run_model
    from ablate.train.launch import prepare_data
    from ablate.train.threads import use_threads

    check_finished(run_dir)  # before the lock: a refused run's directory is left as it was
    with locked(run_dir):
        check_finished(run_dir)  # again: a run may have been resumed meanwhile
        loaded = load_run_model(run_dir)
        use_threads(threads, "--threads N", say=say_once)
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
    """The run itself, or every run under a sweep directory: each directory holding summary.json
    or config.yaml (a run that has none of its record yet is named, not left out)."""
    from ablate.analysis.load import natural
    from ablate.run.directory import CONFIG, SUMMARY
    from cli.common import fail

    if not path.is_dir():
        fail(f"{path}: no such directory (give a run or sweep directory)")
    if (path / SUMMARY).is_file() or (path / CONFIG).is_file():
        return [path]
    found = {s.parent for s in path.rglob(SUMMARY)} | {c.parent for c in path.rglob(CONFIG) if c.parent.name != ".hydra"}
    if not found:
        fail(f"{path}: no runs found (a run directory holds {SUMMARY})")
    return sorted(found, key=natural)


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


def print_run(ev, scored: int) -> None:
    """One run's table, as soon as it is evaluated: on a terminal broken at spaces to its width."""
    from ablate.evaluation.lengths import format_run
    from ablate.terminal import print_lines

    print_lines(format_run(ev, ev.results[0].key.protocol, scored))


def print_skipped(skipped: list[tuple[Path, str]]) -> None:
    from ablate.terminal import print_lines

    if skipped:
        print_lines([f"skipped {len(skipped)} run{'s' if len(skipped) > 1 else ''}:"] +
                    [f"  {why if why.startswith(str(d)) else f'{d}: {why}'}" for d, why in skipped], err=True)


def register(app: typer.Typer) -> None:
    @app.command(name="eval")
    def eval_command(
        path: str = typer.Argument(..., help="A run directory, or a sweep directory: every finished run in it."),
        lengths: str = typer.Option(..., "--lengths", help="Context lengths in tokens, e.g. 256,512,1024."),
        stride: Optional[int] = typer.Option(None, "--stride", help="Sliding windows S tokens apart, each scoring its last S tokens (default: non-overlapping windows)."),
        rope_scaling: Optional[str] = typer.Option(None, "--rope-scaling", help="pi:FACTOR (position interpolation) or ntk:FACTOR (NTK-aware base), RoPE runs only."),
        threads: int = typer.Option(0, "--threads", help="CPU threads (default 0: the cores other processes leave free)."),
        json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Loss and bits per byte of finished runs at other context lengths, on the same validation
        tokens at every length; added to each run's length_eval.json (its other files never change).
        The same lengths again return the stored results. Each run's table is printed as soon as
        it is evaluated; a run that cannot be evaluated is skipped with its reason."""
        import json

        from ablate.errors import AblateError
        from ablate.terminal import print_lines
        from ablate.train.threads import check_threads
        from cli.common import fail

        keys = parse_keys(lengths, stride, rope_scaling)
        try:
            check_threads(threads)
        except AblateError as e:
            fail(str(e))
        dirs = run_dirs(Path(path))
        _said.clear()
        evaluated, skipped = [], []
        asked = ", ".join(str(k.length) for k in keys)
        for i, d in enumerate(dirs, start=1):
            if len(dirs) > 1:  # what the next minute is spent on
                print_lines([f"[{i}/{len(dirs)}] {d}: evaluating at {asked} tokens"], err=True)
            try:
                ev, scored = evaluate_finished(d, keys, threads)
            except AblateError as e:
                if len(dirs) == 1:
                    fail(str(e), e.exit_code)
                skipped.append((d, str(e)))
                continue
            evaluated.append((ev, scored))
            if not json_out:
                print_run(ev, scored)
        if json_out:
            typer.echo(json.dumps({"runs": [ev.to_json() | {"scored_tokens": n} for ev, n in evaluated],
                                   "skipped": [{"run": str(d), "reason": why} for d, why in skipped]}, indent=2))
        print_skipped(skipped)
        if not evaluated:
            fail(f"no run under {path} could be evaluated")
