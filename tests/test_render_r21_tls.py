"""TLS as CONVEYOR_REDIS_URL asks for it, carried into the stream triggers: a `rediss://` URL
whose `ssl_cert_reqs=none` lets the pods take a server's self-signed certificate must let KEDA
take it too (`unsafeSsl`), or its scaler fails every handshake and no pool ever scales."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoscaling.keda import RedisTarget, render
from shared.keys import Keys
from shared.model_repository import ModelRepository
from tests.test_keda import crd_errors

REPOSITORY = Path(__file__).resolve().parent.parent / "model_repository"
KEYS = Keys("cv:")


def _trigger_tls(url: str, cluster: bool) -> set[tuple[str | None, str | None]]:
    """(enableTLS, unsafeSsl) of every stream trigger rendered for `url`, each object valid."""
    objects = render(
        ModelRepository.load(REPOSITORY), KEYS, cluster=cluster, redis=RedisTarget.of_url(url)
    )
    assert all(crd_errors(o) == [] for o in objects)
    triggers = [t for o in objects[1:] for t in o["spec"]["triggers"] if "stream" in t["metadata"]]
    assert triggers
    return {(t["metadata"].get("enableTLS"), t["metadata"].get("unsafeSsl")) for t in triggers}


@pytest.mark.parametrize("cluster", [False, True])
def test_a_url_that_skips_certificate_checks_skips_them_for_keda_too(cluster: bool) -> None:
    url = "rediss://:s3cret@redis.example:6380/0?ssl_cert_reqs=none"
    assert _trigger_tls(url, cluster) == {("true", "true")}


@pytest.mark.parametrize(
    "url",
    [
        "rediss://:s3cret@redis.example:6380/0",
        "rediss://:s3cret@redis.example:6380/0?ssl_cert_reqs=required",
        "redis://:s3cret@redis.example:6379/0?ssl_cert_reqs=none",  # no TLS: nothing to skip
    ],
)
def test_certificates_stay_verified_unless_the_url_says_otherwise(url: str) -> None:
    tls = "true" if url.startswith("rediss") else None
    assert _trigger_tls(url, cluster=False) == {(tls, None)}
