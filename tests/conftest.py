"""Shared test helpers. Tests never touch the network, the user's cache or ./runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# A model and a training budget small enough for a few seconds on 2 CPU cores.
TINY = [
    "model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.max_seq_len=64",
    "train.batch_size=4", "train.seq_len=32", "train.steps=6", "train.warmup_steps=2",
    "train.eval_every=0", "train.eval_tokens=512", "train.log_every=1", "logger=none",
    "train.progress=false",
]


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
               timeout: float = 600) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess (as a user would), capturing output."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=cwd or ROOT,
                          env=full_env, capture_output=True, text=True, timeout=timeout)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def find_run_dirs(root: Path) -> list[Path]:
    return sorted(p.parent for p in Path(root).rglob("summary.json"))


def compose(overrides=(), validate=True):
    from ablate.compose import compose_config

    return compose_config(list(overrides), validate=validate)


@pytest.fixture
def tiny():
    return list(TINY)
