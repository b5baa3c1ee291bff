"""How to quote a value for a Hydra override (run dirs and variant names hold '=' and ',').

Which overrides name a variant is ablate.names's (variant_overrides, variant_name)."""

from __future__ import annotations


def quote(value: str) -> str:
    """A string as a quoted Hydra override value."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
