"""Override strings: which ones name a variant, and how to quote a value for Hydra.

Shared by the run entry point, sweeps, compare and the rank launcher (a leaf module: it imports
nothing of ablate's, so every user imports down)."""

from __future__ import annotations

# Overrides that do not change what is trained (they never name a variant).
NON_VARIANT_PREFIXES = ("hydra.", "hydra/", "logger", "out_dir", "launcher", "train.progress",
                        "train.device", "train.threads", "train.resume", "train.nproc",
                        "train.log_every", "train.ckpt_every", "train.keep_ckpts", "study",
                        "train.diagnostics_every",  # diagnostics never change training
                        "plugins")  # what the option is named by, not what it is
SEED_KEYS = ("seed", "data_seed")


def variant_overrides(overrides: list[str]) -> list[str]:
    out = []
    for o in overrides:
        key = o.lstrip("+~").split("=", 1)[0]
        if key in SEED_KEYS or key.startswith(NON_VARIANT_PREFIXES):
            continue
        out.append(o.lstrip("+"))
    return sorted(out)


def variant_name(overrides: list[str]) -> str:
    return ",".join(variant_overrides(overrides)) or "baseline"


def quote(value: str) -> str:
    """A string as a quoted Hydra override value (run dirs and names hold '=' and ',')."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
