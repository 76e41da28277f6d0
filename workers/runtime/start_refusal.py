"""How a worker refuses to start: one plain line, as the producer and a bad setting refuse."""

from __future__ import annotations

import sys
from typing import NoReturn

from celery.platforms import EX_FAILURE


def refuse_start(reason: object) -> NoReturn:
    """End a worker's start from a bootstep with `Error: the worker cannot start: <reason>` on
    stderr, exit 1 (Celery ends the worker with a SystemExit's code): a step's error was Celery's
    JSON log line with its tracebacks, no `Error:` line a supervisor or an operator looks for.
    The running worker's log stays JSON."""
    print(f"Error: the worker cannot start: {reason}", file=sys.stderr, flush=True)
    raise SystemExit(EX_FAILURE) from None
