"""A value with a final newline (a Kubernetes secret made `--from-file`) or surrounding spaces is
refused by name rather than kept: `CONVEYOR_STATE_DIR='var/run\\n'` became a folder whose name
ends in a newline, and `CONVEYOR_WEBHOOK_SECRET='s3cret\\n'` signed every delivery with a key its
receivers (given `s3cret`) could not verify. A secret's refusal leaves its value out."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from shared.settings import SECRET_FIELDS, UNTRIMMED_FIELDS, Settings, bad_setting


@pytest.mark.parametrize("field", UNTRIMMED_FIELDS)
@pytest.mark.parametrize("value", ["s3cret-value\n", " s3cret-value", "s3cret-value\t"])
def test_surrounding_whitespace_is_a_bad_setting(
    monkeypatch: pytest.MonkeyPatch, field: str, value: str
) -> None:
    name = f"CONVEYOR_{field.upper()}"
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError) as refused:
        Settings()
    line = bad_setting(refused.value)
    shown = "***" if field in SECRET_FIELDS else repr(value)
    assert line.startswith(f"bad setting: {name}={shown}: "), line
    assert "whitespace" in line and "\n" not in line, line
    assert ("s3cret" in line) is (field not in SECRET_FIELDS), line


def test_whitespace_inside_a_value_is_kept() -> None:
    """Only its ends: a path or a secret may hold a space."""
    settings = Settings(state_dir="var/my run", webhook_secret="two words")  # type: ignore[arg-type]
    assert (str(settings.state_dir), settings.webhook_secret) == ("var/my run", "two words")
