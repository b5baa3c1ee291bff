"""Shared test helpers. Tests never touch the network, the user's cache or ./runs.

How the suite runs (`make test`: two xdist workers), and the switches that turn each shortcut off
(set in the environment of pytest, e.g. `ABLATE_TEST_MEMO=0 make test`):
- run_ablate runs a command in the test's process where the test cannot tell the difference
  (in_process); `ABLATE_TEST_IN_PROCESS=0` gives every run_ablate command a process of its own
  (tests that call in_process themselves, to observe the process, still run there).
- A command in a process of its own is forked from a warm interpreter, the zygote
  (tests/forkserver.py); `ABLATE_TEST_ZYGOTE=0` starts a fresh interpreter for each instead.
- Hydra's compositions are derived from earlier ones by the test-side composition memo
  (tests/composition_memo.py), installed for the session here and in the zygote (not in fresh
  interpreters); `ABLATE_TEST_MEMO=0` leaves every composition Hydra's own, as in the product
  (the tests of the memo itself are then skipped).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

import composition_memo
import forkserver

ROOT = Path(__file__).resolve().parent.parent
# One thread per process (before torch is imported; subprocesses inherit it): two xdist workers
# on two cores, each running an `ablate` subprocess, would otherwise spin four or more OpenMP
# threads on two cores, which slows every run by an order of magnitude.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# A model and a training budget small enough for a few seconds on 2 CPU cores. On the CPU even
# where a GPU exists: these tests check CPU semantics (bit-exact resume, gloo for nproc=2).
TINY = [
    "model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.max_seq_len=64",
    "train.batch_size=4", "train.seq_len=32", "train.steps=6",
    # the automatic warmup (train.warmup_steps=null): 2 steps from 5 steps on, fewer below
    "train.warmup_fraction=0.4", "train.warmup_max_steps=2",
    "train.eval_every=0", "train.eval_tokens=512", "train.log_every=1", "logger=none",
    "train.progress=false", "train.device=cpu",
]

# What a preset needs beside TINY-sized models: arch=gemma3's 5 sliding layers to 1 full need 6
# layers (with fewer it is refused in one line, as it should be).
PRESET_DEPTH = {"gemma3": ["model.n_layers=6"]}


def loss_curve(trainer, grad_norm: bool = False) -> list[float]:
    """A scripted_trainer's logged train_loss per step (each followed by its grad_norm if asked)."""
    keys = ("train_loss", "grad_norm") if grad_norm else ("train_loss",)
    return [r[k] for r in trainer.sinks.rows if "train_loss" in r for k in keys]


def completed_trainer(run_dir: Path, *overrides: str):
    """A scripted_trainer with `overrides`, trained to its end (asserted)."""
    trainer = scripted_trainer(run_dir, *overrides)
    outcome = trainer.fit()
    assert outcome.status == "completed", outcome.reason
    return trainer


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    """The cuda tier (tests/test_cuda_*.py, marker `cuda`) runs only where CUDA is available."""
    if any("cuda" in item.keywords for item in items) and not cuda_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is false)")
        for item in items:
            if "cuda" in item.keywords:
                item.add_marker(skip)


_cuda_test = False  # whether the running test is marked cuda (run_ablate reads it)


@pytest.fixture(autouse=True)
def _mark_cuda_test(request):
    global _cuda_test
    _cuda_test = request.node.get_closest_marker("cuda") is not None
    yield
    _cuda_test = False


@pytest.fixture(scope="session", autouse=True)
def _isolated_env(tmp_path_factory):
    """One data cache for the whole session (tokenized once); W&B never goes online."""
    os.environ["ABLATE_CACHE"] = str(tmp_path_factory.mktemp("ablate-cache"))
    os.environ["WANDB_MODE"] = os.environ.get("WANDB_MODE", "offline")
    os.environ["WANDB_SILENT"] = "true"
    os.environ.pop("WANDB_API_KEY", None)
    os.environ.pop("HYDRA_FULL_ERROR", None)
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    yield


def run_ablate(*args: str, cwd: Path | None = None, env: dict | None = None,
               timeout: float = 600, fresh: bool = False, process: bool = False) -> subprocess.CompletedProcess:
    """The real CLI with `args`, as a user would run it: exit code, stdout and stderr. Run in
    this process (CliRunner capture, the process state restored after: in_process) where the
    test cannot tell the difference, which spares the ~5 s of CPU that a new process spends
    importing torch and torch._dynamo; in a process of its own (see needs_process) for the rest.
    That process is forked from this worker's zygote (tests/forkserver.py: an interpreter that
    imported torch, torch._dynamo, Hydra and cli.main once), which spares those ~5 CPU-s of
    imports per command too; a fresh interpreter where the zygote cannot stand in for one
    exactly (it is not running, the environment changes what an import read), in the cuda tier
    or where a GPU is present (the zygote never touches CUDA), and where a test asks for one
    (`fresh`: start-up itself is what it checks). `process`: a process of its own even where
    the test could not otherwise tell (what it checks counts from the process's start). The
    process sees no GPU outside the cuda tier: no CUDA context per test process (12 xdist
    workers each opening one ended in CUBLAS_STATUS_INTERNAL_ERROR), and CPU semantics
    whatever the machine."""
    if not (process or needs_process(args) or _switched_off("ABLATE_TEST_IN_PROCESS")):
        return in_process(*args, cwd=cwd, env=env)
    full_env = {**os.environ, **({} if _cuda_test else {"CUDA_VISIBLE_DEVICES": ""}), **(env or {})}
    cmd = [sys.executable, "-m", "cli.main", *args]
    if not (fresh or _cuda_test or _gpu_present() or _switched_off("ABLATE_TEST_ZYGOTE")):
        forked = forkserver.run(cmd, args, cwd=cwd or ROOT, env=full_env, timeout=timeout)
        if forked is not None:
            return forked
    return subprocess.run(cmd, cwd=cwd or ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)


def _switched_off(name: str) -> bool:
    """A shortcut of the suite's turned off in the environment (the module's docstring)."""
    return os.environ.get(name, "1") == "0"


@pytest.fixture(scope="session", autouse=True)
def _composition_memo():
    """The test-side composition memo for every command run in this process (not where
    ABLATE_TEST_MEMO=0)."""
    composition_memo.install()
    yield
    composition_memo.uninstall()


@pytest.fixture
def one_thread():
    """Tiny matrices: a second thread only adds wake-ups (seconds per test on a busy machine).
    A test file takes it for every test with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def fresh_memo():
    """The composition memo empty for this test, as in a new process: what it composes and
    derives is recorded (a Record); skipped where ABLATE_TEST_MEMO=0 installed none."""
    if not composition_memo.installed():
        pytest.skip("the composition memo is off (ABLATE_TEST_MEMO=0)")
    with composition_memo.fresh() as record:
        yield record


@pytest.fixture(scope="session", autouse=True)
def _zygote():
    """run_ablate's zygote ends with the session (this worker waits for it: its children's CPU
    time counts in this process's)."""
    yield
    forkserver.stop()


# What only a process of its own shows: torchrun ranks and other child processes (their output
# goes to the process's file descriptors), a compiled model (dynamo's caches), W&B (its service
# process), launchers of processes (unless nothing launches).
_PROCESS_ONLY = re.compile(r"^(\+*train\.(nproc|compile\w*|strategy)|\+*logger(=wandb|\.))")
_LAUNCHER = re.compile(r"^(launcher=(?!basic)|hydra/launcher)")


def needs_process(args) -> bool:
    """Whether `ablate args` must run in a process of its own (run_ablate): see _PROCESS_ONLY;
    a GPU; a command run from another thread (signal handlers are the main thread's)."""
    import threading

    launches = not _NO_TRAINING & set(args)
    return _cuda_test or _gpu_present() or any(_PROCESS_ONLY.match(a) for a in args) or \
        (launches and any(_LAUNCHER.match(a) for a in args)) or \
        (bool(args) and args[0] in ("sample", "bench")) or _may_use_wandb(args) or \
        threading.current_thread() is not threading.main_thread()


_NO_TRAINING = {"--dry-run", "--cfg", "--info", "--help", "--hydra-help"}


def _may_use_wandb(args) -> bool:
    """A command that trains with the default logger (W&B), or resumes runs that did."""
    if not args or args[0] not in ("run", "sweep", "resume") or _NO_TRAINING & set(args) or "logger=none" in args:
        return False
    if args[0] != "resume":
        return True
    configs = [p for a in args[1:] if not a.startswith("-") and "=" not in a
               for p in [Path(a) / "config.yaml", *Path(a).glob("*/config.yaml")] if p.is_file()]
    return not configs or not all("logger:\n  name: none" in p.read_text() for p in configs)


def _gpu_present() -> bool:
    """A GPU in this machine: the subprocess hides it (CUDA_VISIBLE_DEVICES), this process cannot."""
    import torch

    return torch.cuda.is_available()


def in_process(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """run_ablate's result from the CLI's entry point called in this process (process_state
    restores what the command changes), output captured by typer's CliRunner. An exception that
    would reach the console is in stderr as the traceback it would print."""
    import traceback

    from typer.testing import CliRunner

    from cli.main import main

    code = 0
    paths = (env or {}).get("PYTHONPATH", "").split(os.pathsep)
    with process_state(), registry_state(paths), CliRunner().isolation(env=env) as (out, err, _):
        os.chdir(cwd or ROOT)
        sys.argv = ["ablate", *args]
        try:
            main()
        except SystemExit as e:
            if isinstance(e.code, str):
                print(e.code, file=sys.stderr)  # as the interpreter prints it
            code = e.code if isinstance(e.code, int) else int(e.code is not None)
        except Exception:  # noqa: BLE001 - what the process would print before exiting with 1
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
        # as run_ablate's text-mode pipes read them: universal newlines
        stdout, stderr = (s.getvalue().decode().replace("\r\n", "\n").replace("\r", "\n") for s in (out, err))
    return subprocess.CompletedProcess(["ablate", *args], code, stdout, stderr)


invoke_ablate = in_process

_FRESH_WARNING_FILTERS = list(__import__("warnings").filters)  # as a new process starts


@contextlib.contextmanager
def process_state():
    """What a command changes in its process, restored after it: environment, cwd, argv,
    logging (Hydra configures it per job), signal handlers, warning filters (as a new process
    has them, so a command's warnings print as they would), torch's threads, RNG, dtype and
    determinism, Python's and numpy's RNGs, Hydra's job config."""
    import logging
    import random
    import signal
    import warnings

    import numpy as np
    import torch
    from hydra.core.hydra_config import HydraConfig

    def loggers():
        return [logging.getLogger()] + [v for v in logging.Logger.manager.loggerDict.values()
                                        if isinstance(v, logging.Logger)]

    environ, cwd, argv = dict(os.environ), os.getcwd(), sys.argv
    saved_logging = {id(lg): (lg, lg.level, list(lg.handlers), lg.propagate, lg.disabled) for lg in loggers()}
    signals = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1,
                                                 signal.SIGUSR2, signal.SIGPIPE)}
    torch_state = (torch.get_num_threads(), torch.get_rng_state(), torch.get_default_dtype(),
                   torch.are_deterministic_algorithms_enabled(), torch.get_float32_matmul_precision())
    rngs = random.getstate(), np.random.get_state()
    hydra_cfg = HydraConfig.instance().cfg  # a job's: outside a job nothing reads one
    try:
        with warnings.catch_warnings():
            warnings.filters[:] = _FRESH_WARNING_FILTERS
            warnings.showwarning = warnings._showwarning_orig  # printed, not recorded by pytest
            yield
    finally:
        for lg in loggers():  # close the handlers the command added (Hydra's ablate.log)
            kept = saved_logging[id(lg)][2] if id(lg) in saved_logging else []
            for h in lg.handlers:
                if h not in kept:
                    h.close()
        for lg, level, handlers, propagate, disabled in saved_logging.values():
            lg.setLevel(level)
            lg.handlers[:], lg.propagate, lg.disabled = handlers, propagate, disabled
        for s, handler in signals.items():
            signal.signal(s, handler)
        threads, rng, dtype, deterministic, precision = torch_state
        torch.set_num_threads(threads)
        torch.set_rng_state(rng)
        torch.set_default_dtype(dtype)
        if torch.are_deterministic_algorithms_enabled() != deterministic:
            torch.use_deterministic_algorithms(deterministic)
        torch.set_float32_matmul_precision(precision)
        random.setstate(rngs[0])
        np.random.set_state(rngs[1])
        HydraConfig.instance().cfg = hydra_cfg
        os.environ.clear()
        os.environ.update(environ)
        os.chdir(cwd)
        sys.argv = argv


def run_on_terminal(*args: str, columns: int = 80, stdout: bool = True, env: dict | None = None,
                    timeout: float = 300) -> tuple[int, str]:
    """Run the real CLI with stderr (and stdout, unless `stdout` is off) on a pseudo-terminal
    `columns` wide, COLUMNS set to match, as in a user's terminal: (exit code, what the terminal
    received, its \\r\\n line ends as \\n and colour codes dropped)."""
    import fcntl
    import pty
    import re
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))  # a new pty is 0 wide
    full_env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "COLUMNS": str(columns), **(env or {})}
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", *args], cwd=ROOT, env=full_env,
                            stdout=slave if stdout else subprocess.DEVNULL, stderr=slave, close_fds=True)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # EIO: every writer has closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    code = proc.wait(timeout=timeout)
    text = b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")
    return code, re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)


# ---- a Table on a terminal (ablate/tables/render.py) --------------------------------------------
def table_on_terminal(table, width: int, wide: bool = False, hint: str = "") -> str:
    """What a terminal `width` columns wide shows of `table` (ablate/tables/render.py print_table)."""
    from rich.console import Console

    from ablate.tables.render import print_table

    console = Console(width=width, force_terminal=True, color_system=None, record=True)
    print_table(table, console, wide, hint)
    return console.export_text()


def table_in_pipe(table) -> str:
    """What a pipe or a file gets of `table`: the console ablate gives them (table_console)."""
    from rich.console import Console

    from ablate.tables.render import print_table

    console = Console(width=1000, soft_wrap=False, force_terminal=False, color_system=None, record=True)
    print_table(table, console)
    return console.export_text()


def phrases(table) -> set[str]:
    """Everything a terminal must show whole: each line of every cell and header, in each of
    their forms (full, compact, plain), the notes' words aside."""
    from rich.text import Text

    out = {table.title}
    for c in table.columns:
        out |= {c.head, c.header(False), *c.header(True).split("\n")}
        for r in table.rows:
            out |= {c.cell(r), *(Text.from_markup(x).plain for x in (c.rich(r) + "\n" + c.narrow(r)).split("\n"))}
    return {" ".join(p.split()) for p in out if p.strip()}


def split_phrases(text: str, table) -> list[str]:
    """The phrases that the text shows, but not on one line: broken by a wrap."""
    lines = [" ".join(line.split()) for line in text.splitlines()]
    flat = " ".join(lines)
    return [p for p in phrases(table) if p in flat and not any(p in line for line in lines)
            and p != table.title]  # the title is a line of words (the notes' rule)


def assert_fits(text: str, width: int, table) -> None:
    """Every line within `width`, none ending in spaces, no phrase of the table broken."""
    for line in text.splitlines():
        assert len(line) <= width, f"{len(line)} > {width}: {line!r}"
        assert line == line.rstrip(), f"trailing spaces: {line!r}"
    assert not split_phrases(text, table), split_phrases(text, table)


@pytest.fixture(scope="session")
def other_pid():
    """The pid of another live process on this host, for a run lock or record held by a live
    process: a command run in this process (in_process) must not find itself holding it."""
    proc = subprocess.Popen(["sleep", "3600"])
    yield proc.pid
    proc.kill()
    proc.wait()


def built_once(tmp_path_factory, name: str, build) -> Path:
    """A directory that `build(directory)` fills once per test session, whichever xdist worker
    asks first; the others wait for it and reuse it. (A module-scoped fixture is built once per
    worker, so a costly one, such as a trained sweep, would otherwise be trained on each.)"""
    import shutil

    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # shared by this session's workers
    directory = base / f"once-{name}"
    with FileLock(str(directory) + ".lock"):
        if not (directory / ".built").is_file():  # a failed build is retried, and fails again
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir()
            build(directory)
            (directory / ".built").touch()
    return directory


def trained_run(run_dir: Path, *overrides: str) -> Path:
    """`ablate run` with `overrides` into `run_dir`, finished (asserted)."""
    res = run_ablate("run", *overrides, f"hydra.run.dir={run_dir}")
    assert res.returncode == 0, res.stderr
    return run_dir


def copy_of_trained_run(tmp_path_factory, tmp_path: Path, *overrides: str) -> Path:
    """tmp_path/run: a copy of a finished `ablate run` with `overrides`, trained once per session
    (built_once) and copied for each test, which may change it. A copied run directory re-enters
    as the original would: nothing in it that the re-entry rule reads names its path."""
    import hashlib
    import shutil

    key = hashlib.sha256("\n".join(overrides).encode()).hexdigest()[:12]
    source = built_once(tmp_path_factory, f"run-{key}", lambda d: trained_run(d / "run", *overrides)) / "run"
    return Path(shutil.copytree(source, tmp_path / "run"))


def start_ablate(*args: str, cwd: Path | None = None) -> subprocess.Popen:
    """The real CLI started in the background (for tests that signal or kill it), pipes captured."""
    return subprocess.Popen([sys.executable, "-m", "cli.main", *args], cwd=cwd or ROOT, env=dict(os.environ),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def read_summary(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "summary.json").read_text())


def train_rows(run_dir: Path) -> int:
    """How many training steps metrics.jsonl holds so far (0 before it exists)."""
    try:
        return sum('"train_loss"' in line for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines())
    except OSError:
        return 0


def weights_hash(run_dir: Path) -> str:
    """A hash of the model weights in a run's newest checkpoint (bit-exact comparisons)."""
    import hashlib

    from ablate.train import checkpoint

    state = checkpoint.load_file(checkpoint.list_checkpoints(run_dir)[-1][1])
    h = hashlib.sha256()
    for name, t in sorted(state["model"].items()):
        h.update(name.encode() + t.cpu().numpy().tobytes())
    return h.hexdigest()


def stop_after_first_checkpoint(args, sig, run_dir: Path) -> tuple[int, str]:
    """Start the CLI with `args`, send `sig` once `run_dir` holds a checkpoint: (exit code, stderr)."""
    import time

    from ablate.train import checkpoint

    proc = start_ablate(*args)
    end = time.time() + 120
    while not checkpoint.list_checkpoints(run_dir) and time.time() < end and proc.poll() is None:
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be stopped: " + proc.stderr.read()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


def no_login_env(tmp_path: Path) -> dict:
    """No key, no netrc (HOME is empty), no WANDB_MODE: the user's first laptop run."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {"HOME": str(home), "WANDB_MODE": "", "WANDB_API_KEY": "", "NETRC": str(home / ".netrc")}


@pytest.fixture
def clean_dynamo():
    """torch.compile's caches empty before and after the test (a compiled model of an earlier
    test must not be reused, nor this test's left behind)."""
    import torch

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def own_registry():
    """Options registered inside the test are gone after it, from the registry and from Hydra's
    ConfigStore (where a later test in the same process would find them as config groups)."""
    with registry_state():
        yield


@contextlib.contextmanager
def registry_state(paths: Sequence[str] = ()):
    """The axis options (with their entries in Hydra's ConfigStore) and the loaded plugins as
    before, after; `paths` on sys.path meanwhile (a plugin's PYTHONPATH), and the modules
    imported from there unloaded after, so the next command imports (and registers) them
    afresh, as a new process would."""
    import importlib

    from hydra.core.config_store import ConfigStore

    from ablate import plugins
    from ablate.model import axis as declarations

    options = {a: dict(o) for a, o in declarations._OPTIONS.items()}
    loaded, entry_points = dict(plugins._loaded), plugins._entry_points_loaded
    modules, path = set(sys.modules), list(sys.path)
    roots = [Path(p).resolve() for p in paths if p]
    if roots:
        sys.path[:0] = [str(r) for r in roots]
        importlib.invalidate_caches()
        plugins._entry_points_loaded = False  # read again, as a new process would, with `paths`
    try:
        yield
    finally:
        for axis, added in declarations._OPTIONS.items():  # their config group entries too
            for name in set(added) - set(options.get(axis, ())):
                ConfigStore.instance().repo.get(axis, {}).pop(f"{name}.yaml", None)
        declarations._OPTIONS.clear()
        declarations._OPTIONS.update(options)
        plugins._loaded.clear()
        plugins._loaded.update(loaded)
        plugins._entry_points_loaded = entry_points
        if roots:
            for name in set(sys.modules) - modules:
                file = getattr(sys.modules[name], "__file__", None) or ""
                if file and any(Path(file).resolve().is_relative_to(r) for r in roots):
                    del sys.modules[name]
            sys.path[:] = path
            importlib.invalidate_caches()


def record_calls(monkeypatch, owner, name: str) -> list:
    """The (args, kwargs) of every call of owner.name during the test; the calls still happen."""
    calls, original = [], getattr(owner, name)

    def recorded(*args, **kwargs):
        calls.append((args, kwargs))
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, recorded)
    return calls


def find_run_dirs(root: Path) -> list[Path]:
    return sorted(p.parent for p in Path(root).rglob("summary.json"))


def compose(overrides=(), validate=True):
    from ablate.config.compose import compose_config

    return compose_config(list(overrides), validate=validate)


@pytest.fixture
def tiny():
    return list(TINY)


@pytest.fixture
def compare_runs(tmp_path):
    """Run directories of three variants with known losses (compare_fixtures.write_three_variants)."""
    from compare_fixtures import write_three_variants

    return write_three_variants(tmp_path / "runs")


def run_context(run_dir: Path, variant: str = "baseline", sweep: str | None = None):
    """The RunContext of a plain run in `run_dir` (rank 0 of 1), as ablate/run/entry.py builds it."""
    from ablate.run.context import RunContext
    from ablate.train.signals import StopRequest

    return RunContext(Path(run_dir), [], variant, sweep, False, StopRequest())


def scripted_trainer(run_dir: Path, *overrides: str, losses=None, diagnostics: bool = False):
    """A tiny in-process Trainer (TINY, 30 steps) on random tokens whose rows are collected in
    `trainer.sinks.rows` and whose optimizer updates are counted in `trainer.updates`.
    `losses(step)`: the loss the trainer measures at that step (None: the real one), so tests can
    script spikes and shifts through the real loop (real gradients and diagnostics)."""
    import numpy as np
    import torch

    from ablate.data.cache import TokenData
    from ablate.train.diagnostics import Diagnostics
    from ablate.model.spec import ModelSpec
    from ablate.model.transformer import build_model
    from ablate.tracking.sinks import Sink
    from ablate.train.optimizers.optim_settings import OptimSpec
    from ablate.train.trainer import Trainer

    class Rows(Sink):
        def __init__(self):
            self.rows = []

        def log(self, row):
            self.rows.append(row)

    cfg = compose([*TINY, "train.steps=30", "train.threads=1", *overrides])
    spec = ModelSpec.from_config(cfg, tokenizer_vocab=256)
    torch.set_num_threads(1)  # what train.threads=1 does in a real run: tiny ops, shared cores
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    data = TokenData(train=rng.integers(0, 256, 4000).astype(np.uint16),
                     val=rng.integers(0, 256, 600).astype(np.uint16), meta={}, path=run_dir)
    model = build_model(spec)
    trainer = Trainer(model, cfg.train, data, Rows(), run_dir, np.ones(spec.vocab_size, dtype=np.int64),
                      on_diagnostics=Diagnostics(model) if diagnostics else None,
                      optim=OptimSpec.from_config(cfg))
    measure, update = trainer.train_step, trainer.apply_update
    trainer.updates = 0

    def scripted(step):
        real, gnorm, lr = measure(step)
        scripted_loss = losses(step) if losses else None
        return (real if scripted_loss is None else torch.tensor(scripted_loss)), gnorm, lr

    def counted():
        trainer.updates += 1
        update()

    trainer.train_step, trainer.apply_update = scripted, counted
    return trainer
