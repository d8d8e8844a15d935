"""The experience store: SQLite as the source of truth, Chroma as its index.

Every write commits to SQLite first; triggers put the changed rows into
``index_outbox`` in the same transaction; ``sync_index`` then embeds them and
writes Chroma, and only afterwards clears their outbox rows. A crash between
the two stores therefore leaves the work in the outbox, and ``open`` finishes it
(``reconcile``). The index can always be rebuilt from SQLite (``reindex``).

This module holds the store's plumbing and its entities; keeping the index in
step lives in ``indexing.py`` and answering queries in ``retrieval.py``.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import sqlite_utils

from .database import Database, json_text, required
from .db import INDEXED_COLLECTIONS
from .effects import Exposures
from .embedder import Embedder
from .errors import (
    AmbiguousId,
    IndexBusy,
    NotFound,
)
from .ids import new_id
from .inbox import TERMINAL, Inbox
from .index import VectorIndex
from .indexing import IndexMaintenance
from .insight_log import InsightLog
from .options import StoreOptions
from .records import (
    Context,
    Ending,
    Event,
    Insight,
    LedgerEntry,
    Outcome,
    Step,
    Task,
    TaskKind,
    TaskStatus,
    ToolRecord,
    Trajectory,
)
from .retrieval import Retrieval
from .search import learnable_sql
from .tool_log import ToolLog
from .tree_records import TreeRecords

__all__ = ["Store", "StoreOptions", "NewTrajectory", "new_id"]

DB_FILE = "evolver.db"
INDEX_DIR = "index"


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


class Store(IndexMaintenance, Retrieval, InsightLog, ToolLog, Exposures):
    """Open with ``Store.open(data_dir)``; close with ``close()`` or a ``with`` block."""

    def __init__(
        self,
        data_dir: Path,
        *,
        embedder: Embedder | None = None,
        options: StoreOptions | None = None,
        readonly: bool = False,
        rebuild_index: bool = False,
        index_owner: bool = True,
        context_from: Callable[..., Context] | None = None,
    ) -> None:
        """``index_owner=False``: SQLite only, beside the process that owns the index, which a task's
        retrieval context is then asked of (``context_from``, with ``context``'s arguments)."""
        self.data_dir = Path(data_dir)
        self.context_from = context_from
        self.db_path = self.data_dir / DB_FILE
        self.options = options or StoreOptions()
        self.readonly = readonly
        self.embedder = embedder or Embedder()
        self._index_lock = threading.Lock()
        self.index: VectorIndex | None = None
        if readonly and not self.db_path.exists():
            raise NotFound(f"There is no store at {self.db_path} yet; start the daemon once to create it.")
        self.database = Database(self.db_path, options=self.options, readonly=readonly)
        self.inbox = Inbox(self.database)
        self.tree = TreeRecords(self.database, inbox=self.inbox)
        try:
            if not index_owner:
                # A worker process beside the daemon: it writes SQLite (its rows wait in the outbox for
                # the daemon, the index's one writer) and never migrates what the daemon owns.
                self.database.require_migrated()
            else:
                # Own the index before changing anything: a second writer that will be
                # refused (IndexBusy) must not have migrated the database under the owner.
                self._open_index(rebuild=rebuild_index)
            if not readonly and index_owner:
                self._migrate()
        except BaseException:
            self.close()
            raise

    @classmethod
    def open(cls, data_dir: Path, **kwargs) -> Store:
        store = cls(data_dir, **kwargs)
        if store.index is not None and not store.readonly:
            try:
                store.reconcile()
            except BaseException:
                store.close()  # or the index stays locked by a store nobody holds
                raise
        return store

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.index is not None:
            self.index.close()
            self.index = None
        database = getattr(self, "database", None)
        if database is not None:
            database.close()

    # --- plumbing ------------------------------------------------------------

    def _migrate(self) -> None:
        self.database.migrate()
        with self.database.errors():
            stored = self.database.writer.execute("SELECT value FROM meta WHERE key = 'embedding_model'").fetchone()
        # The index opened, so it is (now) built with this model; say so where the data lives.
        if stored is None or stored[0] != self.embedder.model_id:
            self.set_meta("embedding_model", self.embedder.model_id)

    def _open_index(self, *, rebuild: bool) -> None:
        try:
            self.index = VectorIndex(
                self.data_dir / INDEX_DIR,
                collections=INDEXED_COLLECTIONS,
                model_id=self.embedder.model_id,
                hnsw=self.options.hnsw(),
                rebuild=rebuild,
                server=self.options.index_server,
            )
        except IndexBusy:
            if not self.readonly:
                raise
            # A reader while the daemon runs: keyword search still works.
            self.index = None

    @contextmanager
    def transaction(self) -> Iterator[sqlite_utils.Database]:
        """Group several of the store's writes into one durable transaction (all or none of them).

        The vector index is brought up to date once the outermost block has
        committed: syncing inside it would index rows a rollback then removes,
        and would take the index lock while holding the write lock.
        """
        with self.database.write() as db:
            yield db
        if not self.database.writing:
            self.sync_index()

    def check(self) -> list[str]:
        """SQLite's full integrity check: ``['ok']`` when the file is sound."""
        return [r["integrity_check"] for r in self.database.all("PRAGMA integrity_check")]

    def migrations(self) -> list[str]:
        return self.database.migrations()

    def get_meta(self, key: str) -> str | None:
        """A small named setting of the store (``meta``)."""
        row = self.database.one("SELECT value FROM meta WHERE key = ?", [key])
        return None if row is None else row["value"]

    def set_meta(self, key: str, value: str) -> None:
        with self.database.write() as db:
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", [key, value])

    # --- tasks ---------------------------------------------------------------

    def set_task_status(
        self, task_id: str, status: str, *, error: str | None = None, ending: Ending | None = None
    ) -> Task:
        checked = TaskStatus.of(status)  # a status no task has is refused, naming them
        now = time.time()
        finished = now if checked in TERMINAL else None
        with self.database.write() as db:
            cursor = db.execute(
                "UPDATE tasks SET status = ?, error = ?, ending = ?, updated_at = ?, "
                "finished_at = coalesce(?, finished_at) WHERE id = ?",
                [checked.value, error, None if ending is None else Ending(ending).value, now, finished, task_id],
            )
            if cursor.rowcount == 0:
                raise NotFound(f"No task with id {task_id!r}.")
        return self.inbox.get_task(task_id)

    # --- trajectories, steps and outcomes -------------------------------------

    def start_trajectory(self, task_id: str, *, node_id: str | None = None, attempt: int = 1) -> Trajectory:
        task = self.inbox.get_task(task_id)
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
        self.sync_index()
        return self.get_trajectory(trajectory_id)

    def resolve_id(self, short: str) -> tuple[str, str]:
        """The kind ("task", "trajectory", "node") and full id of a unique prefix of one, as git takes a
        short commit id; an exact id is itself. ``NotFound`` when none starts so, ``AmbiguousId`` when
        several do (the message names them)."""
        tables = {"task_": ("task", "tasks"), "traj_": ("trajectory", "trajectories"), "node_": ("node", "nodes")}
        kind_table = next((v for k, v in tables.items() if short.startswith(k)), None)
        if kind_table is None:
            raise NotFound(f"{short!r} is not an id: ids start with task_, traj_ or node_")
        kind, table = kind_table
        # A range on the primary key ('~' sorts after every digit and letter of an id).
        rows = self.database.all(
            f"SELECT id FROM {table} WHERE id >= ? AND id < ? ORDER BY id LIMIT 4", [short, short + "~"]
        )
        ids = [r["id"] for r in rows]
        if short in ids or len(ids) == 1:
            return kind, short if short in ids else ids[0]
        if not ids:
            raise NotFound(f"No {kind} with id {short!r}" + ("" if len(short) > 5 else "; give more of its id"))
        more = " and more" if len(ids) > 3 else ""
        raise AmbiguousId(f"{short!r} starts several {kind} ids ({', '.join(ids[:3])}{more}); give more of it")

    def short_ids(self, ids: list[str]) -> dict[str, str]:
        """Each id's shortest unique prefix (at least 8 characters after its kind's ``task_``), to
        show in listings; any of them is taken back by ``resolve_id``."""
        tables = {"task_": "tasks", "traj_": "trajectories", "node_": "nodes"}
        out = {}
        for full in ids:
            table = tables.get(full[:5])
            if table is None:
                out[full] = full
                continue
            # Only the neighbours in sorted order can share a longer prefix with it (an aggregate: one row).
            before = self.database.all(f"SELECT max(id) AS id FROM {table} WHERE id < ?", [full])[0]["id"] or ""
            after = self.database.all(f"SELECT min(id) AS id FROM {table} WHERE id > ?", [full])[0]["id"] or ""
            shared = max(len(os.path.commonprefix([full, before])), len(os.path.commonprefix([full, after])))
            out[full] = full[: max(13, shared + 1)]
        return out

    def get_trajectory(self, trajectory_id: str) -> Trajectory:
        row = self.database.one("SELECT * FROM trajectories WHERE id = ?", [trajectory_id])
        return Trajectory.from_row(required(row, "trajectory", trajectory_id))

    def trajectories_of(self, task_id: str) -> list[Trajectory]:
        """A task's attempts in the order they ran. By time, not by attempt number: a task sent back
        to the queue (a drain, an expired lease) numbers its attempts from 1 again."""
        rows = self.database.all("SELECT * FROM trajectories WHERE task_id = ? ORDER BY started_at, rowid", [task_id])
        return [Trajectory.from_row(r) for r in rows]

    def trajectory_counts(self, task_ids: list[str]) -> dict[str, int]:
        """How many attempts (trajectories) each of ``task_ids`` has had; 0 for one that never ran."""
        counts = dict.fromkeys(task_ids, 0)
        for start in range(0, len(task_ids), 500):  # SQLite's variable limit
            chunk = task_ids[start : start + 500]
            rows = self.database.all(
                f"SELECT task_id, count(*) AS n FROM trajectories WHERE task_id IN "
                f"({','.join('?' * len(chunk))}) GROUP BY task_id",
                chunk,
            )
            counts.update((r["task_id"], r["n"]) for r in rows)
        return counts

    def last_trajectory(self, task_id: str) -> Trajectory | None:
        """The task's newest attempt (see ``trajectories_of``), or None before its first."""
        row = self.database.one(
            "SELECT * FROM trajectories WHERE task_id = ? ORDER BY started_at DESC, rowid DESC LIMIT 1", [task_id]
        )
        return None if row is None else Trajectory.from_row(row)

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

    def last_verdict(self, task_id: str) -> tuple[str, bool | None] | None:
        """The task's last attempt (``last_trajectory``) and whether its check passed (None: no verdict),
        or None without one."""
        last = self.last_trajectory(task_id)
        if last is None:
            return None
        outcome = self.outcome(last.id)
        return last.id, None if outcome is None else outcome.success

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
        found: set[str] = set()
        for start in range(0, len(trajectory_ids), 500):  # SQLite's variable limit
            chunk = trajectory_ids[start : start + 500]
            rows = self.database.all(
                f"SELECT t.id FROM trajectories t WHERE t.id IN ({','.join('?' * len(chunk))}) "
                f"AND {learnable_sql('t')}",
                chunk,
            )
            found.update(r["id"] for r in rows)
        return found

    def steps(self, trajectory_id: str, *, after_seq: int = 0, limit: int = 1000) -> list[Step]:
        rows = self.database.all(
            "SELECT * FROM steps WHERE trajectory_id = ? AND seq > ? ORDER BY seq LIMIT ?",
            [trajectory_id, after_seq, limit],
        )
        return [Step.from_row(r) for r in rows]

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
        self.sync_index()
        outcome = self.outcome(trajectory_id)
        assert outcome is not None  # written above
        return outcome

    def add_feedback(self, trajectory_id: str, *, good: bool, note: str = "") -> Outcome:
        """A person's verdict, kept as they gave it (``person_good``); it decides success where no
        verifier did."""
        self.get_trajectory(trajectory_id)
        with self.database.write() as db:
            db.execute(
                """INSERT INTO outcomes (trajectory_id, success, feedback, person_good, decided_at) VALUES (?,?,?,?,?)
                   ON CONFLICT (trajectory_id) DO UPDATE SET feedback = excluded.feedback,
                   person_good = excluded.person_good,
                   success = CASE WHEN outcomes.verifier IS NULL THEN excluded.success ELSE outcomes.success END,
                   decided_at = CASE WHEN outcomes.verifier IS NULL THEN excluded.decided_at
                                     ELSE outcomes.decided_at END""",
                [trajectory_id, int(good), note or ("good" if good else "bad"), int(good), time.time()],
            )
        self.sync_index()
        outcome = self.outcome(trajectory_id)
        assert outcome is not None  # written above
        return outcome

    def outcome(self, trajectory_id: str) -> Outcome | None:
        row = self.database.one("SELECT * FROM outcomes WHERE trajectory_id = ?", [trajectory_id])
        return None if row is None else Outcome.from_row(row)

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
            self.sync_index()
        return ids

    # --- insights --------------------------------------------------------------

    def add_insight(
        self, text: str, *, importance: int = 2, provenance: list | None = None, node_id: str | None = None
    ) -> Insight:
        if not text.strip():
            raise ValueError("An insight needs text.")
        now = time.time()
        with self.database.write() as db:
            cursor = db.execute(
                "INSERT INTO insights (text, importance, status, provenance, node_id, created_at, updated_at) "
                "VALUES (?,?,?,?,?,?,?)",
                [text, importance, "active", json_text(provenance or []), node_id, now, now],
            )
            insight_id = cursor.lastrowid
            assert insight_id is not None  # an INSERT just ran
        self.sync_index()
        return self.get_insight(insight_id)

    def update_insight(
        self,
        insight_id: int,
        *,
        text: str | None = None,
        importance: int | None = None,
        status: str | None = None,
        provenance: list | None = None,
    ) -> Insight:
        current = self.get_insight(insight_id)
        with self.database.write() as db:
            db.execute(
                "UPDATE insights SET text = ?, importance = ?, status = ?, provenance = ?, updated_at = ? WHERE id = ?",
                [
                    text if text is not None else current.text,
                    importance if importance is not None else current.importance,
                    status or current.status,
                    json_text(provenance if provenance is not None else current.provenance),
                    time.time(),
                    insight_id,
                ],
            )
        self.sync_index()
        return self.get_insight(insight_id)

    def get_insight(self, insight_id: int) -> Insight:
        row = self.database.one("SELECT * FROM insights WHERE id = ?", [insight_id])
        return Insight.from_row(required(row, "insight", insight_id))

    def list_insights(self, *, status: str | tuple[str, ...] | None = "active", limit: int = 100) -> list[Insight]:
        """Insights in ``status`` (one, several, or None: all), most important first."""
        statuses = (status,) if isinstance(status, str) else status
        where, params = (f"WHERE status IN ({','.join('?' * len(statuses))})", list(statuses)) if statuses else ("", [])
        rows = self.database.all(
            f"SELECT * FROM insights {where} ORDER BY importance DESC, id LIMIT ?", [*params, limit]
        )
        return [Insight.from_row(r) for r in rows]

    # --- tools -----------------------------------------------------------------

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
    ) -> ToolRecord:
        now = time.time()
        with self.database.write() as db:
            if version is None:
                version = db.execute(
                    "SELECT coalesce(max(version), 0) + 1 FROM tools WHERE name = ?", [name]
                ).fetchone()[0]
            cursor = db.execute(
                """INSERT INTO tools (name, version, description, code_hash, status, origin, node_id, event_id,
                   created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?)""",
                [name, version, description, code_hash, status, origin, node_id, event_id, now, now],
            )
            tool_id = cursor.lastrowid
            assert tool_id is not None  # an INSERT just ran
        self.sync_index()
        return self.get_tool(tool_id)

    def set_tool_status(self, tool_id: int, status: str) -> ToolRecord:
        with self.database.write() as db:
            cursor = db.execute(
                "UPDATE tools SET status = ?, updated_at = ? WHERE id = ?", [status, time.time(), tool_id]
            )
            if cursor.rowcount == 0:
                raise NotFound(f"No tool with id {tool_id!r}.")
        self.sync_index()
        return self.get_tool(tool_id)

    def record_tool_use(self, tool_id: int, *, ok: bool) -> ToolRecord:
        with self.database.write() as db:
            cursor = db.execute(
                "UPDATE tools SET uses = uses + 1, successes = successes + ?, failures = failures + ?, updated_at = ? "
                "WHERE id = ?",
                [int(ok), int(not ok), time.time(), tool_id],
            )
            if cursor.rowcount == 0:
                raise NotFound(f"No tool with id {tool_id!r}.")
        return self.get_tool(tool_id)

    def get_tool(self, tool_id: int) -> ToolRecord:
        return ToolRecord.from_row(
            required(self.database.one("SELECT * FROM tools WHERE id = ?", [tool_id]), "tool", tool_id)
        )

    def list_tools(self, *, status: str | None = "active") -> list[ToolRecord]:
        where, params = ("WHERE status = ?", [status]) if status else ("", [])
        return [
            ToolRecord.from_row(r)
            for r in self.database.all(f"SELECT * FROM tools {where} ORDER BY name, version", params)
        ]

    def tool_calls(self, names: list[str]) -> dict[str, dict[str, int]]:
        """How often each named tool was called in any task, and how many calls went well (from the
        ``tool`` steps: the usage of tools the store keeps no record of, such as an MCP server's)."""
        if not names:
            return {}
        rows = self.database.all(
            "SELECT json_extract(tool_results, '$[0].name') AS name, count(*) AS calls, "
            "SUM(json_extract(tool_results, '$[0].ok')) AS ok FROM steps WHERE role = 'tool' "
            f"AND json_extract(tool_results, '$[0].name') IN ({','.join('?' * len(names))}) GROUP BY name",
            list(names),
        )
        found = {r["name"]: {"uses": int(r["calls"]), "successes": int(r["ok"] or 0)} for r in rows}
        return {n: found.get(n, {"uses": 0, "successes": 0}) for n in names}

    # --- budget ledger and evolution events -------------------------------------

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
        with self.database.write() as db:
            cursor = db.execute(
                """INSERT INTO ledger (at, model, purpose, tokens_in, tokens_out, cost_usd, latency_ms, task_id,
                                       node_id)
                   VALUES (?,?,?,?,?,?,?,?,?)""",
                [time.time(), model, purpose, tokens_in, tokens_out, cost_usd, latency_ms, task_id, node_id],
            )
            entry_id = cursor.lastrowid
        return LedgerEntry.from_row(
            required(self.database.one("SELECT * FROM ledger WHERE id = ?", [entry_id]), "ledger entry", entry_id)
        )

    def spent(
        self, *, since: float = 0.0, purpose: str | tuple[str, ...] | None = None, task_id: str | None = None
    ) -> tuple[int, float]:
        """Tokens (in + out) and USD spent since a time, optionally for some purposes or one task."""
        sql = "SELECT coalesce(sum(tokens_in + tokens_out), 0), coalesce(sum(cost_usd), 0) FROM ledger WHERE at >= ?"
        params: list = [since]
        if purpose is not None:
            purposes = (purpose,) if isinstance(purpose, str) else tuple(purpose)
            sql += f" AND purpose IN ({','.join('?' * len(purposes))})"
            params += list(purposes)
        if task_id is not None:
            sql, params = sql + " AND task_id = ?", [*params, task_id]
        with self.database.errors():
            tokens, usd = self.database.reader().execute(sql, params).fetchone()
        return int(tokens), float(usd)

    def spent_by_model(self, *, since: float = 0.0) -> dict[str, tuple[int, float]]:
        """By model (the ledger's, a fallback its own), tokens (in + out) and USD spent since a time."""
        with self.database.errors():
            rows = (
                self.database.reader()
                .execute(
                    "SELECT model, coalesce(sum(tokens_in + tokens_out), 0), coalesce(sum(cost_usd), 0) FROM ledger "
                    "WHERE at >= ? GROUP BY model ORDER BY model",
                    [since],
                )
                .fetchall()
            )
        return {model: (int(tokens), float(usd)) for model, tokens, usd in rows}

    def task_results(self, *, since: float) -> dict[str, dict[str, int]]:
        """By task source, the tasks whose last attempt finished since a time: how many succeeded,
        failed, or have no verdict (no check and no feedback)."""
        periods = self.results_over_time(since=since, period_s=float("inf"))
        return periods[0][1] if periods else {}

    def results_over_time(self, *, since: float, period_s: float) -> list[tuple[int, dict[str, dict[str, int]]]]:
        """``task_results`` per period: (n, counts by source) for each period of ``period_s`` seconds
        from ``since`` (n = 0 the first) in which some task's last attempt finished, in order."""
        bucket = "0" if period_s == float("inf") else "CAST((t.finished_at - ?) / ? AS INTEGER)"
        rows = self.database.all(
            f"SELECT {bucket} AS period, k.source AS source, o.success AS success, count(*) AS n "
            "FROM trajectories t JOIN tasks k ON k.id = t.task_id LEFT JOIN outcomes o ON o.trajectory_id = t.id "
            "WHERE t.finished_at >= ? AND NOT EXISTS (SELECT 1 FROM trajectories later "
            "WHERE later.task_id = t.task_id AND later.attempt > t.attempt) "
            "GROUP BY period, k.source, o.success ORDER BY period",
            ([] if period_s == float("inf") else [since, period_s]) + [since],
        )
        out: dict[int, dict[str, dict[str, int]]] = {}
        for row in rows:
            counts = out.setdefault(row["period"], {}).setdefault(
                row["source"], {"succeeded": 0, "failed": 0, "unjudged": 0}
            )
            key = "unjudged" if row["success"] is None else "succeeded" if row["success"] else "failed"
            counts[key] += row["n"]
        return sorted(out.items())

    def learned_since(self, since: float) -> dict[str, int]:
        """What was learned and unlearned since a time: insights added and retired, synthesized tools
        that came into use and that were retired."""
        # A SELECT of values, no FROM: always one row.
        row = self.database.all(
            "SELECT (SELECT count(*) FROM insight_history WHERE at >= ? AND op = 'ADD') AS insights_added, "
            "(SELECT count(*) FROM insight_history WHERE at >= ? AND json_extract(after, '$.status') = 'retired' "
            " AND coalesce(json_extract(before, '$.status'), '') != 'retired') AS insights_retired, "
            "(SELECT count(*) FROM tools WHERE created_at >= ? AND status IN ('active', 'retired')) AS tools_added, "
            "(SELECT count(*) FROM tools WHERE updated_at >= ? AND status = 'retired') AS tools_retired",
            [since] * 4,
        )[0]
        return {key: int(row[key]) for key in ("insights_added", "insights_retired", "tools_added", "tools_retired")}

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
    ) -> Event:
        with self.database.write() as db:
            cursor = db.execute(
                """INSERT INTO events (at, kind, what, why, evidence, cost_usd, node_id, payload, reverts)
                   VALUES (?,?,?,?,?,?,?,?,?)""",
                [
                    time.time(),
                    kind,
                    what,
                    why,
                    json_text(evidence or []),
                    cost_usd,
                    node_id,
                    json_text(payload or {}),
                    reverts,
                ],
            )
            event_id = cursor.lastrowid
            assert event_id is not None  # an INSERT just ran
        return self.get_event(event_id)

    def get_event(self, event_id: int) -> Event:
        return Event.from_row(
            required(self.database.one("SELECT * FROM events WHERE id = ?", [event_id]), "event", event_id)
        )

    def list_events(self, *, kind: str | None = None, since: float = 0.0, limit: int = 100) -> list[Event]:
        sql = "SELECT * FROM events WHERE at >= ?"
        params: list = [since]
        if kind:
            sql, params = sql + " AND kind = ?", [*params, kind]
        rows = self.database.all(sql + " ORDER BY id DESC LIMIT ?", [*params, limit])
        return [Event.from_row(r) for r in rows]
