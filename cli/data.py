"""`ablate data` (work in progress: see the open issue)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    pass
