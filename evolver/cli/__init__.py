"""The `evolver` command (click + rich): one module per family of subcommands."""

from . import daemon, demo, inspect, local, tasks  # noqa: F401  (each registers its commands on `cli`)
from .base import cli, main

__all__ = ["cli", "main"]
