"""The served scaffold: the tree's root, the incumbent, promotion and rollback.

The daemon serves one node of the self-modification tree, the incumbent. Its
id lives in the store (``meta.incumbent``), so every process and every restart
agrees on it. Changing it is one committed write plus an evolution event that
says from which node to which and why; rolling back reads those events.
"""

from __future__ import annotations

import contextlib

from memory import Event, ExperienceStore, Node, NotFound

from ..agent.scaffold import Scaffold, load_scaffold

__all__ = ["IncumbentError", "ensure_root", "incumbent", "promote", "rollback", "scaffold_of"]

KEY = "incumbent"
UNSERVABLE = ("invalid", "proposed")


class IncumbentError(ValueError):
    """A promotion or rollback that cannot be done; the message says why."""


def ensure_root(store: ExperienceStore, seed: Scaffold) -> Node:
    """Make sure the tree has a root (the seed scaffold) and an incumbent; return the incumbent."""
    current = store.get_meta(KEY)
    if current is not None:
        return store.tree.get_node(current)
    store.tree.put_scaffold(seed.hash, seed.canonical_json())
    roots = [n for n in store.tree.list_nodes() if n.parent_id is None]
    root = roots[0] if roots else store.tree.add_node(seed.hash, status="promoted", rationale="the seed scaffold")
    store.set_meta(KEY, root.id)
    store.reports.append_event(
        "seed",
        f"serving the seed scaffold as node {root.id}",
        node_id=root.id,
        payload={"from": None, "to": root.id, "scaffold_hash": root.scaffold_hash},
    )
    return root


def incumbent(store: ExperienceStore) -> Node | None:
    node_id = store.get_meta(KEY)
    return None if node_id is None else store.tree.get_node(node_id)


def scaffold_of(store: ExperienceStore, node: Node) -> Scaffold:
    return load_scaffold(store.tree.get_scaffold(node.scaffold_hash))


def _switch(store: ExperienceStore, kind: str, node_id: str, why: str, *, reverts: int | None = None) -> Event:
    # One transaction: the checks see what they change (two switches cannot interleave), and a
    # crash leaves either no switch or the switch with its node status and its event.
    with store.transaction():
        try:
            node = store.tree.get_node(node_id)
        except NotFound:
            raise IncumbentError(f"there is no node {node_id!r}; `evolver tree` lists them") from None
        if node.status in UNSERVABLE:
            raise IncumbentError(f"node {node_id} is {node.status}; only a validated node can be served")
        scaffold_of(store, node)  # refuse a node whose snapshot no longer loads
        previous = store.get_meta(KEY)
        if previous == node_id:
            raise IncumbentError(f"node {node_id} is already the incumbent")
        store.set_meta(KEY, node_id)
        if node.status != "promoted":
            store.tree.set_node_status(node_id, "promoted")
        # "promoted" is the node being served: the one it replaces goes back to evaluated (two nodes
        # showed as promoted after a rollback).
        if previous is not None:
            with contextlib.suppress(NotFound):
                if store.tree.get_node(previous).status == "promoted":
                    store.tree.set_node_status(previous, "evaluated")
        return store.reports.append_event(
            kind,
            f"serving node {node_id} instead of {previous}",
            why=why,
            node_id=node_id,
            payload={"from": previous, "to": node_id},
            reverts=reverts,
        )


def promote(store: ExperienceStore, node_id: str, *, why: str = "promoted by hand") -> Event:
    """Serve ``node_id`` from the next task on."""
    return _switch(store, "promote", node_id, why)


def rollback(store: ExperienceStore, node_id: str | None = None, *, why: str = "rolled back by hand") -> Event:
    """Serve ``node_id``, or without one the node served before the current incumbent.

    Rolling back again goes further back, as an undo does: the current incumbent came either by a
    promotion or by a rollback to a named node, and the node served before that is the target; a
    rollback without a node only undid such an event, so it is skipped (it re-served the node just
    rolled back from)."""
    if node_id is not None:
        return _switch(store, "rollback", node_id, why)
    current = store.get_meta(KEY)
    for event in store.reports.list_events(limit=1000):
        if event.kind == "rollback" and event.reverts is not None:
            continue
        if event.kind in ("promote", "rollback") and event.payload.get("to") == current:
            target = event.payload.get("from")
            if target is None:
                break
            return _switch(store, "rollback", target, why, reverts=event.id)
    raise IncumbentError("there is no earlier incumbent to roll back to")
