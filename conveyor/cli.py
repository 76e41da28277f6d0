"""The `conveyor` command: every module in `conveyor.commands` contributes one `command`."""

from __future__ import annotations

import importlib
import pkgutil

import click

from conveyor import commands


@click.group()
def main() -> None:
    """Conveyor: queue-driven asynchronous inference."""


for _info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
    main.add_command(importlib.import_module(f"conveyor.commands.{_info.name}").command)
