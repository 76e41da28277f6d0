"""The `conveyor` command: every module in `conveyor.commands` contributes one `command`."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

import click
from pydantic import ValidationError

from conveyor import commands
from shared.model_repository import ModelConfigError
from shared.settings import Settings, bad_setting

# Ctrl-C's exit status, as a shell reports a command SIGINT ended (128 + 2)
INTERRUPTED = 130


class _Group(click.Group):
    """Each module of `conveyor.commands` is the subcommand of its name, imported only when that
    command runs (or `--help` lists them all): a command starts without the others' imports. A
    bad `CONVEYOR_*` setting or model repository ends any command with one line, not a
    traceback; Ctrl-C with INTERRUPTED."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(module.name for module in pkgutil.iter_modules(commands.__path__))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.list_commands(ctx):
            return None
        command: click.Command = importlib.import_module(f"conveyor.commands.{cmd_name}").command
        return command

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:  # click's own exit 1 said a waited-for job ended otherwise
            click.echo("Aborted!", err=True)
            raise click.exceptions.Exit(INTERRUPTED) from None
        except ModelConfigError as exc:
            raise click.ClickException(str(exc)) from None
        except ValidationError as exc:
            if exc.title != Settings.__name__:
                raise
            raise click.ClickException(bad_setting(exc)) from None


@click.group(cls=_Group)
def main() -> None:
    """Conveyor: queue-driven asynchronous inference."""
