"""evolver: a self-evolving agent daemon with experience memory.

Subpackages by job, top to bottom (each imports only those below it; the
contracts in pyproject.toml are checked by import-linter):

    cli      the `evolver` command and its socket client
    service  the daemon, workers, intake, feed, server, sockets, systemd
    api      the HTTP API over the socket (serves any ServiceHost)
    meta     background jobs: distillation, insights, tool synthesis, revert
    tree     the self-modification tree: search, policy, proposer, incumbent
    agent    the loop, the scaffold, the toolbox, the engine's wiring
    judge    checks, the verifier, task packs (imports nothing evolution edits)
    llm      the model client, the budget, the scripted model
    config, storage   settings, and opening the store with them

It builds on (imports) ``memory`` (the experience store), ``tools`` and
``sandbox``, which import nothing of evolver.
"""

from memory import _offline  # noqa: F401  (before litellm, chromadb, transformers)

from .config import Config, ConfigError, load_config
from .storage import open_store

__all__ = ["Config", "ConfigError", "load_config", "open_store", "__version__"]

__version__ = "0.1.0"
