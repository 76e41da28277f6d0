"""`conveyor up`: the whole pipeline on this machine (what `make up` runs), supervised until
Ctrl-C: a child that dies is restarted (`conveyor/supervisor.py`), and the CLI finds the stack
through `<state dir>/stack.json` (`conveyor/local_stack.py`)."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import signal
import socket
import time
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import click

from conveyor.state_dir_lock import state_dir_lock
from shared.cpu_count import usable_cpus
from shared.limits import MAX_PROCESSES

# The stack, Redis, the settings and the model repository are imported in the functions that
# use them: `conveyor up --help` and a usage error need none of them (most of a second).
if TYPE_CHECKING:
    from conveyor.stack import Stack
    from conveyor.supervisor import Supervisor
    from shared.model_repository import ModelRepository

BANNER = """{key_note}
Conveyor is up: producer {url} ({producers}), workers for {models}.
Operator console: {url}/console (log in with an API key that has the read or admin scope)
Worker metrics for Prometheus (each kept across restarts): {metrics}
{examples}
  # models and their queues
  curl -s {url}/v1/models{auth}

  # the CLI (.venv/bin/conveyor) and the SDK from another shell
  export {redis_exports} CONVEYOR_URL={url}{key_export}

Ctrl-C stops everything (workers drain first); a child that dies is restarted.
"""
# A request for each example model, shown only while that model is served: a curl for a model
# the stack does not serve would answer 404.
EXAMPLES = {
    "minilm": """
  # embeddings, submit and wait
  curl -s {url}/v1/models/minilm/predict{auth} -H 'content-type: application/json' \\
       -d '{{"inputs": {{"texts": ["a queue in front of a model", "hello world"]}}}}'
""",
    "identity": """
  # submit, then long-poll the job
  curl -s {url}/v1/jobs{auth} -H 'content-type: application/json' \\
       -d '{{"model": "identity", "inputs": {{"hello": "world"}}}}'
  curl -s '{url}/v1/jobs/<id>?wait=10'{auth}
""",
    "smollm2": """
  # an OpenAI chat completion, streamed
  curl -sN {url}/v1/chat/completions{auth} -H 'content-type: application/json' \\
       -d '{{"model": "smollm2", "stream": true,
            "messages": [{{"role": "user", "content": "Write a haiku about queues."}}]}}'
""",
}
# Any other model: its inputs are whatever its config.yaml's `input_schema` accepts.
ANY_MODEL = """
  # submit to {model} (inputs as its config.yaml's input_schema says), then long-poll the job
  curl -s {url}/v1/jobs{auth} -H 'content-type: application/json' \\
       -d '{{"model": "{model}", "inputs": {{...}}}}'
  curl -s '{url}/v1/jobs/<id>?wait=10'{auth}
"""
SUPERVISE_EVERY_S = 0.5
# Besides Ctrl-C, what stops it in order: `kill` and service managers send SIGTERM, a closed
# terminal or a dropped SSH session SIGHUP (left to its default, `up` died and its children,
# in sessions of their own, ran on). One ignored when `up` starts (`nohup` ignores SIGHUP, a
# script's `cmd &` SIGINT) stays ignored, as Python leaves an ignored SIGINT.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _state_dir(_ctx: click.Context, _param: click.Parameter, value: str | None) -> Path | None:
    """`--state-dir` as a path; an empty one is refused: `--state-dir ""` (a script's unset
    variable) was the current directory, which got the stack's lock, logs and Valkey data."""
    if value == "":
        raise click.BadParameter("'' is empty: name a directory ('.' for this one)")
    return None if value is None else Path(value)


@click.command("up")
@click.option(
    "--port",
    default=None,
    type=click.IntRange(1, 65_535),
    help="Producer port (CONVEYOR_PORT, 8000).",
)
@click.option("--models", default=None, help="Comma-separated models; default: all examples.")
@click.option(
    "--state-dir",
    default=None,
    type=click.Path(),
    callback=_state_dir,
    help="Logs, the embedded server's data, the dev key, stack.json (CONVEYOR_STATE_DIR).",
)
@click.option(
    "--producers",
    default=None,
    type=click.IntRange(1, MAX_PROCESSES),
    help="Producer processes sharing the port (CONVEYOR_PRODUCER_PROCESSES, cores/4).",
)
@click.option(
    "--workers-per-model",
    default=None,
    type=click.IntRange(1, MAX_PROCESSES),
    help="Worker processes per model; default: the cores the producers leave, split over the "
    "batch models (an LLM's engine batches itself: one worker).",
)
def command(
    port: int | None,
    models: str | None,
    state_dir: Path | None,
    producers: int | None,
    workers_per_model: int | None,
) -> None:
    """Run the pipeline: embedded Valkey (unless CONVEYOR_REDIS_URL), producers, workers."""
    from conveyor.configured_repository import configured_repository
    from conveyor.embedded_valkey import config_can_name, io_threads
    from conveyor.local_stack import refuse_unreachable
    from conveyor.stack import Stack
    from shared.settings import get_settings

    settings = get_settings()
    port, host = port or settings.port, settings.host
    # absolute: stack.json and the banner name its key file, which the CLI read relative to
    # its own directory (`var/run/dev-api-key` from anywhere but the checkout)
    state_dir = (state_dir or settings.state_dir).absolute()
    repository = configured_repository(settings)
    names = (
        _all_models(repository, settings.model_repository)
        if models is None
        else _model_names(models)
    )
    repository.partitions(names)  # a mistyped model or variant stops here, before anything runs
    producers = producers or settings.producer_processes
    workers = workers_by_model(repository, names, producers, workers_per_model)
    redis_url = os.environ.get("CONVEYOR_REDIS_URL")
    if redis_url is None and settings.redis_cluster:  # was a traceback once Valkey had started
        raise click.ClickException(
            "CONVEYOR_REDIS_CLUSTER=1 needs CONVEYOR_REDIS_URL, a node of the cluster: "
            "the embedded Valkey is a single server"
        )
    if redis_url is None and not config_can_name(state_dir / "valkey"):
        raise click.ClickException(
            f"the embedded Valkey cannot run in {state_dir}: its config file cannot name a "
            "path with whitespace or a quote; choose another --state-dir or CONVEYOR_STATE_DIR"
        )
    with state_dir_lock(state_dir, "conveyor up", "--state-dir or CONVEYOR_STATE_DIR"):
        _refuse_unbindable(host, port)
        _exit_on_stop_signals()
        if redis_url is not None:  # else it waited, silently, for producers that never got ready
            refuse_unreachable(settings.redis_url, "check CONVEYOR_REDIS_URL")
        valkey_config = None
        if redis_url is None:  # on a machine with cores to spare, I/O threads lift its ceiling
            valkey_config = {"appendonly": "yes", "io-threads": str(io_threads())}
        with _one_line_if_not_ready():  # an embedded Valkey that cannot start
            stack = Stack.create(
                state_dir, redis_url, valkey_config, cluster=settings.redis_cluster
            )
        _serve(stack, state_dir, host, port, producers, workers)


def _serve(
    stack: Stack, state_dir: Path, host: str, port: int, producers: int, workers: dict[str, int]
) -> None:
    """Start the producers and workers, show the banner and supervise until Ctrl-C; then stop
    everything, whatever ended it."""
    from conveyor.local_stack import StackState
    from conveyor.supervisor import Supervisor
    from shared.settings import get_settings

    settings = get_settings()
    try:
        # One console secret for all producers: a session cookie is good on whichever answers.
        secret = settings.console_secret or secrets.token_urlsafe(32)
        key_file = state_dir / "dev-api-key"
        with _one_line_if_not_ready(), _one_line_if_redis_lost(stack.redis_url):
            url = stack.start_producers(
                port, producers, f"up-{os.getpid()}", host, CONVEYOR_CONSOLE_SECRET=secret
            )
            named = worker_names(workers, taken=stack.processes)
            stack.wait_ready(*(stack.spawn_worker(model, name) for name, model in named.items()))
            auth = _auth(stack, key_file)
        dev_key_file = str(key_file) if auth["auth"] else ""
        cluster = stack.settings.redis_cluster
        StackState.for_this_process(stack.redis_url, url, dev_key_file, cluster).write(state_dir)
        banner = BANNER.format(
            url=url,
            producers=f"{producers} process{'es' if producers != 1 else ''}",
            models=", ".join(f"{name} ({count})" for name, count in workers.items()),
            examples=examples(list(workers), url, auth["auth"]),
            metrics=", ".join(f"{name} {stack.metrics_url(name, url)}" for name in named),
            redis_exports=redis_exports(stack.redis_url, cluster),
            **auth,
        )
        click.echo(banner, nl=True)
        failed = _supervise(Supervisor(stack, _warn))
    finally:
        _stop(stack, state_dir)
    if failed:  # a run that lost a child for good is no clean run (a script, a service manager)
        raise click.ClickException(
            f"gave up on {', '.join(failed)} after repeated exits (last log lines above)"
        )


def _stop(stack: Stack, state_dir: Path) -> None:
    """Remove the state file, then stop every child whatever that did: a state file that could
    not be removed (its state dir remounted read-only) raised before the stop, and `up` exited
    with a traceback, its children left running, unwaited. One left behind names a process that
    no longer runs, which every reader ignores (`local_stack._alive`)."""
    from conveyor.local_stack import STATE_FILE, StackState

    try:
        _say("stopping: workers drain their batches first")
        StackState.remove(state_dir)
    except OSError as exc:
        _say(f"cannot remove {state_dir / STATE_FILE} ({exc.strerror or exc})", err=True)
    finally:
        stack.stop()


@contextlib.contextmanager
def _one_line_if_not_ready() -> Iterator[None]:
    """A child that does not get ready ends `up` with its name and the end of its log, not a
    traceback of the wait; so does a port another server took after `_refuse_unbindable`
    looked (a traceback of the RuntimeError it was)."""
    from conveyor.stack import ChildNotReady, PortTaken

    try:
        yield
    except (ChildNotReady, PortTaken) as exc:
        raise click.ClickException(str(exc)) from None


@contextlib.contextmanager
def _one_line_if_redis_lost(url: str) -> Iterator[None]:
    """Redis lost while `up` starts (each look at a worker's readiness asks it, as does the
    development key) ends `up` with the Redis it lost, not a traceback of the wait; `_serve`
    then stops every child it started. A write too few replicas confirmed is said as such:
    ReplicaAckTimeout is a ConnectionError, and `up` called it a lost Redis."""
    import redis

    from shared.redis_client import ReplicaAckTimeout
    from shared.settings import get_settings, masked_url

    try:
        yield
    except ReplicaAckTimeout as exc:  # a ConnectionError, yet Redis answered: acks fell short
        acks = get_settings().replica_acks
        raise click.ClickException(
            f"too few replicas confirmed a write to Redis at {masked_url(url)} while the stack"
            f" started ({exc}): CONVEYOR_REPLICA_ACKS={acks} asks that many; set"
            " CONVEYOR_REPLICA_ACKS=0 for a single-node dev stack, or add replicas"
        ) from None
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        message = f"lost Redis at {masked_url(url)} ({exc}) while the stack started"
        raise click.ClickException(message) from None


def _say(line: str, err: bool = False) -> None:
    """A line that cannot stop the stop: a closed terminal (SIGHUP) answers every write with
    EIO, which skipped the stop and left every child running."""
    with contextlib.suppress(OSError):
        click.echo(line, err=err)


def _warn(line: str) -> None:
    """A line on stderr, beside the children's own (the supervisor's restarts and give-ups)."""
    _say(line, err=True)


def worker_names(workers: dict[str, int], taken: Collection[str] = ()) -> dict[str, str]:
    """Each worker's name (its log `<state dir>/<name>.log`, its Celery hostname) and the model
    it serves: a model's first worker is named as the model, its others `<model>+<n>`. `+` is
    in no model's or variant's name (`shared.model_names.NAME`): with `-` (then `_`, which
    names may have too), model `a`'s second worker and model `a-2`'s (`a_2`'s) first were both
    `a-2`, one of them overwritten in the stack and never started or stopped. Refused: a name
    one of the stack's other children (`taken`) has, say a model named `valkey`."""
    names = {
        (model if number == 1 else f"{model}+{number}"): model
        for model, count in workers.items()
        for number in range(1, count + 1)
    }
    assert len(names) == sum(workers.values()), f"worker names collide: {names}"
    if clash := sorted(set(names) & set(taken)):
        model = names[clash[0]]
        raise click.ClickException(f"model {model}'s worker would be named as another child")
    return names


def redis_exports(url: str, cluster: bool) -> str:
    """The banner's Redis for other tools: a cluster's node needs CONVEYOR_REDIS_CLUSTER=1 too
    (without, their single-server client failed on MOVED)."""
    return f"CONVEYOR_REDIS_URL={url}" + (" CONVEYOR_REDIS_CLUSTER=1" if cluster else "")


def examples(names: list[str], url: str, auth: str) -> str:
    """The banner's requests: one per served example model, else one for the first model."""
    served = list(dict.fromkeys(name.split(":", 1)[0] for name in names))
    blocks = [EXAMPLES[model] for model in served if model in EXAMPLES] or [ANY_MODEL]
    return "".join(block.format(url=url, auth=auth, model=served[0]) for block in blocks)


def workers_by_model(
    repository: ModelRepository,
    names: list[str],
    producers: int,
    per_model: int | None,
    cores: int | None = None,
) -> dict[str, int]:
    """Workers per model: `per_model` when given; else the `cores` (the CPUs `up` may use: a
    container's limit, not the host's cores) the producers leave (Redis takes its share from
    them too) split over the batch models, at least one each, since the workers run the models,
    the expensive part of a real job. An LLM gets one: its engine batches every stream itself
    and owns the device's memory."""
    batch = [name for name in names if _batches(repository, name)]
    share = max(1, ((cores or usable_cpus()) - producers) // max(1, len(batch)))
    return {name: per_model or (share if name in batch else 1) for name in names}


def _all_models(repository: ModelRepository, root: Path) -> list[str]:
    """Every model of the repository at `root`; none is refused: its producers are never
    ready (`/readyz`), and `up` waited out CONVEYOR_START_TIMEOUT_S in silence."""
    if not repository.models:
        raise click.ClickException(
            f"the model repository {root} has no models (a folder with a config.yaml each): "
            "check CONVEYOR_MODEL_REPOSITORY"
        )
    return list(repository.models)


def _model_names(models: str) -> list[str]:
    """`--models` split; an empty name is refused: `--models ""` (a script's unset variable)
    started every model of the repository, an LLM too."""
    names = models.split(",")
    if not all(names):
        raise click.BadParameter(f"{models!r} has an empty model name", param_hint="'--models'")
    return names


def _batches(repository: ModelRepository, name: str) -> bool:
    """`name` (`model` or `model:variant`) is a micro-batching model, not an LLM."""
    return repository.models[name.split(":", 1)[0]].kind == "batch"


def _refuse_unbindable(host: str, port: int) -> None:
    """Another server on the port would answer in our place, and an address this machine does
    not have would fail in every producer: say so instead of starting."""
    from conveyor.producer_server import family_of

    with socket.socket(family_of(host)) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise click.ClickException(_unbindable(host, port, exc)) from None


def _unbindable(host: str, port: int, exc: OSError) -> str:
    """Why `host:port` cannot be listened on, naming the setting to change: the port's for one
    in use or a privileged one (EACCES, which was blamed on CONVEYOR_HOST), else the host's."""
    if exc.errno == errno.EADDRINUSE:
        return (
            f"port {port} is in use ({exc.strerror}): another `conveyor up`? Stop it, "
            "or run this one on another port (--port or CONVEYOR_PORT) with a state "
            "dir of its own (--state-dir or CONVEYOR_STATE_DIR)."
        )
    if exc.errno == errno.EACCES:
        return (
            f"cannot listen on port {port} ({exc.strerror}): a privileged port needs root or "
            "CAP_NET_BIND_SERVICE; choose another (--port or CONVEYOR_PORT)"
        )
    return f"cannot listen on {host}:{port} ({exc.strerror or exc}): check CONVEYOR_HOST"


def _auth(stack: Stack, key_file: Path) -> dict[str, str]:
    """Auth stays on under `make up`: a development key is chosen (reused from the previous
    run when it still works) and shown instead."""
    from conveyor.commands.keys import dev_key
    from shared.settings import get_settings

    settings = get_settings()
    if settings.auth == "disabled":
        note = "\nAuth is disabled (CONVEYOR_AUTH=disabled)."
        return {"key_note": note, "auth": "", "key_export": ""}
    key = dev_key(settings.model_copy(update={"redis_url": stack.redis_url}), key_file)
    return {
        "key_note": f"\nDevelopment API key (tenant dev, all scopes): {key}",
        "auth": f" -H 'authorization: Bearer {key}'",
        "key_export": f" CONVEYOR_API_KEY=$(cat {key_file})",
    }


def _exit_on_stop_signals() -> None:
    """Until the supervisor takes over, SIGTERM (`kill`, `timeout`, a service manager) and
    SIGHUP (its terminal closed, its SSH session dropped) stop what has started, as Ctrl-C
    does: the children run in sessions of their own, and a `conveyor up` ended outright while
    it starts them left them all running."""

    def _terminated(signum: int, _frame: object) -> None:
        for stop in STOP_SIGNALS:  # once: the stop that follows must finish
            signal.signal(stop, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    for stop in _honoured(STOP_SIGNALS):
        signal.signal(stop, _terminated)


def _honoured(signals: Iterable[signal.Signals]) -> list[signal.Signals]:
    """The stop signals `up` acts on: those not ignored. Only `_terminated` ignores one itself,
    and `up` is stopping by then, so one ignored here was ignored when `up` started (`nohup`
    leaves SIGHUP so)."""
    return [stop for stop in signals if signal.getsignal(stop) != signal.SIG_IGN]


def _supervise(supervisor: Supervisor) -> list[str]:
    """Run `supervisor` (restarting children that die) until SIGINT, SIGTERM or SIGHUP, or until
    none can serve (the embedded Valkey or every producer given up on); returns those given up
    on."""
    stopping = False

    def _stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    # SIGINT too only where it was not ignored at start (`cmd &` in a script ignores it there)
    honoured = _honoured((signal.SIGINT, *STOP_SIGNALS))
    for stop in honoured:
        signal.signal(stop, _stop)
    try:
        while not stopping and supervisor.serving:
            supervisor.check()
            time.sleep(SUPERVISE_EVERY_S)
        if not stopping:
            _warn("nothing left serving (see above): stopping")
    finally:
        # the stop that follows: a second Ctrl-C, SIGTERM or SIGHUP ends it, and Stack.stop
        # kills what is left (still swallowed here, one waited out every child's drain in turn)
        if signal.SIGINT in honoured:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        _exit_on_stop_signals()
    return supervisor.failed
