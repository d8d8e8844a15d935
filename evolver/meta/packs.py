"""Learned packs: insights, synthesized tools and a node's scaffold, carried from one installation to another.

Export gathers the active items with their provenance into a pack file
(``evolver.meta.packfile``: its layout, why a tar, and how a pack is verified).

Importing a verified pack goes through what the meta-agent's own changes go
through: every tool through quarantine in the sandbox, with the checks of
tool synthesis (``synthesize.candidate_spec`` and ``synthesize.vet_tool``: its
tests, and the tests of the version it would replace, a duplicate of another
tool refused), insights through distillation's ADD with its similarity
dedup (``insights.plan_changes``), on probation (``probation``). A tool that fails is refused
with its reason while the rest may still come in (a failing tool is not
tampering). Nothing local is overwritten silently: a tool under the name of an
active one is its next version only if it also passes that one's tests (as
synthesis does it), one whose code is already here is skipped, an insight too
similar to an active one is skipped, and each is reported. A node's scaffold
is checked as the proposer's edits are and becomes a proposed child of the
incumbent (a store without a tree gets its seed root first, as the daemon's
start makes it), which the tree search validates (hooks in their sandbox, a
smoke task) and evaluates like any other: never served until it earns a
promotion. Everything imported is one ``import`` event that `evolver history
revert` undoes (``revert.revert_event``).

What quarantine cannot judge is intent: an insight is an instruction the agent
will read, and a tool's docstring is shown to the model. Both are plain files
in the pack, to be read before importing. An insight therefore comes in on
probation: no person's task is shown it until a person approves it or it is
measured to help on the promotion split. A tool, once through quarantine, the
prune job measures like anything learned here and retires if it does not help.
"""

from __future__ import annotations

import base64
from dataclasses import asdict, dataclass
from pathlib import Path

from memory import ExperienceStore, NewTool, NotFound
from tools import BUILTIN_SOURCES, ToolFileError, ToolFiles, code_hash

from ..agent.scaffold import ScaffoldError, load_scaffold
from ..engine import Engine
from ..text import clip
from ..tree.incumbent import ensure_root, incumbent, scaffold_of
from ..tree.proposer import EDITABLE, InvalidProposal, apply_edit, scaffold_diff
from .insights import InsightOp, InsightOpError, parse_ops, plan_changes
from .packfile import (
    MAX_INSIGHTS,
    MAX_PACK_BYTES,
    PROMPT_CHARS,
    PROMPTS,
    Pack,
    PackError,
    read_pack,
    write_pack,
)
from .probation import PROBATION
from .prune import insight_effects, tool_effects
from .synthesize import ToolRejected, candidate_spec, vet_tool

__all__ = ["MAX_PACK_BYTES", "PackError", "export_json", "export_pack", "import_pack", "read_pack"]

# --- export -------------------------------------------------------------------------------------------


def _prompts(store: ExperienceStore, ids: list) -> tuple[int, list[str]]:
    """How many source trajectories, and a few of their prompts (only learnable ones: a held-out task's
    prompt never leaves in a pack)."""
    trajectories = [i for i in ids if isinstance(i, str) and i.startswith("traj_")]
    shown = []
    for trajectory_id in sorted(store.attempts.learnable(trajectories))[:PROMPTS]:
        try:
            shown.append(clip(store.attempts.get_trajectory(trajectory_id).prompt, PROMPT_CHARS, one_line=True))
        except NotFound:
            continue
    return len(trajectories), shown


def _effect(effect) -> dict:
    data = effect.as_dict()
    return {k: data[k] for k in ("exposures", "helped", "hurt", "difference", "interval")}


def _event_provenance(store: ExperienceStore, event_id: int | None) -> dict:
    if event_id is None:
        return {}
    try:
        event = store.reports.get_event(event_id)
    except NotFound:
        return {}
    packs = [f"pack:{event.payload['pack'][:16]}"] if event.kind == "import" and event.payload.get("pack") else []
    return {
        "event": event.kind,
        "made_at": event.at,
        "cost_usd": event.cost_usd,
        "packs": packs,
        **({"tests": clip(event.payload["quarantine"], 500)} if event.payload.get("quarantine") else {}),
        "test_results": [
            {
                "name": clip(str(t.get("name")), 200),
                "ok": bool(t.get("ok")),
                "error": None if t.get("error") is None else clip(str(t["error"]), 1000),
            }
            for t in (event.payload.get("tests") or [])[:200]
            if isinstance(t, dict)
        ],
    }


def _insight_items(store: ExperienceStore, model: str | None) -> list[tuple[dict, bytes]]:
    rows = store.insights.list_insights(status="active", limit=MAX_INSIGHTS)
    effects = insight_effects(store, rows)
    items = []
    for n, insight in enumerate(rows, start=1):
        count, prompts = _prompts(store, list(insight.provenance))
        history = store.insights.insight_history(insight.id)
        made = _event_provenance(store, history[0]["event_id"] if history else None)
        made.pop("test_results", None)
        packs = sorted(
            {*made.pop("packs", []), *(p for p in insight.provenance if isinstance(p, str) and p.startswith("pack:"))}
        )[:20]
        provenance = {
            "trajectories": count,
            "prompts": prompts,
            "packs": packs,
            "model": model,
            **made,
            "effect": _effect(effects[insight.id]),
        }
        items.append(
            (
                {"file": f"insights/{n:04d}.txt", "importance": insight.importance, "provenance": provenance},
                insight.text.encode(),
            )
        )
    return items


def _tool_items(
    store: ExperienceStore, model: str | None, names: set[str] | None, left_out: list[dict]
) -> list[tuple[dict, bytes, bytes]]:
    rows = [
        t
        for t in store.tools.list_tools(status="active")
        if t.origin == "synthesized" and (names is None or t.name in names)
    ]
    effects = tool_effects(store, rows)
    files = ToolFiles(Path(store.data_dir) / "tools")
    items = []
    for tool in rows:
        try:
            code, tests = files.read(tool.name, tool.version, tool.code_hash)
        except ToolFileError as exc:  # never ship what is not what was tested
            left_out.append({"kind": "tool", "name": tool.name, "reason": str(exc)})
            continue
        made = _event_provenance(store, tool.event_id)
        evidence = []
        if tool.event_id is not None:
            evidence = store.reports.get_event(tool.event_id).evidence
        count, prompts = _prompts(store, list(evidence))
        provenance = {
            "trajectories": count,
            "prompts": prompts,
            "model": model,
            **made,
            "uses": tool.uses,
            "successes": tool.successes,
            "failures": tool.failures,
            "effect": _effect(effects[tool.name]),
        }
        entry = {
            "name": tool.name,
            "version": tool.version,
            "description": clip(tool.description, 4000),
            "code": f"tools/{tool.name}/code.py",
            "tests": f"tools/{tool.name}/tests.py",
            "code_hash": code_hash(code, tests),
            "provenance": provenance,
        }
        items.append((entry, code.encode(), tests.encode()))
    return items


def _node_item(store: ExperienceStore, node_id: str, model: str | None) -> tuple[dict, bytes, set[str]]:
    node = store.tree.get_node(node_id)  # NotFound names it
    scaffold = scaffold_of(store, node)
    counts = {"train": [0, 0], "test": [0, 0]}
    for evaluation in store.tree.evaluations_of(node.id):
        if evaluation.success is not None and evaluation.split in counts:
            counts[evaluation.split][0 if evaluation.success else 1] += 1
    provenance = {
        "model": model,
        "cost_usd": node.cost_usd,
        "train": {"successes": counts["train"][0], "failures": counts["train"][1]},
        "held_out": {"successes": counts["test"][0], "failures": counts["test"][1]},
    }
    entry = {
        "id": node.id,
        "file": "node/scaffold.json",
        "scaffold_hash": scaffold.hash,
        "status": node.status,
        "rationale": clip(node.rationale, 4000),
        "provenance": provenance,
    }
    synthesized = {name for name in scaffold.tools if name not in BUILTIN_SOURCES}
    return entry, scaffold.canonical_json().encode(), synthesized


def export_pack(
    store: ExperienceStore,
    *,
    insights: bool = False,
    tools: bool = False,
    node: str | None = None,
    model: str | None = None,
) -> tuple[bytes, dict]:
    """A pack of the active insights (``insights``), the active synthesized tools (``tools``) and node
    ``node``'s scaffold with the synthesized tools it names; with none of them, insights and tools.
    ``model`` is the model this installation is configured with (the store does not record which
    model wrote each item). Returns the pack's bytes and a summary; PackError when it would be empty."""
    if not (insights or tools or node):
        insights = tools = True
    left_out: list[dict] = []
    files: dict[str, bytes] = {}
    manifest: dict = {"model": model, "insights": [], "tools": [], "node": None}
    wanted: set[str] | None = None if tools else set()
    if node:
        entry, body, named = _node_item(store, node, model)
        manifest["node"] = entry
        files[entry["file"]] = body
        if wanted is not None:
            wanted |= named
    if insights:
        for entry, text in _insight_items(store, model):
            manifest["insights"].append(entry)
            files[entry["file"]] = text
    if wanted is None or wanted:
        for entry, code, tests in _tool_items(store, model, wanted, left_out):
            manifest["tools"].append(entry)
            files[entry["code"]], files[entry["tests"]] = code, tests
        if wanted:
            missing = wanted - {t["name"] for t in manifest["tools"]}
            left_out += [
                {
                    "kind": "tool",
                    "name": name,
                    "reason": "the scaffold names it, but it is not an active synthesized tool here",
                }
                for name in sorted(missing)
            ]
    if not (manifest["insights"] or manifest["tools"] or manifest["node"]):
        raise PackError(
            "nothing to export: there are no active insights or synthesized tools (`evolver insights`, `evolver tools`)"
        )
    data, digest = write_pack(manifest, files)
    summary = {
        "id": digest[:16],
        "sha256": digest,
        "bytes": len(data),
        "insights": len(manifest["insights"]),
        "tools": [t["name"] for t in manifest["tools"]],
        "node": manifest["node"]["id"] if manifest["node"] else None,
        "left_out": left_out,
    }
    return data, summary


def export_json(
    store: ExperienceStore,
    model: str | None = None,
    *,
    insights: bool = False,
    tools: bool = False,
    node: str | None = None,
) -> dict:
    """``export_pack`` as JSON (the API's answer, and the CLI's when the daemon is down): the summary and
    the pack's bytes in base64."""
    data, summary = export_pack(store, insights=insights, tools=tools, node=node, model=model)
    return {**summary, "pack": base64.b64encode(data).decode("ascii")}


# --- import ---------------------------------------------------------------------------------------------


@dataclass
class _Outcome:
    kind: str  # "insight", "tool" or "node"
    name: str
    status: str  # "added", "skipped" or "refused"
    reason: str = ""
    detail: dict | None = None


def _vet_tools(engine: Engine, files: ToolFiles, pack: Pack, node_id: str | None, outcomes: list[_Outcome]):
    """Each tool of the pack through quarantine, as tool synthesis checks its own; returns those that pass."""
    store = engine.store
    passed = []
    local = store.tools.list_tools(status=None)
    for tool in pack.tools:
        same = [t for t in local if t.name == tool.name and t.code_hash == tool.code_hash]
        if same:
            here = same[-1]
            reason = (
                f"v{here.version} here has this code and tests"
                if here.status == "active"
                else f"v{here.version} here has this code and tests and is {here.status}, as decided here; "
                f"`evolver tools show {tool.name}` shows the event that did it, which `evolver history "
                "revert` undoes"
            )
            outcomes.append(_Outcome("tool", tool.name, "skipped", reason))
            continue
        held = engine.registry.get(tool.name)
        if held is not None and held.origin not in ("synthesized", "builtin"):  # a built-in: candidate_spec says
            outcomes.append(_Outcome("tool", tool.name, "refused", f"the name belongs to a {held.origin} tool here"))
            continue
        if not engine.sandbox.isolated:
            outcomes.append(
                _Outcome(
                    "tool",
                    tool.name,
                    "refused",
                    "the sandbox is degraded (no bubblewrap): a pack's code is never run without isolation",
                )
            )
            continue
        try:
            spec = candidate_spec(tool.name, tool.code, tool.tests, node_id=node_id)
            replaced, report = vet_tool(engine, files, spec)
        except ToolRejected as exc:
            outcomes.append(_Outcome("tool", tool.name, "refused", str(exc)))
            continue
        passed.append((tool, spec, replaced, report))
    return passed


def _plan_insights(engine: Engine, pack: Pack, outcomes: list[_Outcome]) -> list[dict]:
    """The changes distillation's ADD would make of the pack's insights, less those its similarity dedup
    would merge into an active insight here (skipped: a pack never upvotes or edits a local insight)."""
    store, e = engine.store, engine.config.evolution
    known = {" ".join(i.text.split()): i for i in store.insights.list_insights(status=None, limit=100_000)}
    ops: list[tuple[InsightOp, str, dict]] = []
    seen: dict[str, int] = {}
    for insight in pack.insights:
        label = clip(insight.text, 80, one_line=True)
        try:
            (op,) = parse_ops([{"op": "ADD", "text": insight.text}], shown=0, max_ops=1)
        except InsightOpError as exc:
            outcomes.append(
                _Outcome("insight", label, "refused", str(exc).replace("operation 1", f"insight {insight.number}"))
            )
            continue
        if op.text in seen:
            outcomes.append(
                _Outcome("insight", label, "skipped", f"the same text as the pack's insight {seen[op.text]}")
            )
            continue
        seen[op.text] = insight.number
        here = known.get(op.text)
        if here is not None:
            outcomes.append(
                _Outcome("insight", label, "skipped", f"insight {here.id} here has this text ({here.status})")
            )
            continue
        ops.append((op, label, insight.provenance))
    planned = (
        plan_changes(
            store,
            [op for op, _, _ in ops],
            [],
            provenance=[f"pack:{pack.id}"],
            cap=e.max_insights,
            merge_threshold=e.insight_merge_threshold,
        )
        if ops
        else []
    )
    changes = []
    for (_, label, provenance), change in zip(ops, planned):
        if change["op"] != "ADD":
            outcomes.append(
                _Outcome(
                    "insight",
                    label,
                    "skipped",
                    f"too similar to insight {change['id']} here (at or over "
                    f"insight_merge_threshold {e.insight_merge_threshold}): "
                    f"{clip(store.insights.get_insight(change['id']).text, 80, one_line=True)!r}",
                )
            )
            continue
        changes.append({**change, "status": PROBATION})  # shown to no person's task until it earns it
        outcomes.append(_Outcome("insight", label, "added", "on probation", detail={"provenance": provenance}))
    return changes


def _plan_node(engine: Engine, pack: Pack, outcomes: list[_Outcome]):
    """The pack's scaffold as a proposed child of the incumbent: (scaffold, parent) or None."""
    if pack.node is None:
        return None
    store = engine.store
    try:
        scaffold = load_scaffold(pack.node.scaffold)
    except ScaffoldError as exc:
        outcomes.append(_Outcome("node", pack.node.id, "refused", str(exc)))
        return None
    if scaffold.hash != pack.node.scaffold_hash:
        outcomes.append(
            _Outcome(
                "node",
                pack.node.id,
                "refused",
                f"its scaffold is {scaffold.hash} here, not "
                f"{pack.node.scaffold_hash} as the pack says (another evolver version?)",
            )
        )
        return None
    twin = next((n for n in store.tree.list_nodes() if n.scaffold_hash == scaffold.hash), None)
    if twin is not None:
        outcomes.append(_Outcome("node", pack.node.id, "skipped", f"node {twin.id} here has this scaffold"))
        return None
    parent = incumbent(store) or ensure_root(store, engine.seed_scaffold())
    # As an edit of the incumbent, checked as the proposer's edits are (its prompts render, within bounds).
    data = scaffold.model_dump(mode="json")
    try:
        child = apply_edit(scaffold_of(store, parent), {key: data[key] for key in EDITABLE})
    except InvalidProposal as exc:
        outcomes.append(_Outcome("node", pack.node.id, "refused", str(exc)))
        return None
    return child, parent


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def import_pack(engine: Engine, data: bytes, *, expect: str | None = None) -> dict:
    """Verify the pack (PackError refuses it whole, nothing changed), vet what it holds, and record what
    passes as one ``import`` event. Returns the report: each item added, skipped or refused, with why."""
    pack = read_pack(data, expect=expect)
    store = engine.store
    files = ToolFiles(engine.data_dir / "tools")
    served = incumbent(store)
    outcomes: list[_Outcome] = []
    tools = _vet_tools(engine, files, pack, served.id if served else None, outcomes)
    insight_changes = _plan_insights(engine, pack, outcomes)
    planned_node = _plan_node(engine, pack, outcomes)
    new_tools, replaced_ids, tool_payload = [], {}, []
    for tool, spec, replaced, report in tools:
        version = store.tools.next_tool_version(spec.name)
        digest = files.write(spec.name, version, spec.code, spec.tests)  # durable before the row names it
        new_tools.append(
            NewTool(
                name=spec.name, description=spec.description, code_hash=digest, version=version, node_id=spec.node_id
            )
        )
        if replaced is not None:
            replaced_ids[replaced.id] = "replaced"
        tool_payload.append(
            {
                "name": spec.name,
                "version": version,
                "pack_version": tool.version,
                "replaces": replaced.version if replaced else None,
                "quarantine": report.summary(),
                "tests": report.tests,
                "provenance": tool.provenance,
            }
        )
        outcomes.append(
            _Outcome(
                "tool",
                spec.name,
                "added",
                report.summary(),
                {"version": version, "replaces": replaced.version if replaced else None},
            )
        )
    added = [o for o in outcomes if o.status == "added"]
    counts = {s: sum(o.status == s for o in outcomes) for s in ("added", "skipped", "refused")}
    insights_added = sum(o.kind == "insight" for o in added)
    what = (
        f"imported pack {pack.id}: {_count(insights_added, 'insight')}"
        f"{' (on probation)' if insights_added else ''}, "
        f"{_count(len(new_tools), 'tool')}"
        + (f" ({', '.join(t.name for t in new_tools)})" if new_tools else "")
        + (", 1 node" if planned_node else "")
        + (f"; {counts['refused']} refused" if counts["refused"] else "")
        + (f"; {counts['skipped']} skipped" if counts["skipped"] else "")
    )
    payload = {
        "pack": pack.sha256,
        "evolver": pack.evolver,
        "model": pack.model,
        "tools": tool_payload,
        "insights": [{"text": o.name, **(o.detail or {})} for o in added if o.kind == "insight"],
        "refused": [{"kind": o.kind, "name": o.name, "reason": o.reason} for o in outcomes if o.status == "refused"],
        "skipped": [{"kind": o.kind, "name": o.name, "reason": o.reason} for o in outcomes if o.status == "skipped"],
    }
    with store.transaction():  # the event, its tools, its insights and its node: all or nothing
        for tool in new_tools:
            if store.tools.next_tool_version(tool.name) != tool.version:
                raise PackError(f"tool {tool.name} changed here while the pack was checked; import it again")
        node = None
        if planned_node is not None:
            scaffold, parent = planned_node
            store.tree.put_scaffold(scaffold.hash, scaffold.canonical_json())
            rationale = clip(f"imported from pack {pack.id} (node {pack.node.id} there): {pack.node.rationale}", 4000)
            node = store.tree.add_node(
                scaffold.hash,
                parent_id=parent.id,
                status="proposed",
                rationale=rationale,
                diff=scaffold_diff(scaffold_of(store, parent), scaffold),
            )
            payload["node_changes"] = [{"id": node.id, "before": None, "after": "proposed"}]
            payload["node"] = {"id": node.id, "pack_node": pack.node.id, "provenance": pack.node.provenance}
            outcomes.append(
                _Outcome(
                    "node",
                    pack.node.id,
                    "added",
                    f"proposed as node {node.id}, a child of {parent.id}; the tree search validates and evaluates it",
                    {"node_id": node.id},
                )
            )
        served = incumbent(store)
        event = store.tools.apply_tool_changes(
            "import",
            what,
            why=f"a learned pack from evolver {pack.evolver}{f' ({pack.model})' if pack.model else ''}",
            node_id=served.id if served else None,
            payload=payload,
            new=new_tools,
            status=replaced_ids,
        )
        if insight_changes:  # planned outside the transaction: embedding is slow, and the store waits
            store.insights.apply_insight_changes(insight_changes, event_id=event.id)  # on probation: outside the cap
    engine.toolbox.refresh()
    changes = store.insights.insight_changes_of(event.id)
    ids = iter(c["insight_id"] for c in changes if c["op"] == "ADD")
    for outcome in outcomes:
        if outcome.kind == "insight" and outcome.status == "added":
            outcome.detail = {"id": next(ids, None)}
    return {
        "id": pack.id,
        "sha256": pack.sha256,
        "evolver": pack.evolver,
        "model": pack.model,
        "event_id": event.id,
        **counts,
        "probation": sum(c["op"] == "ADD" for c in changes),
        "items": [{k: v for k, v in asdict(o).items() if v not in (None, "")} for o in outcomes],
    }
