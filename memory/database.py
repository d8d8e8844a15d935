"""The one database object the store's parts are composed over: SQLite's connections and transactions.

Every part of the store (``Store`` and the parts it holds, such as ``TreeRecords``) reads and writes
through the same ``Database``, so writes of different parts made inside one ``write()`` block commit
together, and each thread reads through one connection of its own whichever part it asks.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlite_utils

from .db import MIGRATIONS, connect
from .errors import NotFound, StoreError, translate_os_error, translate_sqlite_error
from .options import StoreOptions

__all__ = ["Database", "required", "json_text"]

# How many values one statement of ``all_in`` carries: well inside SQLite's 32,766 parameters.
VALUES_PER_QUERY = 500
# How long a writer waits before asking for the write lock again: doubling from the first to the second.
WRITE_LOCK_PAUSE_S = (0.0002, 0.002)


def json_text(value: Any) -> str | None:
    """How a structured value is kept in a column: compact JSON with sorted keys (None stays NULL)."""
    return None if value is None else json.dumps(value, separators=(",", ":"), sort_keys=True)


def required(row: dict | None, what: str, key: Any) -> dict:
    """``row``, or ``NotFound`` naming what was looked for."""
    if row is None:
        raise NotFound(f"No {what} with id {key!r}.")
    return row


class Database:
    """The store's SQLite file: one write connection behind a lock, and a read connection per thread."""

    def __init__(self, path: Path, *, options: StoreOptions, readonly: bool) -> None:
        self.path = path
        self.options = options
        self.readonly = readonly
        self._lock = threading.RLock()  # one writer at a time inside this process
        # Reads go through a connection of the reading thread's own (WAL lets readers run beside the
        # writer and see only committed rows), except inside a write, which must see its own rows.
        # A thread's reader is closed with the database, when the thread is collected (the finalizer
        # below), or when another thread opens its own after this one ended (a pool's old thread).
        self._local = threading.local()
        self._readers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # thread -> finalizer closing its reader
        self._readers_lock = threading.Lock()
        self._closed = False
        self.writer: sqlite_utils.Database = connect(path, busy_timeout_ms=options.busy_timeout_ms, readonly=readonly)

    def close(self) -> None:
        with self._readers_lock:
            self._closed = True  # no thread opens a reader any more
            for close_reader in list(self._readers.values()):
                close_reader()
            self._readers.clear()
        self.writer.conn.close()

    # --- the schema ------------------------------------------------------------

    def require_migrated(self) -> None:
        with self.errors():
            pending = MIGRATIONS.pending(self.writer)
        if pending:
            raise StoreError(
                f"{self.path} is not at this version's schema ({len(pending)} migrations pending); "
                "only the store's owner (the daemon) migrates it."
            )

    def migrate(self) -> None:
        with self.errors():
            MIGRATIONS.apply(self.writer)

    def migrations(self) -> list[str]:
        with self.errors():
            return [m.name for m in MIGRATIONS.applied(self.reader())]

    # --- writing ---------------------------------------------------------------

    @contextmanager
    def errors(self) -> Iterator[None]:
        """SQLite's and the file system's errors as the store's own (``StoreError`` and its kinds)."""
        try:
            yield
        except sqlite3.Error as exc:
            raise translate_sqlite_error(exc, self.path) from exc
        except OSError as exc:
            raise translate_os_error(exc, self.path) from exc

    @property
    def writing(self) -> bool:
        """Whether this thread is inside a ``write()`` block."""
        return getattr(self._local, "writing", 0) > 0

    @contextmanager
    def write(self) -> Iterator[sqlite_utils.Database]:
        """One durable transaction; committed (fsynced) when the outermost block ends, a savepoint inside
        another."""
        if self.readonly:
            raise StoreError(f"{self.path} was opened read-only.")
        with self._lock, self.errors():
            self._local.writing = getattr(self._local, "writing", 0) + 1
            try:
                if self.writer.conn.in_transaction:  # nested: a savepoint
                    with self.writer.atomic():
                        yield self.writer
                else:
                    with self._immediate():
                        yield self.writer
            finally:
                self._local.writing -= 1

    @contextmanager
    def _immediate(self) -> Iterator[None]:
        """The outermost write transaction takes SQLite's write lock at BEGIN, waiting for it up to the
        busy timeout. A deferred one that read first and wrote after would fail at once ("database is
        locked") whenever another process, the daemon's worker processes, wrote in between: SQLite
        cannot wait out a stale snapshot."""
        conn = self.writer.conn
        self._begin_immediate(conn)
        try:
            yield
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        else:
            try:
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def _begin_immediate(self, conn: sqlite3.Connection) -> None:
        """``BEGIN IMMEDIATE``, asking again every fraction of a millisecond while another process holds
        the write lock, until the busy timeout. SQLite's own busy handler sleeps 1, 2, 5, 10, 15, 20,
        25, 25, 25, 50, 50 and then 100 ms between its tries: a writer that meets a lock held for two
        milliseconds (a worker's commit, fsynced) could sleep 25 ms or more after it was free, which
        was the daemon's submit p99 beside its worker processes."""
        timeout_ms = self.options.busy_timeout_ms
        conn.execute("PRAGMA busy_timeout = 0")  # each try answers at once; the waiting is ours
        try:
            deadline = time.monotonic() + timeout_ms / 1000
            pause = WRITE_LOCK_PAUSE_S[0]
            while True:
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    return
                except sqlite3.OperationalError as exc:
                    if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() >= deadline:
                        raise
                time.sleep(pause)
                pause = min(pause * 2, WRITE_LOCK_PAUSE_S[1])
        finally:
            conn.execute(f"PRAGMA busy_timeout = {int(timeout_ms)}")

    # --- reading ---------------------------------------------------------------

    def reader(self) -> sqlite_utils.Database:
        """The connection this thread reads through (see ``__init__``).

        Inside ``write`` that is the write connection, so a transaction reads its
        own rows; elsewhere a read-only connection of this thread's own, opened on
        first use, which sees only committed data and never joins a transaction.
        """
        if self._closed:
            raise StoreError(f"{self.path}: the store is closed.")
        if self.readonly or self.writing:
            return self.writer
        reader = getattr(self._local, "reader", None)
        if reader is None:
            reader = connect(self.path, busy_timeout_ms=self.options.busy_timeout_ms, readonly=True)
            with self._readers_lock:
                if self._closed:  # closed while this one was opening
                    reader.conn.close()
                    raise StoreError(f"{self.path}: the store is closed.")
                for thread in [t for t in self._readers if not t.is_alive()]:
                    self._readers.pop(thread)()
                thread = threading.current_thread()
                # The finalizer holds the connection, not the thread: closing runs once, by
                # whichever comes first (the thread collected, its end noticed, the database closed).
                self._readers[thread] = weakref.finalize(thread, reader.conn.close)
            self._local.reader = reader
        return reader

    def one(self, sql: str, params: Iterable = ()) -> dict | None:
        with self.errors():
            cursor = self.reader().execute(sql, list(params))
            try:
                row = cursor.fetchone()
                if row is None:
                    return None
                return dict(zip([c[0] for c in cursor.description], row))
            finally:
                cursor.close()  # an unfinished statement would keep this connection's snapshot open

    def all(self, sql: str, params: Iterable = ()) -> list[dict]:
        with self.errors():
            cursor = self.reader().execute(sql, list(params))
            names = [c[0] for c in cursor.description]
            return [dict(zip(names, row)) for row in cursor.fetchall()]

    def all_in(self, sql: str, values: Sequence) -> list[dict]:
        """The rows of ``sql`` for each of ``values``, however many: ``sql`` says ``IN ({marks})`` where a
        chunk of them goes, and runs once a chunk, kept well inside SQLite's 32,766 parameters."""
        rows: list[dict] = []
        for start in range(0, len(values), VALUES_PER_QUERY):
            chunk = list(values[start : start + VALUES_PER_QUERY])
            rows += self.all(sql.replace("{marks}", ",".join("?" * len(chunk))), chunk)
        return rows
