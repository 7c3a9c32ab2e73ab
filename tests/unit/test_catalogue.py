"""Every Event reason the code can emit, and every annotation or label key it defines, is in its
operator's catalogue (kopf_operators/<operator>/catalogue.py), and so in the generated reference
(docs/reference/events.md, annotations.md).

How reasons are found, without a cluster (a static scan of kopf_operators/):
- a literal reason at an emit site: ``access.event(body, TYPE, REASON, message)``,
  ``notes.announce(body, target, TYPE, REASON, message, log)``, ``report_push(body, REASON, message)``,
  and a literal tuple ``(TYPE, REASON, ...)`` (an Event said later, as ``stall_event`` returns it);
- a computed reason at an emit site (``decision.reason``) must be listed in COMPUTED below, with the
  scan that finds its values where they are made (the literals of ``Decision(...)``, say). A new
  computed site fails here until it is listed;
- and at run time: ``Access.event`` logs an Event reason no catalogue has as an error, and
  tests/unit/fake_access.py fails the controller test that emits it.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import pkgutil
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kopf_operators.core import catalogue
from kopf_operators.core.conventions import OPERATOR_NAMES
from testsupport import reference
from testsupport.paths import REPO

PACKAGE = REPO / "kopf_operators"
PACKAGES = ("core", *OPERATOR_NAMES)
TYPES = ("Normal", "Warning")
REASON = re.compile(r"^[A-Z][A-Za-z0-9]+$")
# Our keys (and stakater Reloader's, which the re-roller reads): "<prefix.>domain/name", not an apiVersion.
KEY = re.compile(r"^([a-z0-9-]+\.)*(kopf-operators\.dev|blackadder\.io|reloader\.stakater\.com|"
                 r"immortalcontainer\.flugel\.it|flant\.com)/(?!v\d+((alpha|beta)\d+)?$)[A-Za-z0-9._-]+$")


@dataclasses.dataclass(frozen=True)
class Emitted:
    where: str  # path:line
    package: str  # the operator (or "core") whose catalogue must have it
    type: str | None  # None: the site's type is computed too
    reason: str


@functools.cache
def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _literal(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _callee(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _files(root: Path) -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(root.rglob("*.py")):
        if path.name != "catalogue.py":
            yield path, _parse(path)


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:{getattr(node, 'lineno', 0)}"


# Emit sites: callee -> (index of the type argument, or the type itself; index of the reason argument).
SITES: dict[str, tuple[int | str, int]] = {"event": (1, 2), "announce": (2, 3), "report_push": ("Warning", 1)}


def emit_sites(root: Path) -> Iterator[tuple[Path, ast.AST, str | None, ast.AST]]:
    """(file, node, type, reason expression) of every place under ``root`` that emits or says an Event."""
    for path, tree in _files(root):
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _callee(node) in SITES:
                type_at, reason_at = SITES[_callee(node)]
                if len(node.args) > reason_at:
                    type_ = type_at if isinstance(type_at, str) else _literal(node.args[type_at])
                    yield path, node, type_, node.args[reason_at]
            if isinstance(node, ast.Tuple) and len(node.elts) >= 2 and _literal(node.elts[0]) in TYPES:
                yield path, node, _literal(node.elts[0]), node.elts[1]


# --- where computed reasons come from --------------------------------------------------------------

Scan = Callable[[], Iterator[Emitted]]


def call_literals(package: str, module: str, callee: str, reason_at: int, type_: str,
                  when: Callable[[ast.Call], bool] = lambda _: True) -> Scan:
    """The literal reasons given to ``callee(...)`` (positional ``reason_at``, or ``reason=``) in a module."""
    def scan() -> Iterator[Emitted]:
        path = PACKAGE / package / module
        for node in ast.walk(_parse(path)):
            if isinstance(node, ast.Call) and _callee(node) == callee and when(node):
                given = [k.value for k in node.keywords if k.arg == "reason"]
                given += node.args[reason_at:reason_at + 1]
                for value in given:
                    if _literal(value):
                        yield Emitted(_where(path, node), package, type_, str(_literal(value)))
    return scan


def default_of(package: str, module: str, cls: str, parameter: str, type_: str) -> Scan:
    """The default of a parameter of ``cls.__init__`` (an exception's reason when none is given)."""
    def scan() -> Iterator[Emitted]:
        path = PACKAGE / package / module
        for node in ast.walk(_parse(path)):
            if isinstance(node, ast.ClassDef) and node.name == cls:
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                        args = item.args.args[len(item.args.args) - len(item.args.defaults):]
                        for arg, default in zip(args, item.args.defaults, strict=True):
                            if arg.arg == parameter and _literal(default):
                                yield Emitted(_where(path, default), package, type_, str(_literal(default)))
    return scan


def tuple_literals(package: str, module: str, function: str, reason_at: int, type_: str,
                   when: Callable[[ast.Tuple], bool] = lambda _: True) -> Scan:
    """The literal at ``reason_at`` of the tuples in ``function`` (returned, or assigned)."""
    def scan() -> Iterator[Emitted]:
        path = PACKAGE / package / module
        for node in ast.walk(_parse(path)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == function:
                for tup in ast.walk(node):
                    if isinstance(tup, ast.Tuple) and len(tup.elts) > reason_at and when(tup):
                        value = _literal(tup.elts[reason_at])
                        if value and REASON.match(value):
                            yield Emitted(_where(path, tup), package, type_, value)
    return scan


def _first_arg_is(*actions: str) -> Callable[[ast.Call], bool]:
    return lambda call: bool(call.args) and isinstance(call.args[0], ast.Attribute) and call.args[0].attr in actions


def _is(index: int, value: object) -> Callable[[ast.Tuple], bool]:
    return lambda tup: (isinstance(element := tup.elts[index], ast.Constant) and element.value is value)


_RULE_ERRORS = [call_literals("copyrator", "rules.py", "RuleError", 1, "Warning"),
                default_of("copyrator", "rules.py", "RuleError", "reason", "Warning")]
_PUSH_PROBLEMS = [*_RULE_ERRORS,  # a push's reason: a stalled readiness, or what decide_push adds
                  tuple_literals("copyrator", "tally.py", "readiness", 2, "Warning", when=_is(1, True)),
                  tuple_literals("copyrator", "tally.py", "decide_push", 0, "Warning")]

# A computed reason at an emit site: (file, the expression) -> the scans that find every value it takes.
COMPUTED: dict[tuple[str, str], list[Scan]] = {
    ("core/conventions.py", "*stalled"): [],  # stall_event's own tuples (scanned as literal tuples)
    ("immortal/controller.py", "*stalled"): [],
    ("copyrator/status.py", "*stalled"): [],
    ("blackadder/notify.py", "*stalled"): [],
    ("immortal/controller.py", "decision.reason"): [
        call_literals("immortal", "decisions.py", "Decision", 1, "Normal", when=_first_arg_is("DELETE")),
        call_literals("immortal", "decisions.py", "Decision", 1, "Warning",
                      when=_first_arg_is("BLOCKED", "INVALID", "REFUSED")),
        call_literals("immortal", "controller.py", "Decision", 1, "Warning",
                      when=_first_arg_is("BLOCKED", "INVALID", "REFUSED"))],
    ("blackadder/controller.py", "decision.reason"): [  # said as a Warning when the agent is not ready
        tuple_literals("blackadder", "decisions.py", "_waiting", 1, "Warning", when=_is(0, False))],
    ("blackadder/notify.py", "reason"): [],  # announce's own parameter: its callers are emit sites
    ("copyrator/status.py", "*event"): [],  # decide_status's said tuples (scanned as literal tuples)
    ("copyrator/status.py", "problem.reason"): _RULE_ERRORS,
    ("copyrator/sources.py", "reason"): [],  # report_push's own parameter: its callers are emit sites
    ("copyrator/sources.py", "push.reason"): _RULE_ERRORS,
    ("copyrator/status.py", "reason"): _PUSH_PROBLEMS,
}


def _done_reasons() -> Iterator[Emitted]:
    """The reroller's ``_done(view, plan, message, (action, outcome, REASON))`` calls."""
    path = PACKAGE / "reroller" / "controller.py"
    for node in ast.walk(_parse(path)):
        if isinstance(node, ast.Call) and _callee(node) == "_done" and len(node.args) >= 4:
            names = node.args[3]
            if isinstance(names, ast.Tuple) and len(names.elts) == 3 and _literal(names.elts[2]):
                yield Emitted(_where(path, node), "reroller", "Normal", str(_literal(names.elts[2])))


COMPUTED[("reroller/controller.py", "reason")] = [_done_reasons]

_RUN_ENDS = {"STEADY_STATE_BROKEN": "Warning", "DURATION_ELAPSED": "Normal", "MAX_ACTIONS": "Normal"}


def _run_end_reasons() -> Iterator[Emitted]:
    """Why a Blackadder run ended (blackadder/steady.py's constants): a halt is a Warning, an end Normal."""
    path = PACKAGE / "blackadder" / "steady.py"
    for node in ast.walk(_parse(path)):
        if isinstance(node, ast.Assign) and isinstance(names := node.targets[0], ast.Tuple) \
                and isinstance(values := node.value, ast.Tuple):
            for name, value in zip(names.elts, values.elts, strict=True):
                if isinstance(name, ast.Name) and name.id in _RUN_ENDS and _literal(value):
                    yield Emitted(_where(path, node), "blackadder", _RUN_ENDS[name.id], str(_literal(value)))


COMPUTED[("blackadder/gameday.py", "why")] = [_run_end_reasons]


@functools.cache
def emitted() -> tuple[list[Emitted], list[str]]:
    """Every reason found, and every computed emit site COMPUTED does not explain."""
    found: list[Emitted] = []
    unexplained: list[str] = []
    for package in PACKAGES:
        for path, node, type_, reason in emit_sites(PACKAGE / package):
            value = _literal(reason)
            if value is not None:
                found.append(Emitted(_where(path, node), package, type_, value))
                continue
            expression = ast.unparse(reason)
            key = (str(path.relative_to(PACKAGE)), expression)
            if key not in COMPUTED:
                unexplained.append(f"{_where(path, node)}: the Event reason `{expression}` is computed; pass a "
                                   f"literal reason, or add {key!r} to COMPUTED in tests/unit/test_catalogue.py "
                                   "with a scan that finds the values it takes")
                continue
            for scan in COMPUTED[key]:
                found.extend(scan())
    return found, unexplained


def _book(package: str) -> catalogue.Catalogue:
    if package == "core":
        return catalogue.CATALOGUE
    return importlib.import_module(f"kopf_operators.{package}.catalogue").CATALOGUE


# --- the tests ---------------------------------------------------------------------------------------------


def test_every_computed_reason_is_explained() -> None:
    _, unexplained = emitted()
    assert not unexplained, "\n".join(unexplained)


def test_every_reason_the_code_emits_is_in_its_operators_catalogue() -> None:
    found, _ = emitted()
    assert len({e.reason for e in found}) >= 40  # the scan sees the emit sites (a broken scan finds none)
    missing = []
    for e in found:
        books = [_book(e.package), catalogue.CATALOGUE]
        types = {entry.type for book in books for entry in book.events if entry.reason == e.reason}
        if not types or (e.type is not None and e.type not in types):
            type_ = e.type or "Warning"
            missing.append(f"{e.where} emits {type_} {e.reason!r}: add `{catalogue.add_line(type_, e.reason)}` "
                           f"to the events of {_book(e.package).source}")
    assert not missing, "\n".join(sorted(set(missing)))


def test_every_catalogued_reason_is_emitted() -> None:
    """No stale line: a reason the code no longer says leaves its catalogue."""
    found, _ = emitted()
    said = {(e.package, e.reason) for e in found} | {("core", e.reason) for e in found}
    stale = [f"{book.source}: {entry.reason!r} is emitted nowhere in kopf_operators/{book.operator}/: remove it"
             for book in catalogue.catalogues() for entry in book.events if (book.operator, entry.reason) not in said]
    assert not stale, "\n".join(stale)


def test_every_key_the_code_defines_is_in_a_catalogue() -> None:
    catalogued = {key.key for book in catalogue.catalogues() for key in book.keys}
    missing = []
    for package in PACKAGES:
        for info in pkgutil.iter_modules([str(PACKAGE / package)]):
            module = importlib.import_module(f"kopf_operators.{package}.{info.name}")
            for name, value in sorted(vars(module).items()):
                if name.isupper() and isinstance(value, str) and KEY.match(value) and value not in catalogued:
                    missing.append(f"kopf_operators/{package}/{info.name}.py: {name} = {value!r}: add "
                                   f"`annotation({info.name}.{name}, \"<on what>\", \"you\" or \"operator\", "
                                   f"\"<meaning>\"),` (or label(...)) to the keys of "
                                   f"kopf_operators/{package}/catalogue.py")
    assert not missing, "\n".join(sorted(set(missing)))


def test_the_catalogues_are_well_formed() -> None:
    for book in catalogue.catalogues():
        reasons = [entry.reason for entry in book.events]
        assert len(reasons) == len(set(reasons)), f"{book.source}: a reason is listed twice"
        keys = [key.key for key in book.keys]
        assert len(keys) == len(set(keys)), f"{book.source}: a key is listed twice"
        for entry in book.events:
            assert REASON.match(entry.reason) and entry.type in TYPES and entry.meaning, f"{book.source}: {entry}"
        for key in book.keys:
            assert key.kind in ("annotation", "label") and key.set_by in ("you", "operator") and key.meaning


def test_the_reference_lists_every_reason_and_key() -> None:
    events, keys = reference.events_page(), reference.annotations_page()
    for book in catalogue.catalogues():
        for entry in book.events:
            assert f"| `{entry.reason}` | {entry.type} |" in events
        for key in book.keys:
            assert f"| `{key.key}` |" in keys


@pytest.mark.parametrize(("type_", "reason", "says"), [
    ("Normal", "NoSuchReason", 'add `normal("NoSuchReason", "<what it tells the user>"),`'),
    ("Normal", "Stalled", "catalogued as Warning, but emitted as Normal"),
])
def test_an_uncatalogued_event_is_refused_with_the_line_to_add(type_: str, reason: str, says: str) -> None:
    problem = catalogue.event_problem(type_, reason)
    assert problem is not None and says in problem
    assert catalogue.event_problem("Warning", "Stalled") is None


def test_the_scan_finds_every_kind_of_emit_site(tmp_path: Path) -> None:
    (tmp_path / "x.py").write_text('access.event(body, "Warning", "Alpha", "m")\n'
                                   'notes.announce(body, None, "Normal", "Beta", "m", log)\n'
                                   'report_push(body, "Gamma", "m")\n'
                                   'said = ("Warning", "Delta", "m")\n'
                                   'access.event(body, "Warning", something.reason, "m")\n'
                                   'metrics.event("pods", "processed")\n')
    found = sorted((type_, _literal(reason) or ast.unparse(reason)) for _, _, type_, reason in emit_sites(tmp_path))
    assert found == [("Normal", "Beta"), ("Warning", "Alpha"), ("Warning", "Delta"), ("Warning", "Gamma"),
                     ("Warning", "something.reason")]


def test_every_warning_has_a_troubleshooting_entry() -> None:
    """A Warning asks a person to act: docs/troubleshooting.md says what it means and what to do."""
    rows = [line for line in (REPO / "docs" / "troubleshooting.md").read_text().splitlines() if line.startswith("|")]
    missing = [f"{book.source}: Warning `{entry.reason}`" for book in catalogue.catalogues() for entry in book.events
               if entry.type == "Warning" and not any(f"`{entry.reason}`" in row for row in rows)]
    assert not missing, ("docs/troubleshooting.md has no row (symptom | cause | fix) naming:\n" + "\n".join(missing))


def test_an_uncatalogued_event_is_logged_once_as_an_error(caplog: pytest.LogCaptureFixture) -> None:
    """What Access.event does with a reason no catalogue has: one error line, however often it is posted."""
    with caplog.at_level("ERROR", logger="kopf_operators.catalogue"):
        for _ in range(3):
            catalogue.check_event("Warning", "NotInAnyCatalogue")
        catalogue.check_event("Warning", "Stalled")
    assert [r.getMessage() for r in caplog.records] == [catalogue.event_problem("Warning", "NotInAnyCatalogue")]
