"""The development Redis on Kubernetes (k8s/base/redis.yaml) had a 1Gi memory limit and no
`maxmemory`: once its data passed the limit the kernel killed it (the last second of its AOF
lost, every pod out of reach while it reloaded), where the pipeline answers a Redis at its own
`maxmemory` with `noeviction` with a 503 and `Retry-After`, and waits for expiring results."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
# Kubernetes' binary suffixes, and Redis's units (`mb` is 1024², `m` 1000²).
K8S_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "": 1}
REDIS_UNITS = {"kb": 2**10, "mb": 2**20, "gb": 2**30, "k": 10**3, "m": 10**6, "g": 10**9, "": 1}


def in_bytes(size: str, units: dict[str, int]) -> int:
    """A whole number with one of `units`' suffixes, in bytes."""
    match = re.fullmatch(r"(\d+)([A-Za-z]*)", size)
    assert match and match.group(2) in units, size
    return int(match.group(1)) * units[match.group(2)]


def redis_container() -> dict[str, Any]:
    documents = yaml.safe_load_all((REPO_ROOT / "k8s" / "base" / "redis.yaml").read_text())
    (statefulset,) = [d for d in documents if d["kind"] == "StatefulSet"]
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    return container


def test_dev_redis_refuses_writes_at_its_maxmemory_before_its_limit_kills_it() -> None:
    container = redis_container()
    args = container["args"]
    assert "--maxmemory" in args, "no maxmemory: the memory limit's OOM kill comes first"
    maxmemory = in_bytes(args[args.index("--maxmemory") + 1].lower(), REDIS_UNITS)
    limit = in_bytes(container["resources"]["limits"]["memory"], K8S_UNITS)
    # An AOF rewrite forks, and the child's copy-on-write pages count against the same limit.
    assert 0 < maxmemory <= limit // 2
    # Jobs and results are never evicted: a full Redis refuses the write instead.
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
