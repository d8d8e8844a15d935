"""The `evolver` command (click + rich): one module per family of subcommands, and ``client``,
the socket client each of them calls.

Imports: anything of evolver (it starts the daemon for ``up --foreground``);
nothing imports it.
"""

from . import canaries, daemon, demo, inspect, local, mcp, packs, tasks, ui  # noqa: F401  (each registers its commands on `cli`)
from .base import cli, main

__all__ = ["cli", "main"]
