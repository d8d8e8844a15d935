"""The tree search's own records: scaffold snapshots by content hash, the nodes of the tree, and their
evaluations (the ``TreeStore`` role, ``store.tree``).

The store keeps scaffolds as opaque text: what a scaffold means is the engine's business; the store only
guarantees a node's exact snapshot can be read back. What an evaluation's task says is the tree's to
decide too (``evolver.tree``): ``start_evaluation`` is handed it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from .database import Database, required
from .errors import NotFound
from .ids import new_id
from .records import Evaluation, Node, Task

__all__ = ["TreeRecords"]


class _Inbox(Protocol):
    """What an evaluation asks of the inbox: its task, queued in the evaluation's own transaction."""

    def add_tasks(self, items: list[dict]) -> list[tuple[Task, bool]]: ...


class TreeRecords:
    """Scaffolds, nodes and evaluations, over the store's database."""

    def __init__(self, database: Database, *, inbox: _Inbox) -> None:
        self.database = database
        self._inbox = inbox

    def put_scaffold(self, scaffold_hash: str, body: str) -> None:
        """Keep a snapshot; storing the same hash again changes nothing."""
        with self.database.write() as db:
            db.execute(
                "INSERT OR IGNORE INTO scaffolds (hash, body, created_at) VALUES (?,?,?)",
                [scaffold_hash, body, time.time()],
            )

    def get_scaffold(self, scaffold_hash: str) -> str:
        row = self.database.one("SELECT body FROM scaffolds WHERE hash = ?", [scaffold_hash])
        if row is None:
            raise NotFound(f"No scaffold with hash {scaffold_hash!r}.")
        return row["body"]

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
    ) -> Node:
        node_id = node_id or new_id("node")
        with self.database.write() as db:
            db.execute(
                """INSERT INTO nodes (id, parent_id, scaffold_hash, status, diff, rationale, cost_usd, tokens,
                                      created_at)
                   VALUES (?,?,?,?,?,?,?,?,?)""",
                [node_id, parent_id, scaffold_hash, status, diff, rationale, cost_usd, tokens, time.time()],
            )
        return self.get_node(node_id)

    def set_node_status(self, node_id: str, status: str, *, reason: str | None = None) -> Node:
        with self.database.write() as db:
            cursor = db.execute(
                "UPDATE nodes SET status = ?, reason = coalesce(?, reason) WHERE id = ?", [status, reason, node_id]
            )
            if cursor.rowcount == 0:
                raise NotFound(f"No node with id {node_id!r}.")
        return self.get_node(node_id)

    def get_node(self, node_id: str) -> Node:
        return Node.from_row(
            required(self.database.one("SELECT * FROM nodes WHERE id = ?", [node_id]), "node", node_id)
        )

    def list_nodes(self) -> list[Node]:
        return [Node.from_row(r) for r in self.database.all("SELECT * FROM nodes ORDER BY created_at, id")]

    def start_evaluation(
        self,
        node_id: str,
        task_ref: str,
        *,
        split: str = "train",
        task_for: Callable[[int], dict] | None = None,
    ) -> Evaluation:
        """Record an evaluation in flight; with ``task_for`` also queue the inbox task that runs it, in the
        same transaction, so neither exists without the other: ``task_for(evaluation_id)`` gives its
        ``add_task`` arguments (what the task says is the tree's to decide, ``evolver.tree``)."""
        with self.database.write() as db:
            cursor = db.execute(
                "INSERT INTO evaluations (node_id, task_ref, split, status, started_at) VALUES (?,?,?,?,?)",
                [node_id, task_ref, split, "running", time.time()],
            )
            evaluation_id = cursor.lastrowid
            assert evaluation_id is not None  # an INSERT just ran
            if task_for is not None:
                ((queued, _),) = self._inbox.add_tasks([task_for(evaluation_id)])
                db.execute("UPDATE evaluations SET task_id = ? WHERE id = ?", [queued.id, evaluation_id])
        return self.get_evaluation(evaluation_id)

    def running_evaluations(self) -> list[Evaluation]:
        rows = self.database.all("SELECT * FROM evaluations WHERE status = 'running' ORDER BY id")
        return [Evaluation.from_row(r) for r in rows]

    def finish_evaluation(self, evaluation_id: int, *, success: bool, trajectory_id: str | None = None) -> Evaluation:
        with self.database.write() as db:
            # Only a running one: a result that arrives twice (a task re-run after a crash) counts once.
            db.execute(
                "UPDATE evaluations SET status = 'done', success = ?, trajectory_id = ?, finished_at = ? "
                "WHERE id = ? AND status = 'running'",
                [int(success), trajectory_id, time.time(), evaluation_id],
            )
        return self.get_evaluation(evaluation_id)

    def get_evaluation(self, evaluation_id: int) -> Evaluation:
        row = self.database.one("SELECT * FROM evaluations WHERE id = ?", [evaluation_id])
        return Evaluation.from_row(required(row, "evaluation", evaluation_id))

    def evaluation_counts(self, *, split: str | None = None) -> list[dict]:
        """Per node, its own evaluations: successes ``s``, failures ``f``, and ``running`` (in flight)."""
        where, params = ("WHERE split = ?", [split]) if split else ("", [])
        return self.database.all(
            "SELECT node_id, coalesce(sum(status = 'done' AND success = 1), 0) AS s, "
            "coalesce(sum(status = 'done' AND success = 0), 0) AS f, "
            f"coalesce(sum(status = 'running'), 0) AS running FROM evaluations {where} "
            "GROUP BY node_id",
            params,
        )

    def abandon_evaluation(self, evaluation_id: int) -> Evaluation:
        """An evaluation whose task ended without a verdict (cancelled, dead): it counts for nothing."""
        with self.database.write() as db:
            db.execute(
                "UPDATE evaluations SET status = 'abandoned', finished_at = ? WHERE id = ? AND status = 'running'",
                [time.time(), evaluation_id],
            )
        return self.get_evaluation(evaluation_id)

    def evaluations_of(self, node_id: str) -> list[Evaluation]:
        rows = self.database.all("SELECT * FROM evaluations WHERE node_id = ? ORDER BY id", [node_id])
        return [Evaluation.from_row(r) for r in rows]

    def hook_effects(self, node_id: str) -> dict[str, dict[str, int]]:
        """Per hook point, how often the node's hooks changed something and how often a call failed,
        over every trajectory run on the node (from its ``hook`` steps)."""
        rows = self.database.all(
            "SELECT json_extract(s.tool_results, '$[0].hook') AS point, "
            "SUM(json_extract(s.tool_results, '$[0].changed')) AS changed, "
            "SUM(json_extract(s.tool_results, '$[0].error') IS NOT NULL) AS failed "
            "FROM steps s JOIN trajectories t ON t.id = s.trajectory_id "
            "WHERE t.node_id = ? AND s.role = 'hook' GROUP BY point ORDER BY point",
            [node_id],
        )
        return {
            r["point"] or "load": {"changed": int(r["changed"] or 0), "failed": int(r["failed"] or 0)} for r in rows
        }
