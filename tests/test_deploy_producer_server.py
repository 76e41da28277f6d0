"""Every deployment runs the producer as `conveyor up` does (conveyor/producer_server.py). Compose,
Kubernetes and the image ran uvicorn's own command line, which takes a request head of any size
(one client's 128 MB header held a producer's event loop for 29 s) and kept the server's
settings in flags beside the CONVEYOR_ variables. Each deployment's command, run as its manifest
gives it (all interfaces, its environment) against the embedded Valkey, answers, refuses a head
past the bound, and keeps an idle connection past uvicorn's own 5 s."""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest
import yaml
from pydantic import ValidationError

from conveyor.stack import Stack, free_port
from shared.settings import Settings
from tests.conftest import until
from tests.test_compose import COMPOSE_DIR, argv, env, parse_dockerfile, service
from tests.test_k8s import KUBECTL, OVERLAYS, env_of, of_kind

REPO_ROOT = Path(__file__).resolve().parents[1]
# No --host or --port: its address is CONVEYOR_HOST's (the image's 0.0.0.0) and CONVEYOR_PORT's
COMMAND = ["python", "-m", "conveyor.producer_server"]
# Kubernetes passes them, CONVEYOR_PORT's value put in by the kubelet: an image of an earlier
# release, which overlays pin, took no address from the env (and required --port)
KUBERNETES_COMMAND = [*COMMAND, "--host", "0.0.0.0", "--port", "$(CONVEYOR_PORT)"]
# Past what asyncio reads at once (256 KiB) beyond the 64 KiB bound: refused whatever the reads.
HUGE_HEAD_BYTES = 330 * 1024


class Deployed(NamedTuple):
    command: list[str]
    env: dict[str, str]  # the literal values it sets (not those from a Secret)


def image_env() -> dict[str, str]:
    """What the producer's image sets (its last stage's ENV), under every deployment's own."""
    _, stages = parse_dockerfile(COMPOSE_DIR / "Dockerfile")
    words = [word for rest in stages[-1].args("ENV") for word in shlex.split(rest)]
    return {name: value for name, _, value in (word.partition("=") for word in words)}


def _compose(name: str) -> Deployed:
    return Deployed(argv(name), env(name))


def _container(deployment: dict[str, Any]) -> Deployed:
    (container,) = [
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "producer"
    ]
    literal = {k: v for k, v in env_of(container).items() if isinstance(v, str)}
    return Deployed(container["command"], literal)


def _kubernetes() -> Deployed:
    documents = yaml.safe_load_all((REPO_ROOT / "k8s" / "base" / "producer.yaml").read_text())
    return _container(next(d for d in documents if d and d["kind"] == "Deployment"))


def _image() -> Deployed:
    _, stages = parse_dockerfile(COMPOSE_DIR / "Dockerfile")
    return Deployed(json.loads(stages[-1].args("CMD")[-1]), {})


DEPLOYMENTS: dict[str, Callable[[], Deployed]] = {
    "compose": lambda: _compose("producer"),
    "compose-cluster": lambda: _compose("producer-cluster"),
    "kubernetes": _kubernetes,
    "image": _image,
}


@pytest.mark.parametrize("deployment", DEPLOYMENTS)
def test_every_deployment_runs_conveyor_ups_producer_server(deployment: str) -> None:
    """Not uvicorn's command line: its server has no head bound, and a flag there would hold a
    setting the CONVEYOR_ variables no longer decide."""
    command = KUBERNETES_COMMAND if deployment == "kubernetes" else COMMAND
    assert DEPLOYMENTS[deployment]().command == command


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_overlay_patches_the_producers_command(overlay: str) -> None:
    assert _container(of_kind(overlay, "Deployment")["producer"]).command == KUBERNETES_COMMAND


@pytest.mark.parametrize("name", ["producer", "producer-cluster"])
def test_compose_cuts_requests_before_it_kills_the_producer(name: str) -> None:
    """Requests in flight get the producer's graceful shutdown, inside compose's stop grace."""
    default = Settings.model_fields["producer_shutdown_grace_s"].default
    grace_s = int(env(name).get("CONVEYOR_PRODUCER_SHUTDOWN_GRACE_S", default))
    assert grace_s < int(str(service(name)["stop_grace_period"]).removesuffix("s"))


def test_a_keep_alive_below_a_second_is_refused() -> None:
    """0 would close every connection once answered: each request a new connection."""
    with pytest.raises(ValidationError, match="keep_alive_s"):
        Settings(keep_alive_s=0)


@pytest.fixture(scope="module", params=["compose", "kubernetes"])
def deployed_address(request: pytest.FixtureRequest, stack: Stack) -> Iterator[tuple[str, int]]:
    """The deployment's command and environment, on a free port (as its container's 8000)."""
    command, manifest_env = DEPLOYMENTS[request.param]()
    port = free_port()
    command = [str(Path(sys.executable).parent / command[0]), *command[1:]]  # the image's PATH
    name = f"producer-deployed-{request.param}"
    own = {k: v for k, v in manifest_env.items() if k.startswith("CONVEYOR_")}
    # the image's address (its paths are the container's), the manifest's over it
    own = {"CONVEYOR_HOST": image_env()["CONVEYOR_HOST"], **own, "CONVEYOR_PORT": str(port)}
    # as the kubelet puts a container's variables in its command's $(NAME)s
    command = [re.sub(r"\$\((\w+)\)", lambda m: own[m.group(1)], word) for word in command]
    stack.spawn(
        name, command, {**own, "CONVEYOR_REDIS_URL": stack.redis_url, "CONVEYOR_INSTANCE_ID": name}
    )
    try:
        until(lambda: _ready(port), timeout=60)
        yield "127.0.0.1", port
    finally:
        stack.stop_process(name)


def _ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


def _received(sock: socket.socket) -> bytes:
    """What the server sent until it closed the connection (a reset ends it too)."""
    received = b""
    while chunk := _received_one(sock):
        received += chunk
    return received


def test_a_deployed_producer_answers_on_every_interface(deployed_address: tuple[str, int]) -> None:
    host, port = deployed_address
    answer = httpx.get(f"http://{host}:{port}/readyz", timeout=5.0)
    assert answer.status_code == 200, answer.text
    assert "server" not in answer.headers


def test_a_deployed_producer_refuses_a_huge_head_431(deployed_address: tuple[str, int]) -> None:
    """However the head is read: the bound (64 KiB) is checked at the read after it passed."""
    head = (
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: "
        + b"a" * HUGE_HEAD_BYTES
        + b"\r\n\r\n"
    )
    with socket.create_connection(deployed_address, timeout=30) as sock:
        # refused (and closed) before the whole head was sent
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(head)
        answer = _received(sock)
    assert answer.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n"), answer[:200]


def test_a_deployed_producer_keeps_an_idle_connection_past_uvicorns_5_s(
    deployed_address: tuple[str, int],
) -> None:
    request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    with socket.create_connection(deployed_address, timeout=30) as sock:
        sock.sendall(request)
        first = _one_answer(sock)
        time.sleep(6)  # not timed: idle past uvicorn's default keep-alive
        sock.sendall(request)
        second = _one_answer(sock)
    assert first.startswith(b"HTTP/1.1 200 OK\r\n"), first[:200]
    assert second.startswith(b"HTTP/1.1 200 OK\r\n"), second[:200]


def _one_answer(sock: socket.socket) -> bytes:
    """One answer, its head and its `content-length` of body; what came before the server
    closed the connection if it did (b'' when it had closed it already)."""
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = _received_one(sock)
        if not chunk:
            return answer
        answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    length = re.search(rb"(?im)^content-length: *(\d+)", head)
    assert length, head
    while len(body) < int(length[1]) and (chunk := _received_one(sock)):
        body += chunk
    return head + b"\r\n\r\n" + body


def _received_one(sock: socket.socket) -> bytes:
    """What one read brings: b'' once the server has closed the connection (reset it)."""
    try:
        return sock.recv(65536)
    except ConnectionResetError:
        return b""
