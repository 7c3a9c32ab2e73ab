"""The shape of the code, checked: controllers a newcomer can hold in their head.

- No module in kopf_operators/ over 700 lines, no class over 400; no module in kopf_operators/core over 500
  (the shared machinery is split by concept, with room to grow).
- No test module imports another test module (shared helpers live in helper modules or conftest).
- No controller keeps its own "newest known version" cache: core.state.Newest is the one.
- Every controller's passes outside Kopf's handlers go through core.controller.GuardedPass: each makes
  one, and none keeps a retry wrapper of its own (a ``Backoff``, a ``next_delay`` call).
- The import graph: no star import; no module imports a name from a module that only imported it itself
  (a re-export; a package's ``__init__.py`` may gather names); no operator imports another (what two
  share lives in kopf_operators/core).
- Tests and benchmarks assert behaviour through the API (objects, Events, status, metrics): only the
  modules in LOG_READERS_ALLOWED read the operator's log text, each for a reason the API cannot serve.

Every operator keeps the first four, with no exceptions listed.
"""

from __future__ import annotations

import ast
import pathlib
import re
import tomllib
from collections.abc import Callable

from tests import scheduling
from testsupport.paths import REPO

PACKAGE = REPO / "kopf_operators"
MAX_MODULE_LINES = 700
MAX_CLASS_LINES = 400
MAX_CORE_MODULE_LINES = 500

# What marks a private version cache (a ``_written``/``_pods_seen`` map, a ``_rv`` parser): every
# controller uses core.state.Newest instead.
VERSION_CACHE_NAMES = {"_written", "_pods_seen", "_rv"}

# What marks a private retry wrapper (a backoff counted per key outside GuardedPass).
RETRY_WRAPPER_NAMES = {"Backoff", "next_delay"}

# The helpers that hand out the operator's log text (testsupport/launcher.py, bench/harness.py,
# tests/e2e/faultkit.py). Not among them: ``errors()``/``tracebacks()`` (a run that goes as the user
# expects logs no ERROR and no traceback: the log line is the promise, and a crash shows nowhere else)
# and ``tail()`` (a failure message's context).
LOG_READERS = {"output", "records", "log_lines_since", "LogWindow"}
LOG_READERS_ALLOWED = {
    "testsupport/launcher.py": "defines them",
    "bench/harness.py": "defines them",
    "tests/e2e/faultkit.py": "defines them",
    "tests/e2e/test_quiet_logs.py": "the log's volume is the promise",
    "bench/sections/quiet_logs.py": "the log's volume is the promise",
    "tests/e2e/test_copyrator.py": "no credential in the log",
    "tests/e2e/test_blackadder_gamedays.py": "no credential in the log (a check's URL from a Secret)",
    "tests/e2e/test_blackadder_shared_process.py": "no credential in the log (a webhook URL with credentials)",
    "tests/e2e/test_tenant_abuse.py": "no credential in the log (a tenant's token)",
    "tests/e2e/test_reroller.py": "no credential in the log; one line per rollout and per failed alert",
    "tests/e2e/test_sharding.py": "which process acted: both shards run as one identity, the API cannot tell",
    "tests/e2e/test_bad_input.py": ("when Kopf has handled an object's events, and handler invocations (a hot "
                                    "loop need make no request): neither shows in the API"),
    "bench/sections/restart_configmaps.py": "times the start to Kopf's 'Every index is filled' line",
    "tests/e2e/test_upgrade_minor.py": "what a cluster upgrade makes the operator log (errors, Kopf's retries)",
}


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


def test_no_module_in_core_over_500_lines() -> None:
    found = {relative(path): len(path.read_text().splitlines()) for path in sorted((PACKAGE / "core").rglob("*.py"))}
    new = [f"{name}: {lines} lines (at most {MAX_CORE_MODULE_LINES})" for name, lines in found.items()
           if lines > MAX_CORE_MODULE_LINES]
    assert not new, "split core by concept:\n" + "\n".join(new)


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


def names_used(path: pathlib.Path, names: set[str], mark: Callable[[ast.AST], str | None]) -> list[str]:
    """The ``names`` that ``mark`` finds in ``path``'s syntax tree (it answers a node's name, or None)."""
    source = path.read_text()
    if not any(name in source for name in names):  # most modules: no parse needed
        return []
    return sorted({name for node in ast.walk(ast.parse(source)) if (name := mark(node)) in names})


def defined(node: ast.AST) -> str | None:
    return node.name if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) else None


def version_caches(path: pathlib.Path) -> list[str]:
    """Names in ``path`` that mark a private version cache: a ``self._written``-like attribute, a ``_rv``."""
    def mark(node: ast.AST) -> str | None:
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            return node.attr
        return defined(node)
    return names_used(path, VERSION_CACHE_NAMES, mark)


def test_no_controller_keeps_its_own_version_cache() -> None:
    found = {relative(path): version_caches(path) for path in sorted(PACKAGE.rglob("*.py"))
             if not path.is_relative_to(PACKAGE / "core")}
    new = [f"{name}: {names}" for name, names in found.items() if names]
    assert not new, "use core.state.Newest:\n" + "\n".join(new)


def retry_wrappers(path: pathlib.Path) -> list[str]:
    """Names in ``path`` that mark a private retry wrapper (a ``Backoff``, a ``.next_delay()`` call)."""
    def mark(node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.alias):
            return node.name
        return node.attr if isinstance(node, ast.Attribute) else None
    return names_used(path, RETRY_WRAPPER_NAMES, mark)


def makes_a_guarded_pass(path: pathlib.Path) -> bool:
    return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "GuardedPass"
               for node in ast.walk(ast.parse(path.read_text())))


def test_every_controllers_pass_goes_through_the_guarded_pass() -> None:
    controllers = sorted(path for path in PACKAGE.glob("*/controller.py") if path.parent.name != "core")
    assert len(controllers) == 4, controllers  # immortal, copyrator, blackadder, reroller
    without = [relative(path) for path in controllers if not makes_a_guarded_pass(path)]
    assert not without, "run the passes outside Kopf's handlers through core.controller.GuardedPass: " + str(without)
    found = {relative(path): retry_wrappers(path) for path in sorted(PACKAGE.rglob("*.py"))
             if not path.is_relative_to(PACKAGE / "core")}
    new = [f"{name}: {names}" for name, names in found.items() if names]
    assert not new, "retry through core.controller.GuardedPass (its results, retry_later):\n" + "\n".join(new)


def log_readers(path: pathlib.Path) -> list[str]:
    """The LOG_READERS that ``path`` calls (a method or function of that name), names (a class) or defines."""
    def mark(node: ast.AST) -> str | None:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            return node.func.attr
        if isinstance(node, ast.Name) and node.id[0].isupper():  # a class, not a variable named ``output``
            return node.id
        return defined(node)
    return names_used(path, LOG_READERS, mark)


def test_tests_read_the_operators_log_only_where_the_log_is_the_promise() -> None:
    paths = [p for tree in ("tests", "bench", "testsupport") for p in sorted((REPO / tree).rglob("*.py"))
             if not p.is_relative_to(REPO / "tests" / "unit")]
    found = {relative(path): log_readers(path) for path in paths}
    new = [f"{name}: {names}" for name, names in found.items() if names and name not in LOG_READERS_ALLOWED]
    assert not new, "assert through the API (objects, Events, status, metrics), not the log:\n" + "\n".join(new)
    stale = sorted(name for name in LOG_READERS_ALLOWED if not found.get(name))
    assert not stale, f"no longer read the log: take them off LOG_READERS_ALLOWED: {stale}"


def test_the_checks_see_what_they_look_for(tmp_path: pathlib.Path) -> None:
    module = tmp_path / "test_x.py"
    module.write_text("from tests.e2e.test_other import helper\nimport tests.unit.test_y\n"
                      "from tests.e2e.helpers import fine\nfrom tests.kube import wait_for\n"
                      "class Cache:\n    def __init__(self):\n        self._written = {}\n"
                      "def _rv(body):\n    return 0\n")
    assert imported_test_modules(module) == ["tests.e2e.test_other", "tests.e2e.test_other.helper",
                                             "tests.unit.test_y"]
    assert version_caches(module) == ["_rv", "_written"]
    wrapper = tmp_path / "controller.py"
    wrapper.write_text("from kopf_operators.core.controller import Backoff\n"
                       "def retry(self):\n    return self.backoff.next_delay(1)\n")
    assert retry_wrappers(wrapper) == ["Backoff", "next_delay"] and not makes_a_guarded_pass(wrapper)
    wrapper.write_text("passes = GuardedPass('op', background, run, say=say)\n")
    assert retry_wrappers(wrapper) == [] and makes_a_guarded_pass(wrapper)
    reader = tmp_path / "test_log.py"
    reader.write_text("def test(operator):\n    assert 'x' in operator.output()\n    LogWindow(operator)\n"
                      "    output = 'no call'\n    assert not operator.errors() and operator.tail()\n")
    assert log_readers(reader) == ["LogWindow", "output"]
    big = tmp_path / "big.py"
    big.write_text("class Big:\n" + "    x = 1\n" * MAX_CLASS_LINES + "\n" * MAX_MODULE_LINES)
    assert [problem.split(": ", 1)[1] for problem in oversized(big)] == [
        f"{MAX_CLASS_LINES + MAX_MODULE_LINES + 1} lines (at most {MAX_MODULE_LINES})",
        f"class Big has {MAX_CLASS_LINES + 1} lines (at most {MAX_CLASS_LINES})"]


def test_every_module_on_the_real_node_runs_where_the_real_node_is() -> None:
    """Under `pytest -n`, only worker gw0's cluster has the real node: tests/scheduling.py sends there the
    modules that use it (its fixtures, or the helpers of tests/e2e/realnode.py)."""
    marks = re.compile(r"\b(real_node|operator_image)\b|tests\.e2e\.realnode")
    using = {relative(path) for path in (REPO / "tests" / "e2e").glob("test_*.py") if marks.search(path.read_text())}
    assert using - scheduling.LAST == scheduling.REAL_NODE_MODULES



def test_every_package_is_in_the_distribution() -> None:
    """The wheel (and so the image) holds the packages pyproject.toml lists: a package left off imports
    fine from the source tree and fails in the pod."""
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {module_name(REPO, init) for init in PACKAGE.rglob("__init__.py")}
    assert found == listed

# --- the import graph: each name imported from where it is defined -----------------------------------

# Where the project's importable Python lives (operators/ holds Kopf's entry files: loaded, never imported).
SOURCE_TREES = ("kopf_operators", "operators", "tests", "bench", "testsupport", "release")
OPERATORS = ("immortal", "copyrator", "blackadder", "reroller")


def python_files(root: pathlib.Path) -> list[pathlib.Path]:
    return [path for tree in SOURCE_TREES for path in sorted((root / tree).rglob("*.py"))]


def module_name(root: pathlib.Path, path: pathlib.Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def star_imports(path: pathlib.Path) -> list[str]:
    """The modules ``path`` star-imports (``from m import *``)."""
    return sorted({node.module or "." for node in ast.walk(ast.parse(path.read_text()))
                   if isinstance(node, ast.ImportFrom) and any(alias.name == "*" for alias in node.names)})


def imports_of(tree: ast.AST) -> tuple[dict[str, str], list[tuple[str, str, int]]]:
    """A module's imports: the names it binds to modules (name -> module) and each name it takes from
    a module ((module, name, line): ``from m import name``)."""
    modules: dict[str, str] = {}
    taken: list[tuple[str, str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    modules[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level and node.module != "__future__":
            for alias in node.names:
                modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                taken.append((node.module, alias.name, node.lineno))
    return modules, taken


def re_exports(root: pathlib.Path) -> list[str]:
    """Names some module takes from a module that only imported them itself (``from m import x`` or
    ``m.x``, where ``m`` imported ``x``): import each from where it is defined. A package's
    ``__init__.py`` may gather names for others."""
    files = {module_name(root, path): path for path in python_files(root)}
    trees = {name: ast.parse(path.read_text()) for name, path in files.items()}
    imported = {name: {bound for bound in imports_of(tree)[0]} for name, tree in trees.items()
                if files[name].name != "__init__.py"}
    found = []
    for name, tree in trees.items():
        modules, taken = imports_of(tree)
        uses = [(module, attr, line) for module, attr, line in taken]
        uses += [(modules[node.value.id], node.attr, node.lineno) for node in ast.walk(tree)
                 if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules]
        found += [f"{relative(files[name])}:{line}: {module}.{attr} (imported there, not defined)"
                  for module, attr, line in uses if attr in imported.get(module, ())]
    return sorted(set(found))


def operator_imports(root: pathlib.Path) -> list[str]:
    """Imports of one operator's modules (kopf_operators/<op>/, operators/<op>.py) from another's."""
    found = []
    for op in OPERATORS:
        paths = [*sorted((root / "kopf_operators" / op).rglob("*.py")), root / "operators" / f"{op}.py"]
        for path in (p for p in paths if p.exists()):
            for node in ast.walk(ast.parse(path.read_text())):
                modules = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom) and node.module:
                    modules = [node.module]
                found += [f"{path.relative_to(root).as_posix()} imports {module}" for module in modules
                          if (parts := module.split("."))[0] == "kopf_operators" and len(parts) > 1
                          and parts[1] in OPERATORS and parts[1] != op]
    return sorted(set(found))


def test_no_star_import() -> None:
    found = {relative(path): star_imports(path) for path in python_files(REPO)}
    new = [f"{name}: from {modules} import *" for name, modules in found.items() if modules]
    assert not new, "import each name from the module that defines it:\n" + "\n".join(new)


def test_no_re_export_outside_a_package_init() -> None:
    found = re_exports(REPO)
    assert not found, "import each name from the module that defines it:\n" + "\n".join(found)


def test_no_operator_imports_another() -> None:
    found = operator_imports(REPO)
    assert not found, "move what two operators share into kopf_operators/core (conventions.py):\n" + "\n".join(found)


def test_the_import_checks_see_what_they_look_for(tmp_path: pathlib.Path) -> None:
    def write(name: str, text: str) -> None:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    write("kopf_operators/__init__.py", "")
    write("kopf_operators/copyrator/__init__.py", "from kopf_operators.copyrator.rules import KIND\n")
    write("kopf_operators/copyrator/rules.py", "from kopf_operators.core.conventions import DOMAIN\nKIND = 'R'\n")
    write("kopf_operators/copyrator/facade.py", "from kopf_operators.copyrator.rules import *\n")
    write("kopf_operators/blackadder/settings.py",
          "from kopf_operators.copyrator import rules\nfrom kopf_operators.copyrator.rules import DOMAIN, KIND\n"
          "from kopf_operators.copyrator import KIND as K\nLABEL = rules.DOMAIN + rules.KIND\n")
    write("tests/test_x.py", "from kopf_operators.copyrator.facade import KIND\n")
    assert star_imports(tmp_path / "kopf_operators/copyrator/facade.py") == ["kopf_operators.copyrator.rules"]
    assert [line.split(": ", 1)[1] for line in re_exports(tmp_path)] == [
        "kopf_operators.copyrator.rules.DOMAIN (imported there, not defined)"] * 2  # from-import, then rules.DOMAIN
    assert [line.split(" imports ")[1] for line in operator_imports(tmp_path)] == [
        "kopf_operators.copyrator", "kopf_operators.copyrator.rules"]  # from kopf_operators/blackadder/settings.py
