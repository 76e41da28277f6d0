"""`conveyor render keda`'s options refuse what would render objects that never work: a metric
source URL with a query or fragment (KEDA puts the endpoint's path after the URL as given) or a
space or line break Go's URL parser refuses, a namespace with a line break after it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from conveyor.cli import main


def _backlog_repository(root: Path, scaler: str) -> Path:
    folder = root / "costly"
    folder.mkdir(parents=True)
    scaling = {"metric": "backlog_seconds", "backlog": {"scaler": scaler}}
    body = {"kind": "batch", "backend": "identity", "autoscaling": scaling}
    (folder / "config.yaml").write_text(yaml.safe_dump(body))
    return root


@pytest.mark.parametrize(
    ("option", "scaler", "value", "problem"),
    [
        ("--producer-url", "metrics-api", "http://conveyor-api:8000/?token=s3cret", "query"),
        ("--producer-url", "metrics-api", "http://conveyor-api:8000?", "query"),
        ("--prometheus-url", "prometheus", "http://prometheus:9090/#s3cret", "query"),
        ("--producer-url", "metrics-api", " http://conveyor-api:8000", "space"),
        ("--producer-url", "metrics-api", "http://conveyor-api:8000\n", "space"),
        ("--prometheus-url", "prometheus", "http://prome theus:9090", "space"),
    ],
)
def test_a_url_keda_cannot_put_its_path_after_is_refused(
    tmp_path: Path, option: str, scaler: str, value: str, problem: str
) -> None:
    """`--producer-url http://conveyor-api:8000/?token=…` rendered the trigger URL
    `…/?token=…/metrics/backlog/costly/default`: KEDA asked for `/` with that query (a 404 from
    the producer; Prometheus likewise got `?…/api/v1/query`). Python's URL parser drops a line
    break and a leading space, and takes a space in the host, where Go's, KEDA's, refuses the
    URL. Either way the pool never scaled. The refusal of a query does not echo it: it may hold a
    token."""
    repository = _backlog_repository(tmp_path / "models", scaler)
    out = tmp_path / "out"
    args = ["render", "keda", "--model-repository", str(repository), "--out", str(out)]
    result = CliRunner().invoke(main, [*args, option, value])
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}'" in result.output, result.output
    assert problem in result.output, result.output
    assert "s3cret" not in result.output
    assert not (out / "keda.yaml").exists()


def test_a_url_with_a_path_still_renders_below_it(tmp_path: Path) -> None:
    """A producer behind a path prefix is a URL KEDA can read: only `?` and `#` are refused."""
    repository = _backlog_repository(tmp_path, "metrics-api")
    args = ["render", "keda", "--model-repository", str(repository)]
    result = CliRunner().invoke(main, [*args, "--producer-url", "http://gw.example/conveyor/"])
    assert result.exit_code == 0, result.output
    (trigger,) = list(yaml.safe_load_all(result.stdout))[1]["spec"]["triggers"]
    assert trigger["metadata"]["url"] == (
        "http://gw.example/conveyor/metrics/backlog/costly/default"
    )


def test_a_namespace_with_a_trailing_newline_is_refused(tmp_path: Path) -> None:
    """The namespace check's `$` matched before a final newline: `inference` and a line break
    rendered a quoted `namespace` holding it, which the API server refuses, and a default
    producer URL with the break inside its host."""
    out = tmp_path / "out"
    args = ["render", "keda", "--out", str(out), "--namespace", "inference\n"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert "is not a Kubernetes namespace" in result.output, result.output
    assert not (out / "keda.yaml").exists()
