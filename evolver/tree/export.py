"""The tree for people: Graphviz DOT, and one standalone HTML page (no network, no CDN).

Both are drawn from the tree view (``evolver.tree.search.tree_view``): each node is
colored by its clade's posterior mean (red for clades that fail, green for
clades that succeed), invalid nodes are grey, the incumbent is outlined. The
HTML page lays the tree out as nested lists, so it needs no script library; a
click on a node opens its diff, rationale and counts.
"""

from __future__ import annotations

import html
import json

__all__ = ["to_dot", "to_html", "clade_color"]


def clade_color(mean: float) -> str:
    """#rrggbb from red (0) through yellow (0.5) to green (1)."""
    mean = min(max(mean, 0.0), 1.0)
    red = 255 if mean < 0.5 else round(255 * (1 - mean) * 2)
    green = round(255 * mean * 2) if mean < 0.5 else 200
    return f"#{red:02x}{green:02x}60"


def _label(node: dict) -> str:
    return (f"{node['id']}\\n{node['status']}\\nown {node['successes']}/{node['successes'] + node['failures']} "
            f"clade {node['clade_successes']}/{node['clade_successes'] + node['clade_failures']}\\n"
            f"mean {node['mean']:.2f} bound {node['bound']:.2f}")


def _dot_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\\\\n", "\\n") + '"'


def to_dot(view: dict) -> str:
    lines = ["digraph evolver_tree {", '  node [shape=box, style="rounded,filled", fontname="Helvetica"];']
    for node in view["nodes"]:
        fill = "#d0d0d0" if node["status"] == "invalid" else clade_color(node["clade_mean"])
        extra = ", penwidth=3" if node["id"] == view["incumbent"] else ""
        tooltip = (node["rationale"] or node["reason"] or "")[:300]
        lines.append(f"  {_dot_string(node['id'])} [label={_dot_string(_label(node))}, fillcolor=\"{fill}\", "
                     f"tooltip={_dot_string(tooltip)}{extra}];")
    for node in view["nodes"]:
        if node["parent_id"]:
            lines.append(f"  {_dot_string(node['parent_id'])} -> {_dot_string(node['id'])};")
    lines.append("}")
    return "\n".join(lines) + "\n"


_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
ul.tree, ul.tree ul { list-style: none; padding-left: 1.6em; border-left: 1px solid #bbb; }
ul.tree { border: none; padding-left: 0; }
.node { display: inline-block; margin: .25em 0; padding: .3em .6em; border-radius: 6px; cursor: pointer;
        border: 1px solid #888; }
.node.incumbent { border: 3px solid #000; }
.node small { color: #333; }
details { margin: .2em 0 .6em 0; }
pre { background: #f6f6f6; padding: .6em; overflow-x: auto; font-size: 12px; }
"""


def _node_html(node: dict, incumbent: str | None) -> str:
    fill = "#d0d0d0" if node["status"] == "invalid" else clade_color(node["clade_mean"])
    marker = " incumbent" if node["id"] == incumbent else ""
    own = node["successes"] + node["failures"]
    clade = node["clade_successes"] + node["clade_failures"]
    held = node["held_out_successes"] + node["held_out_failures"]
    summary = (f'<span class="node{marker}" style="background:{fill}">{html.escape(node["id"])} '
               f'<small>{html.escape(node["status"])}{" ★ incumbent" if marker else ""} · own '
               f'{node["successes"]}/{own} · clade {node["clade_successes"]}/{clade} · mean {node["mean"]:.2f} · '
               f'held-out {node["held_out_successes"]}/{held}, bound {node["bound"]:.2f}</small></span>')
    body = [f"<p><b>rationale:</b> {html.escape(node['rationale'] or '-')}</p>"]
    if node.get("reason"):
        body.append(f"<p><b>invalid:</b> {html.escape(node['reason'])}</p>")
    body.append(f"<p>scaffold {html.escape(node['scaffold_hash'])}, proposal cost ${node['cost_usd']:.4f}</p>")
    body.append(f"<pre>{html.escape(node.get('diff') or '(the root: no diff)')}</pre>")
    return f"<details><summary>{summary}</summary>{''.join(body)}</details>"


def to_html(view: dict) -> str:
    children: dict[str | None, list[dict]] = {}
    for node in view["nodes"]:
        children.setdefault(node["parent_id"], []).append(node)

    def grow(parent: str | None) -> str:
        items = children.get(parent, [])
        if not items:
            return ""
        return "<ul>" + "".join(f"<li>{_node_html(n, view['incumbent'])}{grow(n['id'])}</li>" for n in items) + \
            "</ul>"

    tree = grow(None).replace("<ul>", '<ul class="tree">', 1)
    data = html.escape(json.dumps({"incumbent": view["incumbent"], "nodes": len(view["nodes"])}))
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>evolver: scaffold tree</title><style>{_STYLE}</style></head><body data-tree=\"{data}\">"
            f"<h1>Scaffold tree</h1><p>{len(view['nodes'])} nodes; colour: the clade's posterior mean of success "
            f"(red 0, green 1), grey: invalid; bound: the {view['quantile']:.0%} quantile of the held-out "
            f"posterior. Click a node for its diff.</p>{tree}</body></html>\n")
