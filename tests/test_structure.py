"""Module hygiene: no module-level function or class is defined twice or rebound.

A second ``def f`` (or ``class C``) at module level silently replaces the first, and
ruff's F811 stays quiet when the first was used before the second: a new helper once
shadowed ``_stage_class`` in ``sim/search/bounds.py`` that way. This walks every module of
the packages with :mod:`ast` and fails on a module-level function or class whose name is
bound twice at module level (by ``def``, ``class``, assignment, ``import``, ``for``,
``with`` or ``:=`` -- in the module's body or the bodies of its top-level ``if``/``try``
blocks), naming ``file:line`` of both, and on a class that defines a method (or nested class) twice.
``typing.overload`` stubs and property setters are not redefinitions.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT

PACKAGES = ("base", "topologies", "workloads", "sim", "plots")
"""Every package of the project (``tests/test_layers.py`` checks the list against the
tree)."""


def _module_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements run at module level: ``body`` and, recursively, the bodies of its
    ``if``, ``try`` and ``with`` blocks (not those of functions or classes)."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _module_statements(node.body)
            yield from _module_statements(node.orelse)
        elif isinstance(node, ast.Try | ast.TryStar):
            for block in (node.body, node.orelse, node.finalbody,
                          *(h.body for h in node.handlers)):
                yield from _module_statements(block)
        elif isinstance(node, ast.With | ast.For | ast.While):
            yield from _module_statements(node.body)


def _is_overload(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any((isinstance(d, ast.Name) and d.id == "overload")
               or (isinstance(d, ast.Attribute) and d.attr == "overload")
               for d in node.decorator_list)


def _targets(node: ast.AST) -> Iterator[str]:
    """Names a binding target binds (``a``, ``a, b``, ``[a, *b]``; not ``a.x`` or ``a[i]``)."""
    if isinstance(node, ast.Name):
        yield node.id
    elif isinstance(node, ast.Tuple | ast.List):
        for elt in node.elts:
            yield from _targets(elt)
    elif isinstance(node, ast.Starred):
        yield from _targets(node.value)


def bindings(tree: ast.Module) -> Iterator[tuple[str, int, str]]:
    """(name, line, what) of every module-level binding; ``what`` is ``def``, ``class``
    or how else the name is bound."""
    for node in _module_statements(tree.body):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if not _is_overload(node):
                yield node.name, node.lineno, "def"
        elif isinstance(node, ast.ClassDef):
            yield node.name, node.lineno, "class"
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                yield from ((n, node.lineno, "assignment") for n in _targets(target))
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            if node.value is not None or isinstance(node, ast.AugAssign):
                yield from ((n, node.lineno, "assignment") for n in _targets(node.target))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                name = alias.asname or alias.name.split(".")[0]
                if name != "*":
                    yield name, node.lineno, "import"
        elif isinstance(node, ast.For):
            yield from ((n, node.lineno, "for") for n in _targets(node.target))
        elif isinstance(node, ast.With):
            for item in node.items:
                if item.optional_vars is not None:
                    yield from ((n, node.lineno, "with") for n in _targets(item.optional_vars))
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            for sub in ast.walk(node):  # `:=` in a module-level expression
                if isinstance(sub, ast.NamedExpr):
                    yield from ((n, sub.lineno, ":=") for n in _targets(sub.target))


def redefinitions(path: Path) -> list[str]:
    """``file:line`` pairs where a module-level function or class of ``path`` is bound again."""
    rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
    seen: dict[str, list[tuple[int, str]]] = {}
    for name, line, what in bindings(ast.parse(path.read_text(encoding="utf-8"))):
        seen.setdefault(name, []).append((line, what))
    bad = []
    for name, where in seen.items():
        if len(where) < 2 or not any(what in ("def", "class") for _, what in where):
            continue
        (line0, what0), *rest = sorted(where)
        bad += [f"{rel}:{line0} ({what0}) and {rel}:{line} ({what}) both bind {name!r}"
                for line, what in rest]
    return bad


def _is_accessor(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """``@x.setter`` / ``@x.deleter``: a property's second definition, by design."""
    return any(isinstance(d, ast.Attribute) and d.attr in ("setter", "deleter")
               for d in node.decorator_list)


def method_redefinitions(path: Path) -> list[str]:
    """``file:line`` pairs where a class of ``path`` defines a method or class twice."""
    rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
    bad = []
    for cls in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(cls, ast.ClassDef):
            continue
        seen: dict[str, int] = {}
        for node in cls.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if _is_overload(node) or _is_accessor(node):
                    continue
            elif not isinstance(node, ast.ClassDef):
                continue
            if node.name in seen:
                bad.append(f"{rel}:{seen[node.name]} and {rel}:{node.lineno} both define "
                           f"{cls.name}.{node.name}")
            seen[node.name] = node.lineno
    return bad


def project_modules() -> list[Path]:
    return sorted(p for top in PACKAGES for p in (ROOT / top).rglob("*.py"))


def test_no_module_level_function_or_class_is_bound_twice() -> None:
    bad = [b for path in project_modules() for b in redefinitions(path)]
    assert not bad, "module-level names bound twice:\n" + "\n".join(bad)


def test_no_class_defines_a_method_twice() -> None:
    bad = [b for path in project_modules() for b in method_redefinitions(path)]
    assert not bad, "methods defined twice:\n" + "\n".join(bad)


@pytest.mark.parametrize(("source", "name"), [
    ("def f():\n    pass\nx = f()\ndef f():\n    pass\n", "f"),
    ("class C:\n    pass\nC = 1\n", "C"),
    ("from os import path\ndef path():\n    pass\n", "path"),
    ("if True:\n    def g():\n        pass\ndef g():\n    pass\n", "g"),
    ("def h():\n    pass\nfor h in ():\n    pass\n", "h"),
    ("def k():\n    pass\n(k := 2)\n", "k"),
])
def test_the_checker_catches_a_redefinition(tmp_path: Path, source: str, name: str) -> None:
    path = tmp_path / "mod.py"
    path.write_text(source, encoding="utf-8")
    found = redefinitions(path)
    assert len(found) == 1 and f"both bind {name!r}" in found[0], found
    assert found[0].startswith(f"{path}:")


def test_the_checker_leaves_alone_what_is_not_a_redefinition(tmp_path: Path) -> None:
    path = tmp_path / "mod.py"
    path.write_text("from typing import overload\n"
                    "@overload\ndef f(x: int) -> int: ...\n"
                    "@overload\ndef f(x: str) -> str: ...\n"
                    "def f(x):\n    return x\n"
                    "f.cache = {}\n"                        # an attribute, not the name
                    "def g():\n    f = 1\n    return f\n"  # a local, not the module's
                    "class C:\n    def f(self):\n        pass\n",
                    encoding="utf-8")
    assert redefinitions(path) == [] and method_redefinitions(path) == []


def test_the_checker_catches_a_method_defined_twice(tmp_path: Path) -> None:
    path = tmp_path / "mod.py"
    path.write_text("class C:\n    @property\n    def x(self):\n        return 1\n"
                    "    @x.setter\n    def x(self, v):\n        pass\n"
                    "    def f(self):\n        pass\n    def f(self):\n        pass\n",
                    encoding="utf-8")
    assert method_redefinitions(path) == [f"{path}:8 and {path}:10 both define C.f"]
