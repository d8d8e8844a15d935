"""Undoing an evolution event: its insight changes are put back as they were, as a new event.

Nothing is deleted: a revert is itself an event (``reverts`` names the one it
undoes), and each insight it restores gets a REVERT entry in its history. A
revert that would silently undo later changes to the same insights is refused.
Promotions are undone with `evolver rollback`.
"""

from __future__ import annotations

from memory import Event, Store

__all__ = ["RevertError", "revert_event"]


class RevertError(ValueError):
    """The event cannot be reverted; the message says why."""


def revert_event(store: Store, event_id: int, *, why: str = "reverted by hand") -> Event:
    event = store.get_event(event_id)  # NotFound names the id
    if event.kind in ("promote", "rollback", "seed"):
        raise RevertError(f"event {event_id} changed the served node; use `evolver rollback` to serve another")
    rows = store.insight_changes_of(event_id)
    if not rows:
        raise RevertError(f"event {event_id} ({event.kind}) changed no insight; there is nothing to revert")
    if any(e.reverts == event_id for e in store.list_events(kind="revert", limit=10_000)):
        raise RevertError(f"event {event_id} was already reverted")
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
    revert = store.append_event("revert", f"reverted event {event_id} ({event.kind}): {len(changes)} insights "
                                          "restored", why=why, evidence=event.evidence, reverts=event_id)
    store.apply_insight_changes(changes, event_id=revert.id)
    return revert
