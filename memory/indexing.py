"""Keeping the vector index in step with SQLite: sync the outbox, reconcile, rebuild.

Triggers put every changed row into ``index_outbox`` in the same transaction as
the change. ``sync_index`` embeds those rows, writes Chroma, and only then
clears their outbox rows (if no newer change came meanwhile), so a crash
between the two stores loses nothing: the next sync finishes the work. A
trajectory waits there while its attempt runs, and enters the index when it ends.

``IndexUpkeep`` is the store's own (``Store.sync_index``, ``reconcile``, ``reindex`` call it), composed
over its database and handed the index as it is now: none while a reader shares the daemon's, or once the
store is closed.
"""

from __future__ import annotations

import hashlib
import threading
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from .database import Database
from .db import INDEXED_COLLECTIONS
from .embedder import Embedder
from .errors import StoreError
from .index import VectorIndex
from .options import StoreOptions

__all__ = ["IndexUpkeep"]


# What the index is owed, less the attempts still running: a trajectory enters the index once, when it ends,
# with its outcome. Indexed when it started too, it cost two of Chroma's writes (an upsert, then an update of
# its outcome), each holding the daemon's GIL for milliseconds; its row waits in the outbox meanwhile.
_PENDING_SQL = """
    SELECT o.collection, o.item_id, o.generation FROM index_outbox o
    WHERE NOT (o.collection = 'trajectories'
               AND EXISTS (SELECT 1 FROM trajectories t WHERE t.id = o.item_id AND t.status = 'running'))
    LIMIT ?"""


def _text_hash(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


class IndexUpkeep:
    """Writes the vector index from the outbox, and mends or rebuilds it (see the module)."""

    def __init__(
        self,
        database: Database,
        *,
        options: StoreOptions,
        embedder: Embedder,
        index: Callable[[], VectorIndex | None],
        readonly: bool,
        db_path: Path,
    ) -> None:
        self.database = database
        self.options = options
        self.embedder = embedder
        self._index = index
        self.readonly = readonly
        self.db_path = db_path
        self._lock = threading.Lock()  # one sync at a time: a row is embedded and written once

    @property
    def index(self) -> VectorIndex | None:
        return self._index()

    def _documents(self, collection: str, ids: list[str]) -> dict[str, tuple[str, dict]]:
        """The text to embed and the metadata of each indexable row among ``ids``."""
        marks = ",".join("?" * len(ids))
        docs: dict[str, tuple[str, dict]] = {}
        if collection == "trajectories":
            for r in self.database.all(
                f"""SELECT t.id, t.prompt, t.node_id, t.started_at, o.success FROM trajectories t
                    LEFT JOIN outcomes o ON o.trajectory_id = t.id WHERE t.id IN ({marks})""",
                ids,
            ):
                success = -1 if r["success"] is None else int(r["success"])
                docs[r["id"]] = (
                    r["prompt"],
                    {"success": success, "started_at": r["started_at"], "node_id": r["node_id"] or ""},
                )
        elif collection == "insights":
            for r in self.database.all(
                f"SELECT id, text FROM insights WHERE status IN ('active', 'probation') AND id IN ({marks})", ids
            ):
                docs[str(r["id"])] = (r["text"], {})
        else:
            for r in self.database.all(
                f"SELECT id, name, description FROM tools WHERE status = 'active' AND id IN ({marks})", ids
            ):
                docs[str(r["id"])] = (f"{r['name']}: {r['description']}", {})
        for text, metadata in docs.values():
            metadata["text_hash"] = _text_hash(text)
        return docs

    def _index_items(self, collection: str, ids: list[str]) -> None:
        assert self.index is not None
        docs = self._documents(collection, ids)
        gone = [i for i in ids if i not in docs]
        stored = self.index.metadata_of(collection, list(docs))
        # Unchanged text: only the metadata (say, a new outcome) needs writing.
        same = [i for i in docs if (stored.get(i) or {}).get("text_hash") == docs[i][1]["text_hash"]]
        changed = [i for i in docs if i not in set(same)]
        self.index.delete(collection, gone)
        self.index.update_metadata(collection, same, [docs[i][1] for i in same])
        if changed:
            vectors = self.embedder.embed_documents([docs[i][0] for i in changed])
            self.index.upsert(collection, changed, vectors, [docs[i][1] for i in changed])

    def sync_index(self, *, progress: Callable[[int], None] | None = None) -> int:
        """Bring the index up to date with the outbox; returns how many rows it wrote."""
        if self.index is None or self.readonly:
            return 0
        if self.database.writing:
            return 0  # inside a transaction: ``transaction()`` syncs once it has committed
        done = 0
        with self._lock:
            while True:
                pending = self.database.all(_PENDING_SQL, [self.options.index_batch])
                if not pending:
                    return done
                by_collection: dict[str, list[str]] = defaultdict(list)
                for row in pending:
                    by_collection[row["collection"]].append(row["item_id"])
                try:
                    for collection, ids in by_collection.items():
                        self._index_items(collection, ids)
                except StoreError:
                    raise
                except Exception as exc:
                    raise StoreError(
                        f"Writing the vector index at {self.index.where} failed ({exc}); "
                        "the changes stay queued and are retried on the next write or start."
                    ) from exc
                with self.database.write() as db:
                    db.conn.executemany(
                        "DELETE FROM index_outbox WHERE collection = ? AND item_id = ? AND generation = ?",
                        [(r["collection"], r["item_id"], r["generation"]) for r in pending],
                    )
                done += len(pending)
                if progress:
                    progress(done)

    def _indexable_ids_sql(self, collection: str) -> str:
        return {
            "trajectories": "SELECT id FROM trajectories WHERE status != 'running'",
            "insights": "SELECT CAST(id AS TEXT) AS id FROM insights WHERE status IN ('active', 'probation')",
            "tools": "SELECT CAST(id AS TEXT) AS id FROM tools WHERE status = 'active'",
        }[collection]

    def reconcile(self) -> dict[str, int]:
        """Make the index agree with SQLite; returns how many rows each collection fixed."""
        assert self.index is not None
        fixed = {"outbox": self.sync_index()}
        for collection in INDEXED_COLLECTIONS:
            sql = self._indexable_ids_sql(collection)
            expected = self.database.all(f"SELECT count(*) AS n FROM ({sql})")[0]["n"]
            if expected == self.index.count(collection):
                continue
            truth = {r["id"] for r in self.database.all(sql)}
            present = self.index.all_ids(collection)
            # Rows another process (a worker process) wrote since the sync above wait in the outbox:
            # they are on their way, not drift.
            pending = {
                r["item_id"]
                for r in self.database.all("SELECT item_id FROM index_outbox WHERE collection = ?", [collection])
            }
            stale = sorted(((present - truth) | (truth - present)) - pending)
            if not stale:
                continue
            with self.database.write() as db:
                db.conn.executemany(
                    "INSERT OR IGNORE INTO index_outbox (collection, item_id) VALUES (?, ?)",
                    [(collection, i) for i in stale],
                )
            fixed[collection] = len(stale)
        self.sync_index()
        return fixed

    def reindex(self, *, progress: Callable[[int, int], None] | None = None) -> int:
        """Rebuild the whole index from SQLite, with the configured embedding model."""
        if self.readonly or self.index is None:
            raise StoreError(f"{self.db_path} was opened read-only; reindexing writes the index.")
        with self.database.write() as db:
            for collection in INDEXED_COLLECTIONS:
                db.execute(
                    "INSERT OR IGNORE INTO index_outbox (collection, item_id) "
                    f"SELECT ?, id FROM ({self._indexable_ids_sql(collection)})",
                    [collection],
                )
        total = self.database.all("SELECT count(*) AS n FROM index_outbox")[0]["n"]
        for collection in INDEXED_COLLECTIONS:
            self.index.reset(collection)
        with self.database.write() as db:
            db.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('embedding_model', ?)", [self.embedder.model_id]
            )
        return self.sync_index(progress=(lambda n: progress(n, total)) if progress else None)
