"""The packages form layers and data flows one way: each module imports only its own
layer and the layers below it (DESIGN.md, "The four packages and what each owns").

    base  <-  topologies  <-  workloads  <-  sim  <-  plots  <-  sim.cli

Every ``import`` counts, also those inside functions and under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from conftest import ROOT

LAYERS = ("base", "topologies", "workloads", "sim", "plots", "sim.cli")
"""Bottom to top. ``sim.cli`` (with ``python -m sim``, ``sim/__main__.py``) is the command
line, above plots: it composes simulation and figures."""

PLOTS_MAY_READ = ("sim.timeline",)
"""The only modules of ``sim`` that ``plots`` reads: timelines and their vocabulary (stats
reach plots as plain dicts)."""


def layer(module: str) -> int | None:
    """The layer index of a project module name, None for a module outside the project."""
    if module in ("sim.cli", "sim.__main__") or module.startswith("sim.cli."):
        return LAYERS.index("sim.cli")
    top = module.split(".")[0]
    return LAYERS.index(top) if top in LAYERS else None


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported module) of every import statement in ``path``."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            # `from sim import cli` imports the module sim.cli
            found += [(node.lineno, f"{target}.{alias.name}") for alias in node.names
                      if layer(f"{target}.{alias.name}") != layer(target)]
    return found


def project_modules() -> list[Path]:
    return sorted(p for top in ("base", "topologies", "workloads", "sim", "plots")
                  for p in (ROOT / top).rglob("*.py"))


def violations(path: Path) -> list[str]:
    """Imports in ``path`` that run against the flow of the layers."""
    own = layer(module_name(path))
    assert own is not None, path
    bad = []
    for line, target in imports(path):
        other = layer(target)
        if other is None:
            continue
        if other > own:
            bad.append(f"{path.relative_to(ROOT)}:{line} imports {target} "
                       f"({LAYERS[own]} may not import {LAYERS[other]})")
        elif (LAYERS[own] == "plots" and LAYERS[other] == "sim"
              and not target.startswith(PLOTS_MAY_READ)):
            bad.append(f"{path.relative_to(ROOT)}:{line} imports {target} "
                       f"(plots reads only {', '.join(PLOTS_MAY_READ)})")
    return bad


def test_every_import_looks_down() -> None:
    bad = [v for path in project_modules() for v in violations(path)]
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


def test_the_layers_cover_every_package() -> None:
    """Every top-level package of the tree (and of ``pyproject.toml``'s list) has a layer,
    so :func:`test_every_import_looks_down` reads all of them; ``tests/test_structure.py``
    walks the same packages."""
    from test_structure import PACKAGES

    on_disk = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    listed = set(re.findall(r'"(\w+)\*"', (ROOT / "pyproject.toml").read_text(encoding="utf-8")))
    tops = {name.split(".")[0] for name in LAYERS}
    assert on_disk == listed == tops == set(PACKAGES), (on_disk, listed, tops, PACKAGES)
    assert {p.relative_to(ROOT).parts[0] for p in project_modules()} == tops


def test_base_imports_nothing_of_the_project() -> None:
    for path in (ROOT / "base").rglob("*.py"):
        assert all(layer(t) in (None, 0) for _, t in imports(path)), path


@pytest.mark.parametrize("package, source, target", [
    ("workloads", "from sim.api import simulate\n", "sim.api"),
    ("sim", "def f():\n    from plots.idle import plot_idle\n", "plots.idle"),
    ("sim", "from sim import cli\n", "sim.cli"),
    ("plots", "from sim.idle import idle_breakdown\n", "sim.idle"),
    ("topologies", "from ..workloads import models\n", "workloads"),
])
def test_the_checker_catches_upward_imports(tmp_path, monkeypatch, package, source,
                                            target) -> None:
    """The rule itself: a module importing against the flow is reported, naming the import."""
    path = tmp_path / package / "mod.py"
    path.parent.mkdir(parents=True)
    path.write_text(source, encoding="utf-8")
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    found = violations(path)
    assert len(found) == 1 and f" imports {target}" in found[0], found
    path.write_text("from base.errors import ConfigError\n", encoding="utf-8")
    assert violations(path) == []
