"""One place for the producer's port: Kubernetes set CONVEYOR_PORT beside a `--port 8000` flag,
and only the flag counted (CONVEYOR_PORT=9000 there changed nothing). conveyor/producer_server.py
now listens at CONVEYOR_HOST:CONVEYOR_PORT unless a flag says otherwise, no deployment passes
either flag (tests/test_deploy_producer_server.py), and what each deployment publishes and
probes is the port it listens on."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from urllib.parse import urlsplit

import httpx
import pytest
import yaml
from uvicorn.config import STARTUP_FAILURE

from conveyor.producer_server import listening_socket
from conveyor.stack import Stack, free_port
from shared.settings import Settings
from tests.conftest import REPO_ROOT, until
from tests.test_compose import COMPOSE_DIR, env, parse_dockerfile, published, service
from tests.test_k8s import env_of

DEFAULT_PORT = Settings.model_fields["port"].default
NAME = "producer-port-from-settings"


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


def test_the_producer_server_listens_at_conveyor_host_and_port(stack: Stack) -> None:
    port = free_port()
    command = [sys.executable, "-m", "conveyor.producer_server"]
    settings = {"CONVEYOR_HOST": "127.0.0.1", "CONVEYOR_PORT": str(port)}
    process = stack.spawn(NAME, command, {**settings, "CONVEYOR_INSTANCE_ID": NAME})
    try:
        until(lambda: process.poll() is not None or _answers(f"http://127.0.0.1:{port}"), 60)
        assert process.poll() is None, (stack.log_dir / f"{NAME}.log").read_text()[-2000:]
    finally:
        stack.stop_process(NAME)


def test_kubernetes_listens_on_the_container_port_it_declares() -> None:
    documents = yaml.safe_load_all((REPO_ROOT / "k8s" / "base" / "producer.yaml").read_text())
    deployment = next(d for d in documents if d and d["kind"] == "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    declared = {p["name"]: p["containerPort"] for p in container["ports"]}
    listens = int(env_of(container).get("CONVEYOR_PORT", DEFAULT_PORT))
    assert declared["http"] == listens, (declared, listens)


def test_compose_publishes_and_probes_the_port_its_producers_listen_on() -> None:
    for name in ("producer", "producer-cluster"):
        listens = int(env(name).get("CONVEYOR_PORT", DEFAULT_PORT))
        probed = re.findall(r"127\.0\.0\.1:(\d+)/", str(service(name)["healthcheck"]["test"]))
        assert list(published(name)) == [listens], name
        assert probed == [str(listens)], name


def test_the_image_exposes_and_probes_the_port_its_producer_listens_on(stack: Stack) -> None:
    """Its health check run as the image runs it, CONVEYOR_PORT set to where a producer answers
    (`docker run -e CONVEYOR_PORT=9000` was unhealthy: the check probed 8000)."""
    _, stages = parse_dockerfile(COMPOSE_DIR / "Dockerfile")
    (health,) = stages[-1].args("HEALTHCHECK")
    assert str(DEFAULT_PORT) in stages[-1].args("EXPOSE")[-1].split()
    program, *args = json.loads(health[health.index("CMD") + len("CMD") :])
    assert program == "python"
    port = str(urlsplit(stack.base_url).port)
    probe = subprocess.run([sys.executable, *args], env={**os.environ, "CONVEYOR_PORT": port})
    assert probe.returncode == 0


def test_a_port_past_65535_ends_the_start_on_one_line(caplog: pytest.LogCaptureFixture) -> None:
    """`--port 99999` ended in an OverflowError's traceback, where a taken port ends on one
    line and uvicorn's exit status for a failed start."""
    with pytest.raises(SystemExit) as ended, caplog.at_level(logging.ERROR):
        listening_socket("127.0.0.1", 99999)
    assert ended.value.code == STARTUP_FAILURE
    (record,) = caplog.records
    assert "error while attempting to bind on address ('127.0.0.1', 99999)" in record.getMessage()
