"""Undoing an evolution event: its insight or tool changes are put back as they were, as a new event.

Nothing is deleted: a revert is itself an event (``reverts`` names the one it
undoes). Each insight it restores gets a REVERT entry in its history; each
tool goes back to the status it had (a tool the event registered becomes
"reverted", a version it replaced or retired is active again). A revert that
would silently undo later changes to the same insights or tools is refused.
Promotions are undone with `evolver rollback`.
"""

from __future__ import annotations

from memory import Event, ExperienceStore

__all__ = ["RevertError", "revert_event"]


class RevertError(ValueError):
    """The event cannot be reverted; the message says why."""


def revert_event(store: ExperienceStore, event_id: int, *, why: str = "reverted by hand") -> Event:
    event = store.get_event(event_id)  # NotFound names the id
    if event.kind in ("promote", "rollback", "seed"):
        raise RevertError(f"event {event_id} changed the served node; use `evolver rollback` to serve another")
    rows = store.insight_changes_of(event_id)
    tool_changes = event.payload.get("tool_changes") or []
    if not rows and not tool_changes:
        raise RevertError(f"event {event_id} ({event.kind}) changed no insight or tool; there is nothing to revert")
    if any(e.reverts == event_id for e in store.list_events(kind="revert", limit=10_000)):
        raise RevertError(f"event {event_id} was already reverted")
    if tool_changes:
        return _revert_tools(store, event, tool_changes, why)
    for insight_id in {r["insight_id"] for r in rows}:
        last = store.insight_history(insight_id)[-1]
        if last["event_id"] != event_id:
            raise RevertError(f"insight {insight_id} changed again after event {event_id} (event "
                              f"{last['event_id']}); revert that first")
    restored: dict[int, dict] = {}
    for row in rows:  # the state before the event's first change to each insight
        restored.setdefault(row["insight_id"], row["before"])
    changes = [{"op": "REVERT", "id": insight_id, "status": "retired"} if before is None
               else {"op": "REVERT", "id": insight_id, **before} for insight_id, before in restored.items()]
    # The event and its changes commit together: an event left alone would refuse every retry.
    return store.record_insight_changes("revert", f"reverted event {event_id} ({event.kind}): {len(changes)} "
                                        "insights restored", changes, why=why, evidence=event.evidence,
                                        reverts=event_id)


def _revert_tools(store: ExperienceStore, event: Event, changes: list[dict], why: str) -> Event:
    status: dict[int, str] = {}
    for change in changes:
        tool = store.get_tool(change["id"])
        if tool.status != change["after"]:
            raise RevertError(f"tool {tool.name} v{tool.version} changed again after event {event.id} (it is "
                              f"{tool.status} now); revert that change first")
        status[tool.id] = "reverted" if change["before"] is None else change["before"]
    for tool_id, after in status.items():
        if after == "active":
            tool = store.get_tool(tool_id)
            other = store.active_tool(tool.name)
            if other is not None and other.id not in status:
                raise RevertError(f"tool {tool.name} v{tool.version} cannot be active again: v{other.version} "
                                  f"is active now (event {other.event_id}); revert that first")
    names = ", ".join(sorted({f"{c['name']} v{c['version']}" for c in changes}))
    return store.apply_tool_changes("revert", f"reverted event {event.id} ({event.kind}): {names} restored",
                                    why=why, evidence=event.evidence, reverts=event.id, status=status)
