"""The chart's monitoring, network policy, values schema and pod extras (issue #19), on the real API server.

The monitoring.coreos.com CRDs come from prometheus-operator's Go module (cluster/monitoring.sh; no
controller runs); `promtool` from Prometheus' module checks the alert rules; the dashboard and the alerts
must name only metrics a running operator really serves on /metrics.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import promql_parser
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.kube import Grant, OperatorProcess, account_grants, chart_objects, wait_for
from testsupport.kubectl import kubectl
from testsupport.paths import REPO, helm_binary, kube_version

CHART = REPO / "charts" / "kopf-operators"
PRIORITY_CLASS = "kopf-operators-chart-test"
# Every optional feature on (sharding too: the down alert then has one expression per shard).
ALL_ON = (
    "serviceMonitor.enabled=true", "serviceMonitor.labels.release=prometheus",
    "podMonitor.enabled=true", "prometheusRule.enabled=true", "prometheusRule.labels.release=prometheus",
    "grafanaDashboard.enabled=true", "grafanaDashboard.annotations.grafana_folder=Operators",
    "networkPolicy.enabled=true", "sharding.enabled=true", "sharding.shards=2",
    f"priorityClassName={PRIORITY_CLASS}", "podAnnotations.team=platform", "podLabels.tier=operators",
    "imagePullSecrets[0].name=registry", "extraEnv[0].name=HTTPS_PROXY", "extraEnv[0].value=",
    "metrics.service.annotations.note=scraped", "operators.blackadder.tenants.enabled=true",
    "serviceAccount.annotations.iam\\.gke\\.io/gcp-service-account=ops@example.iam.gserviceaccount.com",
    "topologySpreadConstraints[0].maxSkew=1", "topologySpreadConstraints[0].topologyKey=kubernetes.io/hostname",
    "topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway",
    "serviceMonitor.honorLabels=true", "podMonitor.honorLabels=true",
)
ALL_OFF = (
    "replicaCount=1", "metrics.enabled=false", "metrics.service.enabled=false", "rbac.create=false",
    "serviceAccount.create=false",
    "leaderElection.enabled=false", "serviceMonitor.enabled=false", "podMonitor.enabled=false",
    "prometheusRule.enabled=false", "grafanaDashboard.enabled=false", "networkPolicy.enabled=false",
    "sharding.enabled=false", "operators.blackadder.dryRun=false",
)
# The one series a query may name that no operator serves: Prometheus writes `up` for every target.
PROMETHEUS_OWN = {"up"}


@pytest.fixture(scope="module")
def monitoring(crds: None) -> Path:
    """prometheus-operator's ServiceMonitor, PodMonitor and PrometheusRule CRDs on the cluster, and promtool."""
    out = subprocess.run([str(REPO / "cluster" / "monitoring.sh")], capture_output=True, text=True, check=True)
    tools = Path(out.stdout.strip())
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(tools / "crds"))
    kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(tools / "crds"))
    return tools


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(helm_binary()), *args], capture_output=True, text=True)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def sets(*values: str) -> list[str]:
    return [arg for value in values for arg in ("--set", value)]


def render(*values: str) -> list[dict[str, Any]]:
    return chart_objects("kopf-operators", "kopf-operators", *values)


@pytest.fixture
def release(monitoring: Path, core: kubernetes.client.CoreV1Api) -> Iterator[tuple[str, str]]:
    """A release name and its own namespace; uninstalled and deleted afterwards."""
    name = f"chart-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": name, "labels": {"kopf-operators.dev/test": "true"}}})
    kubectl("apply", "-f", "-", input=f"apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\n"
                                       f"metadata: {{name: {PRIORITY_CLASS}}}\nvalue: 1000\n")
    yield name, name
    helm("uninstall", name, "--namespace", name, "--wait", "--timeout", "60s", check=False)
    kubectl("delete", "namespace", name, "--ignore-not-found", "--wait=false")


@pytest.mark.parametrize("values", [pytest.param(ALL_ON, id="every-option-on"),
                                    pytest.param((*ALL_ON, "deploymentMode=perOperator"), id="per-operator"),
                                    pytest.param(ALL_OFF, id="every-option-off")])
def test_helm_install_is_accepted_by_the_api_server(
        release: tuple[str, str], values: tuple[str, ...], core: kubernetes.client.CoreV1Api) -> None:
    name, namespace = release
    notes = helm("install", name, str(CHART), "--namespace", namespace, *sets(*values)).stdout
    manifest = [doc for doc in yaml.safe_load_all(helm("get", "manifest", name, "--namespace", namespace).stdout)
                if doc]
    kinds = sorted({doc["kind"] for doc in manifest})
    # Every object the release renders is stored: the API server (and the CRDs' schemas) accepted it.
    for doc in manifest:
        ns = doc["metadata"].get("namespace")
        got = kubectl("get", doc["kind"], doc["metadata"]["name"], *(["-n", ns] if ns else []), "-o", "name",
                      check=False)
        assert got.returncode == 0, f"{doc['kind']} {doc['metadata']['name']}: {got.stderr}"
    optional = {"Service", "ServiceMonitor", "PodMonitor", "PrometheusRule", "NetworkPolicy", "ConfigMap"}
    if values is not ALL_OFF:
        assert optional <= set(kinds), kinds
        # NOTES.txt tells what runs and what to watch out for.
        assert "dry-run is FORCED for every ChaosAgent" in notes
        assert "WARNING: both a ServiceMonitor and a PodMonitor are enabled" in notes
        assert f"Alerts: PrometheusRule {name}-kopf-operators" in notes
        # The NetworkPolicy's API server egress is what the `kubernetes` Service really leads to.
        policy = next(doc for doc in manifest if doc["kind"] == "NetworkPolicy")
        endpoints = kubectl("get", "endpointslices", "-n", "default", "-l", "kubernetes.io/service-name=kubernetes",
                            "-o", "json")
        slice_ = json.loads(endpoints.stdout)["items"][0]
        api_egress = policy["spec"]["egress"][0]
        assert [peer["ipBlock"]["cidr"] for peer in api_egress["to"]] == [
            f"{address}/32" for ep in slice_["endpoints"] for address in ep["addresses"]]
        assert [p["port"] for p in api_egress["ports"]] == [p["port"] for p in slice_["ports"]]
        # The pods were admitted with the extras (the PriorityClass resolved to its value).
        replicas = sum(doc["spec"]["replicas"] for doc in manifest if doc["kind"] == "Deployment")

        def running_pods() -> list[Any]:
            found = core.list_namespaced_pod(namespace, label_selector=f"app.kubernetes.io/instance={name}").items
            return found if len(found) == replicas and all(pod.status.pod_ip for pod in found) else []

        pods = wait_for(running_pods, timeout=60, what=f"the release's {replicas} pods with their IPs")
        for pod in pods:
            assert pod.spec.priority == 1000 and pod.spec.priority_class_name == PRIORITY_CLASS
            assert pod.metadata.labels["tier"] == "operators" and pod.metadata.annotations["team"] == "platform"
            assert [s.name for s in pod.spec.image_pull_secrets] == ["registry"]
            assert "HTTPS_PROXY" in [e.name for e in pod.spec.containers[0].env]
        # What the monitors scrape: the metrics Service's endpoints are every pod's metrics port (the
        # ServiceMonitor's way), and every pod matches the PodMonitor's selector with a `metrics` port.
        monitors = {doc["kind"]: doc for doc in manifest if doc["kind"] in ("ServiceMonitor", "PodMonitor")}
        service = next(doc for doc in manifest if doc["kind"] == "Service")
        assert monitors["ServiceMonitor"]["spec"]["selector"]["matchLabels"].items() <= service["metadata"][
            "labels"].items()

        def scraped_endpoints() -> set[tuple[str, int]]:
            slices = json.loads(kubectl("get", "endpointslices", "-n", namespace, "-o", "json", "-l",
                                        f"kubernetes.io/service-name={service['metadata']['name']}").stdout)
            return {(address, port["port"]) for item in slices["items"] for ep in item.get("endpoints") or ()
                    if (ep.get("conditions") or {}).get("ready") for address in ep["addresses"]
                    for port in item.get("ports") or () if port["name"] == "metrics"}

        expected = {(pod.status.pod_ip, 9090) for pod in pods}
        wait_for(lambda: scraped_endpoints() == expected, timeout=60,
                 what=f"the metrics Service's endpoints to be {expected}")
        selector = monitors["PodMonitor"]["spec"]["selector"]["matchLabels"]
        for pod in pods:
            assert selector.items() <= pod.metadata.labels.items()
            assert 9090 in [p.container_port for p in pod.spec.containers[0].ports if p.name == "metrics"]
    else:
        assert not optional & set(kinds), kinds
        assert "dry-run is OFF: ChaosAgents act for real" in notes and "Metrics are off" in notes
        assert kinds == ["Deployment"]


def test_chart_lints_strictly_with_every_option_on() -> None:
    # `helm lint` reads no cluster: the NetworkPolicy's API server is given, as `helm template` users must.
    result = helm("lint", "--strict", str(CHART), "--kube-version", kube_version(), *sets(
        *ALL_ON, "networkPolicy.apiServer.cidrs={10.0.0.1/32}", "networkPolicy.apiServer.ports={6443}"))
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize(("value", "message"), [
    ("logLevel=loud", "at '/logLevel': value must be one of 'quiet', 'info', 'verbose', 'debug'"),
    ("serviceMonitr.enabled=true", "at '': additional properties 'serviceMonitr' not allowed"),
    ("serviceMonitor.interval=often", "at '/serviceMonitor/interval': 'often' does not match pattern"),
    ("metrics.port=99999", "at '/metrics/port': maximum: got 99,999, want 65,535"),
    ("operators.blackadder.dryRun=maybe", "at '/operators/blackadder/dryRun': got string, want boolean"),
    ("networkPolicy.apiServer.cidrs={10.0.0.1}", "at '/networkPolicy/apiServer/cidrs/0': '10.0.0.1' does not match"),
    ("metrics.port=8080", "metrics.port: 8080 is the operator's health port; choose another"),
    ("extraEnv[0].name=CHAOS_DRY_RUN", "extraEnv: CHAOS_DRY_RUN is set by the chart from its values"),
    ("nameOverride=Ops_Team", "at '/nameOverride': 'Ops_Team' does not match pattern"),
    ("topologySpreadConstraints=zone", "at '/topologySpreadConstraints': got string, want array"),
    ("operators.reroller.cronjobMode=restart-active",
     "restart-active deletes pods: set operators.reroller.allowRestartActive=true too"),
    ("operators.copyrator.tenantRules=true",
     "tenantRules lets namespace admins write CopyratorRules: set operators.copyrator.rulesNeedTargetConsent=true"),
])
def test_helm_install_refuses_a_wrong_value_with_a_readable_message(
        release: tuple[str, str], value: str, message: str) -> None:
    name, namespace = release
    result = helm("install", name, str(CHART), "--namespace", namespace, "--set", value, check=False)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
    assert helm("status", name, "--namespace", namespace, check=False).returncode != 0, "a release was created"


def test_tenant_rules_go_to_namespace_admins_only_and_only_with_target_consent() -> None:
    """A namespace editor may not write rules (a rule is a standing order to the operator); the
    chart renders the aggregated role only together with rulesNeedTargetConsent."""
    objects = render("operators.copyrator.tenantRules=true", "operators.copyrator.rulesNeedTargetConsent=true")
    roles = [o for o in objects
             if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith("-copyrator-rules-admin")]
    assert len(roles) == 1
    aggregated = {k for k, v in roles[0]["metadata"]["labels"].items() if k.startswith("rbac.authorization.k8s.io/")}
    assert aggregated == {"rbac.authorization.k8s.io/aggregate-to-admin"}
    deployment = next(d for d in objects if d["kind"] == "Deployment")
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["COPYRATOR_RULES_NEED_TARGET_CONSENT"] == "true"


def test_extra_env_cannot_shadow_a_variable_the_chart_sets() -> None:
    deployment = next(d for d in render("sharding.enabled=true") if d["kind"] == "Deployment")
    rendered = {e["name"] for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "CHAOS_DRY_RUN" in rendered and "SHARD_INDEX" in rendered
    # Also the variables rendered only under some values (alerts, tenants...): every name the template sets.
    in_template = set(re.findall(r"- name: ([A-Z][A-Z0-9_]+)", (CHART / "templates" / "deployment.yaml").read_text()))
    assert rendered <= in_template
    for env_name in sorted(in_template):
        result = helm("template", "x", str(CHART), "--kube-version", kube_version(),
                      "--set", f"extraEnv[0].name={env_name}", "--set-string", "extraEnv[0].value=1", check=False)
        assert result.returncode != 0 and f"extraEnv: {env_name} is set by the chart" in result.stderr, env_name


def test_schema_describes_every_value_in_values_yaml() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(value: Any, node: dict[str, Any], path: str) -> None:
        assert "type" in node or "oneOf" in node, f"{path}: no type in the schema"
        if isinstance(value, dict) and "properties" in node:
            assert node.get("additionalProperties") is False, f"{path}: unknown keys would pass"
            for key, child in value.items():
                assert key in node["properties"], f"{path}.{key}: not in values.schema.json"
                walk(child, node["properties"][key], f"{path}.{key}")

    walk(values, schema, "")



# --- the knobs of a platform's chart ----------------------------------------------------------------

def deployments(*values: str) -> list[dict[str, Any]]:
    return [d for d in render(*values) if d["kind"] == "Deployment"]


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    return dict(deployment["spec"]["template"]["spec"]["containers"][0])


def test_defaults_stay_hardened_and_probe_kopfs_health_endpoint() -> None:
    for deployment in deployments():
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001,
                                          "seccompProfile": {"type": "RuntimeDefault"}}
        operator = container(deployment)
        assert operator["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                               "capabilities": {"drop": ["ALL"]}}
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            assert operator[probe]["httpGet"] == {"path": "/healthz", "port": "health"}, probe
        # A start over many objects gets minutes before liveness counts (a start with 20,000 objects: ~30 s).
        startup = operator["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 300


def test_openshift_drops_the_fixed_ids_and_a_probe_can_be_left_out() -> None:
    deployment, = deployments("podSecurityContext.runAsUser=null", "podSecurityContext.runAsGroup=null",
                              "startupProbe=null", "readinessProbe=null")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    assert "startupProbe" not in container(deployment) and "readinessProbe" not in container(deployment)
    assert container(deployment)["livenessProbe"]["httpGet"]["path"] == "/healthz"


@pytest.mark.parametrize("mode", ["bundle", "perOperator"])
def test_spread_and_cloud_identity_reach_every_deployment_and_account(mode: str) -> None:
    objects = render(f"deploymentMode={mode}", "serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn=arn:x",
                     "topologySpreadConstraints[0].maxSkew=1",
                     "topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone",
                     "topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway")
    accounts = [d for d in objects if d["kind"] == "ServiceAccount"]
    assert len(accounts) == (4 if mode == "perOperator" else 1)
    assert all(a["metadata"]["annotations"] == {"eks.amazonaws.com/role-arn": "arn:x"} for a in accounts)
    for deployment in (d for d in objects if d["kind"] == "Deployment"):
        spread, = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
        # Without a labelSelector of its own, a constraint counts exactly this Deployment's pods.
        assert spread["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
        assert spread["topologyKey"] == "topology.kubernetes.io/zone"


def test_name_overrides_name_every_object_and_the_chart_label_is_on_each() -> None:
    for values, prefix, name in [((), "r-kopf-operators", "kopf-operators"),
                                 (("nameOverride=ops",), "r-ops", "ops"),
                                 (("fullnameOverride=platform-operators",), "platform-operators", "kopf-operators")]:
        objects = chart_objects("r", "kopf-operators", *values)
        for doc in objects:
            labels = doc["metadata"]["labels"]
            assert labels["helm.sh/chart"] == "kopf-operators-" + yaml.safe_load(
                (CHART / "Chart.yaml").read_text())["version"], doc["metadata"]["name"]
            assert labels["app.kubernetes.io/name"] == name
            assert doc["metadata"]["name"].startswith(prefix), (values, doc["kind"], doc["metadata"]["name"])
        deployment = next(d for d in objects if d["kind"] == "Deployment")
        assert deployment["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == name


def test_monitors_honor_the_scraped_labels_only_when_asked() -> None:
    for honor in (False, True):
        monitors = [d for d in render("serviceMonitor.enabled=true", "podMonitor.enabled=true",
                                      f"serviceMonitor.honorLabels={str(honor).lower()}",
                                      f"podMonitor.honorLabels={str(honor).lower()}")
                    if d["kind"] in ("ServiceMonitor", "PodMonitor")]
        assert len(monitors) == 2
        for monitor in monitors:
            endpoints = monitor["spec"].get("endpoints") or monitor["spec"]["podMetricsEndpoints"]
            assert [e["honorLabels"] for e in endpoints] == [honor]

# --- alerts and dashboard ---------------------------------------------------------------------------

def alert_groups(*values: str) -> list[dict[str, Any]]:
    rule = next(d for d in render("prometheusRule.enabled=true", *values) if d["kind"] == "PrometheusRule")
    return list(rule["spec"]["groups"])


def dashboard(*values: str) -> dict[str, Any]:
    config = next(d for d in render("grafanaDashboard.enabled=true", *values) if d["kind"] == "ConfigMap")
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
    return dict(json.loads(config["data"]["kopf-operators.json"]))


def dashboard_queries(board: dict[str, Any]) -> list[str]:
    # Grafana's own interval variable is no PromQL; any duration stands in for it.
    return [t["expr"].replace("$__rate_interval", "5m") for p in board["panels"] for t in p["targets"]]


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (parsed, not pattern-matched)."""
    names: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            assert node.name, f"a selector without a metric name in {expr}"
            names.add(node.name)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


def served_metric_names(text: str) -> set[str]:
    """Every series name an operator's /metrics offers, labelled children or not yet."""
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created"),
                "summary": ("", "_count", "_sum", "_created"), "gauge": ("",), "info": ("_info",),
                "unknown": ("",)}
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.update(family.name + suffix for suffix in suffixes[family.type])
        names.update(sample.name for sample in family.samples)
    return names


def test_every_alert_and_dashboard_query_names_a_metric_the_operator_serves(operator: OperatorProcess) -> None:
    served = served_metric_names(operator.metrics())
    assert "kopf_operators_reaction_seconds_bucket" in served and "process_resident_memory_bytes" in served
    queries = [rule["expr"] for group in alert_groups("sharding.enabled=true") for rule in group["rules"]]
    queries += dashboard_queries(dashboard())
    assert len(queries) >= 15
    for query in queries:
        unknown = metric_names(query) - served - PROMETHEUS_OWN
        assert not unknown, f"{query} names {unknown}, which the operator does not serve"
    # The chaos alert's action names are the ones Blackadder counts for real actions.
    chaos = next(rule["expr"] for group in alert_groups() for rule in group["rules"]
                 if rule["alert"] == "KopfOperatorsChaosWhileDryRun")
    counted = {action for module in (REPO / "kopf_operators" / "blackadder").glob("*.py")
               for action in re.findall(r'metrics\.action\(OPERATOR, "([a-z-]+)"\)', module.read_text())}
    actions = set(re.search(r'action=~"([^"]+)"', chaos).group(1).split("|"))  # type: ignore[union-attr]
    assert actions <= counted, actions - counted


def test_alert_rules_and_dashboard_queries_pass_promtool(monitoring: Path, tmp_path: Path) -> None:
    groups = alert_groups("sharding.enabled=true", "prometheusRule.additionalRules[0].alert=Extra",
                          "prometheusRule.additionalRules[0].expr=vector(1)")
    alerts = {rule["alert"] for group in groups for rule in group["rules"]}
    assert {"KopfOperatorsDown", "KopfOperatorsErrorRateHigh", "KopfOperatorsReactionSlow",
            "KopfOperatorsEventLoopLag", "KopfOperatorsChaosWhileDryRun", "Extra"} <= alerts
    # The dashboard's queries as recording rules: promtool parses each one too.
    recorded = [{"record": f"kopf_operators:dashboard_query_{i}", "expr": q}
                for i, q in enumerate(dashboard_queries(dashboard()))]
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": [*groups, {"name": "dashboard", "rules": recorded}]}))
    result = subprocess.run([str(monitoring / "promtool"), "check", "rules", str(rules)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {sum(len(g['rules']) for g in groups) + len(recorded)} rules found" in result.stdout


def test_chaos_alert_follows_the_dry_run_the_chart_forces() -> None:
    def alerts(*values: str) -> set[str]:
        return {rule["alert"] for group in alert_groups(*values) for rule in group["rules"]}

    assert "KopfOperatorsChaosWhileDryRun" in alerts()
    assert "KopfOperatorsChaosWhileDryRun" not in alerts("operators.blackadder.dryRun=false")


def test_alerts_and_dashboard_select_the_series_the_monitors_label() -> None:
    objects = render("serviceMonitor.enabled=true", "podMonitor.enabled=true", "prometheusRule.enabled=true",
                     "grafanaDashboard.enabled=true")
    selector = 'job="kopf-operators",namespace="kopf-operators"'
    for kind, endpoints in (("ServiceMonitor", "endpoints"), ("PodMonitor", "podMetricsEndpoints")):
        monitor = next(d for d in objects if d["kind"] == kind)
        relabel = monitor["spec"][endpoints][0]["relabelings"][0]
        assert relabel == {"action": "replace", "targetLabel": "job", "replacement": "kopf-operators"}
        assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["kopf-operators"]}
    queries = [r["expr"] for g in alert_groups() for r in g["rules"]] + dashboard_queries(dashboard())
    for query in queries:
        assert selector in query, query
    custom = 'job="elsewhere"'
    assert all(custom in r["expr"] for g in alert_groups(f"prometheusRule.selector={custom}") for r in g["rules"])


def test_alerts_fire_on_the_series_they_watch_and_only_then(monitoring: Path, tmp_path: Path) -> None:
    """Prometheus' own rule engine (`promtool test rules`) on synthetic series with the operator's metric
    names and labels: each alert fires when its condition holds long enough, and not otherwise."""
    groups = alert_groups("sharding.enabled=true")
    for group in groups:  # annotation templates are checked by `promtool check rules`; compare the rest
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    this = 'job="kopf-operators",namespace="kopf-operators"'
    release = {"job": "kopf-operators", "namespace": "kopf-operators"}

    def fires(alert: str, at: str, *labels: dict[str, str]) -> dict[str, Any]:
        return {"eval_time": at, "alertname": alert, "exp_alerts": [{"exp_labels": dict(lbl)} for lbl in labels]}

    bucket = "kopf_operators_reaction_seconds_bucket"
    series = [
        # Shard 0 answers, then fails from minute 10; shard 1 is never scraped at all.
        (f'up{{{this},shard="0",pod="p0"}}', "1x10 0x30"),
        # copyrator's write errors: 1/s (above 0.05/s); immortal's: 1/min (below).
        (f'kopf_operators_errors_total{{{this},operator="copyrator",kind="write"}}', "0+60x40"),
        (f'kopf_operators_errors_total{{{this},operator="immortal",kind="api"}}', "0+1x40"),
        # 403s at 1/s (above 0.1/s); 409s, expected conflicts, at 10/s.
        (f'kopf_operators_api_errors_total{{{this},status="403"}}', "0+60x40"),
        (f'kopf_operators_api_errors_total{{{this},status="409"}}', "0+600x40"),
        # immortal's reactions all take 10-30 s; reroller's all under 0.1 s.
        *[(f'{bucket}{{{this},operator="immortal",trigger="pod deleted",le="{le}"}}',
           "0+60x40" if le in ("30.0", "+Inf") else "0x40") for le in ("0.1", "10.0", "30.0", "+Inf")],
        *[(f'{bucket}{{{this},operator="reroller",trigger="configmap",le="{le}"}}', "0+60x40")
          for le in ("0.1", "10.0", "30.0", "+Inf")],
        # One real pod kill from minute 20; webhooks are no chaos.
        (f'kopf_operators_actions_total{{{this},operator="blackadder",action="pod-killed",pod="p0"}}', "_x20 1x20"),
        (f'kopf_operators_actions_total{{{this},operator="blackadder",action="webhook",pod="p0"}}', "0+5x40"),
        # p0's loop is held (3 s late) from minute 11 to 20; p1's is late once, at minute 5, for one sample.
        (f'kopf_operators_event_loop_lag_seconds{{{this},pod="p0"}}', "0.01x10 3x9 0.01x20"),
        (f'kopf_operators_event_loop_lag_seconds{{{this},pod="p1"}}', "0.01x4 5 0.01x35"),
    ]
    tests = [
        fires("KopfOperatorsDown", "4m"),  # shard 1 missing, but not yet for 5 minutes
        fires("KopfOperatorsDown", "6m", {**release, "shard": "1", "severity": "critical"}),
        fires("KopfOperatorsDown", "17m", {**release, "shard": "0", "severity": "critical"},
              {**release, "shard": "1", "severity": "critical"}),
        fires("KopfOperatorsErrorRateHigh", "10m"),
        fires("KopfOperatorsErrorRateHigh", "30m", {"operator": "copyrator", "kind": "write", "severity": "warning"}),
        fires("KopfOperatorsApiErrorRateHigh", "30m", {"status": "403", "severity": "warning"}),
        fires("KopfOperatorsReactionSlow", "30m", {"operator": "immortal", "severity": "warning"}),
        fires("KopfOperatorsEventLoopLag", "6m"),  # p1's single late wake: not for 2 minutes
        fires("KopfOperatorsEventLoopLag", "12m"),  # p0 late for 1 minute only
        fires("KopfOperatorsEventLoopLag", "15m", {"namespace": "kopf-operators", "pod": "p0", "severity": "warning"}),
        fires("KopfOperatorsEventLoopLag", "25m"),  # p0's loop free again
        fires("KopfOperatorsChaosWhileDryRun", "19m"),
        fires("KopfOperatorsChaosWhileDryRun", "21m", {"namespace": "kopf-operators", "pod": "p0",
                                                       "action": "pod-killed", "severity": "critical"}),
    ]
    spec = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": [{"series": s, "values": v} for s, v in series],
                       "alert_rule_test": tests}]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(spec))
    result = subprocess.run([str(monitoring / "promtool"), "test", "rules", "test.yaml"], cwd=tmp_path,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


# --- least privilege: deploymentMode, RBAC that follows the settings, releases side by side ----------

OPERATORS = ("immortal", "copyrator", "blackadder", "reroller")
PER_OPERATOR = "deploymentMode=perOperator"
# Each is enough to run code as any ServiceAccount (a pod, a Job, a patched pod template) or to take
# its token (Secrets): no two processes' accounts may hold one of them.
DANGEROUS = {("", "pods", "create"), ("batch", "jobs", "create"), ("batch", "cronjobs", "patch"),
             *{("", "secrets", v) for v in ("create", "update", "patch", "delete")},
             *{("apps", kind, verb) for kind in ("deployments", "statefulsets", "daemonsets")
               for verb in ("patch", "update")}}
# Blackadder's: what a forced dry-run withholds (docs/deploy.md, "Permissions").
DESTRUCTIVE = {("", "pods", "delete"), ("", "pods/eviction", "create"), ("apps", "deployments/scale", "patch"),
               ("", "configmaps", "patch")}
LEDGER_NAMESPACE = "kopf-operators"  # render()'s release namespace: Blackadder's ledger Secrets live there


def verbs(grants: set[Grant]) -> set[tuple[str, str, str]]:
    return {grant[1:] for grant in grants}


def overlap(one: set[Grant], two: set[Grant]) -> set[tuple[str, str, str]]:
    """The rights both hold somewhere in common (the same namespace, or one of them everywhere)."""
    return {a[1:] for a in one for b in two if a[1:] == b[1:] and (a[0] == b[0] or "*" in (a[0], b[0]))}


def test_per_operator_mode_runs_each_operator_in_its_own_deployment_and_account() -> None:
    objects = render(PER_OPERATOR, "replicaCount=2")
    deployments = {d["metadata"]["name"]: d for d in objects if d["kind"] == "Deployment"}
    assert set(deployments) == {f"kopf-operators-{op}" for op in OPERATORS}
    accounts = {d["metadata"]["name"] for d in objects if d["kind"] == "ServiceAccount"}
    assert accounts == set(deployments)
    selectors = []
    for op in OPERATORS:
        deployment = deployments[f"kopf-operators-{op}"]
        pod = deployment["spec"]["template"]
        assert pod["spec"]["serviceAccountName"] == f"kopf-operators-{op}"
        files = [a for a in pod["spec"]["containers"][0]["args"] if a.startswith("/app/operators/")]
        assert files == [f"/app/operators/{op}.py"]
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert selector.items() <= pod["metadata"]["labels"].items()
        selectors.append(selector)
        # Another operator's settings (and the re-roller's webhook credential) stay out of this pod.
        env = {e["name"].split("_", 1)[0] for e in pod["spec"]["containers"][0]["env"]}
        own = {"blackadder": "CHAOS", "copyrator": "COPYRATOR", "reroller": "REROLLER"}
        assert env & set(own.values()) == ({own[op]} if op in own else set()), (op, env)
    # No Deployment selects another's pods; the PDBs, one per Deployment, select exactly its pods.
    pods = {name: d["spec"]["template"]["metadata"]["labels"] for name, d in deployments.items()}
    for name, d in deployments.items():
        chosen = {other for other, labels in pods.items()
                  if d["spec"]["selector"]["matchLabels"].items() <= labels.items()}
        assert chosen == {name}
    budgets = [b["spec"]["selector"]["matchLabels"] for b in objects if b["kind"] == "PodDisruptionBudget"]
    assert sorted(map(str, budgets)) == sorted(map(str, selectors))
    # The metrics Service (so the ServiceMonitor) and the NetworkPolicy/PodMonitor selector take every pod.
    service = next(o for o in objects if o["kind"] == "Service")
    assert all(service["spec"]["selector"].items() <= labels.items() for labels in pods.values())
    # A disabled operator: no Deployment, no account.
    fewer = render(PER_OPERATOR, "operators.blackadder.enabled=false")
    assert {d["metadata"]["name"] for d in fewer if d["kind"] == "Deployment"} == {
        f"kopf-operators-{op}" for op in OPERATORS if op != "blackadder"}


@pytest.mark.parametrize("values", [
    pytest.param((), id="defaults"),
    pytest.param(("operators.blackadder.dryRun=false", "operators.blackadder.tenants.enabled=true",
                  "operators.reroller.argoRollouts=true"), id="chaos-tenants-rollouts"),
    pytest.param(("watchNamespaces={team-a,team-b}", "sharding.enabled=true"), id="namespaces-sharded"),
])
def test_no_two_operator_accounts_share_a_dangerous_right(values: tuple[str, ...]) -> None:
    grants = account_grants(render(PER_OPERATOR, *values))
    assert set(grants) == {f"kopf-operators/kopf-operators-{op}" for op in OPERATORS}
    # The exceptions, Secrets in the release's own namespace only: Blackadder's ledgers, the re-roller's
    # digest key (created once; read by name).
    own = {"blackadder": {("", "secrets", v) for v in ("create", "update", "delete")},
           "reroller": {("", "secrets", "create")}}
    for operator, rights in own.items():
        account = f"kopf-operators/kopf-operators-{operator}"
        assert {g for g in grants[account] if g[1:] in rights} == {(LEDGER_NAMESPACE, *g) for g in rights}
    for one, two in itertools.combinations(sorted(grants), 2):
        shared = overlap(grants[one], grants[two]) & DANGEROUS
        for account in (one, two):
            shared -= own.get(account.rsplit("-", 1)[-1], set())
        assert not shared, f"{one} and {two} share {shared}"
    # The same rights as the bundle's, only split: the mode changes who holds them, not what is granted.
    bundle = account_grants(render(*values))
    assert set().union(*(verbs(g) for g in grants.values())) == verbs(bundle["kopf-operators/kopf-operators"])


def test_the_reroller_may_delete_pods_only_where_restart_active_is_allowed() -> None:
    reroller = "kopf-operators/kopf-operators-reroller"
    pods = {("", "pods", "list"), ("", "pods", "delete")}
    assert not verbs(account_grants(render(PER_OPERATOR))[reroller]) & pods
    allowed = render(PER_OPERATOR, "operators.reroller.allowRestartActive=true")
    assert verbs(account_grants(allowed)[reroller]) >= pods
    deployment = next(d for d in allowed if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("reroller"))
    assert {"name": "REROLLER_ALLOW_RESTART_ACTIVE", "value": "true"} in container(deployment)["env"]


def test_the_reroller_writes_configmaps_and_secrets_only_with_history_enabled() -> None:
    reroller = "kopf-operators/kopf-operators-reroller"
    writes = {("", resource, verb) for resource in ("configmaps", "secrets")
              for verb in ("get", "create", "patch", "delete")}
    def everywhere(objects: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
        # (The digest key's Role in the release namespace holds Secrets' get and create there only.)
        return {grant[1:] for grant in account_grants(objects)[reroller] if grant[0] == "*"}

    off = render(PER_OPERATOR)
    assert not everywhere(off) & writes
    on = render(PER_OPERATOR, "operators.reroller.history.enabled=true")
    assert everywhere(on) - everywhere(off) == writes
    for objects, value in ((off, "false"), (on, "true")):
        deployment = next(d for d in objects
                          if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("reroller"))
        assert {"name": "REROLLER_HISTORY", "value": value} in container(deployment)["env"]


def test_blackadder_holds_no_destructive_verb_while_the_chart_forces_dry_run() -> None:
    blackadder = "kopf-operators/kopf-operators-blackadder"
    assert not verbs(account_grants(render(PER_OPERATOR))[blackadder]) & DESTRUCTIVE
    assert verbs(account_grants(render(PER_OPERATOR, "operators.blackadder.dryRun=false"))[blackadder]) >= DESTRUCTIVE
    # The bundle holds one only where another enabled operator needs it (Immortal deletes its pods,
    # Copyrator patches its copies); Blackadder alone holds none.
    bundle = verbs(account_grants(render())["kopf-operators/kopf-operators"])
    assert bundle & DESTRUCTIVE == {("", "pods", "delete"), ("", "configmaps", "patch")}
    alone = render("operators.immortal.enabled=false", "operators.copyrator.enabled=false",
                   "operators.reroller.enabled=false")
    assert not verbs(account_grants(alone)["kopf-operators/kopf-operators"]) & DESTRUCTIVE


@pytest.mark.parametrize("mode", ["bundle", "perOperator"])
def test_watch_namespaces_grant_namespaced_rights_through_roles_there(mode: str) -> None:
    objects = render(f"deploymentMode={mode}", "watchNamespaces={team-a,team-b}")
    # (The release namespace holds Roles of its own: Blackadder's ledger, the Leases.)
    roles = [o for o in objects if o["kind"] == "Role" and o["metadata"]["namespace"] != LEDGER_NAMESPACE]
    assert {o["metadata"]["namespace"] for o in roles} == {"team-a", "team-b"}
    everywhere = set().union(*({g[1:] for g in grants if g[0] == "*"} for grants in account_grants(objects).values()))
    # Immortal's and the re-roller's work is all in the watched namespaces: nothing of theirs cluster-wide.
    for right in [("", "pods", "create"), ("immortalcontainer.flugel.it", "immortalcontainers", "list"),
                  ("apps", "deployments", "patch"), ("batch", "jobs", "create"), ("flant.com", "copyrators", "patch")]:
        assert right not in everywhere, right
    # Cluster-scoped reads stay cluster-wide; so do Copyrator's copies and Blackadder's targets (any
    # namespace an agent names), which the watched namespaces do not bound.
    assert {("apiextensions.k8s.io", "customresourcedefinitions", "list"), ("", "namespaces", "watch"),
            ("blackadder.io", "chaosagents", "list"), ("", "secrets", "create")} <= everywhere
    # A glob names no namespace to create a Role in: the ClusterRole holds everything.
    globbed = render(f"deploymentMode={mode}", "watchNamespaces={team-*}")
    assert not [o for o in globbed if o["kind"] == "Role" and o["metadata"]["namespace"] != LEDGER_NAMESPACE]


@pytest.mark.parametrize("mode", ["bundle", "perOperator"])
def test_two_releases_name_their_cluster_scoped_objects_apart(mode: str) -> None:
    def cluster_scoped(release: str) -> set[tuple[str, str]]:
        objects = chart_objects(release, release, f"deploymentMode={mode}", "operators.blackadder.tenants.enabled=true")
        return {(o["kind"], o["metadata"]["name"]) for o in objects if "namespace" not in o["metadata"]}

    one, two = cluster_scoped("one"), cluster_scoped("two")
    assert one and not one & two
    assert all(name.startswith("one-") for _, name in one)


def test_two_releases_install_side_by_side(release: tuple[str, str], core: kubernetes.client.CoreV1Api) -> None:
    """One release per operator group, each watching its own namespaces, in one cluster."""
    name, namespace = release
    other = f"{name}-b"
    core.create_namespace({"metadata": {"name": other, "labels": {"kopf-operators.dev/test": "true"}}})
    try:
        helm("install", name, str(CHART), "--namespace", namespace, *sets(
            PER_OPERATOR, "operators.blackadder.enabled=false", "operators.reroller.enabled=false",
            f"watchNamespaces={{{namespace}}}"))
        helm("install", other, str(CHART), "--namespace", other, *sets(
            "operators.immortal.enabled=false", "operators.copyrator.enabled=false", f"watchNamespaces={{{other}}}"))
        for release_name, ns in ((name, namespace), (other, other)):
            manifest = [d for d in yaml.safe_load_all(helm("get", "manifest", release_name, "--namespace", ns).stdout)
                        if d]
            for doc in manifest:
                doc_ns = doc["metadata"].get("namespace")
                got = kubectl("get", doc["kind"], doc["metadata"]["name"], *(["-n", doc_ns] if doc_ns else []),
                              "-o", "jsonpath={.metadata.annotations.meta\\.helm\\.sh/release-name}", check=False)
                assert got.returncode == 0 and got.stdout == release_name, f"{doc['kind']} {doc['metadata']['name']}"
    finally:
        helm("uninstall", other, "--namespace", other, "--wait", "--timeout", "60s", check=False)
        kubectl("delete", "namespace", other, "--ignore-not-found", "--wait=false")


def test_no_active_replica_alert_fires_only_when_every_replica_stands_by(monitoring: Path, tmp_path: Path) -> None:
    """`promtool test rules` on the gauge each replica serves (kopf_operators_leader{lease}: 1 acts)."""
    groups = alert_groups(PER_OPERATOR)
    rule = next(r for g in groups for r in g["rules"] if r["alert"] == "KopfOperatorsNoActiveReplica")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": [{"name": "leader", "rules": [rule]}]}))
    this = 'job="kopf-operators",namespace="kopf-operators"'

    def leader(lease: str, pod: str, values: str) -> dict[str, str]:
        return {"series": f'kopf_operators_leader{{{this},lease="{lease}",pod="{pod}"}}', "values": values}

    series = [
        # immortal: someone else holds the Lease from minute 5: both replicas stand by from then on.
        leader("kopf-operators-immortal", "i-0", "1x4 0x20"), leader("kopf-operators-immortal", "i-1", "0x25"),
        # copyrator: a takeover (one minute with nobody acting), then the other replica acts.
        leader("kopf-operators-copyrator", "c-0", "1x4 0x20"), leader("kopf-operators-copyrator", "c-1", "0x5 1x19"),
    ]
    expected = {"namespace": "kopf-operators", "lease": "kopf-operators-immortal", "severity": "critical"}
    # promtool compares the annotations too: the rule's own, with the firing Lease in place of its label.
    annotations = {k: v.replace("{{ $labels.lease }}", expected["lease"]) for k, v in rule["annotations"].items()}
    tests = [{"eval_time": at, "alertname": "KopfOperatorsNoActiveReplica",
              "exp_alerts": [{"exp_labels": expected, "exp_annotations": annotations}] if fire else []}
             for at, fire in (("4m", False), ("6m", False), ("8m", True), ("20m", True))]
    spec = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": tests}]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(spec))
    result = subprocess.run([str(monitoring / "promtool"), "test", "rules", "test.yaml"], cwd=tmp_path,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
