"""The `conveyor` command: every module in `conveyor.commands` contributes one `command`."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

import click
from pydantic import ValidationError

from conveyor import commands
from shared.model_repository import ModelConfigError
from shared.settings import Settings


class _Group(click.Group):
    """A bad `CONVEYOR_*` setting or model repository ends any command with one line, not a
    traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ModelConfigError as exc:
            raise click.ClickException(str(exc)) from None
        except ValidationError as exc:
            if exc.title != Settings.__name__:
                raise
            problems = "; ".join(
                f"CONVEYOR_{'_'.join(map(str, e['loc'])).upper()}={e['input']!r}: {e['msg']}"
                for e in exc.errors()
            )
            raise click.ClickException(f"bad setting: {problems}") from None


@click.group(cls=_Group)
def main() -> None:
    """Conveyor: queue-driven asynchronous inference."""


for _info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
    main.add_command(importlib.import_module(f"conveyor.commands.{_info.name}").command)
