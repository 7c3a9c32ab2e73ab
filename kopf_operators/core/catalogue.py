"""The catalogue of what an operator shows a user outside its CRDs: the Event reasons it emits and the
annotations and labels it reads or writes. Each operator declares its own in
``kopf_operators/<operator>/catalogue.py`` (one line per entry); the Events every operator emits
(``Stalled``, ``Recovered``) are declared here.

- docs/reference/events.md and docs/reference/annotations.md are generated from the catalogues
  (testsupport/reference.py);
- ``Access.event`` looks every Event it posts up here, and logs an error for a reason no catalogue
  declares (the Event is still posted: a missing line of documentation never hides an Event);
- tests/unit/test_catalogue.py fails when the code emits a reason, or defines a key, that its
  operator's catalogue lacks, and says which line to add where.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import logging
from typing import Literal

from kopf_operators.core.conventions import OPERATOR_NAMES

logger = logging.getLogger("kopf_operators.catalogue")

EventType = Literal["Normal", "Warning"]
KeyKind = Literal["annotation", "label"]
SetBy = Literal["you", "operator"]


@dataclasses.dataclass(frozen=True)
class EventReason:
    reason: str
    type: EventType
    meaning: str


@dataclasses.dataclass(frozen=True)
class Key:
    key: str
    kind: KeyKind
    on: str  # the objects it goes on
    set_by: SetBy  # who writes it: "you" (the operator reads it) or the "operator"
    meaning: str


def normal(reason: str, meaning: str) -> EventReason:
    return EventReason(reason, "Normal", meaning)


def warning(reason: str, meaning: str) -> EventReason:
    return EventReason(reason, "Warning", meaning)


def annotation(key: str, on: str, set_by: SetBy, meaning: str) -> Key:
    return Key(key, "annotation", on, set_by, meaning)


def label(key: str, on: str, set_by: SetBy, meaning: str) -> Key:
    return Key(key, "label", on, set_by, meaning)


@dataclasses.dataclass(frozen=True)
class Catalogue:
    operator: str  # "core" for what all operators share
    events_on: str  # the objects its Events are posted on
    events: tuple[EventReason, ...] = ()
    keys: tuple[Key, ...] = ()

    @property
    def source(self) -> str:
        return "kopf_operators/core/catalogue.py" if self.operator == "core" else \
            f"kopf_operators/{self.operator}/catalogue.py"


CATALOGUE = Catalogue("core", "the object whose Stalled condition changed", events=(
    warning("Stalled", "the object's Stalled condition turned True (or its reason changed): the operator cannot "
                       "make progress until a person acts; the message is the condition's reason and message"),
    normal("Recovered", "the object's Stalled condition turned False again"),
))


@functools.cache
def catalogues() -> tuple[Catalogue, ...]:
    """The shared catalogue, then each operator's, in OPERATOR_NAMES order."""
    found = [CATALOGUE]
    for name in OPERATOR_NAMES:
        found.append(importlib.import_module(f"kopf_operators.{name}.catalogue").CATALOGUE)
    return tuple(found)


@functools.cache
def _events() -> dict[str, set[str]]:
    known: dict[str, set[str]] = {}
    for catalogue in catalogues():
        for entry in catalogue.events:
            known.setdefault(entry.reason, set()).add(entry.type)
    return known


def add_line(type_: str, reason: str) -> str:
    """The catalogue line that declares an Event reason."""
    return f'{type_.lower()}("{reason}", "<what it tells the user>"),'


def event_problem(type_: str, reason: str) -> str | None:
    """Why an Event of this type and reason is not in the catalogues, or None when it is."""
    types = _events().get(reason)
    if types is None:
        return (f"Event reason {reason!r} ({type_}) is in no catalogue: add `{add_line(type_, reason)}` to the "
                "events of kopf_operators/<operator>/catalogue.py (the operator that emits it)")
    if type_ not in types:
        return (f"Event reason {reason!r} is catalogued as {'/'.join(sorted(types))}, but emitted as {type_}: "
                "emit it with its catalogued type, or fix the catalogue")
    return None


@functools.cache  # once per (type, reason) and process: an error line, not one per Event
def check_event(type_: str, reason: str) -> None:
    problem = event_problem(type_, reason)
    if problem:
        logger.error(problem)
