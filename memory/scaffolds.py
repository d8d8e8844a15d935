"""Scaffold snapshots by content hash, and small named settings of the store (``meta``).

The store keeps scaffolds as opaque text: what a scaffold means is the engine's
business; the store only guarantees a node's exact snapshot can be read back.
"""

from __future__ import annotations

import time

from ._host import StoreHost
from .errors import NotFound

__all__ = ["Snapshots"]


class Snapshots(StoreHost):
    """The part of ``Store`` that keeps scaffold snapshots and meta values (a mixin)."""

    def put_scaffold(self, scaffold_hash: str, body: str) -> None:
        """Keep a snapshot; storing the same hash again changes nothing."""
        with self._write() as db:
            db.execute(
                "INSERT OR IGNORE INTO scaffolds (hash, body, created_at) VALUES (?,?,?)",
                [scaffold_hash, body, time.time()],
            )

    def get_scaffold(self, scaffold_hash: str) -> str:
        row = self._one("SELECT body FROM scaffolds WHERE hash = ?", [scaffold_hash])
        if row is None:
            raise NotFound(f"No scaffold with hash {scaffold_hash!r}.")
        return row["body"]

    def get_meta(self, key: str) -> str | None:
        row = self._one("SELECT value FROM meta WHERE key = ?", [key])
        return None if row is None else row["value"]

    def set_meta(self, key: str, value: str) -> None:
        with self._write() as db:
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", [key, value])
