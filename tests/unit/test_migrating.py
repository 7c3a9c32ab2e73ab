"""The migration guides (docs/migrating/) name only what exists on our side: every annotation or label
key under our prefixes, every spec field, environment variable, chart value and Kopf flag they name,
and every ChaosAgent or CopyratorRule in their worked examples is one our CRD schemas accept."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

import kopf.cli
import pytest
import yaml

from kopf_operators.blackadder import settings
from kopf_operators.copyrator import rules
from kopf_operators.core import conventions
from kopf_operators.reroller.catalogue import CATALOGUE as reroller_catalogue
from testsupport.paths import REPO
from testsupport.reference import environment_variables

GUIDES = REPO / "docs" / "migrating"
COPYRATOR_GUIDES = ("kubernetes-replicator.md", "reflector.md")
CHAOS_GUIDES = ("chaoskube.md", "kube-monkey.md")

OUR_KEY = re.compile(r"\b((?:copyrator\.kopf-operators\.dev|blackadder\.io)/[A-Za-z0-9][-A-Za-z0-9_.]*)")
API_VERSION = re.compile(r"^v[0-9]+((alpha|beta)[0-9]+)?$")
BACKTICKED = re.compile(r"`([^`\n]+)`")
SPEC_FIELD = re.compile(r"\bspec\.([A-Za-z][A-Za-z0-9]*(?:\.[A-Za-z][A-Za-z0-9]*)*)")
ENV_NAME = re.compile(r"^(?:COPYRATOR|CHAOS|REROLLER|METRICS)_[A-Z0-9_]+$")
CHART_VALUES = re.compile(r"\bchart(?:'s)? ((?:`[A-Za-z][A-Za-z0-9.]*`(?:/|, | and )?)+)")
METRIC = re.compile(r"^(kopf_operators_[a-z_]+)(?:\{(.*)\})?$")
KOPF_FLAGS = re.compile(r"Kopf's ((?:`--[a-z-]+`(?:/|, | and )?)+)")
YAML_BLOCK = re.compile(r"```yaml\n(.*?)```", re.S)


@functools.cache
def variables() -> frozenset[str]:
    return frozenset(environment_variables())


def text(guide: str) -> str:
    return (GUIDES / guide).read_text()


def crds() -> list[dict[str, Any]]:
    return [doc for path in sorted((REPO / "manifests" / "crds").glob("*.yaml"))
            for doc in yaml.safe_load_all(path.read_text()) if doc]


def crd_for(kind: str) -> dict[str, Any]:
    return next(crd for crd in crds() if crd["spec"]["names"]["kind"] == kind)


def spec_schema(kind: str) -> dict[str, Any]:
    schema: dict[str, Any] = crd_for(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return dict(schema["properties"]["spec"])


def our_keys() -> set[str]:
    """Every annotation and label key the two operators define (module constants; the ones Copyrator
    shares with Blackadder live in core)."""
    return {value for module in (rules, settings, conventions) for value in vars(module).values()
            if isinstance(value, str) and OUR_KEY.fullmatch(value)}


def field_exists(schema: Mapping[str, Any], path: str) -> bool:
    for part in path.split("."):
        while schema.get("type") == "array":
            schema = schema["items"]
        props = schema.get("properties") or {}
        if part not in props:
            return False
        schema = props[part]
    return True


def schema_problems(value: Any, schema: Mapping[str, Any], where: str) -> Iterator[str]:
    """What the API server's structural validation would refuse (the subset the guides can hit)."""
    if schema.get("x-kubernetes-int-or-string"):
        if not isinstance(value, int | str) or isinstance(value, bool):
            yield f"{where}: not an int or string"
        return
    kind = schema.get("type")
    if kind == "object" or (kind is None and isinstance(value, dict) and "properties" in schema):
        if not isinstance(value, dict):
            yield f"{where}: not an object"
            return
        props, extra = schema.get("properties"), schema.get("additionalProperties")
        for name in schema.get("required") or ():
            if name not in value:
                yield f"{where}.{name}: required"
        for name, item in value.items():
            if props and name in props:
                yield from schema_problems(item, props[name], f"{where}.{name}")
            elif isinstance(extra, dict):
                yield from schema_problems(item, extra, f"{where}.{name}")
            elif props and not schema.get("x-kubernetes-preserve-unknown-fields"):
                yield f"{where}.{name}: unknown field"
    elif kind == "array":
        if not isinstance(value, list):
            yield f"{where}: not a list"
            return
        for i, item in enumerate(value):
            yield from schema_problems(item, schema.get("items") or {}, f"{where}[{i}]")
    elif kind == "string" and not isinstance(value, str):
        yield f"{where}: not a string ({value!r})"
    elif kind == "integer" and (not isinstance(value, int) or isinstance(value, bool)):
        yield f"{where}: not an integer ({value!r})"
    elif kind == "boolean" and not isinstance(value, bool):
        yield f"{where}: not a boolean ({value!r})"
    if isinstance(value, str):
        if "enum" in schema and value not in schema["enum"]:
            yield f"{where}: {value!r} not one of {schema['enum']}"
        if "pattern" in schema and not re.search(schema["pattern"], value):
            yield f"{where}: {value!r} does not match {schema['pattern']}"
    if isinstance(value, int) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            yield f"{where}: {value} below {schema['minimum']}"
        if "maximum" in schema and value > schema["maximum"]:
            yield f"{where}: {value} above {schema['maximum']}"


def examples(guide: str) -> Iterator[dict[str, Any]]:
    for block in YAML_BLOCK.findall(text(guide)):
        yield from (doc for doc in yaml.safe_load_all(block) if doc)


def chart_value_exists(path: str) -> bool:
    schema = json.loads((REPO / "charts" / "kopf-operators" / "values.schema.json").read_text())
    return field_exists(schema, path)


ALL_GUIDES = sorted(p.name for p in GUIDES.glob("*.md"))


def test_every_peer_has_a_guide_and_the_index_links_them() -> None:
    index = text("README.md")
    for guide in (*COPYRATOR_GUIDES, *CHAOS_GUIDES):
        assert f"]({guide})" in index, f"docs/migrating/README.md does not link {guide}"
    assert "](../reroller.md)" in index and "](reloader.md)" in index


def test_the_reloader_guide_maps_every_reloader_key_the_reroller_reads() -> None:
    guide = text("reloader.md")
    keys = [key.key for key in reroller_catalogue.keys if "reloader.stakater.com/" in key.key]
    assert len(keys) >= 12
    missing = [key for key in keys if f"`{key}`" not in guide]
    assert not missing, f"docs/migrating/reloader.md does not map: {missing}"


@pytest.mark.parametrize("guide", ALL_GUIDES)
def test_every_key_under_our_prefixes_exists_in_the_code(guide: str) -> None:
    known, served = our_keys(), {v["name"] for v in crd_for("ChaosAgent")["spec"]["versions"]}
    named = set(OUR_KEY.findall(text(guide)))
    versions = {k for k in named if API_VERSION.match(k.partition("/")[2])}
    assert {f"blackadder.io/{v}" for v in served} >= versions, f"{guide}: API versions not served"
    missing = sorted(named - versions - known)
    assert not missing, f"{guide} names keys our code does not define: {missing}"


def test_the_guides_name_the_keys_a_peers_user_needs() -> None:
    """The scan above finds something: the keys each translation hinges on are named."""
    named = {k for g in ALL_GUIDES for k in OUR_KEY.findall(text(g))}
    assert {rules.ALLOWED_NAMESPACES_ANNOTATION, rules.PUSH_TO_ANNOTATION,
            rules.PUSH_TO_MATCHING_ANNOTATION, settings.MTBF_LABEL, settings.KILL_MODE_LABEL,
            settings.KILL_VALUE_LABEL, settings.OPT_LABEL} <= named


@pytest.mark.parametrize("guide,kind", [*((g, "CopyratorRule") for g in COPYRATOR_GUIDES),
                                        *((g, "ChaosAgent") for g in CHAOS_GUIDES)])
def test_every_spec_field_named_exists_in_the_crd(guide: str, kind: str) -> None:
    schema = spec_schema(kind)
    fields = {m for span in BACKTICKED.findall(text(guide)) for m in SPEC_FIELD.findall(span)}
    assert len(fields) >= 5, f"{guide}: the scan found almost no spec fields: {sorted(fields)}"
    missing = sorted(f for f in fields if not field_exists(schema, f))
    assert not missing, f"{guide} names {kind} fields the CRD does not have: {missing}"


@pytest.mark.parametrize("guide", ALL_GUIDES)
def test_variables_chart_values_and_kopf_flags_named_exist(guide: str) -> None:
    body = text(guide)
    spans = BACKTICKED.findall(body)
    names = {s.split("=")[0] for s in spans if ENV_NAME.match(s.split("=")[0])}
    unknown = sorted(names - variables())
    assert not unknown, f"{guide} names variables the code does not read: {unknown}"
    values = {s.split(":")[0] for s in spans if s.startswith("operators.")}
    values |= {v for run in CHART_VALUES.findall(body) for v in BACKTICKED.findall(run)}
    unknown = sorted(v for v in values if not chart_value_exists(v))
    assert not unknown, f"{guide} names chart values the chart's schema does not have: {unknown}"
    metrics_page = (REPO / "docs" / "reference" / "metrics.md").read_text()
    source = "\n".join(p.read_text() for p in (REPO / "kopf_operators").rglob("*.py"))
    for family, labels in (m.groups() for m in map(METRIC.match, spans) if m):
        assert f"`{family}`" in metrics_page, f"{guide}: no metric {family}"
        for value in re.findall(r'="([^"]*)"', labels or ""):
            assert f'"{value}"' in source, f"{guide}: no code writes the label value {value!r}"
    flags = set(re.findall(r"--[a-z-]+", " ".join(KOPF_FLAGS.findall(body))))
    options = {opt for param in kopf.cli.run.params for opt in param.opts}
    assert not sorted(flags - options), f"{guide} names flags `kopf run` does not have: {flags - options}"


@pytest.mark.parametrize("guide", ALL_GUIDES)
def test_worked_examples_pass_our_crd_schemas(guide: str) -> None:
    ours = {(c["spec"]["group"], c["spec"]["names"]["kind"]): c for c in crds()}
    checked = 0
    for doc in examples(guide):
        group, _, version = str(doc.get("apiVersion", "")).rpartition("/")
        crd = ours.get((group, doc.get("kind")))
        if crd is None:
            continue
        served = {v["name"]: v for v in crd["spec"]["versions"] if v.get("served")}
        assert version in served, f"{guide}: {doc['apiVersion']} is not served"
        schema = served[version]["schema"]["openAPIV3Schema"]
        body = {k: v for k, v in doc.items() if k not in ("apiVersion", "kind", "metadata")}
        problems = list(schema_problems(body, schema, doc["kind"]))
        assert not problems, f"{guide}: {doc['kind']} {doc['metadata'].get('name')}: {problems}"
        checked += 1
    if guide in (*COPYRATOR_GUIDES, *CHAOS_GUIDES):
        assert checked, f"{guide}: no worked example of ours found"


def test_the_schema_check_refuses_what_the_api_server_would() -> None:
    """The checker itself can fail: an unknown field, a bad enum, a missing required field."""
    agent = {"apiVersion": "blackadder.io/v1beta1", "kind": "ChaosAgent", "metadata": {"name": "a"},
             "spec": {"tantrumMode": True, "podSelectr": {},
                      "activeWindows": [{"weekdays": ["Monday"], "from": "09:00"}]}}
    schema = crd_for("ChaosAgent")["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    found = "\n".join(schema_problems(agent, schema, "ChaosAgent"))
    assert "spec.podSelectr: unknown field" in found
    assert "weekdays[0]: 'Monday' not one of" in found
    assert "activeWindows[0].to: required" in found
    assert "spec.eagerness: required" in found
