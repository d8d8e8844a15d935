"""Inspecting and steering evolution: the tree, a node, the history, insights, tools, jobs, promotion."""

from __future__ import annotations

import json
import sys
import textwrap
import time

import click
from rich.markup import escape
from rich.tree import Tree

from ..api import views
from .base import State, cli, echo, err, full_id, out, print_json, table


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def show_tree(data: dict) -> None:
    """The tree as rich prints it: per node its own and clade counts, posterior mean and held-out bound."""
    children: dict[str | None, list[dict]] = {}
    for node in data["nodes"]:
        children.setdefault(node["parent_id"], []).append(node)

    def label(node: dict) -> str:
        star = " [bold green]★ incumbent[/bold green]" if node["id"] == data["incumbent"] else ""
        own = node["successes"] + node["failures"]
        clade = node["clade_successes"] + node["clade_failures"]
        held = node["held_out_successes"] + node["held_out_failures"]
        flight = f", {node['in_flight']} running" if node["in_flight"] else ""
        why = node["reason"] if node["status"] == "invalid" else node["rationale"]
        return (
            f"{node.get('short_id') or node['id']} [dim]{node['status']}, own {node['successes']}/{own}{flight}, clade "
            f"{node['clade_successes']}/{clade}, mean {node['mean']:.2f}, held-out "
            f"{node['held_out_successes']}/{held} bound {node['bound']:.2f}[/dim]{star} {escape(why[:70])}"
        )

    def grow(branch: Tree, parent_id: str | None) -> None:
        for node in children.get(parent_id, []):
            grow(branch.add(label(node)), node["id"])

    root = Tree(f"scaffold tree ({len(data['nodes'])} nodes)")
    grow(root, None)
    out.print(root)


@cli.command()
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json", "dot", "html"]),
    default="text",
    show_default=True,
    help="text for the terminal; dot for Graphviz; html: one standalone page.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (the same as --format json).")
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    help="Write the export to this file instead of stdout.",
)
@click.pass_obj
def tree(state: State, fmt: str, as_json: bool, output: str | None) -> None:
    """The self-modification tree: every scaffold node, its counts, and which one is served."""
    from ..tree.export import to_dot, to_html

    data = state.view("/v1/tree", views.tree, state.config.evolution.promotion_quantile)
    fmt = "json" if as_json else fmt
    if fmt == "text":
        show_tree(data)
        return
    if fmt == "json":
        text = json.dumps(data, indent=2) + "\n"
    else:
        text = to_dot(data) if fmt == "dot" else to_html(data)
    if output:
        with open(output, "w", encoding="utf-8") as handle:
            handle.write(text)
        err.print(f"wrote {output}")
    else:
        echo(text, nl=False)


@cli.command()
@click.argument("node_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def node(state: State, node_id: str, as_json: bool) -> None:
    """One node: its scaffold, diff against its parent, rationale and evaluations."""
    node_id = full_id(state, node_id, "node")["id"]
    data = state.view(f"/v1/nodes/{node_id}", views.node, node_id)
    if as_json:
        print_json(data)
        return
    out.print(
        f"[bold]{data['id']}[/bold] {data['status']}{' (incumbent)' if data['incumbent'] else ''}, parent "
        f"{data['parent_id']}, scaffold {data['scaffold_hash']}",
        highlight=False,
    )
    out.print(f"rationale: {data['rationale'] or '-'}", markup=False)
    if data.get("reason"):
        out.print(f"invalid: {data['reason']}", markup=False)
    out.print(f"proposal cost: ${data['cost_usd']:.4f}, {data['tokens']} tokens", markup=False)
    if data["diff"]:
        out.print(data["diff"], markup=False, highlight=False)
    params = data["scaffold"]["parameters"]
    out.print("parameters: " + ", ".join(f"{k}={v}" for k, v in params.items()), markup=False)
    out.print("tools: " + ", ".join(data["scaffold"]["tools"]), markup=False)
    hooks = data["scaffold"].get("hooks") or ""
    if hooks.strip():
        out.print("hooks:", markup=False)
        out.print(hooks.rstrip(), markup=False, highlight=False)
        out.print(f"hook effects: {hook_effects_line(data.get('hook_effects'))}", markup=False)
    else:
        out.print("hooks: none", markup=False)
    done = [e for e in data["evaluations"] if e["status"] == "done"]
    out.print(f"evaluations: {sum(bool(e['success']) for e in done)} ok / {sum(not e['success'] for e in done)} failed")


@cli.group(invoke_without_command=True)
@click.option(
    "--kind",
    default=None,
    help="Only events of this kind (distill, tool_registered, tool_rejected, tool_retired, job, job_failed, "
    "promote, revert, ...).",
)
@click.option("--limit", type=click.IntRange(1, 1000), default=30, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def history(ctx: click.Context, kind: str | None, limit: int, as_json: bool) -> None:
    """Evolution events, newest first: what changed, why, and what it reverted."""
    if ctx.invoked_subcommand is not None:
        return
    state: State = ctx.obj
    data = state.view("/v1/history", views.history, kind=kind, limit=limit)
    if as_json:
        print_json(data)
        return
    rows = [{**e, "when": _when(e["at"])} for e in data["events"]]
    out.print(table("history", rows, ["id", "when", "kind", "what", "why", "reverts"], width={"what": 70, "why": 50}))


@history.command("show")
@click.argument("event_id", type=click.IntRange(1))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def history_show(state: State, event_id: int, as_json: bool) -> None:
    """One event whole: what and why, its evidence (open one with `evolver show ID`), and each insight or
    tool it changed, before and after."""
    data = state.view(f"/v1/history/{event_id}", views.event_detail, event_id)
    if as_json:
        print_json(data)
        return
    out.print(
        f"[bold]event {data['id']}[/bold] {data['kind']}, {_when(data['at'])}"
        + (f", node {data['node_id']}" if data.get("node_id") else "")
        + (f", reverts event {data['reverts']}" if data.get("reverts") else "")
        + (f"; reverted by event {', '.join(map(str, data['reverted_by']))}" if data["reverted_by"] else ""),
        highlight=False,
    )
    out.print(f"what: {data['what']}", highlight=False, markup=False)
    if data.get("why"):
        out.print(f"why: {data['why']}", highlight=False, markup=False)
    if data.get("evidence"):
        out.print(
            f"evidence ({len(data['evidence'])}): " + " ".join(map(str, data["evidence"])),
            highlight=False,
            markup=False,
        )
    for change in data["insight_changes"]:
        before, after = change["before"] or {}, change["after"]
        out.print(f"  {change['op']} insight {change['insight_id']}", highlight=False)
        if before.get("text") and before.get("text") != after.get("text"):
            out.print(f"    before: {before['text']}", highlight=False, markup=False)
        fields = ", ".join(
            f"{k} {before.get(k)} -> {after.get(k)}"
            for k in ("status", "importance")
            if before and before.get(k) != after.get(k)
        )
        out.print(
            f"    {'now' if before else 'text'}: {after.get('text')}" + (f" ({fields})" if fields else ""),
            highlight=False,
            markup=False,
        )
    for change in data["tool_changes"]:
        out.print(f"  tool change: {json.dumps(change)}", highlight=False, markup=False)


@history.command("revert")
@click.argument("event_id", type=int)
@click.option("--why", default="reverted by hand", show_default=True, help="Recorded in the history.")
@click.pass_obj
def history_revert(state: State, event_id: int, why: str) -> None:
    """Undo EVENT_ID's insight or tool changes (recorded as a new event; nothing is deleted)."""
    with state.client() as client:
        event = client.post(f"/v1/history/{event_id}/revert", {"why": why})
    echo(f"event {event['id']}: {event['what']}")


@cli.group(invoke_without_command=True)
@click.option(
    "--status",
    type=click.Choice(list(views.INSIGHT_STATUSES)),
    default="current",
    show_default=True,
    help="current: active and on probation (all but the retired).",
)
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def insights(ctx: click.Context, status: str, limit: int, as_json: bool) -> None:
    """Insights, most important first. One on probation (imported from a pack) is shown to no task of yours
    until you approve it (`evolver insights approve ID`) or it is measured to help on the promotion split."""
    if ctx.invoked_subcommand is not None:
        return
    state: State = ctx.obj
    data = state.view("/v1/insights", views.insights, status=status, limit=limit)
    if as_json:
        print_json(data)
        return
    rows = [{**i, "effect": _effect(i.get("effect")), "from": _origin(i["provenance"])} for i in data["insights"]]
    out.print(table("insights", rows, ["id", "importance", "status", "from", "effect", "text"], width={"text": 90}))


@insights.command("approve")
@click.argument("insight_id", type=click.IntRange(1))
@click.option("--why", default="approved by hand", show_default=True, help="Recorded in the history.")
@click.pass_obj
def insights_approve(state: State, insight_id: int, why: str) -> None:
    """Let an insight on probation into your tasks' prompts from the next task on (recorded as an event;
    `evolver history revert` puts it back on probation)."""
    with state.client() as client:
        event = client.post(f"/v1/insights/{insight_id}/approve", {"why": why})
    echo(f"event {event['id']}: {event['what']}")


def _origin(provenance: list) -> str:
    """Where an insight came from: the packs it was imported from, else distilled here."""
    packs = [p for p in provenance if isinstance(p, str) and p.startswith("pack:")]
    return ", ".join(packs) if packs else "distilled here"


def hook_effects_line(effects: dict | None) -> str:
    """Per hook point, how often a node's hooks changed something and how often a call failed."""
    return (
        ", ".join(
            f"{point} changed something {e['changed']}x, failed {e['failed']}x" for point, e in (effects or {}).items()
        )
        or "none yet"
    )


def _effect(effect: dict | None) -> str:
    """A measured effect in a cell: attempts with the item (succeeded/total) and the success-rate
    difference against comparable attempts without it, with its 95% interval (nothing to compare: no
    difference); "same task N" counts its attempts at tasks also attempted without it."""
    if not effect or not effect["exposures"]:
        return "not shown yet"
    ok = f"{effect['helped']}/{effect['exposures']} ok"
    if not effect.get("compared"):
        return f"{ok}, none without it to compare"
    low, high = effect["interval"]
    same = f", same task {effect['matched']}" if effect.get("matched") else ""
    return f"{ok}, {effect['difference']:+.2f} [{low:+.2f}, {high:+.2f}] vs {effect['control']}{same}"


@cli.group(invoke_without_command=True)
@click.option(
    "--status",
    type=click.Choice(["active", "retired", "replaced", "reverted", "all"]),
    default="active",
    show_default=True,
    help="Which synthesized tools to list.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def tools(ctx: click.Context, status: str, as_json: bool) -> None:
    """Tools the agent can use: built-in, and synthesized ones with their usage (`tools show NAME`: one)."""
    if ctx.invoked_subcommand is not None:
        return
    state: State = ctx.obj
    data = state.view("/v1/tools", views.tools, status=status)
    if as_json:
        print_json(data)
        return
    out.print(table("built-in tools", data["builtin"], ["name", "description"], width={"description": 100}))
    rows = [{**t, "effect": _effect(t.get("effect"))} for t in data["synthesized"]]
    out.print(
        table(
            f"synthesized tools ({status})",
            rows,
            ["name", "version", "status", "uses", "successes", "failures", "effect", "description"],
        )
    )
    if data.get("mcp"):  # only a running daemon knows its MCP servers' tools
        rows = [{**t, "effect": _effect(t.get("effect"))} for t in data["mcp"]]
        out.print(
            table("your MCP servers' tools", rows, ["name", "server", "uses", "successes", "effect", "description"])
        )


@tools.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def tools_show(state: State, name: str, as_json: bool) -> None:
    """One synthesized tool: each version's status, usage, the events that changed it, its code and tests,
    and its measured effect."""
    data = state.view(f"/v1/tools/{name}", views.tool_detail, name)
    if as_json:
        print_json(data)
        return
    out.print(f"[bold]{escape(data['name'])}[/bold]: effect {_effect(data['effect'])}", highlight=False)
    for v in data["versions"]:
        out.print(
            f"\n[bold]v{v['version']}[/bold] {v['status']} ({v['origin']}), used {v['uses']}x: "
            f"{v['successes']} ok, {v['failures']} failed; {escape(v['description'])}",
            highlight=False,
        )
        for e in v["events"]:
            out.print(f"  event {e['id']} {_when(e['at'])} {e['kind']}: {e['what']}", highlight=False, markup=False)
        if v["code"] is not None:
            out.print("  code:", highlight=False)
            out.print(textwrap.indent(v["code"].rstrip(), "    "), highlight=False, markup=False)
        out.print("  tests:", highlight=False)
        out.print(textwrap.indent((v["tests"] or "").rstrip(), "    "), highlight=False, markup=False)


@cli.command()
@click.option("--job", default=None, help="Only this job (default: every job, in order).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def evolve(state: State, job: str | None, as_json: bool) -> None:
    """Run one round of the background jobs now, instead of waiting for their schedule."""
    with state.client() as client, err.status(f"running {job or 'every job'}…"):
        data = {"rounds": client.run_rounds(job)}
    if as_json:
        print_json(data)
    else:
        for r in data["rounds"]:
            out.print(
                f"{r['job']}: {'ok' if r['ok'] else 'FAILED'} in {r['seconds']:.2f} s: {r['summary']}",
                markup=False,
                highlight=False,
            )
    if not all(r["ok"] for r in data["rounds"]):
        sys.exit(1)


@cli.command()
@click.argument("node_id")
@click.option("--why", default="promoted by hand", show_default=True, help="Recorded in the history.")
@click.pass_obj
def promote(state: State, node_id: str, why: str) -> None:
    """Serve NODE_ID (or a unique prefix of it) from the next task on."""
    node_id = full_id(state, node_id, "node")["id"]
    with state.client() as client:
        event = client.post("/v1/promote", {"node_id": node_id, "why": why})
    echo(f"event {event['id']}: {event['what']}")


@cli.command()
@click.argument("node_id", required=False)
@click.option("--why", default="rolled back by hand", show_default=True, help="Recorded in the history.")
@click.pass_obj
def rollback(state: State, node_id: str | None, why: str) -> None:
    """Serve an earlier node again: NODE_ID (or a unique prefix of it), or the one served before the
    current incumbent (again: the one before that)."""
    if node_id is not None:
        node_id = full_id(state, node_id, "node")["id"]
    with state.client() as client:
        event = client.post("/v1/rollback", {"node_id": node_id, "why": why})
    echo(f"event {event['id']}: {event['what']}")
