"""Undoing an evolution event: its insight, tool and node changes are put back as they were, as a new event.

Nothing is deleted: a revert is itself an event (``reverts`` names the one it
undoes), and everything it puts back commits with it in one transaction. Each
insight it restores gets a REVERT entry in its history; each tool goes back to
the status it had (a tool the event registered becomes "reverted", a version it
replaced or retired is active again); a node the event added (an imported
pack's scaffold, ``node_changes`` in its payload) is withdrawn: marked invalid,
so it is never served. A revert that would silently undo later changes to the
same insights or tools is refused (later changes to an insight that came back
to what the event left are not in the way), and so is withdrawing the node
served now.
Promotions are undone with `evolver rollback`.
"""

from __future__ import annotations

from memory import Event, ExperienceStore

__all__ = ["RevertError", "revert_event"]

INCUMBENT_KEY = "incumbent"  # the store's meta key of the served node (evolver.tree.incumbent)


class RevertError(ValueError):
    """The event cannot be reverted; the message says why."""


def revert_event(store: ExperienceStore, event_id: int, *, why: str = "reverted by hand") -> Event:
    event = store.reports.get_event(event_id)  # NotFound names the id
    if event.kind in ("promote", "rollback", "seed"):
        raise RevertError(f"event {event_id} changed the served node; use `evolver rollback` to serve another")
    rows = store.insights.insight_changes_of(event_id)
    tool_changes = event.payload.get("tool_changes") or []
    node_changes = event.payload.get("node_changes") or []
    if not rows and not tool_changes and not node_changes:
        raise RevertError(f"event {event_id} ({event.kind}) changed no insight or tool; there is nothing to revert")
    if any(e.reverts == event_id for e in store.reports.list_events(kind="revert", limit=10_000)):
        raise RevertError(f"event {event_id} was already reverted")
    # Every check before any change: a revert is whole or not at all.
    insights = _insights_before(store, event_id, rows)
    status = _tools_before(store, event, tool_changes)
    nodes = _nodes_before(store, event, node_changes)
    parts = []
    if insights:
        parts.append(f"{len(insights)} insights restored")
    if status:
        names = sorted({f"{c['name']} v{c['version']}" for c in tool_changes})
        parts.append(f"{', '.join(names)} restored")
    if nodes:
        parts.append(f"node{'s' if len(nodes) > 1 else ''} {', '.join(n['id'] for n in nodes)} withdrawn")
    what = f"reverted event {event.id} ({event.kind}): {'; '.join(parts)}"
    if not status and not nodes:
        # The event and its changes commit together: an event left alone would refuse every retry.
        return store.insights.record_insight_changes(
            "revert", what, insights, why=why, evidence=event.evidence, reverts=event_id
        )
    with store.transaction():
        revert = store.tools.apply_tool_changes(
            "revert",
            what,
            why=why,
            evidence=event.evidence,
            reverts=event.id,
            status=status,
            payload={"node_changes": nodes} if nodes else None,
        )
        if insights:
            store.insights.apply_insight_changes(insights, event_id=revert.id)
        for node in nodes:
            store.tree.set_node_status(node["id"], node["after"], reason=f"{why} (event {event.id} reverted)")
    return revert


def _insights_before(store: ExperienceStore, event_id: int, rows: list[dict]) -> list[dict]:
    """The REVERT changes that put each insight the event changed back as it was before the event."""
    for insight_id in {r["insight_id"] for r in rows}:
        history = store.insights.insight_history(insight_id)
        left = [h for h in history if h["event_id"] == event_id][-1]["after"]
        last = history[-1]
        # Later changes that came back to what the event left (an approval, then its revert) are not in
        # the way; any other later change would be undone silently.
        if last["event_id"] != event_id and last["after"] != left:
            raise RevertError(
                f"insight {insight_id} changed again after event {event_id} (event "
                f"{last['event_id']}); revert that first"
            )
    restored: dict[int, dict] = {}
    for row in rows:  # the state before the event's first change to each insight
        restored.setdefault(row["insight_id"], row["before"])
    return [
        {"op": "REVERT", "id": insight_id, "status": "retired"}
        if before is None
        else {"op": "REVERT", "id": insight_id, **before}
        for insight_id, before in restored.items()
    ]


def _tools_before(store: ExperienceStore, event: Event, changes: list[dict]) -> dict[int, str]:
    """Each tool the event changed, mapped to the status it goes back to."""
    status: dict[int, str] = {}
    for change in changes:
        tool = store.tools.get_tool(change["id"])
        if tool.status != change["after"]:
            raise RevertError(
                f"tool {tool.name} v{tool.version} changed again after event {event.id} (it is "
                f"{tool.status} now); revert that change first"
            )
        status[tool.id] = "reverted" if change["before"] is None else change["before"]
    for tool_id, after in status.items():
        if after == "active":
            tool = store.tools.get_tool(tool_id)
            other = store.tools.active_tool(tool.name)
            if other is not None and other.id not in status:
                raise RevertError(
                    f"tool {tool.name} v{tool.version} cannot be active again: v{other.version} "
                    f"is active now (event {other.event_id}); revert that first"
                )
    return status


def _nodes_before(store: ExperienceStore, event: Event, changes: list[dict]) -> list[dict]:
    """Each node the event added (withdrawn: invalid) or whose status it set (put back)."""
    out = []
    for change in changes:
        node = store.tree.get_node(change["id"])
        if store.get_meta(INCUMBENT_KEY) == node.id:
            raise RevertError(
                f"node {node.id} is served now; serve another first (`evolver rollback`), then revert event {event.id}"
            )
        if change["before"] is None:  # added by the event: whatever the search made of it since
            after = "invalid"
        elif node.status != change["after"]:
            raise RevertError(f"node {node.id} changed again after event {event.id} (it is {node.status} now)")
        else:
            after = change["before"]
        out.append({"id": node.id, "before": node.status, "after": after})
    return out
