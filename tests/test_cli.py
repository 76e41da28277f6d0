"""The CLI as a user runs it (a subprocess) against the real pipeline: `conveyor batch submit
--wait` writes the output and errors files beside the input; `submit` and `jobs` print jobs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from click.testing import CliRunner

from conveyor.cli import main
from conveyor.client import Client, Event
from conveyor.commands.jobs import NO_WORKER, WARMING, Progress
from conveyor.local_stack import StackState
from conveyor.stack import Stack, free_port
from shared.codec import RequestEntry
from shared.job_store import now_ms
from shared.keys import Keys, new_job_id, replay_job_id
from tests.local_http import LocalServer, serving

pytestmark = pytest.mark.slow
CONVEYOR = str(Path(sys.executable).parent / "conveyor")
REPOSITORY = Path(__file__).resolve().parents[1] / "model_repository"


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [CONVEYOR, *args], capture_output=True, text=True, timeout=180, env=env, check=False
    )
    assert result.returncode == 0, result.stderr
    return result


def test_batch_submit_wait_writes_both_files(
    base_url: str, identity_worker: int, tmp_path: Path
) -> None:
    source = tmp_path / "requests.jsonl"
    lines = [json.dumps({"custom_id": f"r{i}", "body": {"inputs": {"i": i}}}) for i in range(300)]
    lines[10] = '{"custom_id": "r10", "body": '  # malformed: line 11
    source.write_text("\n".join(lines) + "\n")

    result = _run(
        "batch", "submit", str(source), "--model", "identity", "--wait", "--url", base_url
    )

    output = [
        json.loads(line) for line in (tmp_path / "requests.output.jsonl").read_text().splitlines()
    ]
    errors = [
        json.loads(line) for line in (tmp_path / "requests.errors.jsonl").read_text().splitlines()
    ]
    assert [o["custom_id"] for o in output] == [f"r{i}" for i in range(300) if i != 10]
    assert all(o["outputs"] == {"i": int(o["custom_id"][1:])} for o in output)
    assert [(e["line"], e["error"]["type"]) for e in errors] == [(11, "invalid_json")]
    assert "completed: 299 succeeded, 1 failed" in result.stdout
    batch_id = result.stdout.split()[0]
    newest, *more = _run("batch", "list", "--limit", "1", "--url", base_url).stdout.splitlines()
    assert newest.split() == [batch_id, "completed", "299/1", "of", "300", "/v1/jobs"]
    assert more in ([], [f"more: --after {batch_id}"])  # other tests' batches may follow


def test_batch_get_cancel_and_results(base_url: str, tmp_path: Path) -> None:
    """A batch for identity:canary (no worker in these tests: its items stay queued) is shown
    in progress, cancelled, and its results written: every item an error, no output. Its
    errors file is kept the hour its submit asked (`--output-expires-after`: no such option), and
    it shows the metadata its submit gave it (`--metadata`: none either)."""
    source = tmp_path / "later.jsonl"
    body = {"variant": "canary", "inputs": {"n": 1}}
    source.write_text(
        "".join(json.dumps({"custom_id": f"c{i}", "body": body}) + "\n" for i in range(3))
    )
    url = ("--url", base_url)
    kept = ("--output-expires-after", "3600")  # its files' life, from its end
    tags = ("--metadata", "run=7", "--metadata", "note=a=b")
    submitted = _run("batch", "submit", str(source), "--model", "identity", *kept, *tags, *url)
    batch_id = submitted.stdout.strip()

    running = json.loads(_run("batch", "get", batch_id, *url).stdout)
    assert running["id"] == batch_id and running["status"] == "in_progress"
    assert running["metadata"] == {"run": "7", "note": "a=b"}
    cancelled = json.loads(_run("batch", "cancel", batch_id, *url).stdout)
    assert cancelled["status"] == "cancelled" and cancelled["counts"]["cancelled"] == 3
    errors_file = httpx.get(f"{base_url}/v1/files/{cancelled['error_file_id']}").json()
    assert errors_file["expires_at"] == cancelled["cancelled_at"] + 3600, errors_file
    written = _run("batch", "results", batch_id, str(tmp_path / "later"), *url).stdout.split()
    output, errors = tmp_path / "later.output.jsonl", tmp_path / "later.errors.jsonl"
    assert written == [str(output), str(errors)]
    assert output.read_text() == ""
    failed = [json.loads(line) for line in errors.read_text().splitlines()]
    assert [(e["custom_id"], e["error"]["type"]) for e in failed] == [
        (f"c{i}", "cancelled") for i in range(3)
    ]


def test_models_list_names_each_model_with_its_kind_and_backend() -> None:
    rows = {
        line.split("\t")[0]: line.split("\t") for line in _run("models", "list").stdout.splitlines()
    }
    assert rows["identity"] == ["identity", "batch", "identity", "default, canary"]
    assert rows["minilm"] == ["minilm", "batch", "onnxruntime", "default, torch"]
    assert rows["smollm2"] == ["smollm2", "generate", "vllm", "default"]


def test_submit_and_jobs(base_url: str, identity_worker: int) -> None:
    env = {**os.environ, "CONVEYOR_URL": base_url}
    job = json.loads(_run("submit", "identity", "--input", '{"a": [1, 2]}', env=env).stdout)
    assert job["status"] == "succeeded" and job["outputs"] == {"a": [1, 2]}
    again = json.loads(_run("jobs", "get", job["id"], env=env).stdout)
    assert again["id"] == job["id"] and again["outputs"] == {"a": [1, 2]}
    assert "attempt_history" not in again
    history = json.loads(_run("jobs", "get", job["id"], "--attempts", env=env).stdout)
    [run] = history["attempt_history"]
    assert run["outcome"] == "succeeded" and run["consumer"] == f"{run['host']}-{run['pid']}"

    queued = json.loads(
        _run(
            "submit",
            "identity",
            "--variant",
            "canary",
            "--input",
            "{}",
            "--no-wait",
            "--url",
            base_url,
        ).stdout
    )
    cancelled = json.loads(_run("jobs", "cancel", queued["id"], "--url", base_url).stdout)
    assert cancelled["status"] == "cancelled"
    refused = subprocess.run(
        [CONVEYOR, "jobs", "cancel", queued["id"], "--url", base_url],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert refused.returncode != 0 and "409 conflict" in refused.stderr


def _exit_status(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CONVEYOR, *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_a_wait_exits_with_how_the_job_ended(base_url: str) -> None:
    """Scripts branch on the status: 124 when the job had not ended as the wait ran out, 1 once
    it ended otherwise than succeeded (here cancelled; identity:canary has no worker)."""
    url = ("--url", base_url)
    late = _exit_status(
        "submit", "identity", "--variant", "canary", "--input", "{}", "--timeout", "0.5", *url
    )
    job = json.loads(late.stdout)
    assert late.returncode == 124 and job["status"] == "queued", late.stderr
    _run("jobs", "cancel", job["id"], *url)
    for wait in (("jobs", "get", job["id"], "--wait", "5"), ("jobs", "wait", job["id"])):
        ended = _exit_status(*wait, *url)
        assert ended.returncode == 1 and json.loads(ended.stdout)["status"] == "cancelled", wait
    assert _exit_status("jobs", "get", job["id"], *url).returncode == 0  # a read, not a wait


def test_a_wait_that_cannot_learn_how_the_job_ended_exits_3(tmp_path: Path) -> None:
    """A wait that could not reach the producer, or whose request was refused, exited 1,
    which says the job ended otherwise (failed, cancelled, expired): a script counted a job
    still running as failed."""
    unreachable = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    lost = _exit_status("jobs", "get", "0" * 32, "--wait", "1", "--url", unreachable)
    assert lost.returncode == 3, (lost.returncode, lost.stderr)
    assert "Error: cannot reach the producer: ConnectError(" in lost.stderr, lost.stderr
    assert lost.stdout == ""
    lines = tmp_path / "lines.jsonl"
    lines.write_text('{"custom_id": "a", "body": {"inputs": {"text": "x"}}}\n')
    with serving(LocalServer(_Refusing)) as server:
        refused = _exit_status("batch", "submit", str(lines), "--wait", "--url", server.url)
    assert refused.returncode == 3, (refused.returncode, refused.stderr)
    assert "no such key" in refused.stderr and refused.stdout == ""


class _Refusing(BaseHTTPRequestHandler):
    """A producer that refuses every request (401: not retried)."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = json.dumps({"error": {"type": "unauthorized", "message": "no such key"}}).encode()
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass


class _EndingLate(BaseHTTPRequestHandler):
    """An LLM job as the producer serves it between its worker's last two writes: the `final`
    token event is in the stream, the job itself still `running` (the worker marks it finished
    right after); a long-poll answers once it has ended."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.path == "/v1/jobs/j/events":
            body, kind = b'event: final\ndata: {"status": "succeeded"}\n\n', "text/event-stream"
        else:
            status = "succeeded" if "wait=" in self.path else "running"
            body, kind = json.dumps({"id": "j", "status": status}).encode(), "application/json"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass


def test_jobs_wait_prints_the_job_once_it_ended_after_its_final_event() -> None:
    """After the stream's `final` event the job was read without waiting: an LLM job read
    between its final token event and its end was printed `running`, with exit 124 (`the wait
    ran out`) from a command that has no timeout."""
    with serving(LocalServer(_EndingLate)) as server:
        ended = _exit_status("jobs", "wait", "j", "--url", server.url)
    assert ended.returncode == 0, (ended.stdout, ended.stderr)
    assert json.loads(ended.stdout)["status"] == "succeeded"


def test_a_batch_wait_exits_1_unless_the_batch_completed(base_url: str, tmp_path: Path) -> None:
    source = tmp_path / "stalled.jsonl"
    line = {"custom_id": "s", "body": {"variant": "canary", "inputs": {}}}
    source.write_text(json.dumps(line) + "\n")
    with Client(base_url) as client:
        before = client.batches.list(1).data
        waiting = subprocess.Popen(
            [CONVEYOR, "batch", "submit", str(source), "--model", "identity", "--wait",
             "--url", base_url],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        while (newest := client.batches.list(1).data) == before or newest[0].done:
            assert waiting.poll() is None, waiting.communicate()
            time.sleep(0.1)
        client.batches.cancel(newest[0].id)
        out, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 1, err
    assert f"{newest[0].id} cancelled: 0 succeeded" in out


def test_unreachable_redis_is_one_clear_line() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    env = {**os.environ, "CONVEYOR_REDIS_URL": url}
    for args in (("keys", "list"), ("dlq", "list", "identity")):
        result = subprocess.run(
            [CONVEYOR, *args], capture_output=True, text=True, timeout=120, env=env, check=False
        )
        assert result.returncode == 1, result.stdout
        assert result.stderr.startswith(f"Error: cannot reach Redis at {url} ("), result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def _refused(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [CONVEYOR, *args], capture_output=True, text=True, timeout=120, env=env, check=False
    )
    assert result.returncode in (1, 2), (result.returncode, result.stdout, result.stderr)
    return result


@pytest.mark.parametrize(
    "args",
    [
        ("autoscale", "--models", "identity", "--interval", "nan"),  # time.sleep(nan) traceback
        ("canary", "start", "identity", "canary", "--max-error-rate", "nan"),  # a JSON traceback
        ("canary", "start", "identity", "canary", "--max-p99-ms", "inf"),
        ("submit", "identity", "--input", "{}", "--timeout", "nan"),  # waited without a limit
        ("jobs", "get", "0" * 32, "--wait", "nan"),  # the SDK's refusal, naming no option
        ("jobs", "get", "0" * 32, "--wait", "inf"),  # waited without a limit
        ("submit", "identity", "--input", '{"x": NaN}'),  # httpx refused to send it: traceback
        ("submit", "identity", "--input", '{"x": [-Infinity]}'),
        ("submit", "identity", "--input", '{"x": 1e400}'),  # read as inf
    ],
)
def test_a_number_that_is_not_finite_is_a_usage_error(args: tuple[str, ...]) -> None:
    """In-process, as `conveyor`'s entry point runs `main` (a usage error is click's exit 2; an
    uncaught exception, the traceback these were, is exit 1): a process per case cost a second
    or two of imports and proved nothing more."""
    result = CliRunner().invoke(main, args, env={"CONVEYOR_URL": "http://127.0.0.1:9"})
    assert result.exit_code == 2, (result.stderr, result.exception)
    if args[-2] == "--input":  # a number inside the JSON: it is named, not the whole value
        assert "Invalid value for --input: JSON number " in result.stderr, result.stderr
        assert "is not a finite number" in result.stderr, result.stderr
    else:
        said = f"Invalid value for '{args[-2]}': '{args[-1]}' is not a finite number"
        assert said in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_traffic_commands_find_the_running_stack(base_url: str, tmp_path: Path) -> None:
    """`routes` and `canary` read no state file: with no URL they went to port 8000 whatever
    `conveyor up` ran on, as no other command did. And a number no JSON holds (`nan`) or an
    answer that is not JSON was a traceback."""
    StackState("redis://unused", base_url, "", os.getpid()).write(tmp_path)
    unset = ("CONVEYOR_URL", "CONVEYOR_API_KEY")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env["CONVEYOR_STATE_DIR"] = str(tmp_path)
    assert "sticky by" in _run("routes", "show", "identity", env=env).stdout
    for args in (
        ("routes", "set", "identity", "--weight", "default=nan"),
        ("canary", "start", "identity", "canary", "--steps", "5,nan"),
    ):
        refused = _refused(*args, env=env)
        assert "every number must be finite" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr


def test_a_typo_is_one_clear_error_not_silence(
    stack: Stack, identity_worker: int, tmp_path: Path
) -> None:
    """A mistyped model, variant, file or repository gets one line that names it: these used to
    print nothing and exit 0 (so a typo looked like an empty answer), or a traceback. The runs
    change nothing, so they run side by side (each is mostly the CLI's import, on one core)."""
    env = {**os.environ, "CONVEYOR_REDIS_URL": stack.redis_url}
    missing = tmp_path / "missing"
    broken = tmp_path / "broken" / "m"
    broken.mkdir(parents=True)
    (broken / "config.yaml").write_text("backend: no-such-backend\n")
    with ThreadPoolExecutor(max_workers=os.cpu_count()) as pool:

        def ran(*args: str, **more: str) -> Future[subprocess.CompletedProcess[str]]:
            return pool.submit(_run, *args, env={**env, **more})

        def refused(*args: str, **more: str) -> Future[subprocess.CompletedProcess[str]]:
            return pool.submit(_refused, *args, env={**env, **more})

        prepare = refused("models", "prepare", "minilm", "nope")
        named = ran("models", "prepare", "identity")  # printed nothing, as if it had built
        no_repository = [
            refused(*args, CONVEYOR_MODEL_REPOSITORY=str(missing))
            for args in (("models", "list"), ("up",))
        ]
        broken_repository = refused("models", "list", CONVEYOR_MODEL_REPOSITORY=str(broken.parent))
        shutil.copytree(REPOSITORY, tmp_path / "repository")
        in_place = refused(  # would replace smollm2's folder, its config.yaml with it
            "models",
            "prepare",
            "smollm2",
            CONVEYOR_MODEL_REPOSITORY=str(tmp_path / "repository"),
            CONVEYOR_ARTIFACT_DIR=str(tmp_path / "repository"),
        )
        up_typos = [
            (refused("up", "--models", models), problem)
            for models, problem in (
                ("minlm", "unknown model 'minlm' (the repository has identity, minilm, smollm2)"),
                ("identity:nope", "model identity has no variant 'nope'"),
            )
        ]  # refused before anything starts (a worker used to crash-loop on it)
        unread = refused("submit", "identity", "--input", f"@{missing}.json")
        bad_urls = [  # at once, no retries
            refused(*args, CONVEYOR_URL="localhost:8000")
            for args in (("jobs", "get", "x"), ("routes", "show", "identity"))
        ]
        dead = ran("dlq", "list", "identity")
        dlq_typos = [
            refused("dlq", action, "identity", "--variant", "nope")
            for action in ("list", "replay", "purge")
        ]
        no_letters = [  # no such letter: nothing done, no traceback
            (
                ran("dlq", "replay", "identity", "--id", letter),
                ran("dlq", "purge", "identity", "--id", letter),
            )
            for letter in ("1-1", "not-an-id")
        ]

    assert "no model nope (the repository has identity, minilm, smollm2)" in prepare.result().stderr
    assert "preparing" not in prepare.result().stdout  # refused before building anything
    assert (
        named.result().stdout == "identity: nothing to prepare (its config.yaml has no `prepare`)\n"
    )
    for result in no_repository:
        assert result.result().stderr == (
            f"Error: model repository {missing} is not a directory: set "
            "CONVEYOR_MODEL_REPOSITORY to your models' folder\n"
        )
    assert "CONVEYOR_ARTIFACT_DIR is the model repository" in in_place.result().stderr
    assert (tmp_path / "repository" / "smollm2" / "config.yaml").exists()
    said = broken_repository.result().stderr
    assert said.startswith(f"Error: {broken / 'config.yaml'}: "), said
    assert len(said.splitlines()) == 1, said
    for up, problem in up_typos:
        assert up.result().stderr == f"Error: {problem}\n"
    assert f"Invalid value for --input: cannot read {missing}.json: " in unread.result().stderr
    assert "Traceback" not in unread.result().stderr
    for bad_url in bad_urls:
        assert bad_url.result().stderr.endswith(
            "Invalid value for '--url': producer URL 'localhost:8000' is not an http(s) URL "
            "with a host\n"
        ), bad_url.result().stderr
    assert dead.result().stdout == ""  # served, nothing dead
    for typo in dlq_typos:
        said = typo.result().stderr
        assert "no partition identity:nope in this Redis" in said, said
    for replayed, purged in no_letters:
        assert replayed.result().stdout == "replayed 0, kept 0\n"
        assert purged.result().stdout == "purged 0\n"


def test_dlq_replay_prints_each_letter_it_kept_and_why(
    stack: Stack, stack_redis: redis.Redis
) -> None:
    """A letter past its job's deadline is kept, not replayed: the command printed only what it
    replayed (here nothing), so the operator never learnt the letter was kept, or why."""
    env = {**os.environ, "CONVEYOR_REDIS_URL": stack.redis_url}
    keys = Keys()
    dlq = keys.dlq("identity", "default")
    job_id = new_job_id("identity", "default")
    entry = RequestEntry(job_id, {"inputs": {}}, now_ms() - 2_000, now_ms() - 1_000)
    fields: dict[Any, Any] = {"entry": "1-0", "reason": "crashed", "deliveries": 3}
    letter = stack_redis.xadd(dlq, fields | entry.encode())
    try:
        replayed = _run("dlq", "replay", "identity", env=env).stdout
        assert replayed == (
            f"kept {job_id} (dead letter {letter}): deadline_passed\nreplayed 0, kept 1\n"
        )
        assert [dlq_id for dlq_id, _ in stack_redis.xrange(dlq)] == [letter]  # still there
        replay = replay_job_id("identity", "default", job_id, str(letter))
        assert not stack_redis.exists(keys.job(replay))  # never enqueued
    finally:
        stack_redis.xdel(dlq, letter)


def test_a_key_or_split_that_cannot_mean_what_it_says_is_refused(stack: Stack) -> None:
    """A negative rate used to lift the key's rate limit (the bucket's expiry went negative), a
    burst or cap below 1 refused its every request, `--expires-in 0s` made a key that never
    expires, and a variant named twice in `routes set` kept the last weight, silently."""
    env = {**os.environ, "CONVEYOR_REDIS_URL": stack.redis_url}
    models = ("--model", "identity", "--model", "idnetity")
    made = _run("keys", "create", "--tenant", "cli-warned", *models, env=env)
    assert made.stdout.startswith("cvk_")  # made (the model may come later), with a warning
    assert "warning: idnetity not in the model repository" in made.stderr
    assert "this key may use only identity there" in made.stderr

    for option, value, problem in (
        ("--rate", "-5", "rate -5.0 must be a positive number of requests per second"),
        ("--rate", "nan", "rate nan must be a positive number of requests per second"),
        ("--burst", "0", "burst 0 must be at least 1"),
        ("--max-in-flight", "-1", "max in flight -1 must be at least 1"),
        ("--expires-in", "0s", "a lifetime must be longer than 0"),
    ):
        result = _refused("keys", "create", "--tenant", "cli-refused", option, value, env=env)
        assert result.returncode == 2 and problem in result.stderr, result.stderr
    listed = _run("keys", "list", "--json", env=env).stdout.splitlines()
    tenants = {json.loads(line)["tenant"] for line in listed}
    assert "cli-warned" in tenants and "cli-refused" not in tenants  # none of those was made

    twice = ("--weight", "default=60", "--weight", "canary=40", "--weight", "default=10")
    result = _refused("routes", "set", "identity", *twice, env=env)  # refused before any call
    assert result.returncode == 2 and "default given more than once" in result.stderr


def test_the_progress_line_keeps_saying_a_worker_is_being_started() -> None:
    """The server sends `scaling` and then, in the same tick, `queued`: the line said the
    autoscaler was starting a worker for an instant, then only `start time not known yet`."""
    progress = Progress()

    def said(event: str, data: dict[str, object]) -> str | None:
        return progress.line(Event(None, event, json.dumps(data)))

    idle = {"queue_position": 0, "eta_ms": None}
    assert said("scaling", {"consumers": 0, **idle}) == f"queued: {NO_WORKER}"
    assert said("queued", idle) == f"queued: 0 ahead; {NO_WORKER}"
    assert said("queued", {"queue_position": 3, "eta_ms": None}) == f"queued: 3 ahead; {NO_WORKER}"
    served = {"queue_position": 2, "eta_ms": 1500}  # a worker drains the lane: an ETA
    assert said("queued", served) == "queued: 2 ahead, starts in ~1.5s"
    assert said("queued", idle) == "queued: 0 ahead, start time not known yet"


def test_the_progress_line_says_a_worker_loads_only_when_one_does() -> None:
    """It said the autoscaler was starting a worker whenever none served the model: under
    `conveyor up`, which runs no autoscaler, a job for a model it does not serve waited
    forever under that line."""
    progress = Progress()
    idle = {"consumers": 0, "queue_position": 0, "eta_ms": None}
    assert progress.line(Event(None, "scaling", json.dumps({**idle, "warming": 0}))) == (
        "queued: no worker serves this model yet (an autoscaler starts one from the queue)"
    )
    warming = Event(None, "scaling", json.dumps({**idle, "warming": 1}))
    assert progress.line(warming) == f"queued: {WARMING}"
    assert progress.line(Event(None, "queued", json.dumps(idle))) == f"queued: 0 ahead; {WARMING}"


def test_batch_submit_refuses_metadata_that_is_no_pair(tmp_path: Path) -> None:
    """Refused before anything is sent (no producer listens at the URL): no pair, or a key given
    twice (the last value used to win, silently, as a variant named twice in `routes set`
    did)."""
    source = tmp_path / "one.jsonl"
    source.write_text('{"custom_id": "a", "body": {"inputs": {}}}\n')
    url = f"http://127.0.0.1:{free_port()}"
    for pairs, problem in (
        (("run",), "'run': expected KEY=VALUE"),
        (("=7",), "'=7': expected KEY=VALUE"),
        (("run=7", "note=a", "run=8"), "run given more than once"),
    ):
        metadata = [arg for pair in pairs for arg in ("--metadata", pair)]
        refused = CliRunner().invoke(
            main, ["batch", "submit", str(source), *metadata, "--url", url]
        )
        assert refused.exit_code == 2 and problem in refused.output, refused.output


def test_files_feed_a_batch_from_the_shell(base_url: str, tmp_path: Path) -> None:
    """`conveyor files` and `conveyor batch from-file`: an upload (kept the hour asked), listed,
    read back, fed to a batch (its item waits for a canary worker none runs, so a cancel ends
    it), the batch's errors file read by its id, the upload deleted."""
    source = tmp_path / "upload.jsonl"
    source.write_text(
        json.dumps({"custom_id": "u", "body": {"variant": "canary", "inputs": {}}}) + "\n"
    )
    url = ("--url", base_url)
    file_id = _run("files", "upload", str(source), "--expires-after", "3600", *url).stdout.strip()
    shown = json.loads(_run("files", "get", file_id, *url).stdout)
    assert (shown["filename"], shown["expires_at"] - shown["created_at"]) == ("upload.jsonl", 3600)
    listed = _run("files", "list", "--limit", "100", *url).stdout.splitlines()
    assert any(line.split()[0] == file_id and line.endswith("upload.jsonl") for line in listed)
    assert _run("files", "content", file_id, *url).stdout == source.read_text()
    tags = ("--model", "identity", "--metadata", "run=9")
    batch_id = _run("batch", "from-file", file_id, *tags, *url).stdout.strip()
    cancelled = json.loads(_run("batch", "cancel", batch_id, *url).stdout)
    assert (cancelled["input_file_id"], cancelled["metadata"]) == (file_id, {"run": "9"})
    errors = tmp_path / "errors.jsonl"
    _run("files", "content", cancelled["error_file_id"], "-o", str(errors), *url)
    assert json.loads(errors.read_text())["custom_id"] == "u"
    assert json.loads(_run("files", "delete", file_id, *url).stdout)["deleted"] is True
