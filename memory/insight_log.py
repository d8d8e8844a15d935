"""Changes to the insight list, applied together or not at all, each with its before and after."""

from __future__ import annotations

import json
import time

from ._host import StoreHost
from .errors import NotFound
from .records import Event, Insight

__all__ = ["InsightLog"]

_FIELDS = ("text", "importance", "status", "provenance")


def _snapshot(insight: Insight) -> str:
    return json.dumps({f: getattr(insight, f) for f in _FIELDS})


class InsightLog(StoreHost):
    """The part of ``Store`` that applies the meta-agent's insight operations (a mixin)."""

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
        self.sync_index()
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
        with self.transaction():
            event = self.reports.append_event(
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
