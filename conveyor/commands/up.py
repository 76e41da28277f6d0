"""`conveyor up`: the whole pipeline on this machine (what `make up` runs), until Ctrl-C."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import click

from conveyor.commands.keys import create_dev_key
from conveyor.stack import Stack
from shared.model_repository import ModelRepository
from shared.settings import get_settings

EXAMPLES = """{key_note}
Conveyor is up: producer {url}, workers for {models}.

  # embeddings, submit and wait
  curl -s {url}/v1/models/minilm/predict{auth} -H 'content-type: application/json' \\
       -d '{{"inputs": {{"texts": ["a queue in front of a model", "hello world"]}}}}'

  # submit, then long-poll the job
  curl -s {url}/v1/jobs{auth} -H 'content-type: application/json' \\
       -d '{{"model": "identity", "inputs": {{"hello": "world"}}}}'
  curl -s '{url}/v1/jobs/<id>?wait=10'{auth}

  # models and their queues
  curl -s {url}/v1/models{auth}

Ctrl-C stops everything (workers drain first).
"""


@click.command("up")
@click.option("--port", default=None, type=int, help="Producer port (CONVEYOR_PORT, 8000).")
@click.option("--models", default=None, help="Comma-separated models; default: all examples.")
@click.option(
    "--state-dir",
    default=Path("var/run"),
    type=click.Path(path_type=Path),
    help="Logs and the embedded server's data.",
)
def command(port: int | None, models: str | None, state_dir: Path) -> None:
    """Run the pipeline: embedded Valkey (unless CONVEYOR_REDIS_URL), producer, one worker each."""
    settings = get_settings()
    names = (
        models.split(",")
        if models
        else list(ModelRepository.load(settings.model_repository).models)
    )
    redis_url = os.environ.get("CONVEYOR_REDIS_URL")
    valkey_config = {"appendonly": "yes"} if redis_url is None else None
    stack = Stack.create(state_dir, redis_url, valkey_config)
    try:
        url = stack.start_producer(port or settings.port)
        for name in names:
            stack.start_worker(name)
        click.echo(EXAMPLES.format(url=url, models=", ".join(names), **_auth(stack)), nl=True)
        _wait_for_signal(stack)
    finally:
        click.echo("stopping: workers drain their batches first")
        stack.stop()


def _auth(stack: Stack) -> dict[str, str]:
    """Auth stays on under `make up`: a development key is created and shown instead."""
    settings = get_settings()
    if settings.auth == "disabled":
        return {"key_note": "\nAuth is disabled (CONVEYOR_AUTH=disabled).", "auth": ""}
    key = create_dev_key(settings.model_copy(update={"redis_url": stack.redis_url}))
    note = f"\nDevelopment API key (tenant dev, all scopes): {key}"
    return {"key_note": note, "auth": f" -H 'authorization: Bearer {key}'"}


def _wait_for_signal(stack: Stack) -> None:
    stopping = False

    def _stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    while not stopping:
        for name, process in stack.processes.items():
            if process.poll() is not None:
                raise click.ClickException(f"{name} exited with {process.returncode}")
        time.sleep(0.5)
