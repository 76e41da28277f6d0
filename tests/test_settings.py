"""Settings refuse, when a process starts, what could not work: values out of range, a Redis
URL of another scheme, a key prefix or instance id Redis could not use as meant, a log level
logging lacks, a webhook allow-list entry that matches no URL. (`tests/test_up_scale.py` checks
that `conveyor up` reports each as one line.)"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from shared.settings import Settings


@pytest.mark.parametrize(
    "setting",
    [
        {"result_ttl_s": 0},
        {"max_wait_s": 0},
        {"max_body_bytes": 0},
        {"metrics_port": 65_536},
        {"block_ms": 0},  # BLOCK 0 waits forever: a worker would never notice a stop
        {"shutdown_grace_s": -1},
        {"webhook_timeout_s": 0},
        {"webhook_retry_for_s": -1},
        {"key_prefix": "{cv}:"},  # the brace would become every key's hash tag
        {"key_prefix": "my app:"},
        {"instance_id": "my producer"},  # CLIENT SETNAME refuses spaces: no connection would open
        {"instance_id": ""},
        {"shutdown_grace_s": float("inf")},  # overflowed as the consumer thread's join timeout
        {"redis_timeout_s": float("nan")},
        {"start_timeout_s": 0},
    ],
)
def test_settings_out_of_range_are_refused(setting: dict[str, float | str]) -> None:
    with pytest.raises(ValidationError):
        Settings(**setting)  # type: ignore[arg-type]


def test_a_log_level_is_any_name_python_logging_knows() -> None:
    assert Settings(log_level="warn").log_level == "WARN"
    assert Settings(log_level="debug").log_level == "DEBUG"


@pytest.mark.parametrize("entry", ["hooks.example.com", "hooks.example.com:443/x", "ftp://h"])
def test_a_webhook_allowlist_entry_that_matches_nothing_is_refused(entry: str) -> None:
    """Before, every webhook was refused at submit as outside the list, which looked right."""
    with pytest.raises(ValidationError, match="is not http\\(s\\)://host\\[:port\\]"):
        Settings(webhook_allowlist=f"https://ok.example.com,{entry}")  # type: ignore[arg-type]
    good = "https://*.example.com, http://127.0.0.1:9000/hooks"
    listed = Settings(webhook_allowlist=good)  # type: ignore[arg-type]
    assert listed.webhook_allowlist == ["https://*.example.com", "http://127.0.0.1:9000/hooks"]
