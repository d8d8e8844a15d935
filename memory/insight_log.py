"""The insights: what distillation learned, one at a time or as changes applied together or not at all,
each change kept with the insight before and after it.

As ``store.insights``, a part composed over the store's database. It is handed the event log (a change
is recorded with its event), the store's transaction (the event and its changes commit together, and the
index is synced after) and the index's sync.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol

from .database import Database, json_text, required
from .errors import NotFound
from .records import Event, Insight

__all__ = ["InsightLog"]

_FIELDS = ("text", "importance", "status", "provenance")


def _snapshot(insight: Insight) -> str:
    return json.dumps({f: getattr(insight, f) for f in _FIELDS})


class _Events(Protocol):
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
    ) -> Event: ...


class InsightLog:
    """The insights and their history (see the module)."""

    def __init__(
        self,
        database: Database,
        *,
        events: _Events,
        transaction: Callable[[], AbstractContextManager[object]],
        sync_index: Callable[[], object],
    ) -> None:
        self.database = database
        self._events = events
        self._transaction = transaction
        self._sync_index = sync_index

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
        self._sync_index()
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
        self._sync_index()
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

    def apply_insight_changes(self, changes: list[dict], *, event_id: int | None = None) -> list[Insight]:
        """Apply every change in one transaction; returns the insights as they are after it.

        A change is ``{"op": name, "text", "importance", "provenance"}`` for a new
        insight (no ``id``), or ``{"op": name, "id", ...fields to set}`` for an
        existing one. Each is recorded in ``insight_history`` under ``op``.
        """
        now = time.time()
        touched: list[int] = []
        with self.database.write() as db:
            for change in changes:
                if change.get("id") is None:
                    cursor = db.execute(
                        "INSERT INTO insights (text, importance, status, provenance, node_id, created_at, updated_at) "
                        "VALUES (?,?,?,?,?,?,?)",
                        [
                            change["text"],
                            change.get("importance", 2),
                            change.get("status", "active"),
                            json.dumps(change.get("provenance") or []),
                            change.get("node_id"),
                            now,
                            now,
                        ],
                    )
                    insight_id, before = cursor.lastrowid, None
                    assert insight_id is not None  # an INSERT just ran
                else:
                    insight_id = change["id"]
                    row = self.database.one("SELECT * FROM insights WHERE id = ?", [insight_id])
                    if row is None:
                        raise NotFound(f"No insight with id {insight_id!r}.")
                    current = Insight.from_row(row)
                    before = _snapshot(current)
                    values = {f: change.get(f, getattr(current, f)) for f in _FIELDS}
                    db.execute(
                        "UPDATE insights SET text = ?, importance = ?, status = ?, provenance = ?, "
                        "updated_at = ? WHERE id = ?",
                        [
                            values["text"],
                            values["importance"],
                            values["status"],
                            json.dumps(values["provenance"]),
                            now,
                            insight_id,
                        ],
                    )
                after = self.get_insight(insight_id)
                db.execute(
                    "INSERT INTO insight_history (insight_id, op, before, after, event_id, at) VALUES (?,?,?,?,?,?)",
                    [insight_id, change["op"], before, _snapshot(after), event_id, now],
                )
                touched.append(insight_id)
        self._sync_index()
        return [self.get_insight(i) for i in touched]

    def record_insight_changes(
        self,
        kind: str,
        what: str,
        changes: list[dict],
        *,
        why: str = "",
        evidence: list | None = None,
        cost_usd: float = 0.0,
        node_id: str | None = None,
        payload: dict | None = None,
        reverts: int | None = None,
    ) -> Event:
        """Record one event and apply its insight changes (``apply_insight_changes``, under the event's id)
        in one transaction: a revert whose changes fail leaves no revert event to refuse a retry."""
        with self._transaction():
            event = self._events.append_event(
                kind,
                what,
                why=why,
                evidence=evidence,
                cost_usd=cost_usd,
                node_id=node_id,
                payload=payload,
                reverts=reverts,
            )
            self.apply_insight_changes(changes, event_id=event.id)
        return event

    def insight_history(self, insight_id: int) -> list[dict]:
        """Every operation on one insight, oldest first, with the insight before and after it."""
        return self._history("insight_id = ?", insight_id)

    def insight_changes_of(self, event_id: int) -> list[dict]:
        """The insight operations one event made, in the order they were applied."""
        return self._history("event_id = ?", event_id)

    def _history(self, where: str, key: int) -> list[dict]:
        rows = self.database.all(f"SELECT * FROM insight_history WHERE {where} ORDER BY id", [key])
        for row in rows:
            row["before"] = None if row["before"] is None else json.loads(row["before"])
            row["after"] = json.loads(row["after"])
        return rows
