"""The agent's side of the store (``store.agent``): the ``AgentStore`` role, over the parts that keep it.

An agent's run of a task asks for its retrieval context, writes its attempt, steps and outcome, counts
the synthesized tools it calls, notes what it was shown, and charges its model calls to the ledger; a
Ray node's ``RecordingStore`` keeps the same role by recording those writes. Each method is the part's
own (its docstring says what it does); this class only says which part answers it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .attempts import Attempts
from .effects import Exposures
from .inbox import Inbox
from .ledger import Ledger
from .records import Context, Ending, LedgerEntry, Outcome, Step, Task, ToolRecord, Trajectory
from .retrieval import Retrieval
from .tool_log import ToolLog

__all__ = ["AgentRecords"]


class AgentRecords:
    """What an agent asks of the store (``memory.roles.AgentStore``), answered by the store's parts."""

    def __init__(
        self,
        *,
        retrieval: Retrieval,
        ledger: Ledger,
        attempts: Attempts,
        tools: ToolLog,
        exposures: Exposures,
        inbox: Inbox,
    ) -> None:
        self._retrieval = retrieval
        self._ledger = ledger
        self._attempts = attempts
        self._tools = tools
        self._exposures = exposures
        self._inbox = inbox

    def context(
        self,
        query: str,
        *,
        trajectories: int = 3,
        insights: int = 5,
        tools: int = 5,
        successful_only: bool = True,
        probation: bool = False,
    ) -> Context:
        return self._retrieval.context(
            query,
            trajectories=trajectories,
            insights=insights,
            tools=tools,
            successful_only=successful_only,
            probation=probation,
        )

    def spent(
        self, *, since: float = 0.0, purpose: str | tuple[str, ...] | None = None, task_id: str | None = None
    ) -> tuple[int, float]:
        return self._ledger.spent(since=since, purpose=purpose, task_id=task_id)

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
    ) -> LedgerEntry:
        return self._ledger.record_call(
            model=model,
            purpose=purpose,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            cost_usd=cost_usd,
            latency_ms=latency_ms,
            task_id=task_id,
            node_id=node_id,
        )

    def get_trajectory(self, trajectory_id: str) -> Trajectory:
        return self._attempts.get_trajectory(trajectory_id)

    def list_tools(self, *, status: str | None = "active") -> list[ToolRecord]:
        return self._tools.list_tools(status=status)

    def get_tool(self, tool_id: int) -> ToolRecord:
        return self._tools.get_tool(tool_id)

    def start_trajectory(self, task_id: str, *, node_id: str | None = None, attempt: int = 1) -> Trajectory:
        return self._attempts.start_trajectory(task_id, node_id=node_id, attempt=attempt)

    def record_exposures(self, trajectory_id: str, items: Mapping[str, Iterable[str]]) -> None:
        self._exposures.record_exposures(trajectory_id, items)

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
    ) -> Step:
        return self._attempts.add_step(
            trajectory_id,
            role=role,
            content=content,
            tool_calls=tool_calls,
            tool_results=tool_results,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            cost_usd=cost_usd,
            duration_ms=duration_ms,
        )

    def finish_trajectory(self, trajectory_id: str, *, status: str, final_answer: str | None = None) -> Trajectory:
        return self._attempts.finish_trajectory(trajectory_id, status=status, final_answer=final_answer)

    def record_outcome(
        self,
        trajectory_id: str,
        *,
        success: bool | None,
        score: float | None = None,
        verifier: str | None = None,
        verifier_output: str | None = None,
    ) -> Outcome:
        return self._attempts.record_outcome(
            trajectory_id, success=success, score=score, verifier=verifier, verifier_output=verifier_output
        )

    def record_tool_use(self, tool_id: int, *, ok: bool) -> ToolRecord:
        return self._tools.record_tool_use(tool_id, ok=ok)

    def set_task_status(
        self, task_id: str, status: str, *, error: str | None = None, ending: Ending | None = None
    ) -> Task:
        return self._inbox.set_task_status(task_id, status, error=error, ending=ending)
