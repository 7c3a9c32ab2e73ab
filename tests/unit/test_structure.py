"""The shape of the code, checked: controllers a newcomer can hold in their head.

- No module in kopf_operators/ over 700 lines, no class over 400.
- No test module imports another test module (shared helpers live in helper modules or conftest).
- No controller keeps its own "newest known version" cache: core.controller.Newest is the one.

Every operator keeps all three, with no exceptions listed.
"""

from __future__ import annotations

import ast
import pathlib

from testsupport.paths import REPO

PACKAGE = REPO / "kopf_operators"
MAX_MODULE_LINES = 700
MAX_CLASS_LINES = 400

# What marks a private version cache (a ``_written``/``_pods_seen`` map, a ``_rv`` parser): every
# controller uses core.controller.Newest instead.
VERSION_CACHE_NAMES = {"_written", "_pods_seen", "_rv"}


def relative(path: pathlib.Path) -> str:
    return path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else str(path)


def oversized(path: pathlib.Path) -> list[str]:
    source = path.read_text()
    problems = []
    lines = len(source.splitlines())
    if lines > MAX_MODULE_LINES:
        problems.append(f"{relative(path)}: {lines} lines (at most {MAX_MODULE_LINES})")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
            size = node.end_lineno - node.lineno + 1
            if size > MAX_CLASS_LINES:
                problems.append(f"{relative(path)}: class {node.name} has {size} lines (at most {MAX_CLASS_LINES})")
    return problems


def test_no_module_over_700_lines_and_no_class_over_400() -> None:
    found = {relative(path): oversized(path) for path in sorted(PACKAGE.rglob("*.py"))}
    new = [problem for problems in found.values() for problem in problems]
    assert not new, "split along its seams:\n" + "\n".join(new)


def imported_test_modules(path: pathlib.Path) -> list[str]:
    """The test modules (``tests.<...>.test_*``) that ``path`` imports."""
    source = path.read_text()
    if "test_" not in source.replace("def test_", ""):  # most modules: no parse needed
        return []
    found = []
    for node in ast.walk(ast.parse(source)):
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        found += [name for name in names
                  if name.startswith("tests.") and any(part.startswith("test_") for part in name.split(".")[1:])]
    return sorted(set(found))


def test_no_test_module_imports_another() -> None:
    found = {relative(path): imported_test_modules(path) for path in sorted((REPO / "tests").rglob("test_*.py"))}
    new = [f"{name} imports {modules}" for name, modules in found.items() if modules]
    assert not new, "move the shared helpers to a helper module or conftest:\n" + "\n".join(new)


def version_caches(path: pathlib.Path) -> list[str]:
    """Names in ``path`` that mark a private version cache: a ``self._written``-like attribute, a ``_rv``."""
    source = path.read_text()
    if not any(name in source for name in VERSION_CACHE_NAMES):
        return []
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and node.attr in VERSION_CACHE_NAMES:
            found.add(node.attr)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in VERSION_CACHE_NAMES:
            found.add(node.name)
    return sorted(found)


def test_no_controller_keeps_its_own_version_cache() -> None:
    found = {relative(path): version_caches(path) for path in sorted(PACKAGE.rglob("*.py"))
             if not path.is_relative_to(PACKAGE / "core")}
    new = [f"{name}: {names}" for name, names in found.items() if names]
    assert not new, "use core.controller.Newest:\n" + "\n".join(new)


def test_the_checks_see_what_they_look_for(tmp_path: pathlib.Path) -> None:
    module = tmp_path / "test_x.py"
    module.write_text("from tests.e2e.test_other import helper\nimport tests.unit.test_y\n"
                      "from tests.e2e.helpers import fine\nfrom tests.kube import wait_for\n"
                      "class Cache:\n    def __init__(self):\n        self._written = {}\n"
                      "def _rv(body):\n    return 0\n")
    assert imported_test_modules(module) == ["tests.e2e.test_other", "tests.e2e.test_other.helper",
                                             "tests.unit.test_y"]
    assert version_caches(module) == ["_rv", "_written"]
    big = tmp_path / "big.py"
    big.write_text("class Big:\n" + "    x = 1\n" * MAX_CLASS_LINES + "\n" * MAX_MODULE_LINES)
    assert [problem.split(": ", 1)[1] for problem in oversized(big)] == [
        f"{MAX_CLASS_LINES + MAX_MODULE_LINES + 1} lines (at most {MAX_MODULE_LINES})",
        f"class Big has {MAX_CLASS_LINES + 1} lines (at most {MAX_CLASS_LINES})"]
