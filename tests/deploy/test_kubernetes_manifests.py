"""deploy/kubernetes/: rendered (``kubectl kustomize`` where installed, else render.py, and
both must agree), validated against the Kubernetes schemas (kubernetes-validate, strict),
linted (yamllint), and checked against the server they run (the config parses with the
real ``engine serve`` flags; the probe paths, drain budget and metric names fit it)."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
OVERLAYS = ["gpu-1", "tp-2", "router", "autoscaler"]
K8S_VERSIONS = ["1.30.0", "1.37.0"]  # oldest and newest release we validate against
_spec = importlib.util.spec_from_file_location("engine_deploy_render", KUBE / "render.py")
assert _spec is not None and _spec.loader is not None
render_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render_mod)


def rendered(overlay: str) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = render_mod.render(KUBE / "overlays" / overlay)
    return docs


def by_key(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def engine_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = by_key(docs)[("Deployment", "engine")]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container  # type: ignore[no-any-return]


def serve_config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    config = by_key(docs)[("ConfigMap", "engine-config")]
    return yaml.safe_load(config["data"]["config.yaml"])  # type: ignore[no-any-return]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_render_py_agrees_with_kubectl_kustomize(overlay: str) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: render.py alone renders here")
    out = subprocess.run(
        [kubectl, "kustomize", str(KUBE / "overlays" / overlay)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    expected = by_key([d for d in yaml.safe_load_all(out.stdout) if d])
    assert by_key(rendered(overlay)) == expected


def test_render_py_refuses_what_it_does_not_implement(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: []\nnamePrefix: x-\n")
    with pytest.raises(render_mod.RenderError, match=r"\['namePrefix'\] are not supported"):
        render_mod.render(tmp_path)
    doc: dict[str, Any] = {"a": [1, 2], "b/c": {"d": 1}}
    render_mod.apply_op(doc, {"op": "add", "path": "/a/-", "value": 3})
    render_mod.apply_op(doc, {"op": "replace", "path": "/b~1c/d", "value": 2})
    render_mod.apply_op(doc, {"op": "remove", "path": "/a/0"})
    assert doc == {"a": [2, 3], "b/c": {"d": 2}}
    with pytest.raises(render_mod.RenderError, match="no such member"):
        render_mod.apply_op(doc, {"op": "replace", "path": "/missing", "value": 1})


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_manifests_match_the_kubernetes_schemas(overlay: str, version: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    docs = rendered(overlay)
    for doc in docs:
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD: checked against its Service below
        kubernetes_validate.validate(doc, version, strict=True)
    resources = by_key(docs)
    monitor = resources[("ServiceMonitor", "engine")]
    service = resources[("Service", "engine")]
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    port_names = {p["name"] for p in service["spec"]["ports"]}
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= port_names


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_drain_budget_and_secrets(overlay: str) -> None:
    docs = rendered(overlay)
    pod = by_key(docs)[("Deployment", "engine")]["spec"]["template"]["spec"]
    container = engine_container(docs)
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1800  # model load
    config = serve_config(docs)
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    budget = int(pre_stop[1]) + float(config["shutdown-timeout"])
    assert pod["terminationGracePeriodSeconds"] >= budget + 5  # + the abort grace
    # the API key: from the Secret through ENGINE_API_KEY, never in args or the ConfigMap
    env = {e["name"]: e for e in container["env"]}
    assert env["ENGINE_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "engine-api-key"
    assert not any("api-key" in str(a) or "api_key" in str(a) for a in container["args"])
    assert not {"api-key", "api_key"} & set(config)
    # --config points into the ConfigMap's mount
    config_path = Path(container["args"][container["args"].index("--config") + 1])
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["config"]["mountPath"] == str(config_path.parent)
    assert volumes["config"]["configMap"]["name"] == "engine-config"
    assert mounts["dshm"]["mountPath"] == "/dev/shm"
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    claim = volumes["models"]["persistentVolumeClaim"]["claimName"]
    assert ("PersistentVolumeClaim", claim) in by_key(docs)
    assert pod["securityContext"]["runAsNonRoot"] is True
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["http"] == config["port"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_config_parses_with_engine_serve(overlay: str, tmp_path: Path) -> None:
    from engine.cli.serve_args import parse_serve_args

    docs = rendered(overlay)
    path = tmp_path / "config.yaml"
    path.write_text(by_key(docs)[("ConfigMap", "engine-config")]["data"]["config.yaml"])
    parsed = parse_serve_args(["--config", str(path)])
    assert not isinstance(parsed, str)
    assert parsed.server_args.host == "0.0.0.0" and parsed.server_args.metrics_compat == "vllm"
    gpus = engine_container(docs)["resources"]["limits"]["nvidia.com/gpu"]
    assert parsed.engine_args.tensor_parallel_size == gpus


def test_hpa_reads_the_metric_the_adapter_serves() -> None:
    from engine.entrypoints.openai.metrics import ServerMetrics
    from engine.outputs import SchedulerStats

    docs = by_key(rendered("autoscaler"))
    hpa = docs[("HorizontalPodAutoscaler", "engine")]
    assert hpa["spec"]["scaleTargetRef"]["name"] == "engine"
    (metric,) = hpa["spec"]["metrics"]
    adapter = yaml.safe_load(
        (KUBE / "overlays/autoscaler/prometheus-adapter-values.yaml").read_text()
    )
    (rule,) = adapter["rules"]["custom"]
    assert metric["pods"]["metric"]["name"] == rule["name"]["as"]
    series = re.match(r"[\w:]+", rule["seriesQuery"])
    assert series is not None

    stats = SchedulerStats(0, 0, 0.0, 0, 0, 0, 0, 0)
    exported = ServerMetrics("m", lambda: stats).render().decode()
    assert f"\n{series.group(0)}{{" in exported  # the server exports what the adapter reads


def test_router_finds_the_engine_pods() -> None:
    docs = rendered("router")
    resources = by_key(docs)
    assert resources[("Deployment", "engine")]["spec"]["replicas"] == 2
    pvc = resources[("PersistentVolumeClaim", "engine-models")]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]  # replicas on several nodes
    router = resources[("Deployment", "engine-router")]["spec"]["template"]["spec"]
    (container,) = router["containers"]
    args = dict(a.removeprefix("--").split("=", 1) for a in container["args"])
    assert args["routing-logic"] == "prefixaware"
    key, value = args["k8s-label-selector"].split("=")
    engine_pod = resources[("Deployment", "engine")]["spec"]["template"]["metadata"]
    assert engine_pod["labels"][key] == value
    env = {e["name"]: e for e in container["env"]}
    assert env["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "engine-api-key"
    binding = resources[("RoleBinding", "engine-router-pod-reader")]
    assert binding["subjects"][0]["name"] == router["serviceAccountName"]


def test_yamllint() -> None:
    pytest.importorskip("yamllint")
    result = subprocess.run(
        [sys.executable, "-m", "yamllint", "-c", str(KUBE / ".yamllint.yaml"),
         str(ROOT / "deploy"), str(ROOT / "docker" / ".hadolint.yaml")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def expand(arg: str, values: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in args."""
    return re.sub(r"\$\((\w+)\)", lambda m: values[m.group(1)], arg)


def test_leaderworkerset_command_lines_parse() -> None:
    from engine.cli.serve_args import parse_serve_args

    lws = yaml.safe_load((KUBE / "multinode" / "leaderworkerset.yaml").read_text())
    template = lws["spec"]["leaderWorkerTemplate"]
    size = template["size"]
    env = {"LWS_GROUP_SIZE": str(size), "LWS_LEADER_ADDRESS": "engine-tp16-0.engine-tp16"}
    parsed = {}
    for role, worker_index in (("leaderTemplate", "0"), ("workerTemplate", "1")):
        (container,) = template[role]["spec"]["containers"]
        values = {**env, "LWS_WORKER_INDEX": worker_index}
        args = [expand(a, values) for a in container["args"]]
        result = parse_serve_args(args)
        assert not isinstance(result, str)
        gpus = container["resources"]["limits"]["nvidia.com/gpu"]
        assert result.engine_args.tensor_parallel_size == gpus * size
        parsed[role] = result
    leader, worker = parsed["leaderTemplate"], parsed["workerTemplate"]
    assert (leader.engine_args.node_rank, leader.server_args.headless) == (0, False)
    assert (worker.engine_args.node_rank, worker.server_args.headless) == (1, True)
    assert leader.engine_args.master_addr == worker.engine_args.master_addr
    assert leader.engine_args.nnodes == worker.engine_args.nnodes == size
