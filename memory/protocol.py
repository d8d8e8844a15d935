"""The experience store as interfaces sized to their consumers: what the rest of the project may ask.

Each role is a protocol: what an agent asks (``AgentStore``, in ``memory.roles``, with the ledger of model
calls it extends), the inbox, the tree search's nodes and evaluations, what is learned (an attempt's
records, insights, tools, exposures and retrieval) and the reports the views read. ``ExperienceStore``
is all of them with the store's upkeep, and the SQLite + Chroma ``Store`` keeps it: each role is a part
of its own composed over the store's database (``store.agent``, ``store.inbox``, ``store.tree``,
``store.attempts``, ``store.insights``, ``store.tools``, ``store.exposures``, ``store.retrieval``,
``store.ledger``, ``store.reports``). The engine depends on these, never on that class, so a
server-database implementation later is a new class that keeps them, not a rewrite; only
``evolver.storage`` names the class, to open one (a test checks both). Each method means what its
implementation's docstring says.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from typing import Protocol

from .attempts import NewTrajectory
from .effects import Effect
from .embedder import Embedder
from .inbox import Lease
from .index import VectorIndex
from .records import (
    Context,
    Ending,
    Evaluation,
    Event,
    Insight,
    InsightHit,
    Node,
    Outcome,
    Step,
    Task,
    TaskKind,
    ToolHit,
    ToolRecord,
    Trajectory,
    TrajectoryHit,
)
from .roles import AgentStore, AttemptRecords, CallLedger
from .search import Filters
from .tool_log import NewTool, RecordedCall

__all__ = [
    "ExperienceStore",
    "AgentStore",
    "CallLedger",
    "InboxStore",
    "TreeStore",
    "LearnedStore",
    "AttemptStore",
    "InsightStore",
    "ToolStore",
    "ExposureStore",
    "RetrievalStore",
    "Reports",
]


class InboxStore(Protocol):
    """The inbox: tasks, their leases and cancellation (the daemon, its workers, the API's task routes), as
    ``store.inbox``: a part of its own, composed over the store's database (``memory.inbox``)."""

    def add_task(
        self,
        prompt: str,
        *,
        check: dict | None = None,
        priority: int = 0,
        source: TaskKind | str = TaskKind.INBOX,
        metadata: dict | None = None,
        idempotency_key: str | None = None,
        status: str = "queued",
    ) -> tuple[Task, bool]: ...
    def add_tasks(self, items: list[dict]) -> list[tuple[Task, bool]]: ...
    def get_task(self, task_id: str) -> Task: ...
    def set_task_status(
        self, task_id: str, status: str, *, error: str | None = None, ending: Ending | None = None
    ) -> Task: ...
    def list_tasks(
        self, *, status: str | None = None, source: str | None = None, limit: int = 50, offset: int = 0
    ) -> list[Task]: ...
    def task_steps(self, task_id: str, *, after_id: int = 0, limit: int = 500) -> list[tuple[int, int, Step]]: ...
    def claim_task(
        self,
        owner: str,
        *,
        lease_s: float,
        max_attempts: int,
        sources: tuple[str, ...] | None = None,
        exclude_sources: tuple[str, ...] = (),
    ) -> Lease | None: ...
    def renew_lease(self, lease: Lease, *, lease_s: float) -> Lease | None: ...
    def complete_task(
        self, lease: Lease, status: str, *, error: str | None = None, ending: Ending | None = None
    ) -> bool: ...
    def release_task(self, lease: Lease) -> bool: ...
    def expire_leases(self, *, except_owner_prefix: str) -> int: ...
    def abandon_lease(self, lease: Lease) -> bool: ...
    def abandon_leases(self, owner: str) -> list[str]: ...
    def interrupt_task(self, task_id: str, error: str) -> bool: ...
    def request_cancel(self, task_id: str) -> Task: ...
    def cancel_requested(self, task_id: str) -> bool: ...
    def queue_depth(self, *, excluding: tuple[str, ...] = ()) -> dict[str, int]: ...
    def close_interrupted_trajectories(self) -> int: ...


class TreeStore(Protocol):
    """The tree search's own: scaffolds, nodes and their evaluations (``evolver.tree``), as ``store.tree``:
    a part of its own, composed over the store's database (``memory.tree_records``)."""

    def put_scaffold(self, scaffold_hash: str, body: str) -> None: ...
    def get_scaffold(self, scaffold_hash: str) -> str: ...
    def add_node(
        self,
        scaffold_hash: str,
        *,
        parent_id: str | None = None,
        status: str = "proposed",
        diff: str = "",
        rationale: str = "",
        cost_usd: float = 0.0,
        tokens: int = 0,
        node_id: str | None = None,
    ) -> Node: ...
    def get_node(self, node_id: str) -> Node: ...
    def list_nodes(self) -> list[Node]: ...
    def set_node_status(self, node_id: str, status: str, *, reason: str | None = None) -> Node: ...
    def start_evaluation(
        self, node_id: str, task_ref: str, *, split: str = "train", task_for: Callable[[int], dict] | None = None
    ) -> Evaluation: ...
    def get_evaluation(self, evaluation_id: int) -> Evaluation: ...
    def running_evaluations(self) -> list[Evaluation]: ...
    def finish_evaluation(
        self, evaluation_id: int, *, success: bool, trajectory_id: str | None = None
    ) -> Evaluation: ...
    def abandon_evaluation(self, evaluation_id: int) -> Evaluation: ...
    def evaluation_counts(self, *, split: str | None = None) -> list[dict]: ...
    def evaluations_of(self, node_id: str) -> list[Evaluation]: ...
    def hook_effects(self, node_id: str) -> dict[str, dict[str, int]]: ...


class AttemptStore(AttemptRecords, Protocol):
    """An attempt's records as the agent writes them (``AttemptRecords``), whole trajectories imported,
    and the finished attempts the learners read (``store.attempts``, ``memory.attempts``)."""

    def finished_since(
        self, mark: tuple[float, str] | None, *, limit: int = 100
    ) -> list[tuple[Trajectory, bool | None]]: ...
    def finished_until(self, mark: tuple[float, str], *, limit: int = 100) -> list[str]: ...
    def learnable(self, trajectory_ids: list[str]) -> set[str]: ...
    def ingest(self, items: list[NewTrajectory], *, sync: bool = True) -> list[str]: ...
    def reflections(self, trajectory_ids: list[str]) -> dict[str, str]: ...


class InsightStore(Protocol):
    """The insights and their history (``store.insights``, ``memory.insight_log``)."""

    def add_insight(
        self, text: str, *, importance: int = 2, provenance: list | None = None, node_id: str | None = None
    ) -> Insight: ...
    def update_insight(
        self,
        insight_id: int,
        *,
        text: str | None = None,
        importance: int | None = None,
        status: str | None = None,
        provenance: list | None = None,
    ) -> Insight: ...
    def get_insight(self, insight_id: int) -> Insight: ...
    def list_insights(self, *, status: str | tuple[str, ...] | None = "active", limit: int = 100) -> list[Insight]: ...
    def apply_insight_changes(self, changes: list[dict], *, event_id: int | None = None) -> list[Insight]: ...
    def record_insight_changes(
        self,
        kind: str,
        what: str,
        changes: list[dict],
        *,
        why: str = "",
        evidence: list | None = None,
        cost_usd: float = 0.0,
        node_id: str | None = None,
        payload: dict | None = None,
        reverts: int | None = None,
    ) -> Event: ...
    def insight_history(self, insight_id: int) -> list[dict]: ...
    def insight_changes_of(self, event_id: int) -> list[dict]: ...


class ToolStore(Protocol):
    """The synthesized tools, their use and their changes (``store.tools``, ``memory.tool_log``)."""

    def add_tool(
        self,
        name: str,
        *,
        description: str,
        code_hash: str,
        origin: str,
        status: str = "active",
        version: int | None = None,
        node_id: str | None = None,
        event_id: int | None = None,
    ) -> ToolRecord: ...
    def set_tool_status(self, tool_id: int, status: str) -> ToolRecord: ...
    def record_tool_use(self, tool_id: int, *, ok: bool) -> ToolRecord: ...
    def get_tool(self, tool_id: int) -> ToolRecord: ...
    def list_tools(self, *, status: str | None = "active") -> list[ToolRecord]: ...
    def apply_tool_changes(
        self,
        kind: str,
        what: str,
        *,
        why: str,
        evidence: list | None = None,
        cost_usd: float = 0.0,
        node_id: str | None = None,
        payload: dict | None = None,
        new: NewTool | list[NewTool] | None = None,
        status: dict[int, str] | None = None,
        reverts: int | None = None,
        meta: dict[str, str] | None = None,
    ) -> Event: ...
    def active_tool(self, name: str) -> ToolRecord | None: ...
    def next_tool_version(self, name: str) -> int: ...
    def tool_events(self, tool_id: int) -> list[Event]: ...
    def recorded_calls(self, trajectory_ids: list[str], *, tool: str | None = None) -> list[RecordedCall]: ...


class ExposureStore(Protocol):
    """What attempts were shown, and the effects measured from it (``store.exposures``,
    ``memory.effects``)."""

    def record_exposures(self, trajectory_id: str, items: Mapping[str, Iterable[str]]) -> None: ...
    def record_measurements(self, kind: str, measured: Mapping[str, tuple[Effect, str | None]]) -> None: ...
    def verdicts(self, kind: str, items: Iterable[str]) -> dict[str, str]: ...
    def exposures_of(self, trajectory_id: str) -> dict[str, list[str]]: ...
    def effects(self, kind: str, since: dict[str, float], *, promotion: bool = False) -> dict[str, Effect]: ...


class RetrievalStore(Protocol):
    """Similarity queries over attempts, insights and tools (``store.retrieval``,
    ``memory.retrieval``)."""

    def search_trajectories(
        self, query: str, *, k: int = 5, filters: Filters | None = None, vector=None
    ) -> list[TrajectoryHit]: ...
    def search_insights(self, query: str, *, k: int = 5, vector=None, probation: bool = False) -> list[InsightHit]: ...
    def search_tools(self, query: str, *, k: int = 5, vector=None) -> list[ToolHit]: ...
    def context(
        self,
        query: str,
        *,
        trajectories: int = 3,
        insights: int = 5,
        tools: int = 5,
        successful_only: bool = True,
        probation: bool = False,
    ) -> Context: ...


class LearnedStore(Protocol):
    """What is learned and what it is learned from (``evolver.meta``): finished attempts, insights,
    synthesized tools, the effects their exposures measure, and retrieval over them; each a part of its
    own, composed over the store's database."""

    @property
    def attempts(self) -> AttemptStore: ...

    @property
    def insights(self) -> InsightStore: ...

    @property
    def tools(self) -> ToolStore: ...

    @property
    def exposures(self) -> ExposureStore: ...

    @property
    def retrieval(self) -> RetrievalStore: ...


class Reports(Protocol):
    """What the views read (the CLI, the API's inspection routes, the dashboard) and the history they show:
    ids, attempts and outcomes, spend and results over time, events; as ``store.reports``, a part
    of its own composed over the store's database (``memory.reports``)."""

    def resolve_id(self, short: str) -> tuple[str, str]: ...
    def short_ids(self, ids: list[str]) -> dict[str, str]: ...
    def trajectories_of(self, task_id: str) -> list[Trajectory]: ...
    def trajectory_counts(self, task_ids: list[str]) -> dict[str, int]: ...
    def last_trajectory(self, task_id: str) -> Trajectory | None: ...
    def last_verdict(self, task_id: str) -> tuple[str, bool | None] | None: ...
    def steps(self, trajectory_id: str, *, after_seq: int = 0, limit: int = 1000) -> list[Step]: ...
    def add_feedback(self, trajectory_id: str, *, good: bool, note: str = "") -> Outcome: ...
    def outcome(self, trajectory_id: str) -> Outcome | None: ...
    def spent_by_model(self, *, since: float = 0.0) -> dict[str, tuple[int, float]]: ...
    def task_results(self, *, since: float) -> dict[str, dict[str, int]]: ...
    def tool_calls(self, names: list[str]) -> dict[str, dict[str, int]]: ...
    def results_over_time(self, *, since: float, period_s: float) -> list[tuple[int, dict[str, dict[str, int]]]]: ...
    def learned_since(self, since: float) -> dict[str, int]: ...
    def append_event(
        self,
        kind: str,
        what: str,
        *,
        why: str = "",
        evidence: list | None = None,
        cost_usd: float = 0.0,
        node_id: str | None = None,
        payload: dict | None = None,
        reverts: int | None = None,
    ) -> Event: ...
    def get_event(self, event_id: int) -> Event: ...
    def list_events(self, *, kind: str | None = None, since: float = 0.0, limit: int = 100) -> list[Event]: ...


class ExperienceStore(LearnedStore, Protocol):
    """Every role, and the store's upkeep: what the daemon and the CLI, which own a store, hold."""

    @property
    def agent(self) -> AgentStore: ...

    @property
    def ledger(self) -> CallLedger: ...

    @property
    def reports(self) -> Reports: ...

    @property
    def inbox(self) -> InboxStore: ...

    @property
    def tree(self) -> TreeStore: ...

    embedder: Embedder
    index: VectorIndex | None  # None: keyword search only

    def transaction(self) -> AbstractContextManager[object]:
        """A block whose writes commit together or not at all (nested blocks join the outer one)."""
        ...

    def check(self) -> list[str]: ...
    def get_meta(self, key: str) -> str | None: ...
    def set_meta(self, key: str, value: str) -> None: ...
    def sync_index(self, *, progress: Callable[[int], None] | None = None) -> int: ...
    def reconcile(self) -> dict[str, int]: ...
    def reindex(self, *, progress: Callable[[int, int], None] | None = None) -> int: ...
    def close(self) -> None: ...
