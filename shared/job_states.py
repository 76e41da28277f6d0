"""Job states and the only transitions allowed between them; terminal states never change.

The Lua scripts that move a job check its transitions against this table, rendered into them
(`lua_transition_table`), so the state machine is defined once."""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset(
    {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.EXPIRED}
)

# running → running is a redelivery after a crash (the attempt counter goes up).
TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.QUEUED: frozenset(
        {JobStatus.RUNNING, JobStatus.CANCELLED, JobStatus.EXPIRED, JobStatus.FAILED}
    ),
    JobStatus.RUNNING: frozenset(
        {
            JobStatus.RUNNING,
            JobStatus.SUCCEEDED,
            JobStatus.FAILED,
            JobStatus.CANCELLED,
            JobStatus.EXPIRED,
        }
    ),
}


class IllegalTransition(Exception):
    """A transition the state machine refuses (e.g. out of a terminal state)."""

    def __init__(self, job_id: str, current: str | None, target: str) -> None:
        super().__init__(f"job {job_id}: cannot go from {current} to {target}")
        self.job_id = job_id
        self.current = current
        self.target = target


def lua_transition_table() -> str:
    """The table as a Lua literal, for scripts that must check transitions atomically."""
    rows = ", ".join(
        f"{src.value}={{{', '.join(f'{dst.value}=1' for dst in sorted(dsts))}}}"
        for src, dsts in TRANSITIONS.items()
    )
    return "local ALLOWED = {" + rows + "}\n"


# The error types of a job its worker fails without running it, which variant statistics and
# shadow comparisons count untimed: an entry that is no job, and parameters a generate engine
# refuses. Their worker stamps its read as `started`, so they read as run in about 0 ms.
UNDECODABLE_ENTRY = "UndecodableEntry"
INVALID_PARAMETERS = "InvalidParameters"
UNRUN_ERRORS = frozenset({UNDECODABLE_ENTRY, INVALID_PARAMETERS})
