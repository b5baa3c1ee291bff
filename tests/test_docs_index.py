"""docs/index.md is the way in: it names every command the CLI has and links every page."""

from __future__ import annotations

import re

from conftest import ROOT


def test_the_index_lists_every_command_and_every_page():
    from cli.main import app

    index = (ROOT / "docs" / "index.md").read_text()
    commands = {c.name or c.callback.__name__.replace("_", "-") for c in app.registered_commands}
    commands |= {g.name for g in app.registered_groups}
    block = index.split("## The commands")[1]
    listed = set(re.findall(r"^ablate ([a-z-]+)", block, re.M))
    assert commands <= listed, sorted(commands - listed)
    assert "ablate bench --decode" in block
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"index.md"}
    linked = set(re.findall(r"\]\(([a-z-]+\.md)", index))
    assert pages <= linked, sorted(pages - linked)
