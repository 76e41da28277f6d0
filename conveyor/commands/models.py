"""`conveyor models prepare|list`: build example-model artifacts offline and show the repository."""

from __future__ import annotations

import click


@click.group("models")
def command() -> None:
    """Model repository tools."""


@command.command("prepare")
@click.argument("names", nargs=-1)
@click.option("--force", is_flag=True, help="Rebuild even when cached artifacts exist.")
def prepare(names: tuple[str, ...], force: bool) -> None:
    """Build artifacts for the models that need preparing (all by default); cached."""
    # here, not above: the settings and the model repository are not for `--help`
    from conveyor.configured_repository import configured_repository
    from shared.settings import get_settings
    from workers.model_prep import MissingSource, preparer

    settings = get_settings()
    if settings.artifact_dir.resolve() == settings.model_repository.resolve():  # Triton's habit
        raise click.UsageError(
            f"CONVEYOR_ARTIFACT_DIR is the model repository ({settings.model_repository}): a "
            "build replaces its model's folder whole, config.yaml included; give artifacts a "
            "folder of their own"
        )
    repository = configured_repository(settings)
    unknown = [name for name in names if repository.get(name) is None]
    if unknown:
        known = ", ".join(config.name for config in repository)
        raise click.BadParameter(f"no model {', '.join(unknown)} (the repository has {known})")
    for config in repository:
        if names and config.name not in names:
            continue
        if config.prepare is None:
            if names:  # asked for by name: say why nothing happens
                click.echo(f"{config.name}: nothing to prepare (its config.yaml has no `prepare`)")
            continue
        out_dir = settings.artifact_dir / config.name
        click.echo(f"preparing {config.name} → {out_dir}")
        try:
            preparer(config.prepare)(config, out_dir, force)
        except (OSError, MissingSource) as exc:  # unwritable folder, no package: was a traceback
            raise click.ClickException(
                f"cannot prepare {config.name} in {out_dir}: {exc}"
            ) from None


@command.command("list")
def list_models() -> None:
    """Print each model with its kind, backend and variants."""
    from conveyor.configured_repository import configured_repository
    from shared.settings import get_settings

    repository = configured_repository(get_settings())
    for config in repository:
        variants = ", ".join(config.variants)
        click.echo(f"{config.name}\t{config.kind}\t{config.backend}\t{variants}")
