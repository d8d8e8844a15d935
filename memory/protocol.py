"""The experience store as an interface: what the rest of the project may ask of a store.

``ExperienceStore`` is a protocol that the SQLite + Chroma ``Store`` keeps.
The engine depends on it, never on that class, so a server-database
implementation later is a new class that keeps the protocol, not a rewrite;
only ``evolver.storage`` names the class, to open one (a test checks both).
Each method means what ``Store``'s own docstring says.
"""

from __future__ import annotations

from typing import Callable, ContextManager, Protocol

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
    LedgerEntry,
    Node,
    Outcome,
    Step,
    Task,
    ToolHit,
    ToolRecord,
    Trajectory,
    TrajectoryHit,
)
from .search import Filters
from .store import NewTrajectory
from .tool_log import NewTool, RecordedCall

__all__ = ["ExperienceStore"]


class ExperienceStore(Protocol):
    embedder: Embedder
    index: VectorIndex | None  # None: keyword search only

    # --- the inbox: tasks, leases, cancellation ----------------------------------------------------------
    def add_task(
        self,
        prompt: str,
        *,
        check: dict | None = None,
        priority: int = 0,
        source: str = "inbox",
        metadata: dict | None = None,
        idempotency_key: str | None = None,
        status: str = "queued",
    ) -> tuple[Task, bool]: ...
    def add_tasks(self, items: list[dict]) -> list[tuple[Task, bool]]: ...
    def get_task(self, task_id: str) -> Task: ...
    def list_tasks(
        self, *, status: str | None = None, source: str | None = None, limit: int = 50, offset: int = 0
    ) -> list[Task]: ...
    def set_task_status(
        self, task_id: str, status: str, *, error: str | None = None, ending: Ending | None = None
    ) -> Task: ...
    def task_steps(self, task_id: str, *, after_id: int = 0, limit: int = 500) -> list[tuple[int, int, Step]]: ...
    def claim_task(
        self, owner: str, *, lease_s: float, max_attempts: int, sources: tuple[str, ...] | None = None
    ) -> Lease | None: ...
    def renew_lease(self, lease: Lease, *, lease_s: float) -> Lease | None: ...
    def complete_task(
        self, lease: Lease, status: str, *, error: str | None = None, ending: Ending | None = None
    ) -> bool: ...
    def release_task(self, lease: Lease) -> bool: ...
    def expire_leases(self, *, except_owner_prefix: str) -> int: ...
    def request_cancel(self, task_id: str) -> Task: ...
    def cancel_requested(self, task_id: str) -> bool: ...
    def queue_depth(self, *, excluding: tuple[str, ...] = ()) -> dict[str, int]: ...

    # --- attempts: trajectories, steps, outcomes ---------------------------------------------------------
    def start_trajectory(self, task_id: str, *, node_id: str | None = None, attempt: int = 1) -> Trajectory: ...
    def add_step(
        self,
        trajectory_id: str,
        *,
        role: str,
        content: str,
        tool_calls: list | None = None,
        tool_results: list | None = None,
        tokens_in: int = 0,
        tokens_out: int = 0,
        cost_usd: float = 0.0,
        duration_ms: float = 0.0,
    ) -> Step: ...
    def finish_trajectory(
        self, trajectory_id: str, *, status: str, final_answer: str | None = None
    ) -> Trajectory: ...
    def close_interrupted_trajectories(self) -> int: ...
    def get_trajectory(self, trajectory_id: str) -> Trajectory: ...
    def trajectories_of(self, task_id: str) -> list[Trajectory]: ...
    def trajectory_counts(self, task_ids: list[str]) -> dict[str, int]: ...
    def last_trajectory(self, task_id: str) -> Trajectory | None: ...
    def last_verdict(self, task_id: str) -> tuple[str, bool | None] | None: ...
    def steps(self, trajectory_id: str, *, after_seq: int = 0, limit: int = 1000) -> list[Step]: ...
    def record_outcome(
        self,
        trajectory_id: str,
        *,
        success: bool | None,
        score: float | None = None,
        verifier: str | None = None,
        verifier_output: str | None = None,
    ) -> Outcome: ...
    def add_feedback(self, trajectory_id: str, *, good: bool, note: str = "") -> Outcome: ...
    def outcome(self, trajectory_id: str) -> Outcome | None: ...
    def ingest(self, items: list[NewTrajectory], *, sync: bool = True) -> list[str]: ...
    def reflections(self, trajectory_ids: list[str]) -> dict[str, str]: ...
    def finished_since(
        self, mark: tuple[float, str] | None, *, limit: int = 100
    ) -> list[tuple[Trajectory, bool | None]]: ...
    def finished_until(self, mark: tuple[float, str], *, limit: int = 100) -> list[str]: ...
    def learnable(self, trajectory_ids: list[str]) -> set[str]: ...

    # --- retrieval ---------------------------------------------------------------------------------------
    def context(
        self, query: str, *, trajectories: int = 3, insights: int = 5, tools: int = 5, successful_only: bool = True
    ) -> Context: ...
    def search_trajectories(
        self, query: str, *, k: int = 5, filters: Filters | None = None, vector=None
    ) -> list[TrajectoryHit]: ...
    def search_insights(self, query: str, *, k: int = 5, vector=None) -> list[InsightHit]: ...
    def search_tools(self, query: str, *, k: int = 5, vector=None) -> list[ToolHit]: ...

    # --- insights ----------------------------------------------------------------------------------------
    def add_insight(
        self, text: str, *, importance: int = 2, provenance: list | None = None, node_id: str | None = None
    ) -> Insight: ...
    def list_insights(self, *, status: str | None = "active", limit: int = 100) -> list[Insight]: ...
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
    def insight_changes_of(self, event_id: int) -> list[dict]: ...
    def insight_history(self, insight_id: int) -> list[dict]: ...

    # --- synthesized tools -------------------------------------------------------------------------------
    def active_tool(self, name: str) -> ToolRecord | None: ...
    def get_tool(self, tool_id: int) -> ToolRecord: ...
    def list_tools(self, *, status: str | None = "active") -> list[ToolRecord]: ...
    def next_tool_version(self, name: str) -> int: ...
    def record_tool_use(self, tool_id: int, *, ok: bool) -> ToolRecord: ...
    def recorded_calls(self, trajectory_ids: list[str], *, tool: str | None = None) -> list[RecordedCall]: ...
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
        new: NewTool | None = None,
        status: dict[int, str] | None = None,
        reverts: int | None = None,
        meta: dict[str, str] | None = None,
    ) -> Event: ...

    # --- the tree: scaffolds, nodes, evaluations ---------------------------------------------------------
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
        self, node_id: str, task_ref: str, *, split: str = "train", task: dict | None = None
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

    # --- the ledger, events and settings -----------------------------------------------------------------
    def record_call(
        self,
        *,
        model: str,
        purpose: str,
        tokens_in: int,
        tokens_out: int,
        cost_usd: float,
        latency_ms: float,
        task_id: str | None = None,
        node_id: str | None = None,
    ) -> LedgerEntry: ...
    def spent(
        self, *, since: float = 0.0, purpose: str | tuple[str, ...] | None = None, task_id: str | None = None
    ) -> tuple[int, float]: ...
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
    def get_meta(self, key: str) -> str | None: ...
    def set_meta(self, key: str, value: str) -> None: ...

    # --- upkeep ------------------------------------------------------------------------------------------
    def transaction(self) -> ContextManager[object]:
        """A block whose writes commit together or not at all (nested blocks join the outer one)."""
        ...

    def check(self) -> list[str]: ...
    def reconcile(self) -> dict[str, int]: ...
    def reindex(self, *, progress: Callable[[int, int], None] | None = None) -> int: ...
    def close(self) -> None: ...
