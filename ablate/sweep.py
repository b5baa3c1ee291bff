"""Sweeps: which jobs a sweep runs, the checks before anything is launched, and the summary
printed at the end. Hydra runs the sweep (multirun + a launcher); the sweeper plugin in
hydra_plugins/ablate_sweeper/ calls into this module for everything ablate-specific.

Modes
- ofat (one factor at a time): the baseline (the first value of every swept key) plus one job
  per other value of each swept key, every other key held at its baseline value, except the
  keys a preset sets in the job that changes the preset (arch=llama brings its own norm).
- grid: every combination, in the order of Hydra's basic sweeper (the first key varies slowest).
- an explicit job list (a study, conf/study/*.yaml), e.g. a cumulative ladder.
Seeds (`--seeds N` or a swept `seed=...`) multiply every variant; `data_seed` is left alone so
the seeds of different variants are paired (same batches in the same order).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from ablate.errors import ConfigError
from ablate.vocab import FINISHED, STOPPED, STOPPED_EXIT

MODES = ("ofat", "grid")
SEED_KEY = "seed"
# Hydra launcher plugin -> the package that provides it (for a clear "not installed" message).
LAUNCHER_PACKAGES = {"submitit_local": "hydra-submitit-launcher",
                     "submitit_slurm": "hydra-submitit-launcher",
                     "joblib": "hydra-joblib-launcher", "ray": "hydra-ray-launcher",
                     "rq": "hydra-rq-launcher"}


@dataclass
class Job:
    """One run of a sweep: its overrides, its variant name (what differs from the baseline)
    and its seed (None: the config's)."""

    overrides: list[str]
    variant: str = "baseline"
    seed: Optional[int] = None
    note: str = ""  # shown by --dry-run under the job (e.g. which keys a preset sets)

    @property
    def name(self) -> str:
        return self.variant if self.seed is None else f"{self.variant}_seed{self.seed}"


@dataclass
class Parsed:
    fixed: list[str] = field(default_factory=list)  # every job gets these
    swept: list[tuple[str, list[str]]] = field(default_factory=list)  # (key, ["k=v", ...])
    seeds: list[int] = field(default_factory=list)  # from a swept `seed=...`


def parse(arguments: Sequence[str]) -> Parsed:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        overrides = OverridesParser.create().parse_overrides(list(arguments))
    except HydraException as e:
        raise ConfigError(str(e).splitlines()[0]) from None
    out = Parsed()
    fixed_keys = {o.get_key_element().lstrip("+~") for o in overrides if not o.is_sweep_override()}
    swept_keys: set[str] = set()
    for o in overrides:
        key = o.get_key_element()
        if o.is_sweep_override():  # a fixed key given twice is fine: the last wins, as in Hydra
            name = key.lstrip("+~")
            if name in swept_keys or name in fixed_keys:
                raise ConfigError(f"'{name}' is given twice; give it once (a,b,c sweeps it)")
            swept_keys.add(name)
        if not o.is_sweep_override():
            out.fixed.append(o.input_line)
            continue
        if not o.is_discrete_sweep():
            raise ConfigError(f"'{o.input_line}': only lists of values can be swept (a,b,c or range(...))")
        values = list(dict.fromkeys(o.sweep_string_iterator()))  # keep order, drop repeats
        if key.lstrip("+") == SEED_KEY:
            try:
                out.seeds = [int(v) for v in values]
            except ValueError:
                raise ConfigError(f"'{o.input_line}': seeds must be integers") from None
            continue
        out.swept.append((key, [f"{key}={v}" for v in values]))
    return out


def _plain(override: str) -> str:
    """The override without its +/~ prefix, for names ('+x=1' and 'x=1' name the same change)."""
    return override.lstrip("+~")


def dir_safe(name: str, limit: int = 120) -> str:
    name = re.sub(r"[^A-Za-z0-9=,.+_-]", "_", name)
    return name if len(name) <= limit else name[:limit]


def _flat_keys(node: Any, prefix: str = "") -> list[str]:
    if isinstance(node, dict) and node:
        return [k for key, sub in node.items() for k in _flat_keys(sub, f"{prefix}{key}.")]
    return [prefix[:-1]]


def preset_keys(override: str) -> set[str]:
    """The keys a preset option sets, read from its file: arch=llama -> the groups its defaults
    override (`override /norm: rmsnorm`, ...) and its plain values (vaswani: model.emb_scale).
    Empty for an override that is not a preset (norm=rmsnorm, train.lr=0.001)."""
    import yaml

    from ablate.axes import CONF_DIR

    group, _, option = _plain(override).partition("=")
    path = CONF_DIR / group / f"{option}.yaml"
    if "." in group or not option or not path.is_file():
        return set()
    try:
        text = path.read_text(encoding="utf-8")
        doc = yaml.safe_load(text) or {}
    except (OSError, yaml.YAMLError):
        return set()
    if not isinstance(doc, dict):
        return set()
    groups = {str(k).split()[-1].lstrip("/") for entry in doc.get("defaults") or []
              if isinstance(entry, dict) for k in entry if str(k).startswith("override ")}
    if not groups:
        return set()  # an ordinary option of its axis
    plain = {k: v for k, v in doc.items() if k != "defaults"}
    return groups | (set(_flat_keys(plain)) if plain and "@package _global_" in text else set())


def expand_ofat(p: Parsed) -> list[Job]:
    if not p.swept:
        raise ConfigError(
            "an ofat sweep needs at least one swept axis with two or more values, e.g. "
            "`ablate sweep norm=layernorm,rmsnorm` (or use --mode grid / --seeds N alone)")
    baseline = {key: values[0] for key, values in p.swept}
    jobs = [Job(p.fixed + list(baseline.values()), "baseline")]
    for key, values in p.swept:
        for value in values[1:]:
            # A group on the command line beats a preset's `override /norm`, so holding the
            # baseline's norm=layernorm would make the arch=llama job Llama with LayerNorm:
            # the keys the preset sets are left to it. Fixed keys still apply to every job.
            sets = preset_keys(value)
            others = {k: v for k, v in baseline.items() if k != key}
            released = [v for k, v in others.items() if _plain(k) in sets]
            held = [v for v in others.values() if v not in released]
            note = (f"takes {', '.join(_plain(v).split('=', 1)[0] for v in released)} from "
                    f"{_plain(value)}, not the baseline's {', '.join(map(_plain, released))}"
                    if released else "")
            jobs.append(Job(p.fixed + held + [value], _plain(value), note=note))
    if len(jobs) == 1:
        raise ConfigError(
            f"an ofat sweep needs a swept axis with two or more values; got only "
            f"{', '.join(v[0] for _, v in p.swept)}")
    return jobs


def expand_grid(p: Parsed) -> list[Job]:
    """The cartesian product, ordered as Hydra's BasicSweeper orders it."""
    import itertools

    jobs = []
    for combo in itertools.product(*[values for _, values in p.swept]):
        name = ",".join(_plain(v) for v in combo) or "baseline"
        jobs.append(Job(p.fixed + list(combo), name))
    return jobs


def expand_explicit(p: Parsed, entries: Iterable[Any]) -> list[Job]:
    """A fixed job list (a study): each entry {name, overrides}."""
    if p.swept:
        raise ConfigError(
            "a study fixes its own job list; sweep no axes with it "
            f"(got {', '.join(k for k, _ in p.swept)})")
    jobs = []
    for i, entry in enumerate(entries):
        name = str(entry.get("name") or f"job{i}")
        jobs.append(Job(p.fixed + [str(o) for o in (entry.get("overrides") or [])], name))
    if not jobs:
        raise ConfigError("the study's job list (hydra.sweeper.jobs) is empty")
    return jobs


def with_seeds(jobs: list[Job], seeds: Sequence[int]) -> list[Job]:
    """Every job once per seed; the seed is the last override so it wins."""
    if not seeds:
        return jobs
    return [dataclasses.replace(j, overrides=j.overrides + [f"{SEED_KEY}={s}"], seed=s)
            for j in jobs for s in seeds]


def plan(arguments: Sequence[str], mode: str = "ofat", seeds: int = 0,
         jobs: Optional[Iterable[Any]] = None) -> list[Job]:
    """The sweep's jobs, in launch order."""
    if mode not in MODES:
        raise ConfigError(f"unknown sweep mode '{mode}'; choose one of {', '.join(MODES)}")
    if seeds < 0:
        raise ConfigError(f"--seeds must be >= 0, got {seeds}")
    p = parse(arguments)
    if seeds and (p.seeds or any(o.lstrip("+").split("=", 1)[0] == SEED_KEY for o in p.fixed)):
        raise ConfigError("give seeds either as --seeds N or as seed=..., not both")
    seed_list = list(range(seeds)) if seeds else p.seeds
    if jobs:
        base = expand_explicit(p, jobs)
    elif mode == "grid" or (not p.swept and seed_list):
        base = expand_grid(p)  # seeds only: one variant, N seeds
    else:
        base = expand_ofat(p)
    return with_seeds(base, seed_list)


# ---- checks before launching ---------------------------------------------------------------
def preflight(arguments: Sequence[str], mode: str = "ofat", seeds: int = 0) -> list[Job]:
    """Compose the sweep's first job (with the hydra node) and plan the jobs, so a wrong option,
    a launcher that is not installed or an empty ofat sweep is refused in one line before
    Hydra makes any directory. The sweeper checks every job again before launching."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from ablate.axes import CONF_DIR
    from ablate.compose import check_no_secrets, hydra_message
    from ablate.config import register_configs

    check_no_secrets(list(arguments))  # before Hydra sees it: its errors and files echo values
    from ablate.compose import load_plugins

    load_plugins(list(arguments))  # their options are swept like built-in ones
    p = parse(arguments)
    first = p.fixed + [values[0] for _, values in p.swept]
    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="config", overrides=first, return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as e:
        message = hydra_message(e)
        raise ConfigError(missing_launcher_message(message, first) or message) from None
    finally:
        GlobalHydra.instance().clear()
    sweeper = cfg.hydra.sweeper
    if not str(sweeper.get("_target_", "")).startswith("hydra_plugins.ablate_sweeper"):
        return []  # another sweeper was chosen (hydra/sweeper=...): it plans its own jobs
    jobs = sweeper.get("jobs")
    from omegaconf import OmegaConf

    return plan(arguments, mode, seeds, OmegaConf.to_container(jobs, resolve=True) if jobs else None)


def missing_launcher_message(error: str, overrides: Sequence[str]) -> Optional[str]:
    """Hydra's "Could not find 'hydra/launcher/X'" as an install hint, else None."""
    m = re.search(r"hydra/launcher/([A-Za-z0-9_]+)", error)
    if not m:
        return None
    plugin = m.group(1)
    chosen = next((o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == "launcher"), plugin)
    package = LAUNCHER_PACKAGES.get(plugin, f"the Hydra launcher plugin '{plugin}'")
    return (f"launcher={chosen} needs the Hydra launcher plugin '{plugin}', which is not installed; "
            f"install it with `pip install {package}` (nothing was launched)")


def check_job(config: Any, local: bool) -> None:
    """A job's composed config (with its hydra node): ablate's invariants, and where the job
    will run on this machine, torchrun's process count and what tokenizing needs (hub, files)."""
    from ablate.config import validate

    validate(config)
    if local:
        from ablate.data.cache import preflight as data_preflight
        from ablate.train.distributed import check_nproc

        check_nproc(config)
        data_preflight(config.data, config.tokenizer.name)


def is_local_launcher(config: Any) -> bool:
    return launcher_kind(config) != "submitit_slurm"


# ---- several jobs per device (issue 17: small models leave most of a GPU idle) --------------
PLACEMENT_KEYS = ("train.device", "train.threads")


@dataclass
class Packing:
    """How `jobs_per_gpu` places a sweep's jobs. n_jobs: jobs running at once (on this machine,
    or in one SLURM array task); devices: job i runs on devices[i % len(devices)] ([]: train.device
    is left as it is); threads: train.threads per job (0: left as it is); group: jobs per submitit
    task (1: one task per job, as hydra-submitit-launcher submits them)."""

    jobs_per_gpu: int
    n_jobs: int
    devices: list[str] = field(default_factory=list)
    threads: int = 0
    group: int = 1

    def overrides(self, index: int) -> list[str]:
        """The placement of job `index` (hydra.job.num): its device and its CPU threads."""
        out = [f"train.device={self.devices[index % len(self.devices)]}"] if self.devices else []
        return out + ([f"train.threads={self.threads}"] if self.threads else [])

    def describe(self) -> str:
        where = (f"{len(self.devices)} GPU{'s' if len(self.devices) > 1 else ''}" if self.devices
                 else "one device")
        text = f"{self.jobs_per_gpu} jobs per device on {where}: {self.n_jobs} at once"
        if self.group > 1:
            text += f", {self.group} jobs per array task"
        return text + (f", train.threads={self.threads} each" if self.threads else "")


def check_jobs_per_gpu(value: Any) -> Optional[int]:
    """None (not set) or an int >= 1; anything else is a ConfigError."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"jobs_per_gpu must be an integer >= 1, got {value!r} "
                          "(e.g. --jobs-per-gpu 4: four jobs share each GPU)")
    return value


def visible_gpus() -> int:
    """CUDA devices this process sees (CUDA_VISIBLE_DEVICES applies); 0 without CUDA."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def usable_cores() -> int:
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def packing(jobs_per_gpu: int, launcher: str, device: str, threads: int, n_gpus: int, cores: int,
            n_jobs: Optional[int] = None) -> Packing:
    """Where `jobs_per_gpu` jobs share each device. launcher: joblib | submitit_local |
    submitit_slurm; device, threads: the jobs' train.device and train.threads (a device other
    than auto/cuda, or threads > 0, was chosen by the user and is kept); n_gpus, cores: what one
    group of jobs has (this machine, or one SLURM task's allocation); n_jobs: joblib's n_jobs when
    the user set it. Job i goes to GPU i mod n_gpus; each job gets cores / (jobs at once) threads
    so k processes do not each start a thread per core. A CPU-only machine is one device: k
    processes share its cores."""
    spread = device in ("auto", "cuda") and n_gpus > 0
    devices = [f"cuda:{i}" for i in range(n_gpus)] if spread else []
    at_once = max(1, len(devices)) * jobs_per_gpu
    group = at_once if launcher.startswith("submitit") else 1
    if launcher == "joblib" and n_jobs:
        at_once = n_jobs  # the user's n_jobs wins; placement still cycles over the GPUs
    per_job = 0 if threads > 0 else max(1, cores // at_once)
    return Packing(jobs_per_gpu, at_once, devices, per_job, group)


def launcher_kind(config: Any) -> str:
    """basic | joblib | submitit_local | submitit_slurm | other, from hydra.launcher._target_."""
    target = str(config.hydra.launcher.get("_target_", ""))
    for suffix, kind in (("BasicLauncher", "basic"), ("JoblibLauncher", "joblib"),
                         ("LocalLauncher", "submitit_local"), ("SlurmLauncher", "submitit_slurm")):
        if target.endswith(suffix):
            return kind
    return "other"


def check_launcher_packs(kind: str) -> None:
    """jobs_per_gpu needs a launcher that runs jobs at once in their own processes."""
    if kind == "basic":
        raise ConfigError("jobs_per_gpu runs several jobs at once, which launcher=basic (one job after "
                          "another in this process) cannot: use launcher=joblib, submitit_local or slurm")
    if kind == "other":
        raise ConfigError("jobs_per_gpu works with launcher=joblib, submitit_local or slurm")


def plan_packing(jobs_per_gpu: int, config: Any, job_config: Any) -> Packing:
    """packing() for a sweep: config is the sweep's (with its hydra node and the user's
    overrides), job_config a composed job. GPUs and cores come from this machine for local
    launchers, from the launcher's allocation (gpus_per_node, cpus_per_task) for SLURM."""
    kind = launcher_kind(config)
    check_launcher_packs(kind)
    params = config.hydra.launcher
    if int(params.get("tasks_per_node") or 1) > 1 or int(job_config.train.nproc) > 1:
        raise ConfigError("jobs_per_gpu packs single-process jobs; a job with several ranks "
                          "(train.nproc or tasks_per_node > 1) already has its GPUs to itself")
    if kind == "submitit_slurm":
        tasks = max(1, int(params.get("tasks_per_node") or 1))
        n_gpus = int(params.get("gpus_per_node") or 0) // tasks
        cores = int(params.get("cpus_per_task") or 1)
    else:
        n_gpus = visible_gpus() if kind == "joblib" else int(params.get("gpus_per_node") or 0)
        cores = usable_cores()
    user_set = {o.split("=", 1)[0].lstrip("+~") for o in config.hydra.overrides.get("task", [])}
    n_jobs = int(params.n_jobs) if kind == "joblib" and "hydra.launcher.n_jobs" in user_set else None
    return packing(jobs_per_gpu, kind, str(job_config.train.device), int(job_config.train.threads),
                   n_gpus, cores, n_jobs)


# ---- sbatch preview ------------------------------------------------------------------------
def sbatch_script(launcher_params: dict, n_jobs: int) -> str:
    """The sbatch script hydra-submitit-launcher submits for `n_jobs` jobs at once, rendered by
    submitit itself (no cluster needed). The launcher calls executor.map_array: two or more jobs
    are one array job (--array=0-N%P, logs under %A_%a), one job is a plain job. Parameters are
    renamed as AutoExecutor renames them (timeout_min -> time, mem_gb -> mem, ...)."""
    import shlex

    from submitit.slurm.slurm import SlurmExecutor, _convert_mem, _make_sbatch_string

    rename = SlurmExecutor._equivalence_dict()
    kwargs = {}
    for key, value in launcher_params.items():
        if key in ("_target_", "submitit_folder", "max_num_timeout") or value is None:
            continue  # None: unset, as submitit treats it
        kwargs[rename.get(key, key)] = _convert_mem(value) if key == "mem_gb" else value
    folder = Path(str(launcher_params["submitit_folder"])).expanduser().absolute()
    command = f"{shlex.quote(sys.executable)} -u -m submitit.core._submit {shlex.quote(str(folder))}"
    return _make_sbatch_string(command=command, folder=folder,
                               map_count=n_jobs if n_jobs > 1 else None, **kwargs)


# ---- the end of a sweep --------------------------------------------------------------------
@dataclass
class JobResult:
    job: Job
    status: str
    run_dir: Optional[str] = None
    error: str = ""


def result_of(job: Job, ret: Any) -> JobResult:
    """A Hydra JobReturn as (status, dir); a job that raised or crashed counts as failed."""
    run_dir = None
    try:
        run_dir = str(ret.hydra_cfg.hydra.runtime.output_dir)
    except Exception:
        pass
    try:
        value = ret.return_value  # re-raises the job's exception
    except BaseException as e:  # noqa: BLE001 - a crashed job must not stop the summary
        return JobResult(job, "failed", run_dir, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    if isinstance(value, dict):
        return JobResult(job, str(value.get("status", "failed")), run_dir, str(value.get("error", "")))
    return JobResult(job, "failed", run_dir, "the job returned no summary")


def summary_stamp(run_dir: Optional[str]) -> Optional[tuple]:
    """Tells one write of a run's summary.json from another (it is replaced whole, so each write
    is a new file): taken before a launch, it shows which summaries the launch wrote."""
    try:
        st = (Path(run_dir) / "summary.json").stat()
    except (OSError, TypeError):
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def recover(job: Job, run_dir: Optional[str], stamp_before: Optional[tuple], lost: str) -> JobResult:
    """The outcome of a job the launcher lost (it raised instead of returning the job: a job
    killed by SIGKILL, the OOM killer or a node failure, submitit's UncompletedJobError): what
    the job's own summary.json says, if this launch wrote it and it holds an outcome; else failed."""
    from ablate.rundir import live_status, read_json

    stamp = summary_stamp(run_dir)
    if run_dir is None or stamp is None or stamp == stamp_before:
        return JobResult(job, "failed", run_dir, lost)  # never started, or an earlier sweep's
    status = live_status(Path(run_dir))
    if status in FINISHED + STOPPED + ("failed",):
        try:
            error = str(read_json(Path(run_dir) / "summary.json").get("error") or "")
        except (OSError, ValueError, AttributeError):
            error = ""
        return JobResult(job, status, run_dir, error)
    if status == "killed":
        lost = "its process died before it wrote an outcome (SIGKILL, out of memory or node failure)"
    return JobResult(job, "failed", run_dir, lost)


def print_plan(jobs: list[Job], as_json: bool, header: str = "", out=None) -> None:
    out = out or sys.stdout
    if as_json:
        out.write(json.dumps([j.overrides for j in jobs], indent=None) + "\n")
        return
    if header:
        out.write(header + "\n")
    width = len(str(len(jobs) - 1))
    for i, j in enumerate(jobs):
        out.write(f"  #{i:<{width}} {j.name:<28} {' '.join(j.overrides)}\n")
        if j.note:
            out.write(f"{'':<{width + 33}}({j.note})\n")


def _duration(seconds: float) -> str:
    seconds = int(round(max(seconds, 0)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Progress:
    """One line per job as it ends: `[3/12] name  status  val_loss 4.1234  12s  9 left  ETA 1m48s`.
    The ETA is the sweep's mean time per finished job so far times the jobs left (for parallel
    launchers a chunk of jobs ends at once, so it is a bound, not a schedule)."""

    def __init__(self, total: int, out=None, clock=None):
        import time

        self.total, self.done, self.out = total, 0, out
        self.clock = clock or time.monotonic
        self.start = self.clock()

    def line(self, r: JobResult, seconds: Optional[float]) -> str:
        self.done += 1
        left = self.total - self.done
        elapsed = self.clock() - self.start
        eta = f"ETA {_duration(elapsed / self.done * left)}" if left else "done"
        took = _duration(seconds) if seconds is not None else "-"
        return (f"[{self.done}/{self.total}] {r.job.name}  {r.status}  val_loss {_val_loss(r.run_dir)}"
                f"  {took}  {left} left  {eta}")

    def report(self, r: JobResult, seconds: Optional[float] = None) -> None:
        """Print the job's line; `seconds`: how long it took (None: its summary's wall time)."""
        if seconds is None:
            seconds = _summary_value(r.run_dir, "wall_time_s")
        print(self.line(r, seconds), file=self.out or sys.stdout, flush=True)


# Hydra's launchers log each launch ("Launching 1 jobs locally", "#0 : <overrides>") through
# python logging; the per-job lines above say what a user needs, so these are hidden unless
# hydra.verbose is set.
LAUNCHER_LOGGERS = ("hydra._internal.core_plugins.basic_launcher", "hydra_plugins")


@contextlib.contextmanager
def quiet_launcher_logs(verbose: Any):
    import logging

    if verbose:
        yield
        return
    loggers = [logging.getLogger(name) for name in LAUNCHER_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def finish(results: list[JobResult], sweep_dir: Path, strict: bool = False) -> int:
    """Print the comparison (or a status list) and the jobs that did not finish; the sweep's
    exit code: non-zero when no job finished (130 when it was stopped by a signal), and with
    `strict` also when any job failed, diverged or did not finish."""
    write_record(results, sweep_dir)
    done = [r for r in results if r.status in FINISHED]
    printed = _print_compare(sweep_dir) if done else False
    if not printed:
        for i, r in enumerate(results):
            print(f"  #{i} {r.job.name:<28} {r.status:<11} {_val_loss(r.run_dir):<9} {r.run_dir or ''}")
    print(f"sweep: {len(done)}/{len(results)} jobs finished "
          f"({sum(r.status == 'diverged' for r in results)} diverged); sweep dir {sweep_dir}")
    for i, r in enumerate(results):
        if r.status not in FINISHED:
            label = "failed" if r.status == "failed" else "not finished"
            print(f"{label}: #{i} {r.job.name} ({r.status}{': ' + r.error if r.error else ''})",
                  file=sys.stderr)
    if any(r.status in STOPPED for r in results):
        print(f"sweep stopped; resume with: ablate resume {sweep_dir} "
              "(finished jobs return at once, stopped ones resume from their checkpoints)",
              file=sys.stderr)
        if not done or results[-1].status == "not run":
            return STOPPED_EXIT
    if results and not done:
        return 1
    bad = [r for r in results if r.status != "completed"]
    if strict and bad:
        print(f"--strict: {len(bad)} of {len(results)} jobs did not complete "
              f"({', '.join(f'{r.job.name}: {r.status}' for r in bad)})", file=sys.stderr)
        return 1
    return 0


def write_record(results: list[JobResult], sweep_dir: Path) -> None:
    """<sweep_dir>/sweep.json: every job's outcome (what the end of a sweep prints), for scripts."""
    from ablate.rundir import write_json

    jobs = [{"index": i, "name": r.job.name, "variant": r.job.variant, "seed": r.job.seed,
             "overrides": r.job.overrides, "status": r.status, "run_dir": r.run_dir,
             "error": r.error or None} for i, r in enumerate(results)]
    record = {"sweep_dir": str(sweep_dir), "jobs": jobs,
              "finished": sum(r.status in FINISHED for r in results), "total": len(results)}
    try:
        write_json(Path(sweep_dir) / "sweep.json", record)
    except OSError as e:
        print(f"warning: could not write {Path(sweep_dir) / 'sweep.json'}: {e.strerror}", file=sys.stderr)


def _summary_value(run_dir: Optional[str], key: str) -> Optional[float]:
    try:
        v = json.loads((Path(run_dir) / "summary.json").read_text()).get(key)
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    return v if isinstance(v, (int, float)) else None


def _val_loss(run_dir: Optional[str]) -> str:
    v = _summary_value(run_dir, "val_loss")
    return f"{v:.4f}" if v is not None else "-"


def _print_compare(sweep_dir: Path) -> bool:
    """`ablate compare` of the sweep directory, when that module is available."""
    try:
        from ablate.tracking import compare
    except ImportError:
        return False
    try:
        compare.print_comparison(compare.compare_dirs([sweep_dir]))
    except Exception as e:  # noqa: BLE001 - the runs are done; a report problem must not hide them
        print(f"warning: could not compare the sweep's runs ({type(e).__name__}: {e})", file=sys.stderr)
        return False
    return True
