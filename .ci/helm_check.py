"""Renders and lints the Helm chart with the real Helm engine (helm-python-sdk)
and asserts on the rendered objects, not just that rendering succeeds."""
import sys

import helm_python
import yaml

CHART = "helm/ai-orchestrator"

lint = helm_python.lint(CHART, strict=True)
# Helm severities: 1 info, 2 warning, 3 error. Info ("icon is recommended") is fine.
problems = [m for m in lint.get("messages", []) if m.get("severity", 0) >= 2] + list(lint.get("errors") or [])
if problems:
    sys.exit(f"helm lint: {problems}")

chart = helm_python.Chart.load(CHART)
rendered = chart.render({}, name="aio", namespace="ai")
docs = []
for path, text in rendered.items():
    if path.endswith(".yaml"):
        docs += [d for d in yaml.safe_load_all(text) if d]
kinds = {d["kind"]: d for d in docs}
for kind in ("Deployment", "Service", "ConfigMap"):
    assert kind in kinds, f"{kind} not rendered: {sorted(kinds)}"

container = kinds["Deployment"]["spec"]["template"]["spec"]["containers"][0]
assert container["readinessProbe"]["grpc"]["port"] == 50051, container["readinessProbe"]
assert container["livenessProbe"]["grpc"]["port"] == 50051
env = {e["name"]: e for e in container["env"]}
assert env["OPENAI_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "ai-orchestrator-providers"
assert env["DATABASE_URL"]["valueFrom"]["secretKeyRef"]["key"] == "url"
ports = {p["name"]: p for p in kinds["Service"]["spec"]["ports"]}
assert ports["grpc"]["port"] == 50051
assert "config.toml" in kinds["ConfigMap"]["data"]
print(f"helm chart OK: {sorted(kinds)}")
