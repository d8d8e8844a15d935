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


class AmbiguousId(StoreError, ValueError):
    """A short id that starts more than one id; the message names some of them."""


# SQLite's primary result codes (the low byte of an extended code) and what they mean here.
_KIND_BY_CODE = {
    11: "corrupt",  # SQLITE_CORRUPT
    26: "corrupt",  # SQLITE_NOTADB
    5: "locked",  # SQLITE_BUSY
    6: "locked",  # SQLITE_LOCKED
    8: "readonly",  # SQLITE_READONLY
    14: "readonly",  # SQLITE_CANTOPEN
    3: "readonly",  # SQLITE_PERM
    13: "full",  # SQLITE_FULL
}


def _kind(exc: sqlite3.Error, low: str) -> str | None:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        # The code, not the text: "no such column: fullname" is not a full disk.
        return _KIND_BY_CODE.get(code & 0xFF)
    if "not a database" in low or "malformed" in low or "corrupt" in low:
        return "corrupt"
    if "locked" in low or "busy" in low:
        return "locked"
    if "readonly" in low or "read-only" in low or "unable to open" in low:
        return "readonly"
    if "database or disk is full" in low:
        return "full"
    return None


def translate_sqlite_error(exc: sqlite3.Error, path: Path) -> StoreError:
    """Turn a sqlite3 error into the store error that tells the user what to do."""
    text = str(exc)
    kind = _kind(exc, text.lower())
    if kind == "corrupt":
        return StoreCorrupt(
            f"{path} is not a readable SQLite database ({text}). Nothing was changed. "
            "Restore it from a backup, or move it aside to start a new store."
        )
    if kind == "locked":
        return StoreLocked(
            f"{path} is locked by another connection ({text}). "
            "Another process is writing it; try again, or stop the other process."
        )
    if kind == "readonly":
        return StoreReadOnly(
            f"{path} cannot be written ({text}). Check that the data dir "
            f"{path.parent} exists, is writable by this user and is not on a read-only mount."
        )
    if kind == "full":
        return StoreFull(
            f"{path}: the disk is full ({text}). Nothing already stored was lost; free some space and try again."
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
