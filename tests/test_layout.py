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


# ---- Hydra composes as Hydra does: the product patches none of its classes -----------------------
PATCHED_LIBRARIES = ("hydra", "omegaconf")


def _library_names(tree: ast.AST) -> set[str]:
    """The names a module binds to something of Hydra's or OmegaConf's: by import (`from
    hydra._internal.hydra import Hydra`, `import omegaconf as oc`), and by plain assignment of
    one of them (`cls = Hydra`)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                node.module.split(".")[0] in PATCHED_LIBRARIES:
            names |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Import):
            names |= {a.asname or a.name.split(".")[0] for a in node.names
                      if a.name.split(".")[0] in PATCHED_LIBRARIES}
    grown = True
    while grown:  # aliases of aliases
        grown = False
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and _library_root(node.value, names):
                for name in {t.id for t in _targets(node.targets) if isinstance(t, ast.Name)} - names:
                    names.add(name)
                    grown = True
    return names


def _library_root(node: ast.AST, names: set[str]) -> bool:
    """`node` is a name of `names`, or an attribute (or item) reached from one without a call:
    `Hydra`, `hydra._internal.hydra.Hydra`, `Hydra.__dict__["get_mode"]`."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return isinstance(node, ast.Name) and node.id in names


def _targets(targets) -> list[ast.AST]:
    """Assignment targets, tuples and lists unpacked (`A.x, B.y = ...`)."""
    flat = []
    for t in targets:
        flat += _targets(t.elts) if isinstance(t, (ast.Tuple, ast.List)) else \
            _targets([t.value]) if isinstance(t, ast.Starred) else [t]
    return flat


_PATCHERS = {"setattr", "delattr", "patch", "object"}  # setattr(X, ...), monkeypatch.setattr, mock.patch.object


def library_patches(source: str) -> list[str]:
    """Where `source` replaces (or deletes) an attribute of something of Hydra's or OmegaConf's:
    an assignment to one (tuple targets too), `del`, setattr/delattr, monkeypatch.setattr,
    mock.patch.object and mock.patch("hydra...")."""
    tree = ast.parse(source)
    names, found = _library_names(tree), []

    def patched(target: ast.AST) -> bool:
        return isinstance(target, (ast.Attribute, ast.Subscript)) and _library_root(target, names)

    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        found += [f"line {node.lineno}: {ast.unparse(t)}" for t in _targets(targets) if patched(t)]
        if isinstance(node, ast.Call) and node.args:
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            first = node.args[0]
            by_name = isinstance(first, ast.Constant) and isinstance(first.value, str) and \
                first.value.split(".")[0] in PATCHED_LIBRARIES and func in ("setattr", "delattr", "patch")
            if func in _PATCHERS and (_library_root(first, names) or by_name):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_the_patch_finder_finds_every_form_of_patch():
    """library_patches is no vacuous check: each way of replacing a Hydra method is found, and
    setting state on an instance Hydra hands out is not a patch."""
    patches = {
        "from hydra._internal.hydra import Hydra\nHydra.get_mode = lambda self, c, o: None",
        "from hydra._internal.config_loader_impl import ConfigLoaderImpl as L\n"
        "from hydra._internal.config_repository import ConfigRepository\n"
        "L.load_configuration, ConfigRepository.load_config = f, g",
        "import hydra._internal.hydra\nhydra._internal.hydra.Hydra.get_mode = f",
        "from omegaconf import OmegaConf\nsetattr(OmegaConf, 'clear_cache', f)",
        "from hydra._internal.hydra import Hydra\ncls = Hydra\nalias = cls\nalias.get_mode = f",
        "from hydra._internal.hydra import Hydra\ndef f(monkeypatch):\n    monkeypatch.setattr(Hydra, 'get_mode', g)",
        "from unittest import mock\nfrom hydra._internal.hydra import Hydra\nmock.patch.object(Hydra, 'get_mode', g)",
        "from unittest import mock\nmock.patch('hydra._internal.hydra.Hydra.get_mode', g)",
        "from hydra._internal.hydra import Hydra\n[Hydra.get_mode, x] = f, 1",
        "from hydra._internal.hydra import Hydra\nx, *Hydra.get_mode = f, 1",
        "from hydra._internal.hydra import Hydra\nHydra.__dict__['get_mode'] = f",
        "from hydra._internal.hydra import Hydra\ndel Hydra.get_mode",
    }
    for source in patches:
        assert library_patches(source), source
    for source in ("from hydra.core.hydra_config import HydraConfig\nHydraConfig.instance().cfg = None",
                   "from hydra._internal.hydra import Hydra\nself.mode = Hydra.get_mode",
                   "import os\nos.environ['X'] = '1'\nsetattr(self, 'x', 1)"):
        assert not library_patches(source), source


def test_no_module_replaces_an_attribute_of_hydra_or_omegaconf():
    """The product composes as Hydra does: no module replaces a method or attribute of a Hydra or
    OmegaConf class (the test suite's composition memo is tests/composition_memo.py)."""
    found = [f"{path.relative_to(ROOT)} {where}" for path in CODE for where in library_patches(path.read_text())]
    assert not found, found
