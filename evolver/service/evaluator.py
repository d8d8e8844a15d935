"""Where the tree search's evaluations run: the ``[evaluator]`` backend.

"local" (the default): evaluation and smoke tasks are inbox tasks like any
other, claimed by the daemon's own workers; there is nothing more to start.
"ray": the daemon's workers leave those tasks alone and a ``RayEvaluator``
claims them, ships each to a Ray task, and records what comes back (the daemon
stays the single writer of the store).
"""

from __future__ import annotations

from typing import Protocol

from ..config import Config
from ..tree.search import SEARCH_SOURCES

__all__ = ["Evaluator", "local_exclusions", "open_evaluator"]


class Configured(Protocol):
    config: Config


class Evaluator(Protocol):
    def start(self) -> None: ...
    def close(self, grace_s: float) -> None:
        """Stop claiming; hand back (release) what has not come back within ``grace_s``."""

    def running(self) -> list[dict]:
        """The evaluations in flight, as the status shows them: task_id and worker."""


def local_exclusions(daemon: Configured) -> tuple[str, ...]:
    """The task sources the daemon's own workers must leave to another backend."""
    return SEARCH_SOURCES if daemon.config.evaluator.backend == "ray" else ()


def open_evaluator(daemon) -> Evaluator | None:
    """The backend that runs evaluations besides the daemon's workers; None for "local"."""
    if daemon.config.evaluator.backend != "ray":
        return None
    from .ray_evaluator import RayEvaluator  # Ray is an optional dependency

    return RayEvaluator(daemon)  # the daemon keeps ray_evaluator.RayHost
