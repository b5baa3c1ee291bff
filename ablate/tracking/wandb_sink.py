"""The W&B sink (logger=wandb). wandb is imported here only, when the run starts.

mode=auto: online when the user is logged in (WANDB_API_KEY or a netrc entry), else offline,
so a laptop without network never waits on it. Offline runs land in <run_dir>/wandb and can be
uploaded later with `wandb sync`.
"""

from __future__ import annotations

import netrc
import os
import re
from pathlib import Path
from typing import Any, Optional

from ablate.tracking.sinks import Sink

# metrics.jsonl key -> W&B key
WANDB_KEYS = {
    "train_loss": "train/loss", "grad_norm": "train/grad_norm", "lr": "train/lr",
    "tokens_per_s": "train/tokens_per_s", "val_loss": "val/loss", "val_bpb": "val/bpb",
    "tokens": "tokens",
}
SECRET_KEYS = ("api_key", "apikey", "wandb_api_key", "token", "password", "secret")


def is_secret_key(name: str) -> bool:
    """A credential-like key: a SECRET_KEYS entry as a whole `_`/`.`-separated part of the name
    (`hf_token`, `api_key`), not a substring (`tokenizer`, `max_tokens` are not secrets)."""
    parts = [p for p in re.split(r"[._\-]", str(name).lower()) if p]
    joined = "_".join(parts)
    return any(re.search(rf"(^|_){re.escape(s)}($|_)", joined) for s in SECRET_KEYS)


def logged_in() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1].split("/")[0]
        return netrc.netrc().authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def resolve_mode(mode: str) -> str:
    if mode in ("online", "offline", "disabled"):
        return mode
    env = os.environ.get("WANDB_MODE")
    if env in ("online", "offline", "disabled", "dryrun"):
        return "offline" if env == "dryrun" else env
    return "online" if logged_in() else "offline"


def scrub(obj: Any) -> Any:
    """Drop anything that looks like a credential before it reaches a config or a file."""
    if isinstance(obj, dict):
        return {k: scrub(v) for k, v in obj.items()
                if not is_secret_key(k)}
    if isinstance(obj, list):
        return [scrub(v) for v in obj]
    return obj


class WandbSink(Sink):
    def __init__(self, logger_cfg: Any, run_dir: Path, name: str, config: dict, tags: list[str],
                 group: Optional[str], resume_id: Optional[str] = None):
        self.cfg = logger_cfg
        self.run_dir = Path(run_dir)
        self.name, self.config, self.tags, self.group = name, config, tags, group
        self.resume_id = resume_id
        self.run = None

    def start(self, info):
        os.environ.setdefault("WANDB_START_METHOD", "thread")  # safe under Hydra launchers
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        mode = resolve_mode(self.cfg.mode)
        settings = wandb.Settings(init_timeout=float(self.cfg.init_timeout), silent=True)
        kwargs = dict(project=self.cfg.project, entity=self.cfg.entity, group=self.group,
                      job_type=self.cfg.job_type, name=self.name, tags=self.tags,
                      config=scrub(self.config), dir=str(self.run_dir), settings=settings,
                      id=self.resume_id, resume="allow" if self.resume_id else None)
        try:
            self.run = wandb.init(mode=mode, **kwargs)
        except Exception as e:  # no network / auth failure: fall back to offline, one line
            if mode != "online":
                raise
            print(f"warning: W&B online init failed ({type(e).__name__}); logging offline instead")
            self.run = wandb.init(mode="offline", **kwargs)
        self.run.define_metric("tokens")
        self.run.define_metric("train/*", step_metric="tokens")
        self.run.define_metric("val/*", step_metric="tokens")
        self.run.define_metric("diag/*", step_metric="tokens")
        self.run.define_metric("val/loss", summary="min")
        self.run.define_metric("val/bpb", summary="min")

    def log(self, row):
        if self.run is None:
            return
        data = {WANDB_KEYS.get(k, k): v for k, v in row.items() if k != "step"}
        self.run.log(data, step=int(row["step"]))

    def finish(self, summary):
        if self.run is None:
            return
        for key in ("status", "params", "non_embedding_params", "flops_per_token", "tokens_per_s",
                    "val_loss", "val_bpb", "train_loss", "step"):
            if key in summary and summary[key] is not None:
                self.run.summary[key] = summary[key]
        exit_code = 0 if summary.get("status") in ("completed", "diverged") else 1
        self.run.finish(exit_code=exit_code)
        self.run = None
