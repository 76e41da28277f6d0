"""Kubernetes manifests: each overlay builds with `kubectl kustomize`, its KEDA objects satisfy
KEDA's CRD schemas, every worker pool is a Deployment scaled by the ScaledObject rendered for it,
pods are hardened, probed, wired to one Redis and given time to finish their last batch, and
each pool runs an image that can serve it."""

from __future__ import annotations

import argparse
import copy
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from autoscaling.keda import SECRET_NAME, render, scaled_object, worker_name
from autoscaling.scaling_math import StreamTrigger
from shared.keys import Keys
from shared.model_repository import AutoscalingHints, ModelRepository
from shared.settings import Settings
from tests.test_compose import image, parse_dockerfile, preparer_gaps, unservable
from tests.test_keda import crd_errors

REPO_ROOT = Path(__file__).resolve().parent.parent
OVERLAYS = ("dev", "prod", "prod-cluster")
PRODUCTION = ("prod", "prod-cluster")  # no in-cluster Redis, GPU pools on GPU nodes
NAMESPACES = {"dev": "conveyor-dev", "prod": "conveyor", "prod-cluster": "conveyor"}
KUBECTL = shutil.which("kubectl")

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")


def kustomize(path: Path) -> tuple[dict[str, Any], ...]:
    out = subprocess.run(
        [str(KUBECTL), "kustomize", str(path)],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    return tuple(doc for doc in yaml.safe_load_all(out) if doc)


@cache
def build(overlay: str) -> tuple[dict[str, Any], ...]:
    return kustomize(REPO_ROOT / "k8s" / "overlays" / overlay)


def of_kind(overlay: str, kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in build(overlay) if o["kind"] == kind}


def workers(overlay: str) -> dict[str, dict[str, Any]]:
    return {
        name: d
        for name, d in of_kind(overlay, "Deployment").items()
        if d["metadata"]["labels"].get("app.kubernetes.io/component") == "worker"
    }


def pod_specs(overlay: str) -> Iterator[tuple[str, dict[str, Any]]]:
    for obj in build(overlay):
        if obj["kind"] in {"Deployment", "StatefulSet"}:
            yield obj["metadata"]["name"], obj["spec"]["template"]["spec"]


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def served_pool(deployment: dict[str, Any]) -> tuple[str, str]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    model, _, variant = env_of(container)["CONVEYOR_MODELS"].partition(":")
    return model, variant


def docker_build() -> argparse.ArgumentParser:
    """The `docker build` options the overlays' headers use."""
    parser = argparse.ArgumentParser(prog="docker build", add_help=False, exit_on_error=False)
    parser.add_argument("-f", dest="dockerfile", required=True)
    parser.add_argument("-t", dest="tag", required=True)
    parser.add_argument("--build-arg", dest="build_args", action="append", default=[])
    parser.add_argument("context")
    return parser


@cache
def image_builds() -> dict[str, tuple[Path, dict[str, str]]]:
    """Image → its Dockerfile and build args, from the `docker build` commands (run in the
    repository root) that the overlays' header comments give for the images they deploy."""
    builds = {}
    for path in sorted((REPO_ROOT / "k8s" / "overlays").glob("*/kustomization.yaml")):
        lines = path.read_text().splitlines()
        comments = "\n".join(line.removeprefix("#") for line in lines if line.startswith("#"))
        for command in comments.replace("\\\n", " ").splitlines():
            if command.split()[:2] == ["docker", "build"]:
                build = docker_build().parse_args(shlex.split(command)[2:])
                args = dict(arg.split("=", 1) for arg in build.build_args)
                builds[build.tag] = (REPO_ROOT / build.dockerfile, args)
    return builds


@pytest.fixture(scope="module")
def repository() -> ModelRepository:
    return ModelRepository.load(REPO_ROOT / "model_repository")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_keda_objects_validate_against_crds(overlay):
    keda = [o for o in build(overlay) if o["apiVersion"].startswith("keda.sh/")]
    assert {o["kind"] for o in keda} == {"ScaledObject", "TriggerAuthentication"}
    for obj in keda:
        assert crd_errors(obj) == [], obj["metadata"]["name"]
    namespaces = {o["metadata"].get("namespace") for o in build(overlay)} - {None}
    assert namespaces == {NAMESPACES[overlay]}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_pool_is_a_deployment_scaled_by_its_own_streams(overlay, repository):
    deployments, scaled = workers(overlay), of_kind(overlay, "ScaledObject")
    for name, so in scaled.items():
        target = so["spec"]["scaleTargetRef"]
        assert (target.get("kind"), target["name"]) == ("Deployment", name)
        model, variant = served_pool(deployments[name])
        streams = [
            StreamTrigger.from_metadata(t["metadata"]).stream for t in so["spec"]["triggers"]
        ]
        assert streams == [Keys().queue(model, variant), Keys().bulk_queue(model, variant)]
    for name, deployment in deployments.items():
        assert name == worker_name(*served_pool(deployment))
    pools = {worker_name(c.name, v) for c in repository for v in c.variants}
    assert set(deployments) == set(scaled) == pools, "every pool needs a Deployment and a render"


def metrics_api_urls(objects: tuple[dict[str, Any], ...]) -> list[str]:
    return [
        trigger["metadata"]["url"]
        for obj in objects
        if obj["kind"] == "ScaledObject"
        for trigger in obj["spec"]["triggers"]
        if trigger["type"] == "metrics-api"
    ]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_metrics_api_triggers_read_the_producer_of_the_overlays_namespace(overlay, tmp_path):
    """KEDA's operator fetches a backlog-seconds trigger's URL from its own namespace: base
    renders `producer.conveyor.svc`, which in conveyor-dev named a producer that is not there.
    Built over a base that also scales a pool on backlog seconds, so that the check bites."""
    k8s = shutil.copytree(REPO_ROOT / "k8s", tmp_path / "k8s")
    models = tmp_path / "models"
    (models / "slow").mkdir(parents=True)
    (models / "slow" / "config.yaml").write_text(
        "kind: batch\nbackend: identity\nautoscaling: {metric: backlog_seconds}\n"
    )
    (config,) = ModelRepository.load(models)
    with (k8s / "base" / "keda.yaml").open("a") as keda:
        keda.write(yaml.safe_dump(scaled_object(config, "default", Keys()), explicit_start=True))
    urls = metrics_api_urls(kustomize(k8s / "overlays" / overlay)) + metrics_api_urls(
        build(overlay)
    )
    assert urls, "no metrics-api trigger built"
    producer = f"http://producer.{NAMESPACES[overlay]}.svc/"
    assert [url for url in urls if not url.startswith(producer)] == []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_run_non_root_on_a_read_only_root(overlay):
    for name, spec in pod_specs(overlay):
        pod = spec.get("securityContext", {})
        emptydirs = {v["name"] for v in spec.get("volumes", []) if "emptyDir" in v}
        for container in spec["containers"]:
            ctx = {**pod, **container.get("securityContext", {})}
            assert ctx.get("runAsNonRoot") is True and ctx.get("runAsUser", 0) != 0, name
            assert ctx.get("readOnlyRootFilesystem") is True, name
            assert ctx.get("allowPrivilegeEscalation") is False, name
            assert "ALL" in ctx.get("capabilities", {}).get("drop", []), name
            mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
            assert mounts.get("/tmp") in emptydirs, f"{name}: /tmp must be a writable emptyDir"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_hit_ports_the_container_serves(overlay):
    for name, spec in pod_specs(overlay):
        for container in spec["containers"]:
            ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
            for kind in ("readinessProbe", "livenessProbe"):
                probe = container.get(kind)
                assert probe, f"{name}: no {kind}"
                action = probe.get("httpGet") or probe.get("tcpSocket")
                if action is not None:
                    port = action["port"]
                    assert port in ports or port in ports.values(), f"{name}: {kind} port"
            if name in workers(overlay):
                metrics = int(env_of(container)["CONVEYOR_METRICS_PORT"])
                assert ports["metrics"] == metrics
                assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    producer = of_kind(overlay, "Deployment")["producer"]["spec"]["template"]["spec"]
    assert producer["containers"][0]["readinessProbe"]["httpGet"]["path"] == "/readyz"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_grace_period_outlasts_the_slowest_batch(overlay, repository):
    """kubelet's SIGKILL comes after the worker's own forced exit (its drain limit, itself above
    the slowest batch, plus CONVEYOR_FORCED_EXIT_MARGIN_S for the engines' close and Celery's
    exit, as `conveyor up` and `conveyor autoscale` wait): identity's 60 s fell inside 45 + 20."""
    for name, deployment in workers(overlay).items():
        model, _ = served_pool(deployment)
        config = repository.get(model)
        hints = config.autoscaling if config is not None else AutoscalingHints()
        spec = deployment["spec"]["template"]["spec"]
        env = env_of(spec["containers"][0])
        drain = float(env.get("CONVEYOR_SHUTDOWN_GRACE_S", Settings().shutdown_grace_s))
        margin = float(env.get("CONVEYOR_FORCED_EXIT_MARGIN_S", Settings().forced_exit_margin_s))
        assert drain > hints.slowest_batch_s, name
        assert spec["terminationGracePeriodSeconds"] > drain + margin, name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_producer_leaves_its_endpoints_before_it_stops_listening(overlay):
    """The producer closes its socket at SIGTERM, while Services and ingresses route to the pod
    until they see it leave the endpoints: a preStop wait comes first, and the grace period
    holds it and the producer's graceful shutdown (CONVEYOR_PRODUCER_SHUTDOWN_GRACE_S).
    Without it, requests in that window were refused."""
    spec = of_kind(overlay, "Deployment")["producer"]["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    pre_stop = container.get("lifecycle", {}).get("preStop", {})
    command = pre_stop.get("exec", {}).get("command", [])
    assert command[:1] == ["sleep"], "no preStop wait"
    wait_s = float(command[1])
    assert wait_s >= 5
    env = env_of(container)
    graceful_s = float(
        env.get("CONVEYOR_PRODUCER_SHUTDOWN_GRACE_S", Settings().producer_shutdown_grace_s)
    )
    assert spec["terminationGracePeriodSeconds"] > wait_s + graceful_s


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gpu_pools_request_gpus_only_where_labelled(overlay):
    gpu_pools = 0
    for name, deployment in workers(overlay).items():
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        gpus = int(container.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
        labelled = deployment["metadata"]["labels"]["conveyor.dev/accelerator"] == "gpu"
        assert (gpus >= 1) == labelled, name
        assert ("gpu" in container["image"]) == labelled, name
        gpu_pools += labelled
    # prod: minilm:torch and smollm2 on GPUs (minilm:default is ONNX Runtime on the CPU); dev
    # runs every pool on the CPU
    assert gpu_pools == (2 if overlay in PRODUCTION else 0)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_pool_runs_an_image_that_can_serve_it(overlay):
    """prod ran minilm:default (ONNX Runtime) on the GPU image, which has no ONNX Runtime, and
    dev ran smollm2 (vLLM) on a CPU image without vLLM or smollm2's artifacts: both crash-looped."""
    builds = image_builds()
    for name, deployment in workers(overlay).items():
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert container["image"] in builds, f"{name}: no overlay header builds its image"
        built = image(*builds[container["image"]])
        assert unservable(built, env_of(container)["CONVEYOR_MODELS"]) == [], name


def test_each_image_build_installs_what_its_preparers_import():
    """The dev image's build adds smollm2 to what it prepares, and must add `gguf` with it."""
    assert image_builds(), "no overlay header says how its images are built"
    for tag, (dockerfile, build_args) in image_builds().items():
        _, stages = parse_dockerfile(dockerfile, build_args)
        assert preparer_gaps(stages) == [], tag


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gpu_pools_need_no_gpu_operator_labels(overlay):
    """`nvidia.com/gpu.present` comes from NVIDIA's GPU Operator (GPU Feature Discovery) alone:
    with just the device plugin the README asks for, a GPU pool selecting it stayed Pending.
    The `nvidia.com/gpu` limit and the toleration place it."""
    for name, deployment in workers(overlay).items():
        if deployment["metadata"]["labels"]["conveyor.dev/accelerator"] == "gpu":
            selector = deployment["spec"]["template"]["spec"].get("nodeSelector", {})
            assert not [k for k in selector if k.startswith("nvidia.com/")], name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_everything_reads_one_redis_secret(overlay):
    for name, spec in pod_specs(overlay):
        for container in spec["containers"]:
            url = env_of(container).get("CONVEYOR_REDIS_URL")
            if name != "redis":
                assert url == {"secretKeyRef": {"name": SECRET_NAME, "key": "url"}}, name
    (producer,) = of_kind(overlay, "Deployment")["producer"]["spec"]["template"]["spec"][
        "containers"
    ]
    console = {"secretKeyRef": {"name": "conveyor-console", "key": "secret"}}
    assert env_of(producer)["CONVEYOR_CONSOLE_SECRET"] == console  # one for every replica
    (auth,) = of_kind(overlay, "TriggerAuthentication").values()
    refs = {(r["parameter"], r["name"], r["key"]) for r in auth["spec"]["secretTargetRef"]}
    address = "addresses" if overlay == "prod-cluster" else "address"
    assert refs == {(address, SECRET_NAME, address), ("password", SECRET_NAME, "password")}


def test_dev_redis_is_the_one_the_secret_names_and_keeps_an_aof():
    """KEDA's operator reads `address` from its own namespace: a short name (`redis`, as this
    test once required) resolved to nothing there, and no ScaledObject could scale."""
    secret = of_kind("dev", "Secret")[SECRET_NAME]["stringData"]
    service = of_kind("dev", "Service")["redis"]
    host, port = secret["address"].split(":")
    namespace = service["metadata"]["namespace"]
    assert host == f"redis.{namespace}.svc.cluster.local"
    assert int(port) == service["spec"]["ports"][0]["port"]
    assert secret["url"] == f"redis://:{secret['password']}@{secret['address']}/0"
    (container,) = of_kind("dev", "StatefulSet")["redis"]["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    assert args[args.index("--appendfsync") + 1] == "everysec"
    assert container["image"].startswith("redis:7")


@pytest.mark.parametrize("overlay", PRODUCTION)
def test_prod_runs_bigger_pinned_and_without_in_cluster_redis(overlay):
    kinds = {(o["kind"], o["metadata"]["name"]) for o in build(overlay)}
    assert ("StatefulSet", "redis") not in kinds and ("Secret", SECRET_NAME) not in kinds
    assert ("Secret", "conveyor-console") not in kinds
    for name, spec in pod_specs(overlay):
        for container in spec["containers"]:
            image, _, tag = container["image"].rpartition(":")
            assert image and tag not in {"", "latest", "dev"}, f"{name}: unpinned image"
            limits = container.get("resources", {}).get("limits", {})
            assert {"cpu", "memory"} <= set(limits), f"{name}: no resource limits"
    replicas = {o: of_kind(o, "Deployment")["producer"]["spec"]["replicas"] for o in OVERLAYS}
    assert replicas[overlay] > replicas["dev"]


def test_prod_cluster_is_prod_in_cluster_mode_with_the_cluster_render(repository, monkeypatch):
    """Every pod gets CONVEYOR_REDIS_CLUSTER, replica acks and the Secret's `addresses` as its
    seed nodes (KEDA's list: a `url` naming one node, down, stopped every pod's start); KEDA's
    objects become what `conveyor render keda --redis-cluster` emits, and nothing else of prod
    changes."""
    prod, cluster = build("prod"), build("prod-cluster")
    rendered = {
        o["metadata"]["name"]: o
        for o in render(repository, Keys(), namespace="conveyor", cluster=True)
    }
    assert len(prod) == len(cluster)
    for before, after in zip(prod, cluster, strict=True):
        name, kind = after["metadata"]["name"], after["kind"]
        expected = copy.deepcopy(before)
        if kind == "Deployment":
            (container,) = expected["spec"]["template"]["spec"]["containers"]
            container["env"] += [
                {"name": "CONVEYOR_REDIS_CLUSTER", "value": "1"},
                {"name": "CONVEYOR_REPLICA_ACKS", "value": "1"},
                {
                    "name": "CONVEYOR_REDIS_CLUSTER_NODES",
                    "valueFrom": {"secretKeyRef": {"name": SECRET_NAME, "key": "addresses"}},
                },
            ]
        elif kind == "TriggerAuthentication":
            expected["spec"] = rendered[name]["spec"]
        elif kind == "ScaledObject":
            expected["spec"]["triggers"] = rendered[name]["spec"]["triggers"]
            expected["metadata"]["labels"] = rendered[name]["metadata"]["labels"]
        assert after == expected, f"{kind} {name}"
    producer = of_kind("prod-cluster", "Deployment")["producer"]["spec"]["template"]["spec"]
    for key, value in env_of(producer["containers"][0]).items():
        if isinstance(value, str):
            monkeypatch.setenv(key, value)
    assert (Settings().redis_cluster, Settings().replica_acks) == (True, 1)
