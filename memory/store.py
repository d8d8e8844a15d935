"""The experience store: SQLite as the source of truth, Chroma as its index.

Every write commits to SQLite first; triggers put the changed rows into
``index_outbox`` in the same transaction; ``sync_index`` then embeds them and
writes Chroma, and only afterwards clears their outbox rows. A crash between
the two stores therefore leaves the work in the outbox, and ``open`` finishes it
(``reconcile``). The index can always be rebuilt from SQLite (``reindex``).

``Store`` opens the one database object (``database.py``) and the index, and composes
over the database the parts that keep its roles, each handed what it asks of another:
``store.inbox``, ``store.tree`` (the search's nodes and evaluations), ``store.reports``,
``store.attempts``, ``store.insights``, ``store.tools``, ``store.exposures``,
``store.retrieval`` and ``store.ledger``; ``store.agent`` is the agent's role over them.
It keeps only its upkeep: transactions, the integrity check, its settings and the index.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlite_utils

from .agent_records import AgentRecords
from .attempts import Attempts
from .database import Database
from .db import INDEXED_COLLECTIONS
from .effects import Exposures
from .embedder import Embedder
from .errors import IndexBusy, NotFound
from .ids import new_id
from .inbox import Inbox
from .index import VectorIndex
from .indexing import IndexUpkeep
from .insight_log import InsightLog
from .ledger import Ledger
from .options import StoreOptions
from .records import Context
from .reports import ReportRecords
from .retrieval import Retrieval
from .tool_log import ToolLog
from .tree_records import TreeRecords

__all__ = ["Store", "StoreOptions", "new_id"]

DB_FILE = "evolver.db"
INDEX_DIR = "index"


class Store:
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
        self.db_path = self.data_dir / DB_FILE
        self.options = options or StoreOptions()
        self.readonly = readonly
        self.embedder = embedder or Embedder()
        self.index: VectorIndex | None = None
        if readonly and not self.db_path.exists():
            raise NotFound(f"There is no store at {self.db_path} yet; start the daemon once to create it.")
        self.database = Database(self.db_path, options=self.options, readonly=readonly)
        self._indexing = IndexUpkeep(
            self.database,
            options=self.options,
            embedder=self.embedder,
            index=lambda: self.index,
            readonly=readonly,
            db_path=self.db_path,
        )
        # The parts, each composed over the one database and handed what it asks of another.
        self.inbox = Inbox(self.database)
        self.tree = TreeRecords(self.database, inbox=self.inbox)
        self.reports = ReportRecords(self.database, sync_index=self.sync_index)
        self.ledger = Ledger(self.database)
        self.attempts = Attempts(self.database, inbox=self.inbox, reports=self.reports, sync_index=self.sync_index)
        self.insights = InsightLog(
            self.database, events=self.reports, transaction=self.transaction, sync_index=self.sync_index
        )
        self.tools = ToolLog(self.database, events=self.reports, sync_index=self.sync_index)
        self.exposures = Exposures(self.database)
        self.retrieval = Retrieval(
            self.database,
            options=self.options,
            embedder=self.embedder,
            index=lambda: self.index,
            verdicts=self.exposures.verdicts,
            context_from=context_from,
        )
        self.agent = AgentRecords(
            retrieval=self.retrieval,
            ledger=self.ledger,
            attempts=self.attempts,
            tools=self.tools,
            exposures=self.exposures,
            inbox=self.inbox,
        )
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

    # --- the vector index: the store's upkeep ------------------------------------

    def sync_index(self, *, progress: Callable[[int], None] | None = None) -> int:
        """Bring the index up to date with the outbox; returns how many rows it wrote."""
        return self._indexing.sync_index(progress=progress)

    def reconcile(self) -> dict[str, int]:
        """Make the index agree with SQLite; returns how many rows each collection fixed."""
        return self._indexing.reconcile()

    def reindex(self, *, progress: Callable[[int, int], None] | None = None) -> int:
        """Rebuild the whole index from SQLite, with the configured embedding model."""
        return self._indexing.reindex(progress=progress)
