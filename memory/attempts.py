"""An attempt's records: its trajectory, steps and outcome as the agent writes them, whole trajectories
imported at once, and the finished attempts the learners read (only learnable ones: ``learnable_sql``).

As ``store.attempts``, a part composed over the store's database. It is handed the inbox (an attempt is
of a task), the reports (an outcome is read back as they read it) and the index's sync: an attempt enters
the index when it ends, and its outcome with it.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from .database import Database, json_text, required
from .errors import NotFound
from .ids import new_id
from .records import Outcome, Step, Task, TaskKind, Trajectory
from .search import learnable_sql

__all__ = ["Attempts", "NewTrajectory"]


@dataclass
class NewTrajectory:
    """A whole finished trajectory to import at once (benchmarks, imports, replays)."""

    prompt: str
    final_answer: str | None = None
    success: bool | None = None
    node_id: str | None = None
    steps: list[dict] = field(default_factory=list)
    started_at: float | None = None
    check: dict | None = None
    source: TaskKind | str = TaskKind.IMPORT
    status: str = "finished"
    """How the attempt ended: finished (with an answer), step_limit, repeating, ..."""
    verifier_output: str | None = None


class _Inbox(Protocol):
    def get_task(self, task_id: str) -> Task: ...


class _Reports(Protocol):
    def outcome(self, trajectory_id: str) -> Outcome | None: ...


class Attempts:
    """The attempts' records (see the module)."""

    def __init__(
        self, database: Database, *, inbox: _Inbox, reports: _Reports, sync_index: Callable[[], object]
    ) -> None:
        self.database = database
        self._inbox = inbox
        self._reports = reports
        self._sync_index = sync_index

    def start_trajectory(self, task_id: str, *, node_id: str | None = None, attempt: int = 1) -> Trajectory:
        task = self._inbox.get_task(task_id)
        trajectory_id = new_id("traj")
        with self.database.write() as db:
            db.execute(
                "INSERT INTO trajectories (id, task_id, node_id, prompt, status, attempt, started_at) "
                "VALUES (?,?,?,?,?,?,?)",
                [trajectory_id, task.id, node_id, task.prompt, "running", attempt, time.time()],
            )
        return self.get_trajectory(trajectory_id)

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
        """Append one step durably; its sequence number follows the last one."""
        now = time.time()
        with self.database.write() as db:
            seq = db.execute(
                "SELECT coalesce(max(seq), 0) + 1 FROM steps WHERE trajectory_id = ?", [trajectory_id]
            ).fetchone()[0]
            try:
                db.execute(
                    """INSERT INTO steps (trajectory_id, seq, role, content, tool_calls, tool_results,
                       tokens_in, tokens_out, cost_usd, duration_ms, created_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)""",
                    [
                        trajectory_id,
                        seq,
                        role,
                        content,
                        json_text(tool_calls),
                        json_text(tool_results),
                        tokens_in,
                        tokens_out,
                        cost_usd,
                        duration_ms,
                        now,
                    ],
                )
            except sqlite3.IntegrityError as exc:
                if "FOREIGN KEY" not in str(exc):
                    raise  # say, a missing content: not a missing trajectory
                raise NotFound(f"No trajectory with id {trajectory_id!r}.") from exc
            db.execute(
                "UPDATE trajectories SET tokens_in = tokens_in + ?, tokens_out = tokens_out + ?, "
                "cost_usd = cost_usd + ? WHERE id = ?",
                [tokens_in, tokens_out, cost_usd, trajectory_id],
            )
        return Step(
            trajectory_id=trajectory_id,
            seq=seq,
            role=role,
            content=content,
            created_at=now,
            tool_calls=tool_calls,
            tool_results=tool_results,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            cost_usd=cost_usd,
            duration_ms=duration_ms,
        )

    def finish_trajectory(self, trajectory_id: str, *, status: str, final_answer: str | None = None) -> Trajectory:
        with self.database.write() as db:
            cursor = db.execute(
                "UPDATE trajectories SET status = ?, final_answer = ?, finished_at = ? WHERE id = ?",
                [status, final_answer, time.time(), trajectory_id],
            )
            if cursor.rowcount == 0:
                raise NotFound(f"No trajectory with id {trajectory_id!r}.")
        self._sync_index()
        return self.get_trajectory(trajectory_id)

    def get_trajectory(self, trajectory_id: str) -> Trajectory:
        row = self.database.one("SELECT * FROM trajectories WHERE id = ?", [trajectory_id])
        return Trajectory.from_row(required(row, "trajectory", trajectory_id))

    def finished_since(
        self, mark: tuple[float, str] | None, *, limit: int = 100
    ) -> list[tuple[Trajectory, bool | None]]:
        """Trajectories finished after ``mark`` (finished_at, id), oldest first, with their success.

        A background job keeps the last one it processed as its watermark, so it
        neither repeats nor skips work across restarts. Only learnable attempts
        (``memory.search.learnable_sql``): nothing learned (insights, tools, which
        the proposer sees) may come from the split that judges promotions.
        """
        at, last_id = mark or (0.0, "")
        rows = self.database.all(
            "SELECT t.*, o.success AS outcome_success FROM trajectories t "
            "LEFT JOIN outcomes o ON o.trajectory_id = t.id "
            "WHERE t.finished_at IS NOT NULL AND (t.finished_at > ? OR (t.finished_at = ? AND t.id > ?)) "
            f"AND {learnable_sql('t')} ORDER BY t.finished_at, t.id LIMIT ?",
            [at, at, last_id, limit],
        )
        out = []
        for row in rows:
            success = row.pop("outcome_success")
            out.append((Trajectory.from_row(row), None if success is None else bool(success)))
        return out

    def finished_until(self, mark: tuple[float, str], *, limit: int = 100) -> list[str]:
        """Ids of the learnable trajectories finished at or before ``mark``, newest first (a job's
        look back; see ``finished_since``)."""
        at, last_id = mark
        rows = self.database.all(
            "SELECT t.id FROM trajectories t WHERE t.finished_at IS NOT NULL "
            "AND (t.finished_at < ? OR (t.finished_at = ? AND t.id <= ?)) "
            f"AND {learnable_sql('t')} ORDER BY t.finished_at DESC, t.id DESC LIMIT ?",
            [at, at, last_id, limit],
        )
        return [r["id"] for r in rows]

    def learnable(self, trajectory_ids: list[str]) -> set[str]:
        """Those of ``trajectory_ids`` a learner may see (``memory.search.learnable_sql``)."""
        rows = self.database.all_in(
            f"SELECT t.id FROM trajectories t WHERE t.id IN ({{marks}}) AND {learnable_sql('t')}", trajectory_ids
        )
        return {r["id"] for r in rows}

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
        with self.database.write() as db:
            db.execute(
                """INSERT INTO outcomes (trajectory_id, success, score, verifier, verifier_output, decided_at)
                   VALUES (?,?,?,?,?,?)
                   ON CONFLICT (trajectory_id) DO UPDATE SET success = excluded.success, score = excluded.score,
                   verifier = excluded.verifier, verifier_output = excluded.verifier_output,
                   decided_at = excluded.decided_at""",
                [
                    trajectory_id,
                    None if success is None else int(success),
                    score,
                    verifier,
                    verifier_output,
                    time.time(),
                ],
            )
        self._sync_index()
        outcome = self._reports.outcome(trajectory_id)
        assert outcome is not None  # written above
        return outcome

    def ingest(self, items: list[NewTrajectory], *, sync: bool = True) -> list[str]:
        """Import whole trajectories in one transaction (task, steps, outcome); returns their ids."""
        ids: list[str] = []
        now = time.time()
        with self.database.write() as db:
            for item in items:
                if not item.prompt.strip():
                    raise ValueError("A trajectory needs a non-empty prompt.")
                source = TaskKind.of(item.source).value
                task_id, trajectory_id = new_id("task"), new_id("traj")
                started = now if item.started_at is None else item.started_at
                db.execute(
                    """INSERT INTO tasks (id, prompt, "check", status, source, metadata, created_at, updated_at,
                                          finished_at)
                       VALUES (?,?,?,?,?,?,?,?,?)""",
                    [task_id, item.prompt, json_text(item.check), "done", source, "{}", started, started, started],
                )
                # A step's accounting is kept as add_step keeps it, and summed on the trajectory.
                totals = [
                    sum(step.get(key) or 0 for step in item.steps) for key in ("tokens_in", "tokens_out", "cost_usd")
                ]
                db.execute(
                    """INSERT INTO trajectories (id, task_id, node_id, prompt, status, final_answer, started_at,
                                                 finished_at,
                       tokens_in, tokens_out, cost_usd) VALUES (?,?,?,?,?,?,?,?,?,?,?)""",
                    [
                        trajectory_id,
                        task_id,
                        item.node_id,
                        item.prompt,
                        item.status,
                        item.final_answer,
                        started,
                        started,
                        *totals,
                    ],
                )
                for seq, step in enumerate(item.steps, start=1):
                    db.execute(
                        """INSERT INTO steps (trajectory_id, seq, role, content, tool_calls, tool_results,
                           tokens_in, tokens_out, cost_usd, duration_ms, created_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)""",
                        [
                            trajectory_id,
                            seq,
                            step.get("role", "assistant"),
                            step.get("content", ""),
                            json_text(step.get("tool_calls")),
                            json_text(step.get("tool_results")),
                            step.get("tokens_in") or 0,
                            step.get("tokens_out") or 0,
                            step.get("cost_usd") or 0.0,
                            step.get("duration_ms") or 0.0,
                            started,
                        ],
                    )
                if item.success is not None:
                    db.execute(
                        "INSERT INTO outcomes (trajectory_id, success, decided_at, verifier_output) VALUES (?,?,?,?)",
                        [trajectory_id, int(item.success), started, item.verifier_output],
                    )
                ids.append(trajectory_id)
        if sync:
            self._sync_index()
        return ids

    def reflections(self, trajectory_ids: list[str]) -> dict[str, str]:
        """The reflection written after each of these trajectories failed, by trajectory id."""
        if not trajectory_ids:
            return {}
        marks = ",".join("?" * len(trajectory_ids))
        rows = self.database.all(
            f"SELECT trajectory_id, content FROM steps WHERE role = 'reflection' "
            f"AND trajectory_id IN ({marks}) ORDER BY seq",
            list(trajectory_ids),
        )
        return {r["trajectory_id"]: r["content"] for r in rows}
