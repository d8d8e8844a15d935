"""Typed records of the experience store: what a row means, not how it is stored.

Every record is a frozen dataclass built from a SQLite row. JSON columns
(check, metadata, tool calls, provenance, evidence) are decoded here, so the
rest of the program never sees a raw string where a structure belongs.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = [
    "Ending",
    "TaskKind",
    "TaskStatus",
    "Task",
    "Trajectory",
    "Step",
    "Outcome",
    "Insight",
    "ToolRecord",
    "Node",
    "Evaluation",
    "LedgerEntry",
    "Event",
    "TrajectoryHit",
    "InsightHit",
    "ToolHit",
    "Context",
]

JSON_COLUMNS = {
    "check",
    "metadata",
    "tool_calls",
    "tool_results",
    "provenance",
    "evidence",
    "payload",
    "stats",
}


class _Record:
    @classmethod
    def from_row(cls, row: dict[str, Any]):
        names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        values = {}
        for key, value in row.items():
            if key not in names:
                continue
            if key in JSON_COLUMNS and isinstance(value, str):
                value = json.loads(value)
            if key in ("success", "cancel_requested", "person_good") and value is not None:
                value = bool(value)
            if key == "ending" and value is not None:
                value = Ending(value)
            if key == "source" and cls is Task:
                value = TaskKind.of(value)
            if key == "status" and cls is Task:
                value = TaskStatus.of(value)
            values[key] = value
        return cls(**values)


class Ending(str, enum.Enum):
    """How a run of a task ended, as a typed field (the task's ``error`` is the human sentence).

    Callers decide on this, never on the wording of the error: a smoke task that
    failed for want of budget is not the scaffold's fault, an internal error is.
    """

    ANSWERED = "answered"  # an answer its check accepted, or one with no check to judge it
    CHECK_FAILED = "check_failed"  # the last attempt's answer failed its check
    NO_ANSWER = "no_answer"  # no answer (a step limit) and no check to fall back on
    CANCELLED = "cancelled"
    BUDGET = "budget"  # the day's budget for its kind of work was spent
    MODEL_ERROR = "model_error"  # the model could not be reached or answered nonsense after retries
    INTERNAL_ERROR = "internal_error"  # a bug or a broken part of evolver
    INTERRUPTED = "interrupted"  # the daemon stopped while it ran


class _Named(str, enum.Enum):
    """A stored value with a name: printed, it is its value ("done", not "TaskStatus.DONE")."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @classmethod
    def of(cls, value: str):
        """The member stored as ``value``; a value no member has is refused, naming them."""
        try:
            return cls(value)
        except ValueError:
            names = ", ".join(m.value for m in cls)
            raise ValueError(f"{cls._what} is one of {names}, not {value!r}") from None  # type: ignore[attr-defined]


class TaskStatus(_Named):
    """Where a task is in the inbox (the database's CHECK holds the same list)."""

    _what = enum.nonmember("a task's status")
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    DEAD = "dead"  # dead-lettered: its attempts were used up


class TaskKind(_Named):
    """Where a task came from, which decides how it is run and counted: what budget it spends, whether a
    failing hook fails its run, whether the tree search reads its result. Stored as the task's ``source``.

    A task is admitted through one door (``evolver.tree.split.Admission.admit``), which also decides its split."""

    API = "api"  # a person's, through the socket API (``evolver submit``, MCP's submit_task)
    CLI = "cli"  # a person's, run in the foreground without the daemon (``evolver run``)
    CHAT = "chat"  # a chat turn
    BENCH = "bench"  # a benchmark's measured task (``evolver bench``), through the daemon or not
    EVALUATION = "evaluation"  # the tree search's evaluation of a node on a pack task
    SMOKE = "smoke"  # the tree search's smoke run of a new node
    IMPORT = "import"  # an attempt brought in whole (``ExperienceStore.ingest``): never run here
    INBOX = "inbox"  # added to the store directly, by no door (tests, and rows older than the kinds)

    _what = enum.nonmember("a task's source")

    @property
    def searched(self) -> bool:
        """The tree search's own work: it reads the result, and it runs on the node it tests."""
        return self in (TaskKind.EVALUATION, TaskKind.SMOKE)

    @property
    def purpose(self) -> str:
        """What its model calls are charged as: the search's work is background work (``evaluate``)."""
        return "evaluate" if self.searched else "task"

    @property
    def measured(self) -> bool:
        """A run whose result measures a scaffold (the search's, a benchmark's): a hook that failed in it
        fails the run, since its result would not be the scaffold's. A person's task gets its answer."""
        return self.searched or self is TaskKind.BENCH

    @property
    def persons(self) -> bool:
        """Handed over by a person, to be solved (not a chat turn, a measurement or an import)."""
        return self in (TaskKind.API, TaskKind.CLI, TaskKind.INBOX)


@dataclass(frozen=True)
class Task(_Record):
    id: str
    prompt: str
    status: TaskStatus
    created_at: float
    updated_at: float
    check: dict | None = None
    priority: int = 0
    source: TaskKind = TaskKind.INBOX
    metadata: dict = field(default_factory=dict)
    idempotency_key: str | None = None
    finished_at: float | None = None
    error: str | None = None
    attempts: int = 0
    lease_owner: str | None = None
    lease_token: int = 0
    lease_expires_at: float | None = None
    cancel_requested: bool = False
    started_at: float | None = None
    ending: Ending | None = None  # how its last run ended; None while it has not

    @property
    def held_out(self) -> bool:
        """In the held-out split (its metadata's ``split`` is "test"): never learned from
        (``memory.search.learnable_sql``, the same rule in SQL), and judged in one attempt."""
        return self.metadata.get("split") == "test"


@dataclass(frozen=True)
class Trajectory(_Record):
    id: str
    task_id: str
    prompt: str
    status: str
    started_at: float
    node_id: str | None = None
    attempt: int = 1
    final_answer: str | None = None
    finished_at: float | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0


@dataclass(frozen=True)
class Step(_Record):
    trajectory_id: str
    seq: int
    role: str
    content: str
    created_at: float
    tool_calls: list | None = None
    tool_results: list | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    duration_ms: float = 0.0


@dataclass(frozen=True)
class Outcome(_Record):
    trajectory_id: str
    success: bool | None
    decided_at: float
    score: float | None = None
    verifier: str | None = None
    verifier_output: str | None = None
    feedback: str | None = None
    person_good: bool | None = None
    """A person's word on the answer (None: none given); ``success`` is the verifier's where one decided."""


@dataclass(frozen=True)
class Insight(_Record):
    id: int
    text: str
    importance: int
    status: str
    created_at: float
    updated_at: float
    provenance: list = field(default_factory=list)
    node_id: str | None = None


@dataclass(frozen=True)
class ToolRecord(_Record):
    id: int
    name: str
    version: int
    description: str
    code_hash: str
    status: str
    origin: str
    created_at: float
    updated_at: float
    node_id: str | None = None
    event_id: int | None = None
    uses: int = 0
    successes: int = 0
    failures: int = 0


@dataclass(frozen=True)
class Node(_Record):
    id: str
    scaffold_hash: str
    status: str
    created_at: float
    parent_id: str | None = None
    diff: str = ""
    rationale: str = ""
    cost_usd: float = 0.0
    tokens: int = 0
    reason: str = ""  # why it is invalid


@dataclass(frozen=True)
class Evaluation(_Record):
    id: int
    node_id: str
    task_ref: str
    split: str
    status: str
    started_at: float
    success: bool | None = None
    trajectory_id: str | None = None
    finished_at: float | None = None
    task_id: str | None = None  # the inbox task that runs it


@dataclass(frozen=True)
class LedgerEntry(_Record):
    id: int
    at: float
    model: str
    purpose: str
    tokens_in: int
    tokens_out: int
    cost_usd: float
    latency_ms: float
    task_id: str | None = None
    node_id: str | None = None


@dataclass(frozen=True)
class Event(_Record):
    id: int
    at: float
    kind: str
    what: str
    why: str = ""
    evidence: list = field(default_factory=list)
    cost_usd: float = 0.0
    node_id: str | None = None
    payload: dict = field(default_factory=dict)
    reverts: int | None = None


# --- retrieval results -------------------------------------------------------


@dataclass(frozen=True)
class TrajectoryHit:
    """A past trajectory found for a query, with how it was found."""

    trajectory_id: str
    task_id: str
    prompt: str
    final_answer: str | None
    success: bool | None
    score: float  # fused reciprocal-rank score; higher is better
    similarity: float | None  # cosine similarity, when the vector search found it
    keyword_rank: int | None  # 1-based rank in the keyword search, when it found it
    work: str | None = None  # the code it delivered or ran last (its latest "work" step), if any


@dataclass(frozen=True)
class InsightHit:
    insight_id: int
    text: str
    importance: int
    score: float
    similarity: float | None
    keyword_rank: int | None
    measured: str | None = None
    """The verdict it earned when last measured ("helps"; see ``memory.effects``), if any."""


@dataclass(frozen=True)
class ToolHit:
    tool_id: int
    name: str
    version: int
    description: str
    score: float
    similarity: float | None
    keyword_rank: int | None
    measured: str | None = None
    """The verdict it earned when last measured ("helps"; see ``memory.effects``), if any."""


@dataclass(frozen=True)
class Context:
    """Everything memory offers one task: examples, insights and tools."""

    trajectories: list[TrajectoryHit]
    insights: list[InsightHit]
    tools: list[ToolHit]
    vector_search: bool = True  # False when the index is owned by another process
