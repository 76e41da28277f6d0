"""The model repository CONVEYOR_MODEL_REPOSITORY names, as the CLI's commands load it: its
default (`model_repository`) is relative, so a command run from anywhere but the checkout found
no such folder and said so by the relative name alone."""

from __future__ import annotations

import click

from shared.model_repository import ModelRepository
from shared.settings import Settings


class RepositoryNotFound(click.ClickException):
    """No folder where CONVEYOR_MODEL_REPOSITORY points: one line, a usage error's exit status
    (click's own usage errors print the command's usage too, no help for a setting)."""

    exit_code = 2


def configured_repository(settings: Settings) -> ModelRepository:
    """The repository `settings` names, loaded with their result TTL as the producer and the
    workers load it (without it, a `queue.max_queue_time_s` past CONVEYOR_RESULT_TTL_S was
    listed, prepared and started while both refused to start on it); a missing folder is named
    absolute, with the setting that moves it."""
    root = settings.model_repository
    if not root.is_dir():
        relative = "" if root.is_absolute() else f" ('{root}' is relative to this directory)"
        raise RepositoryNotFound(
            f"model repository {root.absolute()} is not a directory{relative}: set "
            "CONVEYOR_MODEL_REPOSITORY to your models' folder"
        )
    return ModelRepository.load(root, settings.result_ttl_s)
