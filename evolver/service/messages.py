"""The messages between the daemon and its worker processes, one type each, over the worker's pipe.

A message is a frozen dataclass; the pipe pickles it, and each side reads it with one ``match`` on
its type (``DaemonLink.listen`` in the worker, ``WorkerProcess._read`` in the daemon). A type's
fields are its whole content: nothing travels beside them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memory import Context, Lease, Step, Task

from ..agent.loop import TaskResult

__all__ = [
    "ToWorker",
    "FromWorker",
    "WorkArrived",
    "Drain",
    "ContextReply",
    "ChatAsked",
    "ChatCancelled",
    "Ready",
    "Claimed",
    "Idle",
    "Wrote",
    "Ended",
    "ContextAsked",
    "ChatStep",
    "ChatPiece",
    "ChatDone",
    "McpCalled",
    "McpAnswer",
]


# --- from the daemon to a worker process ------------------------------------------------------------


@dataclass(frozen=True)
class WorkArrived:
    """A task may be claimable now (one was submitted, or a lease ended): look in the inbox."""


@dataclass(frozen=True)
class Drain:
    """Stop at the next step boundary, send the task back to the queue, end the chat turns, exit."""


@dataclass(frozen=True)
class ContextReply:
    """The answer to ``ContextAsked`` ``request``: the context, or why there is none."""

    request: int
    context: Context | None = None
    error: str = ""


@dataclass(frozen=True)
class ChatAsked:
    """Answer this chat turn; its task is already recorded."""

    turn: int
    task: Task


@dataclass(frozen=True)
class ChatCancelled:
    """The chat turn's client went away: stop it at its next step."""

    turn: int


@dataclass(frozen=True)
class McpAnswer:
    """The answer to ``McpCalled`` ``request``: whether the tool succeeded, and its text or why it failed."""

    request: int
    ok: bool
    text: str


ToWorker = WorkArrived | Drain | ContextReply | ChatAsked | ChatCancelled | McpAnswer


# --- from a worker process to the daemon ------------------------------------------------------------


@dataclass(frozen=True)
class Ready:
    """The process has opened its engine and takes work and chat turns."""

    pid: int


@dataclass(frozen=True)
class Claimed:
    """It holds this lease (the daemon shows it, and hands it back if the process dies)."""

    lease: Lease


@dataclass(frozen=True)
class Idle:
    """It holds no lease any more."""


@dataclass(frozen=True)
class Wrote:
    """It wrote a step of this task: wake its live streams, bring the index up to date."""

    task_id: str


@dataclass(frozen=True)
class Ended:
    """This task ended (the search reads its result); the process holds no lease."""

    task_id: str


@dataclass(frozen=True)
class ContextAsked:
    """The retrieval context of a task (the index is the daemon's): ``store.context(query, **options)``."""

    request: int
    query: str
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ChatStep:
    """A step of chat turn ``turn``, as it was recorded."""

    turn: int
    step: Step


@dataclass(frozen=True)
class ChatPiece:
    """A piece of chat turn ``turn``'s answer, as the model writes it."""

    turn: int
    piece: str


@dataclass(frozen=True)
class ChatDone:
    """Chat turn ``turn`` ended: its result, or the exception it raised (one that survives the pipe)."""

    turn: int
    result: TaskResult | None = None
    error: BaseException | None = None


@dataclass(frozen=True)
class McpCalled:
    """Call the user's MCP tool ``name`` (the agent's name of it) with ``arguments``: the servers are the
    daemon's, started once."""

    request: int
    name: str
    arguments: dict[str, Any]


FromWorker = Ready | Claimed | Idle | Wrote | Ended | ContextAsked | ChatStep | ChatPiece | ChatDone | McpCalled
