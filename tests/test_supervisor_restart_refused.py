"""A child `conveyor up` cannot start again (its program gone while the virtualenv is
reinstalled, no process to be had) counts as a run that ended at once: backed off, given up on
after the crash loop's exits, while the others keep serving. Its restart's OSError ended `up`
with a traceback, and every other child with it."""

from __future__ import annotations

import sys
from pathlib import Path

from conveyor.stack import Stack
from conveyor.supervisor import CRASH_LOOP_EXITS, Supervisor

NO_REDIS = "redis://127.0.0.1:1/0"  # a stack that never talks to Redis


def test_a_child_that_cannot_be_started_again_is_given_up_on_not_fatal(tmp_path: Path) -> None:
    program = tmp_path / "crasher"
    program.write_text(
        f"#!{sys.executable}\nprint('cannot serve', flush=True)\nraise SystemExit(3)\n"
    )
    program.chmod(0o755)
    stack = Stack.create(tmp_path, redis_url=NO_REDIS)
    crasher = stack.spawn("crasher", [str(program)], {})
    survivor = stack.spawn("survivor", [sys.executable, "-c", "import time; time.sleep(600)"], {})
    clock = iter(range(0, 10_000, 100)).__next__  # each look 100 s on: every backoff is over
    said: list[str] = []
    supervisor = Supervisor(stack, said.append, lambda: float(clock()))
    try:
        crasher.wait()
        program.unlink()
        for _ in range(2 * CRASH_LOOP_EXITS):
            supervisor.check()
        assert supervisor.failed == ["crasher"], said
        assert survivor.poll() is None
        refused = [line for line in said if line.startswith("crasher: could not be started")]
        assert len(refused) == CRASH_LOOP_EXITS - 2, said  # the first exit, then each refusal
        assert said[-1].startswith(f"crasher: failed ({CRASH_LOOP_EXITS} exits"), said
        assert "| cannot serve" in said[-1]  # its last log lines, as for any crash loop
    finally:
        stack.stop()
