"""docs/architecture.md's table of Lua scripts names every script of the Batch API with the
invariant it keeps: COMMIT and SET_UNLESS_SET came without their rows."""

from __future__ import annotations

from shared import batch_api_scripts
from tests.conftest import REPO_ROOT


def test_every_batch_api_script_has_its_row() -> None:
    scripts = [
        name
        for name, value in vars(batch_api_scripts).items()
        if name.isupper() and isinstance(value, str) and "redis.call" in value
    ]
    text = (REPO_ROOT / "docs" / "architecture.md").read_text()
    assert {"COUNT", "ADVANCE", "COMMIT"} <= set(scripts)
    missing = [name for name in scripts if f"| `batch_api_scripts.py` {name} | " not in text]
    assert missing == [], "Batch API scripts docs/architecture.md's script table never names"
