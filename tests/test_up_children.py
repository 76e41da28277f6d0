"""`conveyor up`'s children: each worker has a name of its own, and none outlives `up` (nor a
worker `conveyor autoscale`). They run in sessions of their own (Ctrl-C reaches `up` alone,
which stops them in order), so a terminal closed under `up` (SIGHUP) or a `kill -9` / OOM kill
of it left Valkey, the producers (on the port) and the workers running, and the next `make up`
found its port taken."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import signal
import subprocess
import termios
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import psutil
import pytest
import redis

from conveyor.commands.up import worker_names
from conveyor.local_stack import STATE_FILE
from conveyor.stack import free_port
from shared.keys import Keys
from tests.conftest import until
from tests.up_process import BANNER_END, CONVEYOR

GONE_WITHIN_S = 120.0  # workers drain (CONVEYOR_SHUTDOWN_GRACE_S, set short here) as they exit
STEADY = """kind: batch
backend: identity
input_schema: {type: object}
autoscaling: {min_replicas: 1, max_replicas: 1, polling_interval_s: 1}
"""


def test_a_model_named_like_another_models_second_worker_gets_its_own_worker() -> None:
    """`a`'s second worker and `a-2`'s first were both `a-2`: one overwrote the other in the
    stack, whose wait for them then failed (KeyError), the other running on unstopped."""
    names = worker_names({"a": 2, "a-2": 1})
    assert names == {"a": "a", "a+2": "a", "a-2": "a-2"}


def test_a_model_named_with_an_underscore_and_a_number_gets_its_own_worker() -> None:
    """`_` is in a model's name too: `a`'s second worker and `a_2`'s first were both `a_2`,
    and `a`'s never started while the banner said `a (2)`."""
    names = worker_names({"a": 2, "a_2": 1})
    assert len(names) == 3 and list(names.values()).count("a") == 2, names


def test_a_worker_named_as_another_child_is_refused() -> None:
    """A model named `valkey` took the embedded server's place in the stack."""
    with pytest.raises(click.ClickException, match="model valkey's worker"):
        worker_names({"valkey": 1}, taken=["valkey", "producer"])


@dataclass
class TerminalUp:
    """A `conveyor up` on a terminal of its own (its controlling terminal, as in a shell)."""

    process: subprocess.Popen[bytes]
    terminal: int  # the terminal's master side: closing it hangs the terminal up
    output: bytearray = field(default_factory=bytearray)
    children: list[psutil.Process] = field(default_factory=list)  # all its descendants
    hung_up: bool = False

    def hang_up(self) -> None:
        os.close(self.terminal)
        self.hung_up = True


@contextmanager
def up_on_a_terminal(state_dir: Path) -> Iterator[TerminalUp]:
    """Started and read until its banner ends; whatever outlives the test is killed after it,
    so a failing run leaves nothing behind."""
    terminal, user_side = pty.openpty()
    own = ("CONVEYOR_REDIS_URL", "CONVEYOR_STATE_DIR", "CONVEYOR_INSTANCE_ID")
    env = {k: v for k, v in os.environ.items() if k not in own}
    command = [str(CONVEYOR), "up", "--models", "identity", "--port", str(free_port())]
    process = subprocess.Popen(
        [*command, "--state-dir", str(state_dir)],
        env={**env, "CONVEYOR_AUTH": "disabled", "CONVEYOR_SHUTDOWN_GRACE_S": "5"},
        stdin=user_side,
        stdout=user_side,
        stderr=user_side,
        start_new_session=True,
        preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
    )
    os.close(user_side)
    up = TerminalUp(process, terminal)
    try:
        while BANNER_END.encode() not in up.output:
            up.output += os.read(terminal, 4096)  # EIO once it exited: it failed to start
        up.children = psutil.Process(process.pid).children(recursive=True)
        yield up
    finally:
        _stop(process, up.children)
        if not up.hung_up:
            os.close(terminal)


def test_closing_its_terminal_stops_every_child(tmp_path: Path) -> None:
    """SIGHUP stops the stack as SIGTERM does, though every write to the closed terminal now
    fails (EIO): it ended `up` at once, its children left running."""
    with up_on_a_terminal(tmp_path) as up:
        up.hang_up()
        until(lambda: all(_gone(child) for child in up.children), timeout=GONE_WITHIN_S)
        assert up.process.wait(timeout=GONE_WITHIN_S) >= 0  # it exited, not killed by SIGHUP
        assert not (tmp_path / STATE_FILE).exists()


def test_its_children_exit_when_it_is_killed(tmp_path: Path) -> None:
    """SIGKILL (an OOM kill) leaves `up` no time to stop anything: each child is told by the
    kernel (PR_SET_PDEATHSIG: SIGTERM) and stops itself."""
    with up_on_a_terminal(tmp_path) as up:
        up.process.kill()
        until(lambda: all(_gone(child) for child in up.children), timeout=GONE_WITHIN_S)


def test_closing_the_terminal_of_autoscale_drains_its_workers(
    redis_url: str, tmp_path: Path
) -> None:
    """SIGHUP drains them as Ctrl-C does; it ended the autoscaler, its workers left running."""
    repository = tmp_path / "models"
    (repository / "steady").mkdir(parents=True)
    (repository / "steady" / "config.yaml").write_text(STEADY)
    env = {
        **os.environ,
        "CONVEYOR_REDIS_URL": redis_url,
        "CONVEYOR_KEY_PREFIX": f"hangup-{os.getpid()}:",  # the shared server: keys of its own
        "CONVEYOR_MODEL_REPOSITORY": str(repository),
        "CONVEYOR_SHUTDOWN_GRACE_S": "5",
    }
    command = [str(CONVEYOR), "autoscale", "--models", "steady", "--state-dir", str(tmp_path)]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    workers: list[psutil.Process] = []
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == "steady:default replicas=1\n"
        workers = psutil.Process(process.pid).children(recursive=True)
        assert workers
        process.send_signal(signal.SIGHUP)
        assert process.wait(timeout=GONE_WITHIN_S) == 0  # it drained, not killed by SIGHUP
        assert all(_gone(worker) for worker in workers)
        # and gave up the pool's lease: another autoscaler scales it at once
        lease = Keys(env["CONVEYOR_KEY_PREFIX"]).autoscale_leader("steady", "default")
        assert redis.Redis.from_url(redis_url).exists(lease) == 0
    finally:
        _stop(process, workers)


def _gone(process: psutil.Process) -> bool:
    """Exited: gone, or a zombie no one reaps (`up` died, and this container's init may not)."""
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _stop(process: subprocess.Popen[Any], children: list[psutil.Process]) -> None:
    """Stop `process` as Ctrl-C does, then kill any child it left (psutil checks each is the
    same process, not a pid since reused)."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=GONE_WITHIN_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
