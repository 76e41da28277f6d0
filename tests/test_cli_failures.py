"""The CLI against a small real HTTP server that answers what a producer answers at its worst
(503s mid-wait), and against a local disk that refuses its result files: each failure is one
line that says what to do next, not a traceback, a silent two-minute hang, or a job (or batch)
left running under an id nobody was told."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from conveyor.cli import main
from conveyor.client import Client, InvalidArgument
from conveyor.stack import free_port
from tests.local_http import LocalServer, QuietHandler, serving

CONVEYOR = str(Path(sys.executable).parent / "conveyor")
_JSON = {"Content-Type": "application/json"}
_DOWN = {"error": {"type": "unavailable", "message": "down for a restart"}}


class _Server(LocalServer):
    def __init__(self) -> None:
        super().__init__(_Handler)
        self.posts: list[str] = []
        self.batch_reads = 0  # GETs of /v1/batches/batch_made


class _Handler(QuietHandler):
    """`job_made` and `batch_made` are created, then every read of them is a 503 (after one
    read of the batch in progress); `batch_done` ended; `down` is a producer restarting."""

    protocol_version = "HTTP/1.1"
    server: _Server

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        path = self.path.split("?")[0]
        self.server.posts.append(path)
        if path == "/v1/jobs":
            self._json(202, {"id": "job_made", "status": "queued"})
        else:
            self._json(200, _batch("batch_made", "in_progress"))

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        if path == "/v1/batches/batch_made":
            self.server.batch_reads += 1
            if self.server.batch_reads == 1:
                self._json(200, _batch("batch_made", "in_progress"))
                return
        if path == "/v1/batches/batch_done":
            self._json(200, _batch("batch_done", "completed"))
        elif path.endswith(("/output", "/errors", "/content")):  # an ended batch's: no lines
            self.answer(200, b"", {"Content-Type": "application/jsonl"})
        else:
            self._json(503, _DOWN, {"Retry-After": "0"})

    def _json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        self.answer(status, json.dumps(body).encode(), {**_JSON, **(headers or {})})


def _batch(batch_id: str, status: str) -> dict[str, Any]:
    return {
        "id": batch_id,
        "status": status,
        "created_at": 0,
        "counts": {"total": 1, "succeeded": 0, "failed": 0, "pending": 1},
    }


@pytest.fixture
def server() -> Iterator[_Server]:
    with serving(_Server()) as running:
        yield running


def _invoke(server: _Server, *args: str) -> Result:
    return CliRunner().invoke(main, [*args, "--url", server.url])


def _one_error_line(result: Result) -> str:
    """The error line (retry notices aside), once no exception escaped as a traceback would."""
    assert not isinstance(result.exception, OSError), result.exception
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def test_a_result_file_that_cannot_be_written_is_one_line(server: _Server, tmp_path: Path) -> None:
    """`files content -o` and `batch results` into a folder that does not exist raised
    FileNotFoundError, a traceback, after the download."""
    missing = tmp_path / "missing"
    content = _invoke(server, "files", "content", "file-1", "-o", str(missing / "out.jsonl"))
    assert content.exit_code == 1
    assert f"cannot write {missing / 'out.jsonl'}" in _one_error_line(content)
    results = _invoke(server, "batch", "results", "batch_done", str(missing / "run"))
    assert results.exit_code == 1
    said = _one_error_line(results)
    assert f"cannot write {missing / 'run.output.jsonl'}" in said
    assert "conveyor batch results batch_done" in said  # how to fetch them elsewhere


def test_a_batch_wait_whose_result_files_cannot_be_written_is_refused_first(
    server: _Server, tmp_path: Path
) -> None:
    """`batch submit --wait` writes FILE.output.jsonl beside FILE: where that cannot be (a
    folder of that name), it was found after the whole batch had run, as a traceback."""
    source = tmp_path / "lines.jsonl"
    source.write_text('{"custom_id": "a", "body": {"inputs": {}}}\n')
    (tmp_path / "lines.output.jsonl").mkdir()
    refused = _invoke(server, "batch", "submit", str(source), "--model", "m", "--wait")
    assert refused.exit_code == 2, refused.output
    assert f"cannot write {tmp_path / 'lines.output.jsonl'}" in refused.stderr
    assert server.posts == []  # nothing was submitted


@pytest.mark.parametrize(
    ("args", "made", "follow_up"),
    [
        (("submit", "m", "--input", "{}"), "job_made", "conveyor jobs get job_made"),
        (("batch", "submit", "@lines", "--wait"), "batch_made", "conveyor batch get batch_made"),
    ],
)
def test_a_wait_that_fails_after_a_create_names_what_it_created(
    server: _Server, tmp_path: Path, args: tuple[str, ...], made: str, follow_up: str
) -> None:
    """The producer went away while the command waited: it exited 3 (outcome unknown) saying
    only the 503, and the job or batch it had created ran on under an id it never printed."""
    source = tmp_path / "lines.jsonl"
    source.write_text('{"custom_id": "a", "body": {"inputs": {}}}\n')
    args = tuple(str(source) if arg == "@lines" else arg for arg in args)
    failed = _invoke(server, *args)
    assert failed.exit_code == 3, failed.output
    said = _one_error_line(failed)
    assert "503 unavailable" in said and made in said and follow_up in said, said
    assert failed.stdout == ""


def test_jobs_wait_on_a_producer_that_is_down_ends_as_every_command_does(
    server: _Server,
) -> None:
    """Its event stream retried for two minutes (the stream's `reconnect_for_s`), printing
    nothing, where every other command gives up after its few retries: a mistyped URL or a
    stopped producer looked like a job still running."""
    started = time.monotonic()
    try:
        waited = subprocess.run(
            [CONVEYOR, "jobs", "wait", "down", "--url", server.url],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail("`jobs wait` was still retrying its stream after 30 s")
    assert time.monotonic() - started < 30
    assert waited.returncode == 3, waited.stderr
    assert waited.stderr.splitlines()[-1].startswith("Error: 503 unavailable"), waited.stderr
    assert "Traceback" not in waited.stderr


class _Hanging(QuietHandler):
    """Takes the submit (202), then holds every read unanswered until the test ends."""

    protocol_version = "HTTP/1.1"
    reading = threading.Event()
    released = threading.Event()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.dumps({"id": "job_made", "status": "queued"}).encode()
        self.answer(202, body, _JSON)

    def do_GET(self) -> None:
        type(self).reading.set()
        type(self).released.wait(30)
        self.close_connection = True


def test_ctrl_c_during_a_submits_wait_names_the_job_it_leaves_running() -> None:
    """Ctrl-C ended the wait with `Aborted!` alone: the job ran on, its id printed nowhere."""
    _Hanging.reading.clear()
    _Hanging.released.clear()
    with serving(LocalServer(_Hanging)) as server:
        waiting = subprocess.Popen(
            [CONVEYOR, "submit", "m", "--input", "{}", "--url", server.url],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert _Hanging.reading.wait(30), "the wait never began"
            waiting.send_signal(signal.SIGINT)
            stdout, stderr = waiting.communicate(timeout=30)
        finally:
            _Hanging.released.set()
            if waiting.poll() is None:
                waiting.kill()
                waiting.wait()
    assert waiting.returncode == 130, stderr
    assert stderr.splitlines() == [
        "job job_made was submitted: `conveyor jobs get job_made` shows it",
        "Aborted!",
    ], stderr
    assert stdout == ""


NGINX_404 = b"""<html>
<head><title>404 Not Found</title></head>
<body>
<center><h1>404 Not Found</h1></center>
<hr><center>nginx/1.24.0</center>
</body>
</html>
"""


class _Elsewhere(QuietHandler):
    """Another web server at the URL given (a typo in the port, a path prefix forgotten)."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.answer(404, NGINX_404, {"Content-Type": "text/html"})


@pytest.mark.parametrize("args", [("jobs", "get", "j"), ("routes", "show", "m")])
def test_a_wrong_urls_html_page_is_one_line(args: tuple[str, ...]) -> None:
    """The page's own lines were the error's: eight lines of nginx's HTML on stderr."""
    with serving(LocalServer(_Elsewhere)) as server:
        refused = CliRunner().invoke(main, [*args, "--url", server.url])
    assert refused.exit_code == 1, refused.output
    assert refused.stderr.splitlines() == [
        "Error: 404 http_error: <html> <head><title>404 Not Found</title></head> <body> "
        "<center><h1>404 Not Found</h1></center> <hr><center>nginx/1.24.0</center> </body> "
        "</html>"
    ], refused.stderr


class _KeyChecking(QuietHandler):
    """A job for the key `cvk_good`; 401 for any other."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.headers.get("Authorization") != "Bearer cvk_good":
            body = {"error": {"type": "unauthorized", "message": "unknown API key"}}
            self.answer(401, json.dumps(body).encode(), _JSON)
            return
        self.answer(200, json.dumps({"id": "j", "status": "queued"}).encode(), _JSON)


def test_an_api_key_read_from_a_file_with_its_newline_is_used() -> None:
    """A key read with its trailing newline (a Kubernetes Secret made from a file, an env
    file) is no header value: each try failed before it was sent, was retried for seconds as
    if the producer were down, and ended in "cannot reach the producer" with the key printed."""
    with serving(LocalServer(_KeyChecking)) as server:
        read = CliRunner().invoke(
            main, ["jobs", "get", "j", "--url", server.url], env={"CONVEYOR_API_KEY": "cvk_good\n"}
        )
        assert read.exit_code == 0, read.output
        assert json.loads(read.stdout)["id"] == "j"
        with Client(server.url, api_key=" cvk_good\r\n") as client:
            assert client.get("j").status == "queued"


@pytest.mark.parametrize("key", ["cvk_\u043a\u043b\u044e\u0447", "cvk_a\x01b", "cvk_a\nb"])
def test_an_api_key_no_header_can_carry_is_a_usage_error_naming_the_key_option(key: str) -> None:
    """A non-ASCII key was blamed on `--url` ("Invalid value for '--url': 'ascii' codec can't
    encode"), a control character retried as an outage; neither is sent, nor the key shown."""
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: refused before any request
    for args in (("jobs", "get", "j"), ("routes", "show", "m")):
        refused = CliRunner().invoke(main, [*args, "--url", url, "--api-key", key])
        assert refused.exit_code == 2, refused.output
        assert "Invalid value for '--api-key'" in refused.stderr, refused.stderr
        assert key not in refused.stderr and "retry" not in refused.stderr
    with pytest.raises(InvalidArgument, match="API key"):
        Client(url, api_key=key)
