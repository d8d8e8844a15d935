"""What the store's parts still mixed into ``Store`` use of the store they are part of.

Each such part reads and writes through the store's database object (``Database``), reads its options,
embedder and index, and calls a few of its methods, all defined on ``Store`` or on a sibling part.
``StoreHost`` declares them once, for the type checker only: at run time its body is empty, so a part's
attributes and methods still come from ``Store`` and its other parts. A part composed over the database
instead (``Inbox``, ``TreeRecords``, ``ReportRecords``) is handed what it uses and needs none of this.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import threading
    from collections.abc import Callable, Iterable
    from contextlib import AbstractContextManager
    from pathlib import Path

    import sqlite_utils

    from .database import Database
    from .embedder import Embedder
    from .index import VectorIndex
    from .options import StoreOptions
    from .records import Context, Insight
    from .reports import ReportRecords

__all__ = ["StoreHost"]


class StoreHost:
    """The store as its parts see it (see the module); a part inherits this."""

    if TYPE_CHECKING:
        db_path: Path
        options: StoreOptions
        readonly: bool
        embedder: Embedder
        index: VectorIndex | None
        context_from: Callable[..., Context] | None
        database: Database
        reports: ReportRecords  # the events the parts write go to its log
        _index_lock: threading.Lock

        # A transaction that brings the index up to date after it (``Store``).
        def transaction(self) -> AbstractContextManager[sqlite_utils.Database]: ...

        # The index (``IndexMaintenance``).
        def sync_index(self, *, progress: Callable[[int], None] | None = None) -> int: ...

        # Measured effects (``Exposures``).
        def verdicts(self, kind: str, items: Iterable[str]) -> dict[str, str]: ...

        # Entities (``Store``).
        def get_insight(self, insight_id: int) -> Insight: ...
