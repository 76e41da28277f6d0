"""Settings refuse, when a process starts, what could not work: values out of range, a Redis
URL of another scheme, a key prefix or instance id Redis could not use as meant, a log level
logging lacks, a webhook allow-list entry that matches no URL. (`tests/test_up_scale.py` checks
that `conveyor up` reports each as one line.) README's configuration table names every setting
with its default."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from shared.settings import Settings


@pytest.mark.parametrize(
    "setting",
    [
        {"result_ttl_s": 0},
        {"max_wait_s": 0},
        {"max_body_bytes": 0},
        {"max_upload_bytes": 0},
        {"webhook_internal_hosts": "http://hooks:8080"},  # a host name, matched exactly
        {"redis_cluster_nodes": "node-1:7000,node-2"},  # a seed without its port
        {"redis_cluster_nodes": "node-1:0"},
        {"redis_cluster_nodes": "fd00::2:7001"},  # an IPv6 host unbracketed
        {"metrics_port": 65_536},
        {"block_ms": 0},  # BLOCK 0 waits forever: a worker would never notice a stop
        {"shutdown_grace_s": -1},
        {"webhook_timeout_s": 0},
        {"webhook_timeout_s": 301},
        {"rate_limit_per_s": 1e-16},  # a bucket Redis cannot keep: every request answered 500
        {
            "rate_limit_burst": 10**10
        },  # a bucket that never empties  # its claim would outlive the broker's redelivery of it
        {"webhook_retry_for_s": -1},
        {"webhook_concurrency": 0},  # a worker that never delivers
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


def _documented_defaults() -> dict[str, str]:
    """README's configuration table: variable name -> its default column, one row naming two
    variables (`A` / `B`) split into both."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    table = readme.split("## Configuration", 1)[1].split("\n\n| variable |", 1)[1]
    rows = table.split("\n\n", 1)[0].splitlines()[2:]
    documented: dict[str, str] = {}
    for row in rows:
        names, default = (cell.strip() for cell in row.strip("|").split("|")[:2])
        values = [value.strip() for value in default.split(" / ")]
        for i, name in enumerate(re.findall(r"`CONVEYOR_([A-Z_]+)`", names)):
            documented[name.lower()] = values[min(i, len(values) - 1)]
    return documented


def _as_documented(value: object) -> str:
    """A default as the table writes it: booleans as 0/1, whole floats without `.0`."""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def test_readme_documents_every_setting_with_its_default() -> None:
    """A setting added without a README row, or a default changed in one place only, fails
    here: the table is what operators read."""
    documented = _documented_defaults()
    fields = Settings.model_fields
    assert set(fields) - set(documented) == set(), "settings without a README row"
    assert set(documented) - set(fields) == set(), "README rows without a setting"
    for name, field in fields.items():
        written = documented[name]
        default = field.get_default(call_default_factory=True)
        if default in ("", []):
            assert written.startswith(("(empty", "(random")), (name, written)
        elif field.default_factory is None:  # a factory's depends on the machine: words say how
            assert written.split(" (")[0] == f"`{_as_documented(field.default)}`", (name, written)
