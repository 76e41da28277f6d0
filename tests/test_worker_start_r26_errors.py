"""A worker started as documented (`celery -A workers.app worker`) on a bad cluster setting:
CONVEYOR_REDIS_CLUSTER=1 with a server that is no cluster node ended it with Celery's
`Unable to load celery application` and three chained tracebacks (exit 2), where a bad
setting, config.yaml or model ends it in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from shared.settings import masked_url
from tests.conftest import REPO_ROOT

CELERY = Path(sys.executable).parent / "celery"


def test_cluster_mode_on_a_server_that_is_no_cluster_node_is_one_line(redis_url: str) -> None:
    env = {
        **os.environ,
        "CONVEYOR_REDIS_URL": redis_url,
        "CONVEYOR_REDIS_CLUSTER": "1",
        "CONVEYOR_MODELS": "identity",
        "CONVEYOR_METRICS_PORT": "0",
    }
    ended = subprocess.run(
        [str(CELERY), "-A", "workers.app", "worker", "--without-mingle", "--without-gossip"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ended.returncode == 1, ended.stderr
    assert "Traceback" not in ended.stderr, ended.stderr
    last = ended.stderr.strip().splitlines()[-1]
    assert last.startswith(f"Error: cannot use the Redis cluster at {masked_url(redis_url)}: ")
    assert last.endswith("Cluster mode is not enabled on this node"), last
