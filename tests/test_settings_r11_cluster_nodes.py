"""CONVEYOR_REDIS_CLUSTER_NODES without CONVEYOR_REDIS_CLUSTER=1 is refused at start: only a
cluster's client reads the nodes, so they were ignored in silence and every process connected to
the URL's node as to a single server."""

from __future__ import annotations

from collections.abc import Callable

from click.testing import CliRunner

from conveyor.cli import main
from shared.settings import get_settings


def test_cluster_nodes_without_the_cluster_flag_stop_a_command_in_one_line(
    settings_env: Callable[..., None],
) -> None:
    settings_env(CONVEYOR_REDIS_CLUSTER_NODES="node-1:7000,node-2:7000")
    result = CliRunner().invoke(main, ["keys", "list"])
    assert result.exit_code == 1, result.output
    assert result.output.startswith("Error: bad setting: CONVEYOR_REDIS_CLUSTER_NODES="), (
        result.output
    )
    assert "CONVEYOR_REDIS_CLUSTER=1" in result.output, result.output
    assert result.output.count("\n") == 1, result.output


def test_cluster_nodes_with_the_cluster_flag_are_kept(settings_env: Callable[..., None]) -> None:
    settings_env(CONVEYOR_REDIS_CLUSTER="1", CONVEYOR_REDIS_CLUSTER_NODES="node-1:7000")
    assert get_settings().redis_cluster_nodes == [("node-1", 7000)]
