"""KEDA rendering and scaling: rendered objects satisfy KEDA's own CRD schemas, and on a real
stream the metric, activation and replica count come out exactly as KEDA and the HPA compute
them."""

from __future__ import annotations

import copy
import json
import math
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from click.testing import CliRunner
from jsonschema import Draft7Validator

from autoscaling.keda import (
    CLUSTER_STREAMS_SCALER,
    SCALER_LABEL,
    SECRET_NAME,
    STREAMS_SCALER,
    MetricSources,
    RedisTarget,
    render,
    scaled_object,
    worker_name,
)
from autoscaling.local_autoscaler import PoolScaler
from autoscaling.scaling_math import (
    NULL_LAG,
    BacklogTrigger,
    StreamTrigger,
    desired_replicas,
    group_lag,
    pending_entries,
    poll,
    read_metric,
    replicas_for_metric,
)
from conveyor.cli import main
from conveyor.valkey_cluster import local_cluster
from shared.keys import GROUP, Keys
from shared.model_repository import ModelConfig, ModelRepository
from shared.settings import get_settings

REPO_ROOT = Path(__file__).resolve().parent.parent
CRD_DIR = Path(__file__).parent / "fixtures" / "keda"
COMMITTED = REPO_ROOT / "k8s" / "base" / "keda.yaml"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
KEYS = Keys("cv:")


# ---------------------------------------------------------------- schema helpers (also test_k8s)


def strict(schema: Any) -> Any:
    """A copy that rejects unknown fields, as `kubectl apply --validate=strict` does; the CRDs
    leave additionalProperties open because the API server prunes instead."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict(value) for key, value in schema.items()}
    open_ended = "additionalProperties" in out or out.get("x-kubernetes-preserve-unknown-fields")
    if "properties" in out and not open_ended:
        out["additionalProperties"] = False
    return out


@cache
def crd_validators() -> dict[tuple[str, str], Draft7Validator]:
    """(apiVersion, kind) → validator for every served version of the fixture CRDs."""
    validators: dict[tuple[str, str], Draft7Validator] = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            schema = strict(version["schema"]["openAPIV3Schema"])
            validators[(f"{group}/{version['name']}", kind)] = Draft7Validator(schema)
    return validators


def crd_errors(obj: dict[str, Any]) -> list[str]:
    """Every schema violation of one KEDA object (an unknown kind is one)."""
    validator = crd_validators().get((obj.get("apiVersion", ""), obj.get("kind", "")))
    if validator is None:
        return [f"no KEDA CRD serves {obj.get('apiVersion')} {obj.get('kind')}"]
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(obj)]


# ---------------------------------------------------------------- rendering


@pytest.fixture(scope="module")
def repository() -> ModelRepository:
    return ModelRepository.load(REPO_ROOT / "model_repository")


def odd_model() -> ModelConfig:
    """A model whose names stress DNS safety: dots, underscores and a near-limit length."""
    return ModelConfig.model_validate(
        {
            "name": "m" * 60,
            "kind": "batch",
            "backend": "identity",
            "variants": {"v1.2": {}, "v1_2": {}, "default": {}},
            "autoscaling": {"lag_per_replica": 8, "min_replicas": 2, "max_replicas": 3},
        }
    )


def test_every_rendered_object_validates_against_keda_crds(repository):
    odd = ModelRepository({"odd": odd_model()})
    objects = render(repository, KEYS) + render(odd, KEYS, namespace="conveyor")
    kinds = {o["kind"] for o in objects}
    assert kinds == {"ScaledObject", "TriggerAuthentication"}
    for obj in objects:
        assert crd_errors(obj) == [], obj["metadata"]["name"]


def test_schema_check_catches_a_misspelt_field(repository):
    obj = copy.deepcopy(render(repository, KEYS)[1])
    obj["spec"]["minReplicas"] = obj["spec"].pop("minReplicaCount")
    obj["spec"]["triggers"][0]["metadata"]["streamLength"] = 64  # metadata values are strings
    errors = crd_errors(obj)
    assert any("minReplicas" in e for e in errors)
    assert any("is not of type 'string'" in e for e in errors)


def test_one_scaled_object_per_pool_with_dns_safe_distinct_names(repository):
    pools = [(c.name, v) for c in repository for v in c.variants]
    objects = [o for o in render(repository, KEYS) if o["kind"] == "ScaledObject"]
    assert sorted(o["metadata"]["name"] for o in objects) == sorted(
        worker_name(m, v) for m, v in pools
    )
    odd = odd_model()
    names = {worker_name(odd.name, v) for v in odd.variants}
    assert len(names) == 3
    for name in names:
        assert DNS_LABEL.match(name), name
    assert worker_name("minilm", "default") == "worker-minilm-default"


def test_triggers_watch_both_lanes_with_the_model_hints(repository):
    for config in repository:
        for variant in config.variants:
            spec = scaled_object(config, variant, KEYS)["spec"]
            hints = config.autoscaling
            assert spec["scaleTargetRef"]["name"] == worker_name(config.name, variant)
            assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (
                hints.min_replicas,
                hints.max_replicas,
            )
            assert spec["cooldownPeriod"] == hints.cooldown_s
            assert spec["pollingInterval"] == hints.polling_interval_s
            triggers = [StreamTrigger.from_metadata(t["metadata"]) for t in spec["triggers"]]
            assert [t.stream for t in triggers] == [
                KEYS.queue(config.name, variant),
                KEYS.bulk_queue(config.name, variant),
            ]
            assert {(t.mode, t.target, t.activation) for t in triggers} == {
                ("streamLength", hints.lag_per_replica, hints.activation_lag)
            }


def backlog_model(scaler: str) -> ModelConfig:
    return ModelConfig.model_validate(
        {
            "name": f"costly.{scaler}",
            "kind": "generate",
            "backend": "vllm",
            "autoscaling": {
                "metric": "backlog_seconds",
                "backlog": {"target_s": 12.5, "scaler": scaler},
                "max_replicas": 6,
            },
        }
    )


def test_backlog_seconds_pools_render_one_valid_trigger_per_scaler():
    sources = MetricSources("http://producer.inference.svc", "http://prom.monitoring.svc:9090")
    metrics_api, prometheus = (
        scaled_object(backlog_model(s), "default", KEYS, "inference", sources)
        for s in ("metrics-api", "prometheus")
    )
    for obj in (metrics_api, prometheus):
        assert crd_errors(obj) == [], obj["metadata"]["name"]
        assert len(obj["spec"]["triggers"]) == 1  # instead of the two stream triggers
    (trigger,) = metrics_api["spec"]["triggers"]
    assert trigger["type"] == "metrics-api" and trigger["metricType"] == "AverageValue"
    assert trigger["metadata"] == {
        "url": "http://producer.inference.svc/metrics/backlog/costly.metrics-api/default",
        "valueLocation": "scaling_seconds",
        "targetValue": "12.5",
        "activationTargetValue": "0",
    }
    (trigger,) = prometheus["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    assert trigger["metadata"] == {
        "serverAddress": "http://prom.monitoring.svc:9090",
        "query": (
            'max(conveyor_backlog_scaling_seconds{namespace="inference",'
            'model="costly.prometheus",variant="default"})'
        ),
        "threshold": "12.5",
        "activationThreshold": "0",
    }
    # the namespace names the producer's Service when no URL is given
    url = scaled_object(backlog_model("metrics-api"), "default", KEYS, "ml")["spec"]["triggers"]
    assert url[0]["metadata"]["url"].startswith("http://producer.ml.svc/metrics/backlog/")


@pytest.mark.parametrize("scaler", ["metrics-api", "prometheus"])
def test_local_autoscaler_reads_the_rendered_backlog_target(scaler):
    config = backlog_model(scaler)
    pool = PoolScaler.for_partition(config, "default", KEYS, str, lambda _: None, lambda _: True)
    assert pool.triggers == [BacklogTrigger(config, "default", KEYS, 12.5, 0.0)]


def test_render_cli_takes_the_metric_sources(tmp_path):
    folder = tmp_path / "costly"
    folder.mkdir()
    body = {"kind": "batch", "backend": "identity", "autoscaling": {"metric": "backlog_seconds"}}
    (folder / "config.yaml").write_text(yaml.safe_dump(body))
    args = ["render", "keda", "--model-repository", str(tmp_path)]
    urls = ["--producer-url", "http://conveyor-api:8000", "--prometheus-url", "http://p:9090"]
    result = CliRunner().invoke(main, [*args, *urls])
    assert result.exit_code == 0, result.output
    scaled = list(yaml.safe_load_all(result.stdout))[1]
    assert crd_errors(scaled) == []
    assert scaled["spec"]["triggers"][0]["metadata"]["url"] == (
        "http://conveyor-api:8000/metrics/backlog/costly/default"
    )


def test_metric_source_urls_ending_in_a_slash_still_name_the_endpoints(tmp_path):
    """`--producer-url http://conveyor-api:8000/` rendered `…:8000//metrics/backlog/…`, a path
    the producer answers 404 (KEDA's client sends it as written): the pool never scaled."""
    for scaler in ("metrics-api", "prometheus"):
        folder = tmp_path / scaler / "costly"
        folder.mkdir(parents=True)
        scaling = {"metric": "backlog_seconds", "backlog": {"scaler": scaler}}
        body = {"kind": "batch", "backend": "identity", "autoscaling": scaling}
        (folder / "config.yaml").write_text(yaml.safe_dump(body))
        args = ["render", "keda", "--model-repository", str(folder.parent)]
        urls = ["--producer-url", "http://conveyor-api:8000/", "--prometheus-url", "http://p:9090/"]
        result = CliRunner().invoke(main, [*args, *urls])
        assert result.exit_code == 0, result.output
        (trigger,) = list(yaml.safe_load_all(result.stdout))[1]["spec"]["triggers"]
        expected = {
            "metrics-api": ("url", "http://conveyor-api:8000/metrics/backlog/costly/default"),
            "prometheus": ("serverAddress", "http://p:9090"),
        }[scaler]
        assert (expected[0], trigger["metadata"][expected[0]]) == expected


@pytest.mark.parametrize("target_s", [0.0009, 1e-7])
def test_render_refuses_a_backlog_target_keda_would_send_as_zero(tmp_path, target_s):
    """KEDA hands the HPA a target in whole thousandths (cut before 2.20): `target_s` under 1 ms
    rendered a trigger the HPA got as 0 and refused. It is refused at load, by model and field;
    1 ms, the least KEDA can send, renders."""
    config = tmp_path / "eager" / "config.yaml"
    config.parent.mkdir()
    args = ["render", "keda", "--model-repository", str(tmp_path)]
    rendered = []
    for target in (target_s, 0.001):
        scaling = {"metric": "backlog_seconds", "backlog": {"target_s": target}}
        body = {"kind": "batch", "backend": "identity", "autoscaling": scaling}
        config.write_text(yaml.safe_dump(body))
        rendered.append(CliRunner().invoke(main, args))
    refused, least = rendered
    assert refused.exit_code == 1, refused.output
    assert f"{config}: autoscaling.backlog.target_s: " in refused.output, refused.output
    assert "KEDA sends the HPA 0.001 s at least" in refused.output, refused.output
    assert least.exit_code == 0, least.output
    (trigger,) = list(yaml.safe_load_all(least.stdout))[1]["spec"]["triggers"]
    assert trigger["metadata"]["targetValue"] == "0.001"


# How Go's YAML reads a plain (unquoted) scalar, written from go-yaml v3's resolve.go (`resolve`:
# its map of words, then, for a scalar starting with a digit or sign, a timestamp, Go's
# strconv.ParseInt/ParseUint in base 0 with `_` removed, then `yamlStyleFloat`; for one starting
# with `.`, strconv.ParseFloat), with v2's YAML 1.1 booleans: sigs.k8s.io/yaml, which kubectl
# and kustomize read manifests with, decodes with go-yaml v2. Not from autoscaling/keda.py's
# dumper, so a rule the dumper lacks shows up here as a value Go reads as another type.
_GO_WORDS: dict[str, Any] = {
    **dict.fromkeys(
        ["true", "True", "TRUE", "y", "Y", "yes", "Yes", "YES", "on", "On", "ON"], True
    ),
    **dict.fromkeys(
        ["false", "False", "FALSE", "n", "N", "no", "No", "NO", "off", "Off", "OFF"], False
    ),
    **dict.fromkeys(["", "~", "null", "Null", "NULL"], None),
    **dict.fromkeys([".nan", ".NaN", ".NAN"], math.nan),
    **dict.fromkeys([".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"], math.inf),
    **dict.fromkeys(["-.inf", "-.Inf", "-.INF"], -math.inf),
}
_GO_HINTED = frozenset("+-0123456789yYnNtTfFoO~.")  # resolveTable: others are strings at once
# strconv.ParseInt(s, 0, 64)'s syntax: a sign, then 0x/0X, 0b/0B, 0o/0O, a leading 0 (octal)
_GO_INT = re.compile(r"([-+]?)(0[xX][0-9a-fA-F]+|0[bB][01]+|0[oO][0-7]+|0[0-7]*|[1-9][0-9]*)")
_GO_YAML_STYLE_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
# strconv.ParseFloat of a scalar starting with `.`: `_` only between digits (underscoreOK)
_GO_DOT_FLOAT = re.compile(r"\.[0-9](_?[0-9])*([eE][-+]?[0-9](_?[0-9])*)?")
_GO_DATE = re.compile(r"[0-9]{4}-")  # parseTimestamp's quick check


def go_int(plain: str) -> int | None:
    """strconv.ParseInt(plain, 0, 64), else ParseUint (no sign): None where both fail."""
    if not (found := _GO_INT.fullmatch(plain)):
        return None
    sign, digits = found.groups()
    octal = digits[:1] == "0" and digits[1:2].isdigit()  # Go's 017; Python's int() refuses it
    value = int(digits, 8) if octal else int(digits, 0)
    value = -value if sign == "-" else value
    fits = -(2**63) <= value < 2**63 or (not sign and value < 2**64)
    return value if fits else None


def go_plain(text: str) -> Any:
    """The value Go's YAML decodes a plain scalar `text` to (into an interface{}, as
    sigs.k8s.io/yaml does before converting to JSON): a timestamp stays a string there."""
    if text[:1] not in _GO_HINTED and text:
        return text
    if text in _GO_WORDS:
        return _GO_WORDS[text]
    if text.startswith("."):
        return float(text.replace("_", "")) if _GO_DOT_FLOAT.fullmatch(text) else text
    if text[:1] not in "+-0123456789" or _GO_DATE.match(text):
        return text  # a word's first letter not in the map; a timestamp, decoded as a string
    plain = text.replace("_", "")
    if (value := go_int(plain)) is not None:
        return value
    if _GO_YAML_STYLE_FLOAT.fullmatch(plain) and math.isfinite(number := float(plain)):
        return number  # ParseFloat's overflow is an error: Go keeps the string
    return text


class GoYamlLoader(yaml.SafeLoader):
    """Reads YAML as Go's YAML (kubectl, kustomize) does: PyYAML parses the structure, every
    plain scalar is resolved by `go_plain` (quoted ones are strings, as everywhere)."""

    def resolve(self, kind: Any, value: Any, implicit: Any) -> str:
        if kind is yaml.ScalarNode and implicit[0]:
            return "!go-plain"
        return super().resolve(kind, value, implicit)


GoYamlLoader.add_constructor("!go-plain", lambda loader, node: go_plain(node.value))


def test_the_go_reader_reads_plain_scalars_as_resolve_go_does():
    """The reader the render is checked with, against go-yaml's own resolution of each family."""
    read = {
        **{"1e3": 1000.0, "2_5e1": 250.0, ".5": 0.5, "08": 8.0, "1_e3": 1000.0},
        **{"0o17": 15, "017": 15, "0x1f": 31, "0_x1f": 31, "0B11": 3, "1_000": 1000, "-0b1": -1},
        **{"y": True, "on": True, "TRUE": True, "n": False, "off": False, "~": None, "": None},
        **{"2001-12-14": "2001-12-14", "1e400": "1e400", "._5": "._5", "0x": "0x", "nan": "nan"},
    }
    assert {text: go_plain(text) for text in read} == read
    assert {type(go_plain(text)) for text in ("1_000", "0_x1f")} == {int}


# model `1e3`'s variants: each a family of plain scalars Go's YAML reads as a number or a boolean
ODD_VARIANTS = ("default", "0o17", "2_5e1", "0_x1f", "0_b1", "0e_-1", "1_000", "08", "y", "on")


def test_names_that_read_as_numbers_stay_strings_for_kubectl(tmp_path):
    """A model named `1e3` rendered `conveyor.dev/model: 1e3`: kubectl read a number there and
    refused the file (`cannot unmarshal number into … labels of type string`); one named `0_x1f`
    rendered unquoted too (Go drops `_` before parsing: 31). Read as Go reads it, every value of
    the render is what PyYAML wrote (a string a string, a number a number)."""
    folder = tmp_path / "1e3"
    folder.mkdir()
    body = {
        "kind": "batch",
        "backend": "identity",
        "variants": {name: {} for name in ODD_VARIANTS},
    }
    (folder / "config.yaml").write_text(yaml.safe_dump(body))
    args = ["render", "keda", "--model-repository", str(tmp_path)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    documents = list(yaml.load_all(result.stdout, Loader=GoYamlLoader))
    scaled = documents[1:]
    models = {o["metadata"]["labels"]["conveyor.dev/model"] for o in scaled}
    variants = {o["metadata"]["labels"]["conveyor.dev/variant"] for o in scaled}
    assert (models, variants) == ({"1e3"}, set(ODD_VARIANTS))
    written = list(yaml.safe_load_all(result.stdout))
    assert json.dumps(documents) == json.dumps(written)  # by type: 1 is not "1", nor 1.0


def test_committed_manifest_is_a_fresh_render():
    args = ["render", "keda", "--model-repository", str(REPO_ROOT / "model_repository")]
    result = CliRunner().invoke(main, [*args, "--key-prefix", "cv:"])
    assert result.exit_code == 0, result.output
    assert COMMITTED.read_text() == result.stdout, (
        "k8s/base/keda.yaml is stale: run `conveyor render keda --out k8s/base`"
    )


def auth_refs(objects: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    (auth,) = [o for o in objects if o["kind"] == "TriggerAuthentication"]
    return {(r["parameter"], r["name"], r["key"]) for r in auth["spec"]["secretTargetRef"]}


def test_cluster_render_uses_redis_cluster_streams_on_the_tagged_streams(repository):
    odd = ModelRepository({"odd": odd_model(), "costly": backlog_model("prometheus")})
    objects = render(repository, KEYS, cluster=True) + render(odd, KEYS, "ml", cluster=True)
    for obj in objects:
        assert crd_errors(obj) == [], obj["metadata"]["name"]
    assert auth_refs(objects[:1]) == {
        ("addresses", SECRET_NAME, "addresses"),
        ("password", SECRET_NAME, "password"),
    }
    for config in [*repository, odd_model()]:
        for variant in config.variants:
            obj = scaled_object(config, variant, KEYS, cluster=True)
            assert obj["metadata"]["labels"][SCALER_LABEL] == CLUSTER_STREAMS_SCALER
            triggers = obj["spec"]["triggers"]
            assert {t["type"] for t in triggers} == {CLUSTER_STREAMS_SCALER}
            tag = Keys.tag(config.name, variant)
            online, bulk = (t["metadata"]["stream"] for t in triggers)
            assert (online, bulk) == (KEYS.queue(config.name, variant), f"{online}:bulk")
            assert tag in online  # one slot per partition: KEDA's cluster client finds its master
            single = scaled_object(config, variant, KEYS)["spec"]["triggers"]
            assert [t["metadata"] for t in triggers] == [t["metadata"] for t in single]
    (backlog,) = scaled_object(backlog_model("prometheus"), "default", KEYS, cluster=True)["spec"][
        "triggers"
    ]
    assert backlog["type"] == "prometheus"  # seconds of backlog do not come from Redis


def test_single_server_render_keeps_redis_streams_and_one_address(repository):
    objects = render(repository, KEYS)
    assert auth_refs(objects) == {
        ("address", SECRET_NAME, "address"),
        ("password", SECRET_NAME, "password"),
    }
    for obj in objects[1:]:
        assert obj["metadata"]["labels"][SCALER_LABEL] == STREAMS_SCALER
        assert {t["type"] for t in obj["spec"]["triggers"]} == {STREAMS_SCALER}


def test_render_cli_follows_the_cluster_setting_unless_told(monkeypatch):
    monkeypatch.setenv("CONVEYOR_REDIS_CLUSTER", "1")
    get_settings.cache_clear()
    try:
        args = ["render", "keda", "--model-repository", str(REPO_ROOT / "model_repository")]
        runs = {
            flag: CliRunner().invoke(main, [*args, *flag])
            for flag in [(), ("--single-redis",), ("--redis-cluster",)]
        }
    finally:
        get_settings.cache_clear()
    types = {}
    for flag, result in runs.items():
        assert result.exit_code == 0, result.output
        scaled = list(yaml.safe_load_all(result.stdout))[1]
        assert crd_errors(scaled) == []
        types[flag] = scaled["spec"]["triggers"][0]["type"]
    assert types == {
        (): CLUSTER_STREAMS_SCALER,
        ("--single-redis",): STREAMS_SCALER,
        ("--redis-cluster",): CLUSTER_STREAMS_SCALER,
    }


def test_render_takes_the_urls_database_and_tls_never_its_password(monkeypatch):
    """A CONVEYOR_REDIS_URL naming DB 3 rendered triggers without `databaseIndex`: KEDA read
    DB 0, found no stream and held every pool at its minimum; a `rediss://` one, no
    `enableTLS`. A cluster has DB 0 only; the password stays in the Secret either way."""
    monkeypatch.setenv("CONVEYOR_REDIS_URL", "rediss://:s3cret@redis.example:6380/3")
    get_settings.cache_clear()
    try:
        args = ["render", "keda", "--model-repository", str(REPO_ROOT / "model_repository")]
        runs = [
            CliRunner().invoke(main, [*args, flag])
            for flag in ("--single-redis", "--redis-cluster")
        ]
    finally:
        get_settings.cache_clear()
    connections = []
    for result in runs:
        assert result.exit_code == 0, result.output
        assert "s3cret" not in result.stdout
        scaled = list(yaml.safe_load_all(result.stdout))[1]
        assert crd_errors(scaled) == []
        metadata = [t["metadata"] for t in scaled["spec"]["triggers"]]
        connections += [(m.get("databaseIndex"), m.get("enableTLS")) for m in metadata]
    assert connections == [("3", "true")] * 2 + [(None, "true")] * 2


def test_an_acl_user_in_the_url_is_read_from_the_secret(repository):
    """A URL naming an ACL user (MemoryDB, ElastiCache RBAC) rendered a TriggerAuthentication
    without `username`: KEDA authenticated as the default user with that user's password, was
    refused, and scaled nothing. The name comes from the Secret, as the password does."""
    for cluster in (False, True):
        user = RedisTarget.of_url("rediss://keda-acl-user:s3cret@redis.example:6379/0")
        objects = render(repository, KEYS, cluster=cluster, redis=user)
        assert ("username", SECRET_NAME, "username") in auth_refs(objects)
        assert crd_errors(objects[0]) == [] and "keda-acl-user" not in yaml.safe_dump_all(objects)
        plain = render(repository, KEYS, cluster=cluster, redis=RedisTarget.of_url("redis://h/0"))
        assert "username" not in {parameter for parameter, _, _ in auth_refs(plain)}


def test_render_to_a_directory_sets_the_namespace(tmp_path):
    args = ["render", "keda", "--out", str(tmp_path), "--namespace", "inference"]
    repository = str(REPO_ROOT / "model_repository")
    result = CliRunner().invoke(main, [*args, "--model-repository", repository])
    assert result.exit_code == 0, result.output
    docs = list(yaml.safe_load_all((tmp_path / "keda.yaml").read_text()))
    assert docs and {d["metadata"]["namespace"] for d in docs} == {"inference"}


@pytest.mark.parametrize(
    ("option", "value", "problem"),
    [
        ("--namespace", "Inference_Prod", "is not a Kubernetes namespace"),
        ("--namespace", "", "is not a Kubernetes namespace"),
        ("--producer-url", "conveyor-api:8000", "is not an http(s) URL with a host"),
        ("--prometheus-url", "ftp://prometheus", "is not an http(s) URL with a host"),
        ("--prometheus-url", "http://admin:s3cret@prometheus:9090", "carries credentials"),
        ("--producer-url", "http://s3cret@producer.conveyor.svc", "carries credentials"),
    ],
)
def test_render_refuses_what_kubernetes_or_keda_would(tmp_path, option, value, problem):
    """These rendered YAML that the API server refuses, a trigger that never reads, or a
    credential in plain text in the manifest (which the refusal does not echo either)."""
    args = ["render", "keda", "--out", str(tmp_path), option, value]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and problem in result.output, result.output
    assert "s3cret" not in result.output
    assert not (tmp_path / "keda.yaml").exists()


def test_render_to_a_file_is_one_error_naming_the_option(tmp_path):
    """`--out` naming a file, not a folder, was a FileExistsError traceback."""
    taken = tmp_path / "taken"
    taken.write_text("")
    result = CliRunner().invoke(main, ["render", "keda", "--out", str(taken)])
    assert result.exit_code == 1, result.output
    assert f"--out {taken}: cannot write keda.yaml there" in result.output
    assert isinstance(result.exception, SystemExit)


def test_autoscale_refuses_a_poll_interval_that_is_not_positive():
    """A negative interval was a traceback after the first tick; 0 meant the default, silently."""
    for value in ("-1", "0"):
        result = CliRunner().invoke(
            main, ["autoscale", "--models", "identity", "--interval", value]
        )
        assert result.exit_code == 2 and "is not in the range 0<x<=" in result.output, result.output


# ---------------------------------------------------------------- scaling on a real stream


def minilm_pool(repository: ModelRepository) -> tuple[list[StreamTrigger], int, int]:
    config = repository.get("minilm")
    assert config is not None
    spec = scaled_object(config, "default", KEYS)["spec"]
    triggers = [StreamTrigger.from_metadata(t["metadata"]) for t in spec["triggers"]]
    return triggers, spec["minReplicaCount"], spec["maxReplicaCount"]


def decide(client: redis.Redis, pool: tuple[list[StreamTrigger], int, int], current: int) -> int:
    triggers, low, high = pool
    return desired_replicas(poll(client, triggers), low, high, current)


def enqueue(client: redis.Redis, stream: str, count: int) -> list[bytes]:
    pipe = client.pipeline()
    for i in range(count):
        pipe.xadd(stream, {"job": f"j{i}"})
    return pipe.execute()


def finish(client: redis.Redis, stream: str, ids: list[bytes]) -> None:
    """What a worker does on completion: XACK and XDEL in one round trip."""
    pipe = client.pipeline(transaction=True)
    pipe.xack(stream, GROUP, *ids)
    pipe.xdel(stream, *ids)
    pipe.execute()


def test_zero_one_and_many_queued_jobs(redis_client, repository):
    pool = minilm_pool(repository)  # lag_per_replica 64, min 0, max 4
    stream = KEYS.queue("minilm", "default")
    assert decide(redis_client, pool, current=0) == 0  # stream not even created yet
    redis_client.xgroup_create(stream, GROUP, id="0", mkstream=True)
    assert decide(redis_client, pool, current=0) == 0
    enqueue(redis_client, stream, 1)
    assert [r.active for r in poll(redis_client, pool[0])] == [True, False]
    assert decide(redis_client, pool, current=0) == 1  # one job wakes the pool from zero
    enqueue(redis_client, stream, 149)
    assert decide(redis_client, pool, current=1) == 3  # ceil(150 / 64)
    enqueue(redis_client, stream, 850)
    assert decide(redis_client, pool, current=3) == 4  # ceil(1000 / 64) = 16, clamped to max


def test_in_flight_entries_keep_replicas_until_acknowledged(redis_client, repository):
    pool = minilm_pool(repository)
    stream = KEYS.queue("minilm", "default")
    redis_client.xgroup_create(stream, GROUP, id="0", mkstream=True)
    enqueue(redis_client, stream, 150)
    delivered = redis_client.xreadgroup(GROUP, "w1", {stream: ">"}, count=150)
    ids = [entry_id for entry_id, _ in delivered[0][1]]
    assert pending_entries(redis_client, stream, GROUP) == 150
    assert group_lag(redis_client, stream, GROUP) == 0  # nothing left to deliver...
    assert decide(redis_client, pool, current=3) == 3  # ...but 150 jobs are still running
    finish(redis_client, stream, ids[:100])
    assert decide(redis_client, pool, current=3) == 1  # ceil(50 / 64)
    finish(redis_client, stream, ids[100:])
    assert decide(redis_client, pool, current=1) == 0


def test_bulk_lane_alone_wakes_the_pool(redis_client, repository):
    pool = minilm_pool(repository)
    enqueue(redis_client, KEYS.bulk_queue("minilm", "default"), 200)
    online, bulk = poll(redis_client, pool[0])
    assert (online.value, online.active, bulk.value, bulk.active) == (0, False, 200, True)
    assert decide(redis_client, pool, current=0) == 4  # ceil(200 / 64)


def test_min_replicas_hold_an_idle_pool(redis_client, repository):
    config = repository.get("identity")
    assert config is not None and config.autoscaling.min_replicas == 1
    spec = scaled_object(config, "default", KEYS)["spec"]
    triggers = [StreamTrigger.from_metadata(t["metadata"]) for t in spec["triggers"]]
    pool = (triggers, spec["minReplicaCount"], spec["maxReplicaCount"])
    assert decide(redis_client, pool, current=2) == 1


def test_cluster_triggers_read_each_pool_on_its_own_master(tmp_path, repository):
    """What KEDA's redis-cluster-streams scaler does: XLEN through a cluster client given one
    node's address, for two pools whose streams sit on different masters."""
    with local_cluster(tmp_path, masters=2) as cluster:
        by_master = {
            cluster.master_of(KEYS.queue(c.name, v)).port: (c, v)
            for c in repository
            for v in c.variants
        }
        assert len(by_master) == 2, "every pool hashed to one master"
        (first, first_variant), (second, second_variant) = by_master.values()
        client = cluster.client()
        enqueue(client, KEYS.queue(first.name, first_variant), 3)  # type: ignore[arg-type]
        enqueue(client, KEYS.bulk_queue(second.name, second_variant), 130)  # type: ignore[arg-type]
        readings = []
        for config, variant in by_master.values():
            spec = scaled_object(config, variant, KEYS, cluster=True)["spec"]
            triggers = [StreamTrigger.from_metadata(t["metadata"]) for t in spec["triggers"]]
            readings.append([r.value for r in poll(client, triggers)])  # type: ignore[arg-type]
        client.close()
    assert readings == [[3, 0], [0, 130]]


def test_lag_count_goes_blind_when_jobs_finish_out_of_order(redis_client):
    """Why the renderer uses streamLength: XDEL of a finished job leaves a tombstone at the
    group's position, Redis answers `lag: nil`, and KEDA's lagCount reads -1 (inactive)."""
    stream = KEYS.queue("minilm", "default")
    redis_client.xgroup_create(stream, GROUP, id="0", mkstream=True)
    enqueue(redis_client, stream, 2)
    redis_client.xreadgroup(GROUP, "slow", {stream: ">"}, count=1)
    fast = redis_client.xreadgroup(GROUP, "fast", {stream: ">"}, count=1)
    finish(redis_client, stream, [fast[0][1][0][0]])
    enqueue(redis_client, stream, 1)  # one job running, one queued
    lag = StreamTrigger.from_metadata(
        {"stream": stream, "consumerGroup": GROUP, "lagCount": "1", "activationLagCount": "0"}
    )
    length = StreamTrigger.from_metadata({"stream": stream, "streamLength": "1"})
    lag_reading, length_reading = read_metric(redis_client, lag), read_metric(redis_client, length)
    assert (lag_reading.value, lag_reading.active) == (NULL_LAG, False)
    assert (length_reading.value, length_reading.active) == (2, True)
    assert desired_replicas([lag_reading], 0, 4, current=1) == 0
    assert desired_replicas([length_reading], 0, 4, current=1) == 2


def test_lag_count_edge_cases_read_like_keda(redis_client):
    stream = "cv:q:absent:default"
    assert group_lag(redis_client, stream, GROUP) == 0  # no such key
    enqueue(redis_client, stream, 3)
    assert group_lag(redis_client, stream, GROUP) == 3  # no group yet: KEDA falls back to XLEN
    redis_client.xgroup_create(stream, GROUP, id="0")
    assert group_lag(redis_client, stream, GROUP) == 3


def test_trigger_modes_follow_keda_metadata_rules():
    pending = StreamTrigger.from_metadata({"stream": "s", "consumerGroup": "g"})
    assert (pending.mode, pending.target, pending.activation) == ("pendingEntriesCount", 5, 0)
    lag = StreamTrigger.from_metadata({"stream": "s", "consumerGroup": "g", "lagCount": "7"})
    assert (lag.mode, lag.target) == ("lagCount", 7)
    length = StreamTrigger.from_metadata({"stream": "s", "lagCount": "7"})
    assert (length.mode, length.target) == ("streamLength", 5)  # no group: XLEN, default 5


def test_hpa_tolerance_and_rounding():
    assert replicas_for_metric(66, 64, current=1) == 1  # within 10 %: no change
    assert replicas_for_metric(72, 64, current=1) == 2
    assert replicas_for_metric(300, 64, current=2) == 5
    assert replicas_for_metric(NULL_LAG, 64, current=3) == 0
