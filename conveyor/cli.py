"""The `conveyor` command: every module in `conveyor.commands` contributes one `command`."""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

# Ctrl-C's exit status, as a shell reports a command SIGINT ended (128 + 2)
INTERRUPTED = 130

# Each subcommand (the module of its name in `conveyor.commands`) and the first sentence of its
# help, which `conveyor --help` lists: listing them by importing every module cost each
# command's imports (Redis, numpy, the model repository: most of a second) to print a menu.
SUMMARIES = {
    "autoscale": "Scale workers between each model's min and max replicas, as KEDA would.",
    "batch": "JSONL batches on the bulk lane.",
    "canary": "Canary rollouts of a model's variants (needs an admin key).",
    "dlq": "Dead-letter queues (entries that exhausted max_deliveries).",
    "files": "Batch input files, and batches' output and errors files.",
    "jobs": "Jobs on a running producer.",
    "keys": "API keys: tenant, scopes (submit, read, admin), models, expiry, limits.",
    "models": "Model repository tools.",
    "render": "Render deployment manifests from the model repository.",
    "routes": "Live routes of a model (needs an admin key).",
    "submit": "Submit a job to MODEL and print it.",
    "up": "Run the pipeline: embedded Valkey (unless CONVEYOR_REDIS_URL), producers, workers.",
}


class _Group(click.Group):
    """Each subcommand is imported only when it runs (or prints its own help): a command starts
    without the others' imports. A bad `CONVEYOR_*` setting or model repository ends any
    command with one line, not a traceback; Ctrl-C with INTERRUPTED."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUMMARIES)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in SUMMARIES:
            return None
        command: click.Command = importlib.import_module(f"conveyor.commands.{cmd_name}").command
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's own listing (each summary cut to the terminal's width), from SUMMARIES."""
        limit = formatter.width - 6 - max(map(len, SUMMARIES))
        rows = [
            (name, click.Command(name, help=SUMMARIES[name]).get_short_help_str(limit))
            for name in self.list_commands(ctx)
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:  # click's own exit 1 said a waited-for job ended otherwise
            click.echo("Aborted!", err=True)
            raise click.exceptions.Exit(INTERRUPTED) from None
        except Exception as exc:
            line = _one_line(exc)
            if line is None:
                raise
            raise click.ClickException(line) from None


def _one_line(exc: Exception) -> str | None:
    """A bad setting's or model repository's error as one line; None for any other. Their
    modules are looked up, not imported: one of their errors means its module is loaded, and a
    command that loads neither (`jobs get`) must not import them (half a second) to learn it."""
    if "shared.model_repository" in sys.modules:
        from shared.model_repository import ModelConfigError

        if isinstance(exc, ModelConfigError):
            return str(exc)
    if "shared.settings" in sys.modules:
        from pydantic import ValidationError

        from shared.settings import Settings, bad_setting

        if isinstance(exc, ValidationError) and exc.title == Settings.__name__:
            return bad_setting(exc)
    return None


@click.group(cls=_Group)
def main() -> None:
    """Conveyor: queue-driven asynchronous inference."""
