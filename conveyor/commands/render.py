"""`conveyor render keda`: write the KEDA objects for every worker pool, so the Kubernetes
manifests are generated from model_repository/ and never drift from it by hand."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

import click

from autoscaling.prometheus_url import PROMETHEUS_URL
from shared.http_url import is_http_url
from shared.keys import Keys

KEDA_FILE = "keda.yaml"
# A Kubernetes namespace is an RFC 1123 label: anything else renders YAML the API server refuses.
NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
# A Secret's name is an RFC 1123 subdomain: labels joined by dots, at most 253 in all.
SUBDOMAIN = re.compile(
    r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)


def _namespace(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    # Matched whole: `$` alone matched before a final newline, and `ns\n` rendered.
    if value is not None and not NAMESPACE.fullmatch(value):
        raise click.BadParameter(
            f"{value!r} is not a Kubernetes namespace (lowercase letters, digits and '-', "
            "at most 63, starting and ending with a letter or digit)"
        )
    return value


def _secret_name(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not SUBDOMAIN.fullmatch(value):
        raise click.BadParameter(
            f"{value!r} is not a Secret name (lowercase letters, digits, '-' and '.')"
        )
    return value


def _key_prefix(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """CONVEYOR_KEY_PREFIX's rule: triggers for a prefix the pods refuse watch streams no one
    writes."""
    from shared.settings import valid_key_prefix

    if value is None:
        return value
    try:
        return valid_key_prefix(value)
    except ValueError as exc:
        raise click.BadParameter(f"{value!r} {exc}") from None


def _http_url(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """KEDA's scalers fetch these URLs: a typo would render a trigger that never reads, and a
    `user:password@` would sit in plain text in the manifest, which is committed. The endpoint's
    path goes after the URL as given, so a `?` or `#` in it (an empty one too) would take that
    path into its query or fragment: KEDA asked for `/` and the pool never scaled. Python's
    parser drops a line break or a leading space and takes a space in the host; Go's, KEDA's,
    refuses such a URL."""
    if value is None:
        return value
    if not is_http_url(value):
        raise click.BadParameter(f"{value!r} is not an http(s) URL with a host")
    if urlsplit(value).username is not None:  # not echoed: it holds the credential
        raise click.BadParameter(
            "carries credentials (user:password@), which would be written into the manifest in "
            "plain text: give the trigger KEDA's authModes and a TriggerAuthentication instead"
        )
    if "?" in value or "#" in value:  # not echoed: a query may hold a token
        raise click.BadParameter(
            "has a query or fragment ('?', '#'): the trigger's path would be appended inside it; "
            "give the scheme, host, port and path only"
        )
    if not value.isprintable() or " " in value:
        raise click.BadParameter(f"{value!r} holds a space or a control character (write %20)")
    return value


@click.group("render")
def command() -> None:
    """Render deployment manifests from the model repository."""


@command.command("keda")
@click.option(
    "--namespace",
    default=None,
    callback=_namespace,
    help="metadata.namespace (default: none, for kustomize)",
)
@click.option(
    "--out",
    default="-",
    show_default=True,
    help=f"'-' for stdout, or a directory to write {KEDA_FILE} into.",
)
@click.option(
    "--model-repository",
    type=click.Path(path_type=Path, exists=True, file_okay=False),
    default=None,
    help="The models to render pools for (default: CONVEYOR_MODEL_REPOSITORY).",
)
@click.option(
    "--key-prefix",
    default=None,
    callback=_key_prefix,
    help="Redis key prefix (default: CONVEYOR_KEY_PREFIX).",
)
@click.option(
    "--producer-url",
    default=None,
    callback=_http_url,
    help="Producer Service KEDA's metrics-api reads backlog seconds from "
    "(default: http://producer.<namespace or conveyor>.svc).",
)
@click.option(
    "--prometheus-url",
    default=PROMETHEUS_URL,
    callback=_http_url,
    show_default=True,
    help="Prometheus server for pools with `autoscaling.backlog.scaler: prometheus`.",
)
@click.option(
    "--redis-cluster/--single-redis",
    default=None,
    help="Scale on a Redis/Valkey Cluster (redis-cluster-streams triggers, the Secret's "
    "`addresses`) or on one server (default: CONVEYOR_REDIS_CLUSTER).",
)
@click.option(
    "--redis-tls-secret",
    default=None,
    callback=_secret_name,
    help="Secret KEDA reads the TLS files of CONVEYOR_REDIS_URL from (ssl_ca_certs: `ca.crt`; "
    "ssl_certfile/ssl_keyfile: `tls.crt`/`tls.key`); required when the URL names them.",
)
def keda(
    namespace: str | None,
    out: str,
    model_repository: Path | None,
    key_prefix: str | None,
    producer_url: str | None,
    prometheus_url: str,
    redis_cluster: bool | None,
    redis_tls_secret: str | None,
) -> None:
    """TriggerAuthentication plus one ScaledObject per (model, variant), as multi-doc YAML. The
    stream triggers take CONVEYOR_REDIS_URL's database (`databaseIndex`) and TLS
    (`rediss://`: `enableTLS`); its password stays in the Secret, its CA and client
    certificate in the one `--redis-tls-secret` names."""
    # The renderer, Redis's URL parser, the settings and the model repository are imported
    # here: `conveyor render --help` and a usage error need none of them.
    from autoscaling.keda import MetricSources, RedisTarget, RedisTargetError, render, to_yaml
    from conveyor.configured_repository import configured_repository
    from shared.model_repository import ModelRepository
    from shared.settings import get_settings

    settings = get_settings()
    repository = (  # a missing --model-repository is click's to refuse (`exists`)
        configured_repository(settings)
        if model_repository is None
        else ModelRepository.load(model_repository)
    )
    keys = Keys(key_prefix if key_prefix is not None else settings.key_prefix)
    default = MetricSources.for_namespace(namespace)
    sources = MetricSources(producer_url or default.producer_url, prometheus_url)
    cluster = settings.redis_cluster if redis_cluster is None else redis_cluster
    try:  # its database and TLS, not its password
        redis = RedisTarget.of_url(settings.redis_url, redis_tls_secret)
    except RedisTargetError as exc:
        raise click.ClickException(str(exc)) from None
    text = to_yaml(render(repository, keys, namespace, sources, cluster, redis))
    if out == "-":
        click.echo(text, nl=False)
        return
    target = Path(out) / KEDA_FILE
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")  # what kubectl reads, whatever the locale
    except OSError as exc:  # a file where the folder goes, no permission: a traceback before
        raise click.ClickException(f"--out {out}: cannot write {KEDA_FILE} there: {exc}") from exc
    click.echo(f"wrote {target}", err=True)
