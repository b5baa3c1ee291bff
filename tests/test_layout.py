"""The package's layout (docs/architecture.md): a top level grouped by what it does, module names
that say what they hold, and no module reaching into another's private names."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ablate"
CODE = [*PACKAGE.rglob("*.py"), *(ROOT / "cli").rglob("*.py"), *(ROOT / "hydra_plugins").rglob("*.py")]


def test_the_top_level_holds_at_most_ten_modules_beside_its_packages():
    modules = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(modules) <= 10, modules
    packages = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
    assert {"analysis", "config", "data", "evaluation", "hf", "measure", "model", "run", "sweep",
            "tracking", "train"} <= set(packages)


def test_no_two_modules_share_a_name():
    names: dict[str, list[str]] = {}
    for p in PACKAGE.rglob("*.py"):
        if p.name != "__init__.py":
            names.setdefault(p.name, []).append(str(p.relative_to(ROOT)))
    assert not {n: ps for n, ps in names.items() if len(ps) > 1}


def _module_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_module_imports_another_modules_private_names():
    """`from ablate.x import _helper` (or `x._helper` on an imported ablate module) makes a
    private helper a public interface nobody declared: make it public where it lives."""
    found = []
    for path in CODE:
        tree, here = ast.parse(path.read_text()), _module_of(path)
        aliases = {}  # local name -> the ablate module it names
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ("ablate", "cli"):
                for a in node.names:
                    if a.name.startswith("_") and not a.name.startswith("__") and node.module != here:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.module}.{a.name}")
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == "ablate":
                        aliases[a.asname or a.name] = a.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and node.attr.startswith("_") and not node.attr.startswith("__")
                    and aliases[node.value.id] != here):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {aliases[node.value.id]}.{node.attr}")
    assert not found, found
