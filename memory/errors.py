"""The store's errors. Each message names the file and what to do.

    StoreError
    ├── StoreCorrupt        the database file is not a readable SQLite database
    ├── StoreLocked         another connection holds the write lock too long
    ├── StoreReadOnly       the data dir or database cannot be written
    ├── StoreFull           the disk (or the database's size cap) is full
    ├── IndexBusy           another process owns the vector index
    ├── EmbeddingMismatch   the index was built with another embedding model
    └── NotFound            no row with that id

Lower-level errors (sqlite3, Chroma, OS) are re-raised as one of these with
``raise ... from`` so callers handle one family and tracebacks keep the cause.
"""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path

__all__ = [
    "StoreError",
    "StoreCorrupt",
    "StoreLocked",
    "StoreReadOnly",
    "StoreFull",
    "IndexBusy",
    "EmbeddingMismatch",
    "NotFound",
    "translate_sqlite_error",
    "translate_os_error",
]


class StoreError(Exception):
    """Base class of every error the experience store raises."""


class StoreCorrupt(StoreError):
    pass


class StoreLocked(StoreError):
    pass


class StoreReadOnly(StoreError):
    pass


class StoreFull(StoreError):
    pass


class IndexBusy(StoreError):
    pass


class EmbeddingMismatch(StoreError):
    pass


class NotFound(StoreError, KeyError):
    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "not found"


def translate_sqlite_error(exc: sqlite3.Error, path: Path) -> StoreError:
    """Turn a sqlite3 error into the store error that tells the user what to do."""
    text = str(exc)
    low = text.lower()
    if "not a database" in low or "malformed" in low or "corrupt" in low:
        return StoreCorrupt(
            f"{path} is not a readable SQLite database ({text}). Nothing was changed. "
            "Restore it from a backup, or move it aside to start a new store."
        )
    if "locked" in low or "busy" in low:
        return StoreLocked(
            f"{path} is locked by another connection ({text}). "
            "Another process is writing it; try again, or stop the other process."
        )
    if "readonly" in low or "read-only" in low or "unable to open" in low:
        return StoreReadOnly(
            f"{path} cannot be written ({text}). Check that the data dir "
            f"{path.parent} exists, is writable by this user and is not on a read-only mount."
        )
    if "full" in low:
        return StoreFull(
            f"{path}: the disk is full ({text}). Nothing already stored was lost; "
            "free some space and try again."
        )
    return StoreError(f"{path}: {text}")


def translate_os_error(exc: OSError, path: Path) -> StoreError:
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return StoreReadOnly(
            f"{path} cannot be written ({exc.strerror}). Check the permissions of the data dir "
            "or choose another with [daemon] data_dir."
        )
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StoreFull(
            f"{path}: the disk is full ({exc.strerror}). Nothing already stored was lost; "
            "free some space and try again."
        )
    return StoreError(f"{path}: {exc}")
