"""The W&B sink (logger=wandb). wandb is imported here only, when the run starts.

mode=auto: online when wandb itself would find credentials (its own rules: WANDB_API_KEY,
WANDB_IDENTITY_TOKEN_FILE, the netrc file named by NETRC or ~/.netrc, a key in its settings),
else offline, so a laptop without network never waits on it. Offline runs land in <run_dir>/wandb and can be
uploaded later with `wandb sync`. An online init that failed (a compute node without network
waits logger.init_timeout for nothing) is remembered for OFFLINE_MEMORY_S per host, so the next
runs of a sweep go offline at once; logger.mode=online always tries.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any, Optional

from ablate.run.record import RunInfo, RunRecord, WandbInfo, to_plain
from ablate.tracking.sinks import Sink, say
from ablate.names import FINISHED, TOKENS, VAL_BPB, VAL_LOSS, Status, wandb_name

OFFLINE_MEMORY_S = 600  # how long a failed online init sends mode=auto runs offline at once
SECRET_KEYS = ("api_key", "apikey", "wandb_api_key", "token", "password", "secret")


def is_secret_key(name: str) -> bool:
    """A credential-like key: a SECRET_KEYS entry as a whole `_`/`.`-separated part of the name
    (`hf_token`, `api_key`), not a substring (`tokenizer`, `max_tokens` are not secrets)."""
    parts = [p for p in re.split(r"[._\-]", str(name).lower()) if p]
    joined = "_".join(parts)
    return any(re.search(rf"(^|_){re.escape(s)}($|_)", joined) for s in SECRET_KEYS)


def logged_in() -> bool:
    """Whether wandb.init would find credentials for its server, by wandb's own lookup: its
    environment variables (WANDB_API_KEY, WANDB_IDENTITY_TOKEN_FILE), its netrc reader ($NETRC,
    else ~/.netrc) for WANDB_BASE_URL's host. Nothing is sent anywhere, and no wandb session or
    settings singleton is created (wandb.init makes its own)."""
    from wandb import env

    if os.environ.get(env.API_KEY) or os.environ.get(env.IDENTITY_TOKEN_FILE):
        return True
    base_url = os.environ.get(env.BASE_URL) or "https://api.wandb.ai"
    try:
        from wandb.sdk.lib.wbauth import read_netrc_auth

        return read_netrc_auth(host=base_url) is not None
    except ImportError:  # another wandb: the standard library's reader, wandb's file rule
        import netrc

        try:
            path = os.environ.get("NETRC") or os.path.expanduser("~/.netrc")
            return netrc.netrc(path).authenticators(base_url.split("://")[-1].split("/")[0]) is not None
        except (OSError, netrc.NetrcParseError):
            return False
    except Exception:  # noqa: BLE001 - an entry wandb finds malformed: online init says why
        return True


def resolve_mode(mode: str) -> str:
    if mode in ("online", "offline", "disabled"):
        return mode
    env = os.environ.get("WANDB_MODE")
    if env in ("online", "offline", "disabled", "dryrun"):
        return "offline" if env == "dryrun" else env
    return "online" if logged_in() else "offline"


def scrub(obj: Any) -> Any:
    """Drop anything that looks like a credential before it reaches a config or a file.
    Credentials are strings: a number under a token-ish key (`flops_per_token`) is kept."""
    if isinstance(obj, dict):
        return {k: scrub(v) for k, v in obj.items()
                if not (is_secret_key(k) and isinstance(v, str))}
    if isinstance(obj, list):
        return [scrub(v) for v in obj]
    return obj


def hydra_choice(group: str) -> Optional[str]:
    """The option Hydra chose for a config group in this job (None outside a Hydra job).
    `arch` needs it: a preset only changes other groups and leaves no key of its own."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return HydraConfig.get().runtime.choices.get(group) if HydraConfig.initialized() else None
    except Exception:  # noqa: BLE001 - a label for the dashboard must never stop a run
        return None


def wandb_config(cfg: Any, variant: str, info: RunInfo, arch: Optional[str] = None) -> dict:
    """The resolved config with every axis as a plain top-level value (`norm: rmsnorm`) so the
    W&B UI can group and filter by it; an axis group's other keys become `<axis>_<key>`
    (`norm_eps`, `pos_base`, `dropout_rate`). Params and FLOPs are there too, to group by size,
    and `arch`, the preset the run started from (`arch`, else Hydra's choice in this job)."""
    from omegaconf import OmegaConf

    from ablate.config.schema import axis_values

    resolved = OmegaConf.to_container(cfg, resolve=True)
    config: dict = {}
    for axis, value in axis_values(cfg).items():
        group = resolved.pop(axis, None)
        config[axis] = value
        if isinstance(group, dict):
            config.update({f"{axis}_{k}": v for k, v in group.items() if k != "name"})
    config.update(resolved)
    arch = arch or hydra_choice("arch")
    if arch:
        config["arch"] = arch
    config.update(variant=variant, params=info.params, non_embedding_params=info.non_embedding_params,
                  active_params=info.active_params, flops_per_token=info.flops_per_token)
    if info.provenance:  # git commit, versions, device, host: which code ran where
        config["provenance"] = to_plain(info.provenance)
    return scrub(config)


def run_name(variant: str, seed: int, limit: int = 120) -> str:
    """Readable in the W&B run list: the variant (what differs from the defaults) and the seed."""
    suffix = f" seed={seed}"
    if len(variant) + len(suffix) > limit:
        variant = variant[:limit - len(suffix) - 1] + "~"
    return variant + suffix


def clean_env_mode() -> None:
    """wandb refuses to start when WANDB_MODE holds something it does not know (even ''):
    drop it, with a warning when it was not empty, so the run's own mode decides."""
    env = os.environ.get("WANDB_MODE")
    if env is not None and env not in ("online", "offline", "disabled", "dryrun", "run", "shared"):
        if env.strip():
            print(f"warning: ignoring WANDB_MODE={env!r} (use online, offline or disabled)")
        os.environ.pop("WANDB_MODE")


class WandbSink(Sink):
    """Logs rows under W&B names (train/loss, val/loss, ...) against `tokens` as the x-axis.

    W&B is the dashboard, never the run's outcome: if it cannot start (online and offline both
    failing) the run goes on without it after one warning line."""

    def __init__(self, logger_cfg: Any, run_dir: Path, name: str, config: dict, tags: list[str],
                 group: Optional[str], resume_id: Optional[str] = None, quiet: bool = False):
        self.quiet = quiet  # a sweep job: where the records went is in its ablate.log only
        self.cfg = logger_cfg
        self.run_dir = Path(run_dir)
        self.name, self.config, self.tags, self.group = name, config, list(tags), group
        arch = config.get("arch")
        if arch and arch != _default_arch() and f"arch={arch}" not in self.tags:
            self.tags.insert(0, f"arch={arch}")  # the axis tags alone do not say which preset
        self.resume_id = resume_id
        self.run = None

    def _init(self, wandb: Any, mode: str) -> Any:
        settings = wandb.Settings(init_timeout=float(self.cfg.init_timeout), silent=True)
        return wandb.init(mode=mode, project=self.cfg.project, entity=self.cfg.entity,
                          group=self.group, job_type=self.cfg.job_type, name=self.name,
                          tags=self.tags, config=scrub(self.config), dir=str(self.run_dir),
                          settings=settings, id=self.resume_id,
                          resume="allow" if self.resume_id else None)

    def start(self, info):
        os.environ.setdefault("WANDB_SILENT", "true")
        clean_env_mode()
        import wandb

        mode = resolve_mode(self.cfg.mode)
        if mode == "disabled":  # WANDB_MODE=disabled with logger.mode=auto
            return
        started = time.monotonic()
        forced = self.cfg.mode == "online" or os.environ.get("WANDB_MODE") == "online"
        failed = None if forced or mode != "online" else recent_online_failure()
        if failed:
            mode = "offline"
            ago = f"{failed['age_s']:.0f} s" if failed["age_s"] < 60 else f"{failed['age_s'] / 60:.0f} min"
            print(f"warning: W&B online init failed {ago} ago on this host "
                  f"({failed['error']}); logging offline at once (logger.mode=online tries again)")
        try:
            self.run = self._init(wandb, mode)
            if mode == "online":
                forget_online_failure()
        except Exception as e:  # no network, bad key, unreachable host: offline, one line
            first = first_line(e)
            if mode == "online":
                remember_online_failure(first)
                print(f"warning: W&B online init failed ({first}); logging offline instead (for "
                      f"{OFFLINE_MEMORY_S // 60} min, runs on this host start offline; "
                      "logger.mode=online forces a try)")
                try:
                    wandb.teardown()  # the failed run still holds its id in the W&B service
                    self.run, mode = self._init(wandb, "offline"), "offline"
                except Exception as e2:
                    print(f"warning: W&B offline init failed too ({first_line(e2)}); "
                          "this run is not logged to W&B")
            else:
                print(f"warning: W&B {mode} init failed ({first}); this run is not logged to W&B")
        if self.run is None:
            return
        self.run.define_metric(TOKENS)
        for prefix in ("train/*", "val/*", "diag/*"):
            self.run.define_metric(prefix, step_metric=TOKENS)
        for metric in (VAL_LOSS, VAL_BPB):
            self.run.define_metric(wandb_name(metric), step_metric=TOKENS, summary="min")
        for key, value in (("params", info.params), ("non_embedding_params", info.non_embedding_params),
                           ("active_params", info.active_params), ("flops_per_token", info.flops_per_token)):
            if value is not None:
                self.run.summary[key] = value
        # Where the records went: lands in summary.json (the info becomes part of it).
        where = WandbInfo(mode=mode, id=self.run.id, project=self.cfg.project, group=self.group,
                          init_s=round(time.monotonic() - started, 2))
        if mode == "offline":
            where.dir = str(Path(self.run.dir).parent)  # .../wandb/offline-run-<stamp>-<id>
            say(f"W&B: offline; upload later with: wandb sync {where.dir}", console=not self.quiet)
        elif mode == "online" and getattr(self.run, "url", None):
            where.url = self.run.url
            say(f"W&B: {self.run.url}", console=not self.quiet)
        info.wandb = where

    def log(self, row):
        if self.run is None:
            return
        data = {wandb_name(k): v for k, v in row.items() if k != "step"}
        self.run.log(data, step=int(row["step"]))

    def finish(self, record: RunRecord):
        """Always called (also on failure): the W&B run's state says how the run ended."""
        if self.run is None:
            return
        run, self.run = self.run, None
        try:
            for key, value in summary_for_wandb(record).items():
                run.summary[key] = value
            if getattr(self.cfg, "log_checkpoint", False):
                self._log_checkpoint(run)
            if record.status == Status.PREEMPTED:
                run.mark_preempting()  # W&B shows it as preempted; the resumed job continues it
        finally:
            run.finish(exit_code=0 if record.status in FINISHED else 1)

    def _log_checkpoint(self, run) -> None:
        """The run's latest checkpoint as a `model` artifact (offline: kept in the offline run,
        uploaded by `wandb sync`)."""
        from ablate.train.checkpoint import list_checkpoints

        found = list_checkpoints(self.run_dir)
        if not found:
            return
        import wandb

        step, path = found[-1]
        artifact = wandb.Artifact(f"ckpt-{run.id}", type="model", metadata={"step": step})
        artifact.add_file(str(path))
        run.log_artifact(artifact, aliases=["latest", f"step-{step}"])


# summary.json keys written to the W&B summary: those no row logs (one name per metric). A logged
# metric keeps the summary W&B makes of it under its logged name: val/loss and val/bpb their
# minimum (define_metric), train/loss, train/tokens_per_s, train/mfu their last value.
SUMMARY_KEYS = ("status", "params", "non_embedding_params", "active_params", "flops_per_token", "compile_s", "step",
                "wall_time_s", "time_to_first_step_s")


def summary_for_wandb(record: RunRecord) -> dict:
    summary = record.to_json()
    return {k: summary[k] for k in SUMMARY_KEYS if summary.get(k) is not None}


def _default_arch() -> Optional[str]:
    from ablate.config.axes import defaults

    return defaults().get("arch")


def _failure_marker() -> Path:
    """Per host (a shared home must not send a networked login node offline) and per server."""
    import hashlib
    import socket

    from ablate.data.cache import default_cache_root

    server = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")
    key = hashlib.sha1(f"{socket.gethostname()} {server}".encode()).hexdigest()[:12]
    return default_cache_root().parent / "wandb" / f"online_failed_{key}.json"


def recent_online_failure() -> Optional[dict]:
    """{error, age_s} of an online init that failed here less than OFFLINE_MEMORY_S ago."""
    try:
        failed = json.loads(_failure_marker().read_text())
        age = time.time() - float(failed["time"])
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return {"error": str(failed.get("error")), "age_s": age} if 0 <= age < OFFLINE_MEMORY_S else None


def remember_online_failure(error: str) -> None:
    from ablate.run.directory import write_json

    path = _failure_marker()
    try:  # best effort: a read-only cache only costs the next run the wait
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, {"time": time.time(), "error": error})
    except OSError:
        pass


def forget_online_failure() -> None:
    try:
        _failure_marker().unlink(missing_ok=True)
    except OSError:
        pass


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__
