"""Renders and lints the Helm chart with the real Helm engine (helm-python-sdk)
and asserts on the rendered objects, not just that rendering succeeds.

Value sets: the chart defaults, helm/ai-orchestrator/ci/*-values.yaml, and a
few variants; each render is checked (probes, ports, secret references,
security context, config checksum, the ConfigMap's TOML) and validated
against the Kubernetes schema (kubernetes-validate, offline). Bad values must
make rendering fail with a helpful message (guard rails).

    python3 .ci/helm_check.py [--service-binary PATH]

With --service-binary, the rendered ConfigMaps are also given to the
service's own `check-config` (dummy keys in the environment).
"""
from __future__ import annotations

import argparse
import copy
import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import helm_dashboard
import helm_guard_rails
import helm_python
import kubernetes_validate
import yaml

CHART = Path("helm/ai-orchestrator")
NAME, NAMESPACE = "aio", "ai"
FULLNAME = "aio-ai-orchestrator"
SERVICE = "ai.orchestrator.v1.Orchestrator"
# The chart's kubeVersion floor and the newest schema we have.
KUBE_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
CRDS = {"ServiceMonitor", "PrometheusRule"}

chart = helm_python.Chart.load(str(CHART))
results: list[tuple[str, str | None]] = []


def check(name: str):
    """Runs the decorated function now and records pass/fail under `name`."""

    def run(fn):
        try:
            fn()
            results.append((name, None))
        except Exception as e:  # noqa: BLE001 - report every failure, keep going
            results.append((name, f"{type(e).__name__}: {e}"))
        return fn

    return run


def ci_values(name: str) -> dict:
    return yaml.safe_load((CHART / "ci" / f"{name}-values.yaml").read_text())


def merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


class Render:
    """One rendered release: its objects by kind/name and the parsed config."""

    def __init__(self, values: dict):
        self.values = values
        self.merged = chart.merge_values(values)
        self.files = chart.render(values, name=NAME, namespace=NAMESPACE)
        self.docs = []
        for path, text in self.files.items():
            if path.endswith(".yaml"):
                self.docs += [d for d in yaml.safe_load_all(text) if d]
        self.by_kind: dict[str, list[dict]] = {}
        for d in self.docs:
            self.by_kind.setdefault(d["kind"], []).append(d)
        self.deployment = self.one("Deployment", FULLNAME)
        self.pod = self.deployment["spec"]["template"]["spec"]
        self.container = self.pod["containers"][0]
        self.env = {e["name"]: e for e in self.container.get("env", [])}
        self.toml_text = self.one("ConfigMap", FULLNAME)["data"]["config.toml"]
        self.config = tomllib.loads(self.toml_text)
        self.postgres = "DATABASE_URL" in self.env

    def one(self, kind: str, name: str | None = None) -> dict:
        found = [d for d in self.by_kind.get(kind, []) if name is None or d["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}: {sorted(self.by_kind)}"
        return found[0]

    def file(self, template: str) -> str:
        return self.files[f"ai-orchestrator/templates/{template}"]


def seconds(duration: str) -> int:
    scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    total = sum(int(n) * scale[u] for n, u in re.findall(r"(\d+)(ms|s|m|h)", duration))
    return int(-(-total // 1))


def normalise(v):
    """Values reach Helm as float64: 8 and 8.0 are the same value."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, dict):
        return {k: normalise(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [normalise(x) for x in v]
    return v


def assert_common(r: Render, label: str):
    """What every render must satisfy, whatever the values."""
    grpc_port, metrics_port = r.merged["ports"]["grpc"], r.merged["ports"]["metrics"]

    # Ports: the Service exposes both, by the container's port names.
    svc = r.one("Service", FULLNAME)
    ports = {p["name"]: p for p in svc["spec"]["ports"]}
    assert ports["grpc"]["port"] == grpc_port and ports["grpc"]["targetPort"] == "grpc", ports
    assert ports["metrics"]["port"] == metrics_port and ports["metrics"]["targetPort"] == "metrics", ports
    cports = {p["name"]: p["containerPort"] for p in r.container["ports"]}
    expected = {"grpc": grpc_port, "metrics": metrics_port}
    if r.merged["http"]["enabled"]:
        expected["http"] = r.merged["ports"]["http"]
    assert cports == expected, cports

    # The server listens on all interfaces inside the pod, on those ports.
    server = r.config["server"]
    assert server["listen"] == f"0.0.0.0:{grpc_port}", server
    assert server["metrics_listen"] == f"0.0.0.0:{metrics_port}", server
    assert r.env["AIO_CONFIG"]["value"] == "/etc/ai-orchestrator/config.toml"
    assert r.env["AIO_LOG_FORMAT"]["value"] in ("json", "text")
    # The image's own listen variables are overridden with the chart's ports.
    assert r.env["AIO_SERVER__LISTEN"]["value"] == f"0.0.0.0:{grpc_port}", r.env
    assert r.env["AIO_SERVER__METRICS_LISTEN"]["value"] == f"0.0.0.0:{metrics_port}", r.env
    mounts = {m["name"]: m for m in r.container["volumeMounts"]}
    assert mounts["config"]["mountPath"] == "/etc/ai-orchestrator" and mounts["config"]["readOnly"]

    # The ConfigMap says what the values say (nothing lost by the TOML writer).
    want = normalise(r.merged["config"])
    got = r.config
    for section, table in want.items():
        for key, value in table.items():
            if section == "database" and key == "url":
                continue
            if section == "providers" and key in (r.merged.get("providerAccountLimits") or {}):
                value = {k: v for k, v in value.items() if k not in ("rpm", "max_concurrency")}
                got_p = {k: v for k, v in got[section][key].items() if k not in ("rpm", "max_concurrency")}
                assert got_p == value, (section, key, got_p, value)
                continue
            assert got[section][key] == value, (section, key, got[section].get(key), value)

    # Secrets: every provider key and DATABASE_URL come from a secretKeyRef.
    for name, provider in r.config.get("providers", {}).items():
        var = provider.get("api_key_env")
        if var:
            assert var in r.env, f"providers.{name}: {var} not in env"
            ref = r.env[var].get("valueFrom", {}).get("secretKeyRef", {})
            assert ref.get("name") and ref.get("key"), f"{var} is not a secretKeyRef: {r.env[var]}"
            assert "value" not in r.env[var]
    if r.postgres:
        ref = r.env["DATABASE_URL"]["valueFrom"]["secretKeyRef"]
        assert ref["name"] and ref["key"], ref
        assert "url" not in r.config.get("database", {}), "a PostgreSQL URL must not be in the ConfigMap"
        assert not any(v.get("persistentVolumeClaim") for v in r.pod["volumes"])
    else:
        url = r.config["database"]["url"]
        assert url.startswith("sqlite:///var/lib/ai-orchestrator/"), url
        assert mounts["data"]["mountPath"] == "/var/lib/ai-orchestrator", mounts
        assert r.deployment["spec"]["strategy"]["type"] == "Recreate"
        assert r.deployment["spec"].get("replicas", 1) == 1
        assert "HorizontalPodAutoscaler" not in r.by_kind
    for e in r.container.get("env", []):
        if any(s in e["name"] for s in ("KEY", "PASSWORD", "TOKEN", "DATABASE_URL")):
            assert "valueFrom" in e, f"{e['name']} is a literal"

    # Security context.
    psc, csc = r.pod["securityContext"], r.container["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] != 0, psc
    assert psc["seccompProfile"]["type"] == "RuntimeDefault", psc
    assert csc["readOnlyRootFilesystem"] is True, csc
    assert csc["allowPrivilegeEscalation"] is False, csc
    assert csc["capabilities"]["drop"] == ["ALL"], csc
    assert csc["runAsNonRoot"] is True, csc
    assert r.pod["automountServiceAccountToken"] is False
    sa = r.one("ServiceAccount")
    assert sa["automountServiceAccountToken"] is False
    assert r.pod["serviceAccountName"] == sa["metadata"]["name"]
    assert mounts["tmp"]["mountPath"] == "/tmp"

    # Config changes roll the pods.
    annotations = r.deployment["spec"]["template"]["metadata"]["annotations"]
    expected = hashlib.sha256(r.file("configmap.yaml").encode()).hexdigest()
    assert annotations["checksum/config"] == expected, "checksum/config is not the ConfigMap's sha256"

    # Probes on the health service (gRPC) or the HTTP endpoints.
    tls = r.merged["tls"]["enabled"]
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = r.container[kind]
        if "grpc" in probe:
            assert not tls, f"{kind}: gRPC probe with TLS"
            assert probe["grpc"]["port"] == grpc_port, probe
            want_service = SERVICE if kind == "readinessProbe" else None
            assert probe["grpc"].get("service") == want_service, probe
        else:
            assert probe["httpGet"]["port"] == "metrics", probe
            want_path = "/readyz" if kind == "readinessProbe" else "/healthz"
            assert probe["httpGet"]["path"] == want_path, probe

    # Shutdown: the kubelet waits longer than the preStop pause + drain.
    grace = seconds(r.config["server"].get("shutdown_grace", "30s"))
    pre = r.container.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    assert r.pod["terminationGracePeriodSeconds"] > grace + pre, (r.pod["terminationGracePeriodSeconds"], grace, pre)

    # Labels: selector labels on the pods, recommended labels on every object.
    selector = r.deployment["spec"]["selector"]["matchLabels"]
    assert selector == {"app.kubernetes.io/name": "ai-orchestrator", "app.kubernetes.io/instance": NAME}
    assert r.deployment["spec"]["template"]["metadata"]["labels"].items() >= selector.items()
    for d in r.docs:
        labels = d["metadata"].get("labels", {})
        assert labels.get("app.kubernetes.io/managed-by") == "Helm", d["metadata"]["name"]

    # Kubernetes schema (strict: unknown fields are errors), oldest and newest.
    for d in r.docs:
        if d["kind"] in CRDS:
            assert d["apiVersion"] == "monitoring.coreos.com/v1"
            continue
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(d, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                raise AssertionError(f"{d['kind']} {d['metadata']['name']} invalid for Kubernetes {version}: {e.message}") from None


# --- lint -------------------------------------------------------------------

@contextlib.contextmanager
def quiet_stderr():
    """Helm lints in "lint mode": fail() only logs (to fd 2, from Go) and
    values set to null do not remove defaults, so the guard rails log
    spurious "funcMap fail" lines. Guards are checked by rendering below."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def lint(values: dict | None, label: str):
    with quiet_stderr():
        out = helm_python.lint(str(CHART), values, strict=True)
    # Helm severities: 1 info, 2 warning, 3 error. Info ("icon is recommended") is fine.
    problems = [m for m in out.get("messages", []) if m.get("severity", 0) >= 2] + list(out.get("errors") or [])
    assert not problems, f"helm lint ({label}): {problems}"


@check("lint: default values")
def _():
    lint(None, "defaults")


for _name in ("production", "sqlite"):
    @check(f"lint: ci/{_name}-values.yaml")
    def _(n=_name):
        lint(ci_values(n), n)


# --- value sets -------------------------------------------------------------

renders: dict[str, Render] = {}


def render_set(label: str, values: dict, extra=None):
    @check(f"render: {label}")
    def _():
        r = Render(values)
        renders[label] = r
        assert_common(r, label)
        if extra:
            extra(r)


def default_extra(r: Render):
    assert r.deployment["spec"]["replicas"] == 1
    pvc = r.one("PersistentVolumeClaim")
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    claim = next(v for v in r.pod["volumes"] if v["name"] == "data")["persistentVolumeClaim"]
    assert claim["claimName"] == pvc["metadata"]["name"]
    assert r.container["readinessProbe"]["grpc"]["service"] == SERVICE
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "PERPLEXITY_API_KEY"):
        assert r.env[var]["valueFrom"]["secretKeyRef"]["name"] == "ai-orchestrator-providers"
    assert r.one("PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    for kind in ("HorizontalPodAutoscaler", "ServiceMonitor", "PrometheusRule", "Secret"):
        assert kind not in r.by_kind, kind
    assert "auth" not in r.config and "telemetry" not in r.config and "tls" not in r.config["server"]
    assert r.pod["terminationGracePeriodSeconds"] == 5 + 30 + 15


def production_extra(r: Render):
    assert "replicas" not in r.deployment["spec"], "replicas must be left to the HPA"
    strategy = r.deployment["spec"]["strategy"]
    assert strategy["type"] == "RollingUpdate" and strategy["rollingUpdate"]["maxUnavailable"] == 0
    hpa = r.one("HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 10)
    assert hpa["spec"]["scaleTargetRef"]["name"] == FULLNAME
    cpu = [m for m in hpa["spec"]["metrics"] if m["resource"]["name"] == "cpu"]
    assert cpu[0]["resource"]["target"]["averageUtilization"] == 60
    r.one("PodDisruptionBudget")
    sm = r.one("ServiceMonitor")
    assert sm["spec"]["endpoints"][0]["port"] == "metrics" and sm["spec"]["endpoints"][0]["path"] == "/metrics"
    assert sm["spec"]["selector"]["matchLabels"] == r.deployment["spec"]["selector"]["matchLabels"]
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    rules = {x["alert"]: x for g in r.one("PrometheusRule")["spec"]["groups"] for x in g["rules"]}
    for alert in ("AIOrchestratorCircuitBreakerOpen", "AIOrchestratorHighFallbackRate",
                  "AIOrchestratorAllProvidersFailing", "AIOrchestratorStorageUnavailable",
                  "AIOrchestratorQuotaRejections",
                  "AIOrchestratorHighOverhead", "AIOrchestratorNotReady", "AIOrchestratorLoadShedding"):
        assert alert in rules, alert
    assert 'job="aio-ai-orchestrator"' in rules["AIOrchestratorCircuitBreakerOpen"]["expr"]
    assert r.env["DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {"name": "ai-orchestrator-db", "key": "url"}
    assert not any(v["name"] == "data" for v in r.pod["volumes"])
    assert "PersistentVolumeClaim" not in r.by_kind
    # TLS: the Secret is mounted where [server.tls] points; probes went HTTP.
    tls = r.config["server"]["tls"]
    mounts = {m["name"]: m["mountPath"] for m in r.container["volumeMounts"]}
    assert tls["cert"] == mounts["tls"] + "/tls.crt" and tls["key"] == mounts["tls"] + "/tls.key", (tls, mounts)
    assert tls["client_ca"] == mounts["tls-client-ca"] + "/ca.crt", (tls, mounts)
    vols = {v["name"]: v for v in r.pod["volumes"]}
    assert vols["tls"]["secret"]["secretName"] == "ai-orchestrator-tls"
    assert vols["tls-client-ca"]["secret"]["secretName"] == "ai-orchestrator-client-ca"
    assert r.container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # Auth: hashes (never keys) in the ConfigMap.
    assert r.config["auth"]["enabled"] is True
    keys = r.config["auth"]["keys"]
    assert [k["name"] for k in keys] == ["sms-pipeline", "ops"], keys
    assert keys[1] == {"name": "ops", "sha256": "fcde2b2edba56bf408601fb721fe9b5c338d10ee429ea04fae5511b68fbf8fb9",
                       "teams": ["*"], "role": "admin"}
    # OpenTelemetry: env for the SDK and the config key.
    assert r.env["OTEL_EXPORTER_OTLP_ENDPOINT"]["value"] == "http://otel-collector.observability:4317"
    assert r.env["OTEL_SERVICE_NAME"]["value"] == FULLNAME
    assert r.config["telemetry"]["otlp_endpoint"] == "http://otel-collector.observability:4317"
    # Account limits divided by maxReplicas (10).
    p = r.config["providers"]
    assert (p["openai"]["rpm"], p["openai"]["max_concurrency"]) == (3000, 100), p["openai"]
    assert p["anthropic"]["rpm"] == 400 and p["anthropic"]["max_concurrency"] == 64, p["anthropic"]
    assert p["perplexity"]["rpm"] == 50
    headless = r.one("Service", FULLNAME + "-headless")
    assert headless["spec"]["clusterIP"] == "None"
    assert r.config["database"]["max_connections"] == 10


def sqlite_extra(r: Render):
    claim = next(v for v in r.pod["volumes"] if v["name"] == "data")["persistentVolumeClaim"]
    assert claim["claimName"] == "ai-orchestrator-sqlite"
    assert "PersistentVolumeClaim" not in r.by_kind, "existingClaim must not create a PVC"
    secret = r.one("Secret")
    assert secret["metadata"]["annotations"]["ai-orchestrator/dev-only"] == "true"
    assert r.env["OPENAI_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": secret["metadata"]["name"], "key": "OPENAI_API_KEY"}
    assert set(r.config["providers"]) == {"openai"}
    # the default providerKeys entries of the removed providers are not referenced
    assert "ANTHROPIC_API_KEY" not in r.env and "PERPLEXITY_API_KEY" not in r.env
    annotations = r.deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["checksum/dev-secret"] == hashlib.sha256(r.file("secret-dev.yaml").encode()).hexdigest()
    assert r.container["livenessProbe"]["httpGet"]["path"] == "/healthz"


render_set("defaults", {}, default_extra)
render_set("ci/production-values.yaml", ci_values("production"), production_extra)
render_set("ci/sqlite-values.yaml", ci_values("sqlite"), sqlite_extra)


def emptydir_extra(r: Render):
    data = next(v for v in r.pod["volumes"] if v["name"] == "data")
    assert "emptyDir" in data and "PersistentVolumeClaim" not in r.by_kind


render_set("sqlite on emptyDir", {"persistence": {"enabled": False}}, emptydir_extra)


def mixed_probes_extra(r: Render):
    assert r.container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert r.container["readinessProbe"]["grpc"]["service"] == SERVICE
    assert "lifecycle" not in r.container
    assert r.pod["terminationGracePeriodSeconds"] == 2 * 60 + 15


render_set(
    "liveness over HTTP, no preStop, longer drain",
    {"probes": {"liveness": {"type": "http"}}, "lifecycle": {"preStopSleepSeconds": 0},
     "config": {"server": {"shutdown_grace": "2m"}}},
    mixed_probes_extra,
)


def output_schema_extra(r: Render):
    schema = r.config["tasks"]["lead_score"]["output_schema"]
    assert schema["properties"]["score"] == {"type": "number", "minimum": 0, "maximum": 1}
    assert schema["required"] == ["score", "why"]
    assert schema["properties"]["why"]["description"] == 'a "quoted" reason\n'
    assert r.config["providers"]["local"]["mock"]["failure_rate"] == 0.25


CUSTOM_TASK = {"config": {
    "providers": {"local": {"kind": "mock", "mock": {"latency": "20ms", "failure_rate": 0.25}}},
    "tasks": {"lead_score": {
        "chain": [{"provider": "local", "model": "m"}],
        "temperature": 0.2,
        "output_schema": {
            "type": "object",
            "required": ["score", "why"],
            "properties": {
                "score": {"type": "number", "minimum": 0, "maximum": 1},
                "why": {"type": "string", "description": "a \"quoted\" reason\n"},
            },
        },
    }},
    "pricing": {"m": {"price": "unknown"}},
}}
render_set("custom task with output_schema and a mock provider", CUSTOM_TASK, output_schema_extra)

ACCOUNT = {"providerAccountLimits": {"openai": {"rpm": 30000, "maxConcurrency": 400}},
           "config": {"providers": {"openai": {"rpm": None, "max_concurrency": None}}}}
VALKEY = merge(merge(ci_values("production"), ACCOUNT), {"valkey": {"enabled": True}})
EXTERNAL_STORE = merge(merge(ci_values("production"), ACCOUNT), {"cluster": {"existingSecret": "aio-redis"}})


def valkey_extra(r: Render):
    store = r.one("Deployment", f"{FULLNAME}-valkey")
    service = r.one("Service", f"{FULLNAME}-valkey")
    assert service["spec"]["selector"] == store["spec"]["selector"]["matchLabels"]
    # The service's own Service and PDB never select the store's pod.
    labels = store["spec"]["template"]["metadata"]["labels"]
    main = r.one("Service", FULLNAME)["spec"]["selector"]
    assert not all(labels.get(k) == v for k, v in main.items()), (labels, main)
    assert r.config["cluster"] == {"key_prefix": "aio:", "on_unavailable": "local", "fallback_share": 0.25,
                                   "redis_url": f"redis://{FULLNAME}-valkey:6379/0"}, r.config["cluster"]
    # The account's numbers, undivided, with a shared store.
    assert (r.config["providers"]["openai"]["rpm"], r.config["providers"]["openai"]["max_concurrency"]) == (30000, 400)
    assert "AIO_CLUSTER__REDIS_URL" not in r.env


def external_store_extra(r: Render):
    assert "Deployment" not in [d["kind"] for d in r.docs if d["metadata"]["name"].endswith("-valkey")]
    assert r.env["AIO_CLUSTER__REDIS_URL"]["valueFrom"]["secretKeyRef"] == {"name": "aio-redis", "key": "url"}
    assert "redis_url" not in r.config["cluster"], "the URL comes from the Secret"
    assert r.config["providers"]["openai"]["rpm"] == 30000


def no_store_extra(r: Render):
    # Without a store each replica gets its share: 30000 / maxReplicas 10.
    assert "cluster" not in r.config
    assert (r.config["providers"]["openai"]["rpm"], r.config["providers"]["openai"]["max_concurrency"]) == (3000, 40)


render_set("production with the chart's Valkey", VALKEY, valkey_extra)
render_set("production with an external cluster store", EXTERNAL_STORE, external_store_extra)
def http_extra(r: Render):
    ports = {p["name"]: p for p in r.one("Service")["spec"]["ports"]}
    assert ports["http"]["port"] == 8080 and ports["http"]["targetPort"] == "http", ports
    assert any(p["name"] == "http" for p in r.container["ports"])
    assert r.config["http"] == {"listen": "0.0.0.0:8080", "cors_origins": ["https://app.example.com"]}


HTTP = {"http": {"enabled": True, "corsOrigins": ["https://app.example.com"]}}
render_set("HTTP edge on", HTTP, http_extra)


@check("HTTP edge off: no http port, no [http]")
def _():
    r = Render({})
    assert all(p["name"] != "http" for p in r.one("Service")["spec"]["ports"])
    assert "http" not in r.config


render_set("production with account limits and no store", merge(ci_values("production"), ACCOUNT), no_store_extra)


@check("checksum/config changes with the config")
def _():
    a = Render({}).deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    b = Render({"config": {"retry": {"max_attempts": 2}}}).deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    assert a != b


@check("Grafana dashboard: sidecar ConfigMap, every query on an exported family")
def _():
    helm_dashboard.self_test()
    assert not [c for c in Render({}).by_kind.get("ConfigMap", []) if c["metadata"]["name"].endswith("-dashboard")]
    cm = Render(ci_values("production")).one("ConfigMap", FULLNAME + "-dashboard")
    meta = cm["metadata"]
    assert meta["labels"]["grafana_dashboard"] == "1" and meta["namespace"] == "monitoring", meta
    assert meta["annotations"] == {"grafana_folder": "AI"}, meta
    assert helm_dashboard.check(cm["data"]["ai-orchestrator.json"]) >= 20


@check("PrometheusRule expressions parse (promtool, when installed)")
def _():
    promtool = shutil.which("promtool")
    if not promtool:
        print("  note: promtool not installed (Debian: prometheus); PromQL not parsed")
        return
    rule = Render(ci_values("production")).one("PrometheusRule")
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump({"groups": rule["spec"]["groups"]}, f)
        f.flush()
        out = subprocess.run([promtool, "check", "rules", f.name], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr


# --- guard rails --------------------------------------------------------------

BAD = helm_guard_rails.bad_values(merge)

for label, values, message in BAD:
    @check(f"refuses: {label}")
    def _(values=values, message=message):
        try:
            chart.render(values, name=NAME, namespace=NAMESPACE)
        except (helm_python.HelmRenderError, helm_python.HelmValuesError) as e:
            assert message in str(e), f"rendering failed, but not with {message!r}: {e}"
            return
        raise AssertionError("rendered, but must be refused")


# --- the service accepts the rendered config -----------------------------------

def service_check(binary: str):
    env = {**os.environ, "OPENAI_API_KEY": "dummy", "ANTHROPIC_API_KEY": "dummy", "PERPLEXITY_API_KEY": "dummy"}
    env = {k: v for k, v in env.items() if not k.startswith("AIO_") and k != "DATABASE_URL"}
    off = {"auth": {"enabled": False}, "tls": {"enabled": False}, "telemetry": {"otlpEndpoint": ""}}
    cases = [
        ("defaults", {}),
        ("ci/sqlite-values.yaml", ci_values("sqlite")),
        ("custom task with output_schema", CUSTOM_TASK),
        ("ci/production-values.yaml, auth/tls/telemetry off", merge(ci_values("production"), off)),
        ("ci/production-values.yaml", ci_values("production")),
        ("production with the chart's Valkey", VALKEY),
        ("production with an external cluster store", EXTERNAL_STORE),
        ("HTTP edge on", HTTP),
    ]
    for label, values in cases:
        @check(f"service check-config: {label}")
        def _(values=values):
            r = Render(values)
            run_env = dict(env)
            # The pod's own AIO_ overrides (the listen addresses).
            for name, e in r.env.items():
                if name.startswith("AIO_SERVER__") and "value" in e:
                    run_env[name] = e["value"]
            # Other secrets the pod reads (the console's signing key): long enough dummies.
            for name, e in r.env.items():
                if "valueFrom" in e and name not in run_env and not name.startswith("AIO_CLUSTER__"):
                    run_env[name] = "dummy-secret-at-least-32-bytes-long"
            if "AIO_CLUSTER__REDIS_URL" in r.env:
                run_env["AIO_CLUSTER__REDIS_URL"] = "redis://:dummy@redis.example:6379/0"
            if r.postgres:
                run_env["DATABASE_URL"] = "postgres://aio@127.0.0.1:5432/aio"
            with tempfile.NamedTemporaryFile("w", suffix=".toml") as f:
                f.write(r.toml_text)
                f.flush()
                out = subprocess.run([binary, "--config", f.name, "check-config"], env=run_env,
                                     capture_output=True, text=True, timeout=30)
            if out.returncode != 0:
                raise AssertionError(out.stderr.strip())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--service-binary", help="run the service's check-config on rendered configs")
    args = parser.parse_args()
    if args.service_binary:
        service_check(args.service_binary)
    failed = [(n, e) for n, e in results if e]
    for name, error in results:
        print(f"{'FAIL' if error else 'ok  '} {name}")
        if error:
            print("     " + error.replace("\n", "\n     ")[:3000])
    print(f"helm-check: {len(results) - len(failed)} passed, {len(failed)} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
