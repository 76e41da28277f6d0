"""`conveyor submit --input @-` reads the inputs from standard input, as `@path` reads a file
(and as curl's `-d @-`): `-` was taken for a file's name, "cannot read -", and only
`@/dev/stdin` worked, where there is one."""

from __future__ import annotations

from click.testing import CliRunner

from conveyor.cli import main
from conveyor.client.cli_options import json_argument

NOWHERE = "http://127.0.0.1:9"  # nothing listens: a call would fail with exit 1


def test_at_dash_reads_a_json_value_from_standard_input() -> None:
    with CliRunner().isolation(input='{"text": "piped", "n": [1, 2]}\n'):
        assert json_argument("@-", "--input") == {"text": "piped", "n": [1, 2]}


def test_submit_reads_its_input_from_standard_input() -> None:
    """What was piped is what is checked: an array is refused as not an object (the value was
    read), and JSON that does not parse is refused as not JSON, both before any call."""
    runner = CliRunner()
    args = ["submit", "identity", "--input", "@-", "--url", NOWHERE, "--no-wait"]

    array = runner.invoke(main, args, input="[1, 2]")
    broken = runner.invoke(main, args, input="{not json")

    assert array.exit_code == 2, array.output
    assert "inputs must be a JSON object" in array.output
    assert broken.exit_code == 2, broken.output
    assert "not JSON" in broken.output
