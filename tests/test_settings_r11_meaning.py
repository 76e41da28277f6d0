"""A value read as something other than what it says is refused by name: an empty
CONVEYOR_KEY_PREFIX (a script's unset variable) gave a process other keys than its peers' `cv:`,
and CONVEYOR_MODELS written as a JSON list (`["identity"]`) passed the settings only to stop a
worker's bootstep with a traceback, while `identity:` served every variant of it."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from shared.settings import settings_or_exit


@pytest.mark.parametrize(
    ("name", "value", "why"),
    [
        ("CONVEYOR_KEY_PREFIX", "", "must not be empty"),
        ("CONVEYOR_MODELS", '["identity"]', "is not model or model:variant"),
        ("CONVEYOR_MODELS", "identity:", "is not model or model:variant"),
        ("CONVEYOR_MODELS", "identity:default minilm", "is not model or model:variant"),
    ],
)
def test_a_process_given_it_exits_with_one_line(
    settings_env: Callable[..., None], name: str, value: str, why: str
) -> None:
    """`celery -A workers.app` and the producer's modules start with settings_or_exit."""
    settings_env(**{name: value})
    with pytest.raises(SystemExit) as ended:
        settings_or_exit()
    line = str(ended.value.code)
    assert line.startswith(f"Error: bad setting: {name}="), line
    assert why in line and "\n" not in line, line


def test_model_selectors_as_documented_are_kept(settings_env: Callable[..., None]) -> None:
    settings_env(CONVEYOR_MODELS=" identity:default, minilm ,smollm2", CONVEYOR_KEY_PREFIX="app:")
    settings = settings_or_exit()
    assert settings.models == ["identity:default", "minilm", "smollm2"]
    assert settings.key_prefix == "app:"
