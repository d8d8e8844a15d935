"""The synthesized tools: their rows and versions, their use, the real calls the agent made, and changes to
them, each applied together with the event that records it (``store.tools``, a part composed over the
store's database, handed the event log and the index's sync).

A tool change is a new tool row (a new tool, or a new version of one) and/or
status changes of existing rows (replaced, retired, reverted, active again).
The event, the rows and an optional watermark move are one transaction, so
the history never shows a change that did not happen and a crash never leaves
a tool without its event. The event's payload keeps every change with its
status before and after, which is what a revert puts back.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from .database import Database, required
from .errors import NotFound
from .records import Event, ToolRecord

__all__ = ["ToolLog", "NewTool", "RecordedCall"]


@dataclass(frozen=True)
class NewTool:
    name: str
    description: str
    code_hash: str
    version: int
    node_id: str | None = None


@dataclass(frozen=True)
class RecordedCall:
    """One real tool call from a trajectory: what was asked and what came back."""

    trajectory_id: str
    task_id: str | None
    seq: int  # the step that made the call
    name: str
    arguments: dict
    output: str
    ok: bool
    success: bool | None  # the trajectory's outcome
    finished_at: float | None = None  # when the trajectory ended


class _Events(Protocol):
    def get_event(self, event_id: int) -> Event: ...


class ToolLog:
    """The synthesized tools and their changes (see the module)."""

    def __init__(self, database: Database, *, events: _Events, sync_index: Callable[[], object]) -> None:
        self.database = database
        self._events = events
        self._sync_index = sync_index

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
        self._sync_index()
        return self.get_tool(tool_id)

    def set_tool_status(self, tool_id: int, status: str) -> ToolRecord:
        with self.database.write() as db:
            cursor = db.execute(
                "UPDATE tools SET status = ?, updated_at = ? WHERE id = ?", [status, time.time(), tool_id]
            )
            if cursor.rowcount == 0:
                raise NotFound(f"No tool with id {tool_id!r}.")
        self._sync_index()
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

    def apply_tool_changes(
        self,
        kind: str,
        what: str,
        *,
        why: str,
        evidence: list | None = None,
        cost_usd: float = 0.0,
        node_id: str | None = None,
        payload: dict | None = None,
        new: NewTool | list[NewTool] | None = None,
        status: dict[int, str] | None = None,
        reverts: int | None = None,
        meta: dict[str, str] | None = None,
    ) -> Event:
        """Record one event and apply its tool changes (and ``meta`` values) in one transaction.

        ``new`` is a new row (or several: an imported pack's tools, one event).
        ``status`` maps tool ids to their new status. The event's payload gains
        ``tool_changes``: ``[{"id", "name", "version", "before", "after"}]``,
        ``before`` None for a new row.
        """
        now = time.time()
        changes: list[dict] = []
        with self.database.write() as db:
            for tool_id, after in (status or {}).items():
                row = db.execute("SELECT name, version, status FROM tools WHERE id = ?", [tool_id]).fetchone()
                if row is None:
                    raise NotFound(f"No tool with id {tool_id!r}.")
                db.execute("UPDATE tools SET status = ?, updated_at = ? WHERE id = ?", [after, now, tool_id])
                changes.append({"id": tool_id, "name": row[0], "version": row[1], "before": row[2], "after": after})
            new_ids = []
            for tool in [] if new is None else [new] if isinstance(new, NewTool) else new:
                # the row first, so the event (append-only) can name it
                new_ids.append(
                    db.execute(
                        "INSERT INTO tools (name, version, description, code_hash, status, origin, node_id, "
                        "created_at, updated_at) VALUES (?,?,?,?,'active','synthesized',?,?,?)",
                        [tool.name, tool.version, tool.description, tool.code_hash, tool.node_id, now, now],
                    ).lastrowid
                )
                changes.append(
                    {"id": new_ids[-1], "name": tool.name, "version": tool.version, "before": None, "after": "active"}
                )
            event_id = db.execute(
                "INSERT INTO events (at, kind, what, why, evidence, cost_usd, node_id, payload, reverts) "
                "VALUES (?,?,?,?,?,?,?,?,?)",
                [
                    now,
                    kind,
                    what,
                    why,
                    json.dumps(evidence or []),
                    cost_usd,
                    node_id,
                    json.dumps({**(payload or {}), "tool_changes": changes}),
                    reverts,
                ],
            ).lastrowid
            assert event_id is not None  # an INSERT just ran
            for new_id in new_ids:
                db.execute("UPDATE tools SET event_id = ? WHERE id = ?", [event_id, new_id])
            for key, value in (meta or {}).items():
                db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", [key, value])
        self._sync_index()
        return self._events.get_event(event_id)

    def active_tool(self, name: str) -> ToolRecord | None:
        row = self.database.one(
            "SELECT * FROM tools WHERE name = ? AND status = 'active' ORDER BY version DESC LIMIT 1", [name]
        )
        return None if row is None else ToolRecord.from_row(row)

    def next_tool_version(self, name: str) -> int:
        return self.database.all("SELECT coalesce(max(version), 0) + 1 AS v FROM tools WHERE name = ?", [name])[0]["v"]

    def tool_events(self, tool_id: int) -> list[Event]:
        """Events that changed this tool, oldest first."""
        rows = self.database.all(
            "SELECT e.* FROM events e, json_each(e.payload, '$.tool_changes') c "
            "WHERE json_extract(c.value, '$.id') = ? ORDER BY e.id",
            [tool_id],
        )
        return [Event.from_row(r) for r in rows]

    def recorded_calls(self, trajectory_ids: list[str], *, tool: str | None = None) -> list[RecordedCall]:
        """The tool calls these trajectories made, each paired with the observation it got."""
        if not trajectory_ids:
            return []
        marks = ",".join("?" * len(trajectory_ids))
        rows = self.database.all(
            f"SELECT s.trajectory_id, s.seq, s.role, s.content, s.tool_calls, s.tool_results, t.task_id, "
            f"t.finished_at, o.success FROM steps s JOIN trajectories t ON t.id = s.trajectory_id LEFT JOIN outcomes o "
            f"ON o.trajectory_id = s.trajectory_id WHERE s.trajectory_id IN ({marks}) "
            f"AND (s.tool_calls IS NOT NULL OR s.tool_results IS NOT NULL) ORDER BY s.trajectory_id, s.seq",
            list(trajectory_ids),
        )
        calls: list[RecordedCall] = []
        pending: dict[tuple[str, str], tuple[dict, dict]] = {}  # (trajectory, call id) -> (call, its step row)
        for row in rows:
            for call in json.loads(row["tool_calls"] or "[]"):
                if isinstance(call, dict) and isinstance(call.get("arguments"), dict) and not call.get("error"):
                    pending[(row["trajectory_id"], str(call.get("id")))] = (call, row)
            for result in json.loads(row["tool_results"] or "[]"):
                key = (row["trajectory_id"], str(result.get("id")))
                if key not in pending:
                    continue
                call, origin = pending.pop(key)
                if tool is not None and call.get("name") != tool:
                    continue
                success = origin["success"]
                calls.append(
                    RecordedCall(
                        trajectory_id=row["trajectory_id"],
                        task_id=row["task_id"],
                        seq=origin["seq"],
                        name=call.get("name", ""),
                        arguments=call["arguments"],
                        output=row["content"],
                        ok=bool(result.get("ok", True)),
                        success=None if success is None else bool(success),
                        finished_at=row["finished_at"],
                    )
                )
        return calls
