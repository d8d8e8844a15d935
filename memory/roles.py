"""What an agent asks of the experience store: the store's agent-facing role.

``AgentStore`` is exactly what an agent's run of a task uses (``evolver.agent``: retrieval, its attempt
and steps, the outcome, the tools it may call, exposures, the ledger of its model calls), and exactly
what a Ray node's ``RecordingStore`` implements. The agent package imports this role and the records,
never the store (an import-linter contract in pyproject.toml holds it); the store answers it as
``store.agent``. ``CallLedger`` is the part of it a model client needs (``store.ledger``: its calls
charged, what was spent). ``ExperienceStore`` (``memory.protocol``) is these roles and the others together.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from .records import Context, Ending, LedgerEntry, Outcome, Step, Task, ToolRecord, Trajectory

__all__ = ["AgentStore", "AttemptRecords", "CallLedger"]


class CallLedger(Protocol):
    """The ledger of model calls (``store.ledger``): what a model client charges each call to, and what the
    budget's caps read."""

    def spent(
        self, *, since: float = 0.0, purpose: str | tuple[str, ...] | None = None, task_id: str | None = None
    ) -> tuple[int, float]: ...
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


class AttemptRecords(Protocol):
    """An attempt as the agent writes it (started, its steps, ended, judged) and reads it back: part of the
    agent's role, and of ``store.attempts`` (``AttemptStore``), which keeps it."""

    def get_trajectory(self, trajectory_id: str) -> Trajectory: ...
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
    def finish_trajectory(self, trajectory_id: str, *, status: str, final_answer: str | None = None) -> Trajectory: ...
    def record_outcome(
        self,
        trajectory_id: str,
        *,
        success: bool | None,
        score: float | None = None,
        verifier: str | None = None,
        verifier_output: str | None = None,
    ) -> Outcome: ...


class AgentStore(CallLedger, AttemptRecords, Protocol):
    """What an agent's run of a task asks (see the module), as ``store.agent``; its model calls go to the
    ledger it extends, and its attempt to the attempt's records."""

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
    def list_tools(self, *, status: str | None = "active") -> list[ToolRecord]: ...
    def get_tool(self, tool_id: int) -> ToolRecord: ...
    def record_exposures(self, trajectory_id: str, items: Mapping[str, Iterable[str]]) -> None: ...
    def record_tool_use(self, tool_id: int, *, ok: bool) -> ToolRecord: ...
    def set_task_status(
        self, task_id: str, status: str, *, error: str | None = None, ending: Ending | None = None
    ) -> Task: ...
