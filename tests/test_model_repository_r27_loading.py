"""What a config.yaml may hold, and how often the producer reads it. A UTF-16 file with its byte
order mark loaded (PyYAML decoded it) while any other file that is not UTF-8 was refused; a
`queue.max_run_s` of 0.0001 deemed every engine call hung; engine `parameters` passed NaN,
infinities and YAML's dates to engines that check none; `uvicorn producer_api.app:app` read the
repository twice, and served the second read."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from shared.model_repository import ModelConfigError, ModelRepository

REPO_ROOT = Path(__file__).resolve().parent.parent
BASE = "kind: batch\nbackend: identity\n"


def _config(root: Path, data: bytes) -> Path:
    """`root` as a repository of one model, `m`, whose config.yaml holds `data`."""
    config = root / "m" / "config.yaml"
    config.parent.mkdir(parents=True)
    config.write_bytes(data)
    return config


def _refusal(root: Path) -> str:
    with pytest.raises(ModelConfigError) as refused:
        ModelRepository.load(root)
    message = str(refused.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32"])
def test_a_config_that_is_not_utf8_is_refused_with_or_without_its_mark(
    tmp_path: Path, encoding: str
) -> None:
    """`utf-16` writes its byte order mark: that one loaded."""
    config = _config(tmp_path, BASE.encode(encoding))
    assert re.match(
        rf"{re.escape(str(config))}: not YAML: unacceptable character", _refusal(tmp_path)
    )


def test_a_utf16_mark_is_refused_as_latin1_is(tmp_path: Path) -> None:
    """The same error as any other byte that is no UTF-8, saying so."""
    config = _config(tmp_path, "\ufeff".encode("utf-16-le") + BASE.encode("utf-16-le"))
    assert _refusal(tmp_path) == (
        f"{config}: not YAML: unacceptable character #x00ff: invalid start byte (not UTF-8) "
        'in "<byte string>", position 0'
    )


def test_utf8_with_its_mark_loads(tmp_path: Path) -> None:
    """YAML allows a UTF-8 file its byte order mark."""
    _config(tmp_path, BASE.encode("utf-8-sig"))
    [config] = ModelRepository.load(tmp_path)
    assert config.name == "m"


@pytest.mark.parametrize("max_run_s", ["0.0001", "0.5", "9e-1"])
def test_a_run_ceiling_under_a_second_is_refused(tmp_path: Path, max_run_s: str) -> None:
    config = _config(tmp_path, f"{BASE}queue: {{max_run_s: {max_run_s}}}\n".encode())
    assert _refusal(tmp_path) == (
        f"{config}: model m: queue.max_run_s ({float(max_run_s):g} s) must be 0 (no ceiling) or "
        "at least 1 s: past it an engine call is deemed hung and the worker exits"
    )


@pytest.mark.parametrize(("max_run_s", "loaded"), [("0", 0.0), ("1", 1.0), ("2.5", 2.5)])
def test_no_ceiling_or_one_of_a_second_or_more_loads(
    tmp_path: Path, max_run_s: str, loaded: float
) -> None:
    _config(tmp_path, f"{BASE}queue: {{max_run_s: {max_run_s}}}\n".encode())
    [config] = ModelRepository.load(tmp_path)
    assert config.queue.max_run_s == loaded


NAN = "nan is not a finite number (JSON has no NaN or infinity)"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("parameters: {scale: .nan}\n", f"model m: parameters.scale: {NAN}"),
        ("parameters: {scale: 1e400}\n", "model m: parameters.scale: inf is not a finite number"),
        (
            "parameters: {clip: [1, {low: -.inf}]}\n",
            "model m: parameters.clip.1.low: -inf is not a finite number",
        ),
        (
            "parameters: {revision: 2024-01-01}\n",
            "model m: parameters.revision: a date (2024-01-01) has no JSON value (quote it for "
            "a string)",
        ),
        (
            "parameters: {since: 2024-01-01 10:00:00}\n",
            "model m: parameters.since: a datetime (2024-01-01 10:00:00) has no JSON value",
        ),
        (
            "parameters: {labels: {null: none}}\n",
            "model m: parameters.labels: key null is not a string, as JSON's keys are",
        ),
        (  # YAML 1.1's `on` is `true`
            "parameters: {features: {on: [a]}}\n",
            "model m: parameters.features: key true is not a string, as JSON's keys are",
        ),
        # a top-level key: pydantic placed it at the key itself, read as an integer
        ("parameters: {on: 1}\n", "parameters: key true is not a string, as JSON's keys are"),
        (
            "variants: {default: {parameters: {off: 1}}}\n",
            "variants.default.parameters: key false is not a string, as JSON's keys are",
        ),
        ("input_schema: {type: object, 3: 1}\n", "input_schema: key 3 is not a string"),
        (
            "variants: {default: {parameters: {scale: .nan}}}\n",
            f"model m variant default: parameters.scale: {NAN}",
        ),
        (
            "input_schema: {type: object, properties: {a: {const: .inf}}}\n",
            "model m: input_schema.properties.a.const: inf is not a finite number",
        ),
    ],
)
def test_a_value_json_has_not_is_refused_naming_its_place(
    tmp_path: Path, text: str, problem: str
) -> None:
    config = _config(tmp_path, f"{BASE}{text}".encode())
    message = _refusal(tmp_path)
    assert message.startswith(f"{config}: {problem}"), message


def test_a_repository_that_loads_is_json(tmp_path: Path) -> None:
    """Quoted dates, finite numbers and nested JSON pass as they are."""
    text = "parameters: {revision: '2024-01-01', scale: 1e3, clip: [1, {low: -2.5, high: null}]}\n"
    _config(tmp_path, f"{BASE}{text}".encode())
    [config] = ModelRepository.load(tmp_path)
    assert config.parameters == {
        "revision": "2024-01-01",
        "scale": 1000.0,
        "clip": [1, {"low": -2.5, "high": None}],
    }


# `uvicorn producer_api.app:app`'s import, then its lifespan, the config edited in between.
SERVE = """
import asyncio, sys
from pathlib import Path

from producer_api.app import app
from tests.app_client import app_client

Path(sys.argv[1]).write_text(sys.argv[2])


async def card() -> None:
    async with app_client(app) as client:
        print((await client.get("/v1/models/m")).json()["max_model_len"])

asyncio.run(card())
"""


def test_the_producer_serves_the_repository_it_read_to_refuse(
    tmp_path: Path, redis_url: str
) -> None:
    """Read once: the lifespan read it again, so a config.yaml changed after the one-line check
    was served unchecked by it (or refused in a lifespan traceback)."""
    config = _config(tmp_path / "repo", f"{BASE}parameters: {{max_model_len: 100}}\n".encode())
    env = {
        **os.environ,
        "CONVEYOR_MODEL_REPOSITORY": str(tmp_path / "repo"),
        "CONVEYOR_REDIS_URL": redis_url,
        "CONVEYOR_KEY_PREFIX": "r27-read-once:",
        "CONVEYOR_AUTH": "disabled",
    }
    edited = f"{BASE}parameters: {{max_model_len: 200}}\n"

    served = subprocess.run(
        [sys.executable, "-c", SERVE, str(config), edited],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert served.returncode == 0, served.stderr
    assert served.stdout.splitlines()[-1] == "100"
    assert config.read_text() == edited
