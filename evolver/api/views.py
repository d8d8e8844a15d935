"""What inspection shows, as JSON-able dicts: one function per view.

The API returns these, and the CLI prints them; when the daemon is down the
CLI calls the same functions on the store directly, so both paths agree.
"""

from __future__ import annotations

import time
from dataclasses import asdict, fields
from pathlib import Path

from memory import ExperienceStore, Filters, NotFound
from tools import builtin_specs

from ..meta.prune import insight_effects, tool_effects
from ..tree.incumbent import scaffold_of

__all__ = ["task_json", "task_detail", "task_list", "search", "insights", "tools", "tree", "node", "history"]


def task_json(task, store: ExperienceStore, *, attempts: int | None = None) -> dict:
    """A task as clients see it. ``attempts`` counts the agent's attempts (its trajectories), however it
    ran; the inbox's own count of worker leases, which a task run in-process (``evolver run``) never
    gets, is ``claims``."""
    # The fields as they are (``asdict`` deep-copies each one, a sixth of a submit's time in the API): the
    # dict is serialized at once and never changed.
    data = {f.name: getattr(task, f.name) for f in fields(task)}
    data.pop("lease_token", None)  # a fencing detail of the inbox, not the client's business
    data["claims"] = data.pop("attempts")
    data["attempts"] = attempts if attempts is not None else store.reports.trajectory_counts([task.id])[task.id]
    return data


def task_list(
    store: ExperienceStore, *, status: str | None = None, source: str | None = None, limit: int = 50, offset: int = 0
) -> dict:
    tasks = store.inbox.list_tasks(status=status, source=source, limit=limit + 1, offset=offset)
    more = len(tasks) > limit
    counts = store.reports.trajectory_counts([t.id for t in tasks[:limit]])
    short = store.reports.short_ids([t.id for t in tasks[:limit]])
    return {
        "tasks": [{**task_json(t, store, attempts=counts[t.id]), "short_id": short[t.id]} for t in tasks[:limit]],
        "next_offset": offset + limit if more else None,
    }


def memories_of(store: ExperienceStore, trajectory_id: str) -> dict:
    """What an attempt was given from memory: past trajectories as examples, insights (with their
    text), synthesized tools offered."""
    shown = store.exposures.exposures_of(trajectory_id)
    insights = []
    for insight_id in shown.get("insight", []):
        try:
            insights.append({"id": int(insight_id), "text": store.insights.get_insight(int(insight_id)).text})
        except NotFound:
            insights.append({"id": int(insight_id), "text": None})
    return {"examples": shown.get("example", []), "insights": insights, "tools": shown.get("tool", [])}


def task_detail(store: ExperienceStore, task_id: str) -> dict:
    task = store.inbox.get_task(task_id)
    trajectories = []
    for trajectory in store.reports.trajectories_of(task_id):
        outcome = store.reports.outcome(trajectory.id)
        trajectories.append(
            {
                **asdict(trajectory),
                "outcome": asdict(outcome) if outcome else None,
                "memories": memories_of(store, trajectory.id),
                "steps": [asdict(s) for s in store.reports.steps(trajectory.id)],
            }
        )
    return {**task_json(task, store, attempts=len(trajectories)), "trajectories": trajectories}


def search(
    store: ExperienceStore,
    text: str,
    *,
    kind: str = "trajectories",
    k: int = 5,
    success: bool | None = None,
    node: str | None = None,
    since_hours: float | None = None,
) -> dict:
    if kind == "trajectories":
        since = time.time() - since_hours * 3600 if since_hours is not None else None
        hits = store.retrieval.search_trajectories(
            text, k=k, filters=Filters(success=success, node_id=node, since=since)
        )
    elif kind == "insights":
        hits = store.retrieval.search_insights(text, k=k)
    else:
        hits = store.retrieval.search_tools(text, k=k)
    return {"kind": kind, "vector_search": store.index is not None, "hits": [asdict(h) for h in hits]}


INSIGHT_STATUSES = {
    "active": ("active",),
    "probation": ("probation",),
    "retired": ("retired",),
    "current": ("active", "probation"),
    "all": None,
}
"""What ``status`` may ask for: one status, "current" (all but the retired) or "all"."""


def insights(store: ExperienceStore, *, status: str = "active", limit: int = 100) -> dict:
    rows = store.insights.list_insights(status=INSIGHT_STATUSES[status], limit=limit)
    effects = insight_effects(store, rows)
    return {"insights": [{**asdict(i), "effect": effects[i.id].as_dict()} for i in rows]}


def tools(store: ExperienceStore, *, status: str = "active", mcp: list[dict] | None = None) -> dict:
    """Built-in and synthesized tools; with ``mcp`` (the daemon's list of its MCP servers' tools), those
    too, with their calls and measured effect."""
    builtin = [{"name": spec.name, "description": spec.description, "origin": "builtin"} for spec in builtin_specs()]
    synthesized = store.tools.list_tools(status=None if status == "all" else status)
    effects = tool_effects(store, synthesized)
    shown = {
        "builtin": builtin,
        "synthesized": [
            {**asdict(t), "effect": effects[t.name].as_dict(), "parameters": _parameters(store, t)} for t in synthesized
        ],
    }
    if mcp is not None:
        names = [t["name"] for t in mcp if t["name"]]  # a server left out has none
        calls, measured = store.reports.tool_calls(names), store.exposures.effects("tool", dict.fromkeys(names, 0.0))
        shown["mcp"] = [
            {
                **t,
                **calls.get(t["name"], {"uses": 0, "successes": 0}),
                "effect": measured[t["name"]].as_dict() if t["name"] else None,
            }
            for t in mcp
        ]
    return shown


def _parameters(store: ExperienceStore, tool) -> dict | None:
    """A synthesized tool's parameters (JSON schema), from its code as tested; None when its files
    cannot be read (the toolbox does not offer such a tool either)."""
    from tools import ToolFileError, ToolFiles, ToolSpecError, spec_from_source

    try:
        code, _ = ToolFiles(Path(store.data_dir) / "tools").read(tool.name, tool.version, tool.code_hash)
        return spec_from_source(code, name=tool.name).parameters
    except (ToolFileError, ToolSpecError):
        return None


def tree(store: ExperienceStore, quantile: float = 0.05) -> dict:
    """Every node with its counts (own, clade, held-out), posterior mean and bound, and the incumbent."""
    from ..tree.search import tree_view

    return tree_view(store, quantile)


def node(store: ExperienceStore, node_id: str) -> dict:
    found = store.tree.get_node(node_id)
    return {
        **asdict(found),
        "scaffold": scaffold_of(store, found).model_dump(mode="json"),
        "incumbent": store.get_meta("incumbent") == node_id,
        "evaluations": [asdict(e) for e in store.tree.evaluations_of(node_id)],
        "hook_effects": store.tree.hook_effects(node_id),
    }


def history(store: ExperienceStore, *, kind: str | None = None, limit: int = 100) -> dict:
    return {"events": [asdict(e) for e in store.reports.list_events(kind=kind, limit=limit)]}


def resolve_id(store: ExperienceStore, short: str) -> dict:
    """What a short id (a unique prefix) names: its kind and full id; a trajectory's task too."""
    kind, full = store.reports.resolve_id(short)
    found = {"kind": kind, "id": full}
    if kind == "trajectory":
        found["task_id"] = store.attempts.get_trajectory(full).task_id
    return found


def event_detail(store: ExperienceStore, event_id: int) -> dict:
    """One event whole: what, why, its evidence, its payload, and the insight changes it made (each
    insight before and after) or the tool changes it recorded."""
    event = store.reports.get_event(event_id)
    reverted_by = [e.id for e in store.reports.list_events(kind="revert", limit=1000) if e.reverts == event_id]
    return {
        **asdict(event),
        "insight_changes": store.insights.insight_changes_of(event_id),
        "tool_changes": (event.payload or {}).get("tool_changes", []),
        "reverted_by": reverted_by,
    }


def tool_detail(store: ExperienceStore, name: str) -> dict:
    """A synthesized tool by name: every version with its status, usage, measured effect, the events
    that changed it, its code and its tests."""
    from tools import ToolFileError, ToolFiles

    versions = [t for t in store.tools.list_tools(status=None) if t.name == name]
    if not versions:
        raise NotFound(f"No synthesized tool named {name!r}; `evolver tools --status all` lists them")
    files = ToolFiles(Path(store.data_dir) / "tools")
    effect = tool_effects(store, versions)[name].as_dict()
    out = []
    for tool in sorted(versions, key=lambda t: t.version):
        try:
            code, tests = files.read(tool.name, tool.version, tool.code_hash)
        except ToolFileError as exc:
            code, tests = None, f"(its files cannot be read: {exc})"
        out.append(
            {
                **asdict(tool),
                "code": code,
                "tests": tests,
                "events": [
                    {"id": e.id, "at": e.at, "kind": e.kind, "what": e.what} for e in store.tools.tool_events(tool.id)
                ],
            }
        )
    return {"name": name, "effect": effect, "versions": out}
