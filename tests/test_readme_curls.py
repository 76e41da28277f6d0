"""The README's examples are true: every `curl` of README.md's shell blocks (any other is a
recorded console transcript) runs, in order, against a live stack with API keys on (the key
filled in as `$KEY`, `<id>` and `<last id you saw>` from the answers before them) and answers
2xx. A finished job's view carries every field the README lists for it
(`attempts` included), however it was read."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from conveyor.stack import Stack, free_port
from tests.conftest import REPO_ROOT, issue_key

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
README = REPO_ROOT / "README.md"
BLOCK = re.compile(r"```(?:bash|sh|shell)\n(.*?)```", re.DOTALL)
TRANSCRIPT = re.compile(r"```console\n(.*?)```", re.DOTALL)  # recorded `$ command` + output
README_ADDRESS = "localhost:8000"
PRODUCER = "readme-producer"  # keys enforced, beside the shared stack's own
JOB_FIELDS = {"id", "status", "model", "variant", "timings", "batch_size", "attempts"}


def readme_curls(text: str) -> Iterator[str]:
    """Each `curl` command of the README's shell blocks, its continuation lines joined (a
    command goes on while a line ends in a backslash or a quote is still open)."""
    for block in BLOCK.findall(text):
        command = ""
        for line in block.splitlines():
            if not command and not line.lstrip().startswith("curl "):
                continue
            command += line.removesuffix("\\") + ("\n" if not line.endswith("\\") else " ")
            if line.endswith("\\") or not _complete(command):
                continue
            yield command.strip()
            command = ""


def _complete(command: str) -> bool:
    try:
        shlex.split(command, comments=True)
    except ValueError:  # "No closing quotation"
        return False
    return True


@dataclass
class Session:
    """What a reader following the README has seen so far: the last job id, an event id."""

    base_url: str
    key: str
    job_id: str = ""
    event_id: str = ""
    answers: list[tuple[str, int, str]] = field(default_factory=list)

    def run(self, command: str) -> tuple[int, str]:
        """The command as the reader would type it, against this stack: (HTTP status, body)."""
        filled = (
            command.replace(README_ADDRESS, self.base_url)
            .replace("<id>", self.job_id)
            .replace("<last id you saw>", self.event_id)
        )
        assert "<" not in filled.split("#")[0], f"a placeholder the test cannot fill: {command}"
        # -w prints the status after the body; --max-time bounds a stream that never ends.
        instrumented = filled.replace("curl ", "curl -w '\\n%{http_code}' --max-time 300 ", 1)
        result = subprocess.run(
            ["bash", "-c", instrumented],
            env={**os.environ, "KEY": self.key},
            capture_output=True,
            text=True,
            timeout=330,
            check=False,
        )
        body, _, status = result.stdout.rpartition("\n")
        assert result.returncode == 0, (command, result.returncode, result.stderr)
        self._remember(body)
        self.answers.append((command, int(status), body))
        return int(status), body

    def _remember(self, body: str) -> None:
        if ids := re.findall(r"^id: (\S+)$", body, re.MULTILINE):
            self.event_id = ids[0]  # resume after the first: "the rest" is then not empty
            return
        try:
            answer = json.loads(body)
        except ValueError:
            return
        if isinstance(answer, dict) and isinstance(answer.get("id"), str):
            self.job_id = answer["id"]


@pytest.fixture(scope="module")
def readme_url(
    stack: Stack, identity_worker: int, minilm_worker: int, smollm2_worker: None
) -> Iterator[str]:
    """The README's models served, as `make up` serves them, behind a producer of their own
    with API keys enforced, as in production. It joins the shared stack, whose smollm2 worker
    the LLM tests started (a vLLM start is about a minute on 2 cores), and stops with the
    module; the README's curls change no state other tests read (jobs and a key only)."""
    url = stack.start_producer(free_port(), name=PRODUCER, CONVEYOR_AUTH="enabled")
    yield url.removeprefix("http://")
    stack.stop_process(PRODUCER)


def test_the_readme_has_the_curls_it_should() -> None:
    text = README.read_text()
    commands = list(readme_curls(text))
    assert len(commands) >= 9, commands
    # Any other curl must be a recorded console transcript (`$ curl` and its output, such as
    # the traffic walkthrough's), never an example left out of the run below.
    recorded = sum(len(re.findall(r"^\$ curl ", block, re.M)) for block in TRANSCRIPT.findall(text))
    assert len(re.findall(r"^\s*(?:\$ )?curl ", text, re.M)) == len(commands) + recorded
    protected = [c for c in commands if not re.search(r"/(healthz|readyz|metrics)\b", c)]
    assert all("Bearer $KEY" in c for c in protected), [c for c in protected if "$KEY" not in c]


def test_every_readme_curl_answers_2xx(stack: Stack, readme_url: str) -> None:
    key = issue_key(stack.redis_url, "readme", "submit", "read")
    session = Session(readme_url, key)
    for command in readme_curls(README.read_text()):
        status, body = session.run(command)
        assert 200 <= status < 300, (command, status, body)
        if '"status":"succeeded"' in body.replace(" ", "") and body.startswith("{"):
            view = json.loads(body)
            if "outputs" in view and "choices" not in view:
                assert set(view) >= JOB_FIELDS, (command, sorted(view))


def test_a_command_that_fails_is_caught(readme_url: str) -> None:
    """The check can fail: a curl without the key answers 401 here."""
    session = Session(readme_url, "cvk_not_a_key")
    status, _ = session.run(f"curl -s {README_ADDRESS}/v1/models")
    assert status == 401
