"""A store that records: what an agent writes, kept in order for the store's owner to replay.

Why it exists: an evaluation shipped to another machine (a Ray node, see
``evolver/service/ray_evaluator.py``) runs the same ``Engine`` and ``Agent`` as
the daemon's own workers, but the daemon stays the single writer of its store
(SQLite and the index). The agent there is handed a ``RecordingStore``: what
it reads comes from a ``Snapshot`` the daemon took when it shipped the task
(the retrieval context the agent will ask for, the ledger's totals the budget
checks, the active synthesized tools), and what it writes (trajectories,
steps, exposures, outcomes, ledger rows, tool use) is kept as a list of plain
``Write``s. When the result comes back the daemon ``replay``s them into its
store, in one transaction with the task's completion, and the ids the node
made up become the store's own.

Only what the agent's parts ask of a store while they run one task is here
(the loop, the model client, the budget guard, the toolbox); anything else is
an ``AttributeError``, so a new call on the store shows up as a failing test,
not as a silently dropped write.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from memory.errors import NotFound
from memory.records import Context, LedgerEntry, Outcome, Step, Task, ToolRecord, Trajectory
from memory.roles import AgentStore

__all__ = ["RecordingStore", "ReplayError", "Snapshot", "Write", "replay", "spent_key"]

# The writes a recording may hold, and so the only store methods a replay ever calls.
REPLAYED = (
    "start_trajectory",
    "record_exposures",
    "add_step",
    "finish_trajectory",
    "record_outcome",
    "record_call",
    "record_tool_use",
)


class ReplayError(ValueError):
    """A recording that cannot be replayed (a write it may not hold, an attempt it never started)."""


def spent_key(purpose: str | tuple[str, ...] | None, task_id: str | None) -> tuple:
    """How a ``spent`` query is found in a snapshot: by what it counts (the time it counts from is the
    day's start, or 0 for a task, in every query the budget makes)."""
    purposes = None if purpose is None else ((purpose,) if isinstance(purpose, str) else tuple(sorted(purpose)))
    return purposes, task_id


@dataclass(frozen=True)
class Snapshot:
    """What the agent reads, taken by the store's owner when it ships the task."""

    context: Context  # the store's answer to the agent's one ``context`` query
    spent: dict[tuple, tuple[int, float]] = field(default_factory=dict)  # spent_key -> (tokens, usd)
    tools: list[ToolRecord] = field(default_factory=list)  # the active synthesized tools


@dataclass(frozen=True)
class Write:
    """One write the agent made: the store method, its keyword arguments, and (for a trajectory it
    started) the id it was given here."""

    method: str
    kwargs: dict
    made_id: str | None = None


class RecordingStore:
    """Reads from a ``Snapshot``; keeps every write as a ``Write``, in order, in ``writes``."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.writes: list[Write] = []
        self._trajectories: dict[str, Trajectory] = {}
        self._seq: dict[str, int] = {}
        self._calls: list[LedgerEntry] = []
        self._tools = {t.id: t for t in snapshot.tools}

    def _note(self, method: str, made_id: str | None = None, **kwargs) -> None:
        self.writes.append(Write(method, kwargs, made_id))

    # --- reads ----------------------------------------------------------------------------------------

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
        return self.snapshot.context  # taken by the daemon with the same query (``ray_evaluator.ship``)

    def spent(
        self, *, since: float = 0.0, purpose: str | tuple[str, ...] | None = None, task_id: str | None = None
    ) -> tuple[int, float]:
        """What the snapshot says was spent, plus the calls made here since it was taken."""
        tokens, usd = self.snapshot.spent.get(spent_key(purpose, task_id), (0, 0.0))
        purposes = spent_key(purpose, None)[0]
        for call in self._calls:
            if (
                call.at >= since
                and (purposes is None or call.purpose in purposes)
                and (task_id is None or call.task_id == task_id)
            ):
                tokens, usd = tokens + call.tokens_in + call.tokens_out, usd + call.cost_usd
        return tokens, usd

    def get_trajectory(self, trajectory_id: str) -> Trajectory:
        try:
            return self._trajectories[trajectory_id]
        except KeyError:
            raise NotFound(f"No trajectory with id {trajectory_id!r}.") from None

    def list_tools(self, *, status: str | None = "active") -> list[ToolRecord]:
        return [t for t in self._tools.values() if status is None or t.status == status]

    def get_tool(self, tool_id: int) -> ToolRecord:
        try:
            return self._tools[tool_id]
        except KeyError:
            raise NotFound(f"No tool with id {tool_id!r}.") from None

    # --- writes ---------------------------------------------------------------------------------------

    def start_trajectory(self, task_id: str, *, node_id: str | None = None, attempt: int = 1) -> Trajectory:
        made = f"recorded-{len(self._trajectories) + 1}"
        self._note("start_trajectory", made, task_id=task_id, node_id=node_id, attempt=attempt)
        trajectory = Trajectory(
            id=made,
            task_id=task_id,
            prompt="",
            status="running",
            started_at=time.time(),
            node_id=node_id,
            attempt=attempt,
        )
        self._trajectories[made] = trajectory
        return trajectory

    def record_exposures(self, trajectory_id: str, items: Mapping[str, Iterable[str]]) -> None:
        self.get_trajectory(trajectory_id)
        self._note(
            "record_exposures",
            trajectory_id=trajectory_id,
            items={kind: [str(i) for i in names] for kind, names in items.items()},
        )

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
        trajectory = self.get_trajectory(trajectory_id)
        seq = self._seq[trajectory_id] = self._seq.get(trajectory_id, 0) + 1
        kwargs: dict[str, Any] = {
            "role": role,
            "content": content,
            "tool_calls": tool_calls,
            "tool_results": tool_results,
            "tokens_in": tokens_in,
            "tokens_out": tokens_out,
            "cost_usd": cost_usd,
            "duration_ms": duration_ms,
        }
        self._note("add_step", trajectory_id=trajectory_id, **kwargs)
        self._trajectories[trajectory_id] = replace(
            trajectory,
            tokens_in=trajectory.tokens_in + tokens_in,
            tokens_out=trajectory.tokens_out + tokens_out,
            cost_usd=trajectory.cost_usd + cost_usd,
        )
        return Step(trajectory_id=trajectory_id, seq=seq, created_at=time.time(), **kwargs)

    def finish_trajectory(self, trajectory_id: str, *, status: str, final_answer: str | None = None) -> Trajectory:
        trajectory = self.get_trajectory(trajectory_id)
        self._note("finish_trajectory", trajectory_id=trajectory_id, status=status, final_answer=final_answer)
        self._trajectories[trajectory_id] = replace(
            trajectory, status=status, final_answer=final_answer, finished_at=time.time()
        )
        return self._trajectories[trajectory_id]

    def record_outcome(
        self,
        trajectory_id: str,
        *,
        success: bool | None,
        score: float | None = None,
        verifier: str | None = None,
        verifier_output: str | None = None,
    ) -> Outcome:
        self.get_trajectory(trajectory_id)
        self._note(
            "record_outcome",
            trajectory_id=trajectory_id,
            success=success,
            score=score,
            verifier=verifier,
            verifier_output=verifier_output,
        )
        return Outcome(
            trajectory_id=trajectory_id,
            success=success,
            decided_at=time.time(),
            score=score,
            verifier=verifier,
            verifier_output=verifier_output,
        )

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
        kwargs: dict[str, Any] = {
            "model": model,
            "purpose": purpose,
            "tokens_in": tokens_in,
            "tokens_out": tokens_out,
            "cost_usd": cost_usd,
            "latency_ms": latency_ms,
            "task_id": task_id,
            "node_id": node_id,
        }
        self._note("record_call", **kwargs)
        entry = LedgerEntry(id=len(self._calls) + 1, at=time.time(), **kwargs)
        self._calls.append(entry)
        return entry

    def record_tool_use(self, tool_id: int, *, ok: bool) -> ToolRecord:
        tool = self.get_tool(tool_id)
        self._note("record_tool_use", tool_id=tool_id, ok=ok)
        self._tools[tool_id] = replace(
            tool, uses=tool.uses + 1, successes=tool.successes + int(ok), failures=tool.failures + int(not ok)
        )
        return self._tools[tool_id]

    def set_task_status(self, task_id: str, status: str, *, error=None, ending=None) -> Task:
        """Refused: a task's status is its lease holder's, the daemon, which records how the shipped task
        ended (the node runs it with ``record_status=False``)."""
        raise ReplayError("a Ray node never records a task's status; its lease holder does")


def replay(
    store: AgentStore, writes: list[Write], *, task_id: str, tool_use: Callable[[int, bool], object] | None = None
) -> dict[str, str]:
    """Write a recording into ``store``, in order; returns the ids the recording made -> the store's ids.

    Call it inside ``store.transaction()`` (with the task's completion) so a recording is all in the
    store or none of it. Only the writes in ``REPLAYED`` are made, each about ``task_id`` (the task that
    was shipped): a recording that holds anything else raises ``ReplayError``. ``tool_use`` counts one
    call of a synthesized tool (default: ``store.record_tool_use``; the daemon passes its toolbox's, which
    also retires a tool that keeps failing)."""
    ids: dict[str, str] = {}
    for write in writes:
        if write.method not in REPLAYED:
            raise ReplayError(f"a recording may not hold {write.method!r}")
        kwargs = dict(write.kwargs)
        if kwargs.get("task_id") not in (None, task_id):
            raise ReplayError(f"a recording of task {task_id} writes about task {kwargs['task_id']}")
        if "trajectory_id" in kwargs:
            if kwargs["trajectory_id"] not in ids:
                raise ReplayError(f"{write.method} names an attempt the recording never started")
            kwargs["trajectory_id"] = ids[kwargs["trajectory_id"]]
        if write.method == "start_trajectory":
            if not write.made_id:
                raise ReplayError("a recorded start_trajectory carries no id")
            ids[write.made_id] = store.start_trajectory(**kwargs).id
        elif write.method == "record_tool_use":
            (tool_use or (lambda tool_id, ok: store.record_tool_use(tool_id, ok=ok)))(kwargs["tool_id"], kwargs["ok"])
        else:
            trajectory_id = kwargs.pop("trajectory_id", None)
            method = getattr(store, write.method)
            method(trajectory_id, **kwargs) if trajectory_id is not None else method(**kwargs)
    return ids
