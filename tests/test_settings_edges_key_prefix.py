"""`conveyor render keda --key-prefix` is held to CONVEYOR_KEY_PREFIX's rule (printable ASCII, no
spaces or braces): before, `a{b}:` rendered triggers for streams the pods, refusing that prefix
when their settings load, would never write."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from conveyor.cli import main
from shared.settings import Settings


@pytest.mark.parametrize("prefix", ["a{b}:", "my app:", "caf\u00e9:"])
def test_render_refuses_a_key_prefix_the_settings_refuse(prefix: str) -> None:
    with pytest.raises(ValidationError):
        Settings(key_prefix=prefix)
    result = CliRunner().invoke(main, ["render", "keda", "--key-prefix", prefix])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--key-prefix'" in result.output, result.output
    assert "braces" in result.output and "stream:" not in result.output, result.output


def test_render_takes_a_key_prefix_the_settings_take() -> None:
    result = CliRunner().invoke(main, ["render", "keda", "--key-prefix", "tenant-a:"])
    assert result.exit_code == 0, result.output
    assert "stream: tenant-a:q:" in result.output, result.output
