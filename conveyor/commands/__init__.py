"""Subcommands of `conveyor`; each module exposes a click `command`."""
