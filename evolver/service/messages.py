"""The messages between the daemon and its worker processes, one type each, over the worker's pipe.

A message is a frozen dataclass; the pipe pickles it, and each side reads it with one ``match`` on
its type (``DaemonLink.listen`` in the worker, ``WorkerProcess._read`` in the daemon). A type's
fields are its whole content: nothing travels beside them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memory import Context, Lease

__all__ = [
    "ToWorker",
    "FromWorker",
    "WorkArrived",
    "Drain",
    "ContextReply",
    "Ready",
    "Claimed",
    "Idle",
    "Wrote",
    "Ended",
    "ContextAsked",
    "Answered",
    "McpCalled",
    "McpAnswer",
]


# --- from the daemon to a worker process ------------------------------------------------------------


@dataclass(frozen=True)
class WorkArrived:
    """A task may be claimable now (one was submitted, or a lease ended): look in the inbox."""


@dataclass(frozen=True)
class Drain:
    """Stop at the next step boundary, send the tasks back to the queue (chat turns too), exit."""


@dataclass(frozen=True)
class ContextReply:
    """The answer to ``ContextAsked`` ``request``: the context, or why there is none."""

    request: int
    context: Context | None = None
    error: str = ""


@dataclass(frozen=True)
class McpAnswer:
    """The answer to ``McpCalled`` ``request``: whether the tool succeeded, and its text or why it failed."""

    request: int
    ok: bool
    text: str


ToWorker = WorkArrived | Drain | ContextReply | McpAnswer


# --- from a worker process to the daemon ------------------------------------------------------------


@dataclass(frozen=True)
class Ready:
    """The process has opened its engine and takes work, chat turns included."""

    pid: int


@dataclass(frozen=True)
class Claimed:
    """It holds this lease, in its task lane or a chat lane (the daemon shows it, and hands it back if the
    process dies)."""

    lease: Lease


@dataclass(frozen=True)
class Idle:
    """Its task lane holds no lease any more."""


@dataclass(frozen=True)
class Wrote:
    """It wrote a step of this task: wake its live streams, bring the index up to date."""

    task_id: str


@dataclass(frozen=True)
class Ended:
    """This task ended (the search reads its result, a chat turn's request its answer); the lane that ran
    it holds no lease."""

    task_id: str


@dataclass(frozen=True)
class Answered:
    """A piece of the answer of ``task_id``'s attempt ``attempt``, as the model writes it (a chat turn's
    request streams it)."""

    task_id: str
    attempt: int
    piece: str


@dataclass(frozen=True)
class ContextAsked:
    """The retrieval context of a task (the index is the daemon's): ``store.retrieval.context(query, **options)``."""

    request: int
    query: str
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class McpCalled:
    """Call the user's MCP tool ``name`` (the agent's name of it) with ``arguments``: the servers are the
    daemon's, started once."""

    request: int
    name: str
    arguments: dict[str, Any]


FromWorker = Ready | Claimed | Idle | Wrote | Ended | Answered | ContextAsked | McpCalled
