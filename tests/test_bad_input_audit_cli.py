"""JSON a client cannot send is a clear usage error, not a traceback: `conveyor submit --input`
nested past Python's recursion limit (json's decoder raised RecursionError), or holding a lone
surrogate (`"\\ud800"`, which json reads but httpx cannot encode as UTF-8); the SDK raises its
`InvalidArgument` for a body httpx cannot encode, before anything is sent."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from conveyor.cli import main
from conveyor.client.errors import InvalidArgument
from conveyor.client.sync_client import Client

NOWHERE = "http://127.0.0.1:9"  # nothing listens: a request sent would fail with exit 1
DEEP = "[" * 100_000 + "]" * 100_000


def _nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("inputs", "said"),
    [
        (f'{{"a": {DEEP}}}', "Invalid value for --input: JSON nested too deeply to read"),
        ('{"a": "\\ud800"}', "cannot be sent: a string holds '\\ud800', a lone surrogate"),
        ('{"\\udfff": 1}', "cannot be sent: a string holds '\\udfff', a lone surrogate"),
    ],
    ids=["deep", "surrogate-value", "surrogate-key"],
)
def test_submit_refuses_json_it_cannot_send_in_one_line(inputs: str, said: str) -> None:
    args = ["submit", "identity", "--input", inputs, "--url", NOWHERE, "--no-wait"]

    result = CliRunner().invoke(main, args)

    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert said in result.output, result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("inputs", "said"),
    [
        ({"a": "x\ud800"}, "a string holds '\\ud800', a lone surrogate"),
        ({"a": _nested(5_000)}, "it is nested too deeply"),
        ({"a": float("nan")}, "Out of range float values are not JSON compliant"),
    ],
    ids=["surrogate", "deep", "nan"],
)
def test_the_sdk_refuses_a_body_it_cannot_encode_before_sending(
    inputs: dict[str, Any], said: str
) -> None:
    with Client(NOWHERE, "cvk_unused") as client, pytest.raises(InvalidArgument) as refused:
        client.submit("identity", inputs)

    assert str(refused.value) == f"the request's JSON body cannot be sent: {said}"


LONG = "x" * 70_000  # past the 65536 characters httpx takes in a URL (or in its query)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("jobs", "get", LONG), "URL too long"),
        (("files", "list", "--after", LONG), "URL component 'query' too long"),
        (("routes", "show", LONG), "URL too long"),  # an admin call, not the SDK's
    ],
    ids=["sdk-path", "sdk-query", "admin-path"],
)
def test_an_argument_too_long_for_a_url_is_a_usage_error(args: tuple[str, ...], said: str) -> None:
    result = CliRunner().invoke(main, [*args, "--url", NOWHERE, "--api-key", "cvk_unused"])

    assert result.exit_code == 2, (result.exit_code, result.output[-300:], result.exception)
    assert f"Error: the request's URL cannot be sent: {said}" in result.output
    assert "Traceback" not in result.output
