"""The experience store: SQLite as the source of truth, Chroma as its index.

Every write commits to SQLite first; triggers put the changed rows into
``index_outbox`` in the same transaction; ``sync_index`` then embeds them and
writes Chroma, and only afterwards clears their outbox rows. A crash between
the two stores therefore leaves the work in the outbox, and ``open`` finishes it
(``reconcile``). The index can always be rebuilt from SQLite (``reindex``).

``Store`` opens the one database object (``database.py``) and composes the parts
over it that are roles of their own: ``store.inbox``, ``store.tree`` and
``store.reports``. It keeps the rest itself for now: an attempt's records, what is
learned, and the ledger, with the parts still mixed in (keeping the index in step,
``indexing.py``; answering queries, ``retrieval.py``; the insight and tool logs;
measured effects).
"""

from __future__ import annotations

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
from .reports import ReportRecords
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
        self.reports = ReportRecords(self.database, sync_index=self.sync_index)
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
        # The index opened, so it is (now) built with this model; say so where the data lives.
        if self.get_meta("embedding_model") != self.embedder.model_id:
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
        """A small named setting of the store (``meta``): the incumbent node, a job's watermark, the
        embedding model the index was built with."""
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
        outcome = self.reports.outcome(trajectory_id)
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
