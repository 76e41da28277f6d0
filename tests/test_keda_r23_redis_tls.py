"""TLS files CONVEYOR_REDIS_URL makes the pods read reach KEDA's redis-streams scaler too: a
private CA (`ssl_ca_certs`) or a client certificate (`ssl_certfile`/`ssl_keyfile`) is read from
the Secret `--redis-tls-secret` names, through the TriggerAuthentication's `ca`, `cert` and
`key`. Without that Secret, and for `ssl_check_hostname=false` (which KEDA cannot do alone),
the render is refused: the triggers it wrote failed every handshake and no pool ever scaled."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import yaml
from click.testing import CliRunner, Result

from conveyor.cli import main
from shared.settings import get_settings
from tests.test_keda import REPO_ROOT, crd_errors

Render = Callable[..., Result]

CA_URL = "rediss://:s3cret@redis.example:6380/0?ssl_ca_certs=/etc/redis-tls/ca.crt"
MTLS_URL = f"{CA_URL}&ssl_certfile=/etc/redis-tls/tls.crt&ssl_keyfile=/etc/redis-tls/tls.key"


@pytest.fixture
def render_with(monkeypatch: pytest.MonkeyPatch) -> Iterator[Render]:
    """`conveyor render keda` of the shipped repository under a CONVEYOR_REDIS_URL."""

    def run(url: str, *flags: str) -> Result:
        monkeypatch.setenv("CONVEYOR_REDIS_URL", url)
        get_settings.cache_clear()
        args = ["render", "keda", "--model-repository", str(REPO_ROOT / "model_repository")]
        return CliRunner().invoke(main, [*args, *flags])

    yield run
    get_settings.cache_clear()


def _rendered(result: Result) -> list[dict[str, object]]:
    assert result.exit_code == 0, result.output
    assert "s3cret" not in result.stdout
    objects = [o for o in yaml.safe_load_all(result.stdout) if o]
    assert all(crd_errors(o) == [] for o in objects)
    return objects


def _tls_refs(auth: dict[str, object]) -> set[tuple[str, str, str]]:
    refs = auth["spec"]["secretTargetRef"]  # type: ignore[index]
    return {
        (r["parameter"], r["name"], r["key"])
        for r in refs
        if r["parameter"] in {"ca", "cert", "key", "tls"}
    }


@pytest.mark.parametrize("url", [CA_URL, MTLS_URL])
def test_tls_files_without_a_secret_for_keda_are_refused(render_with: Render, url: str) -> None:
    result = render_with(url)
    assert result.exit_code == 1, result.output
    assert "--redis-tls-secret" in result.output and "ca.crt" in result.output
    assert ("tls.key" in result.output) is (url == MTLS_URL)
    assert "s3cret" not in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("cluster", ["--single-redis", "--redis-cluster"])
def test_a_private_ca_and_client_certificate_are_read_from_the_named_secret(
    render_with: Render, cluster: str
) -> None:
    auth, *scaled = _rendered(render_with(MTLS_URL, cluster, "--redis-tls-secret", "redis-tls"))
    assert _tls_refs(auth) == {
        ("ca", "redis-tls", "ca.crt"),
        ("cert", "redis-tls", "tls.crt"),
        ("key", "redis-tls", "tls.key"),
    }
    # KEDA refuses `tls` in both the trigger and the TriggerAuthentication: the trigger has it.
    metadata = [t["metadata"] for o in scaled for t in o["spec"]["triggers"]]
    assert {(m.get("enableTLS"), m.get("unsafeSsl")) for m in metadata} == {("true", None)}
    ca_only = _rendered(render_with(CA_URL, cluster, "--redis-tls-secret", "redis-tls"))[0]
    assert _tls_refs(ca_only) == {("ca", "redis-tls", "ca.crt")}


def test_an_unchecked_certificate_needs_no_ca(render_with: Render) -> None:
    """`ssl_cert_reqs=none` renders `unsafeSsl`: KEDA checks no chain, so a CA is not asked
    for; a client certificate still is."""
    unchecked = f"{CA_URL}&ssl_cert_reqs=none&ssl_check_hostname=false"
    auth, *_ = _rendered(render_with(unchecked))
    assert _tls_refs(auth) == set()
    mtls = f"{MTLS_URL}&ssl_cert_reqs=none"
    auth, *_ = _rendered(render_with(mtls, "--redis-tls-secret", "redis-tls"))
    assert _tls_refs(auth) == {("cert", "redis-tls", "tls.crt"), ("key", "redis-tls", "tls.key")}


def test_a_hostname_check_skipped_alone_is_refused(render_with: Render) -> None:
    result = render_with(f"{CA_URL}&ssl_check_hostname=false", "--redis-tls-secret", "redis-tls")
    assert result.exit_code == 1, result.output
    assert "ssl_check_hostname" in result.output and "ssl_cert_reqs=none" in result.output


@pytest.mark.parametrize(
    ("url", "secret", "code", "problem"),
    [
        ("rediss://:s3cret@redis.example:6380/0", "redis-tls", 1, "nothing to read"),
        ("redis://:s3cret@redis.example:6379/0", "redis-tls", 1, "nothing to read"),
        (CA_URL, "Redis_TLS", 2, "not a Secret name"),
    ],
)
def test_a_tls_secret_that_cannot_be_read_is_refused(
    render_with: Render, url: str, secret: str, code: int, problem: str
) -> None:
    result = render_with(url, "--redis-tls-secret", secret)
    assert result.exit_code == code and problem in result.output, result.output
