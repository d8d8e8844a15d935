"""evolver: a self-evolving agent daemon with experience memory.

The engine: settings, the model layer, the agent loop, the scaffold and its
tree, the meta-agent, evaluation, the inbox, the daemon, its socket API and the
CLI. It builds on ``memory`` (the experience store), ``tools`` and ``sandbox``.
"""

from memory import _offline  # noqa: F401  (before litellm, chromadb, transformers)

from .config import Config, ConfigError, load_config
from .storage import open_store

__all__ = ["Config", "ConfigError", "load_config", "open_store", "__version__"]

__version__ = "0.1.0"
