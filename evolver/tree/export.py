"""The tree for people: Graphviz DOT, and one standalone HTML page (no network, no CDN).

Both are drawn from the tree view (``evolver.tree.search.tree_view``): each node is
colored by its clade's posterior mean (red for clades that fail, green for
clades that succeed), invalid nodes are grey, the incumbent is outlined. The
HTML page lays the tree out as nested lists, so it needs no script library; each
node is titled by what changed (its rationale), a click opens its rationale,
counts and coloured diff, and a legend says what the counts mean.
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
    return (
        f"{node['id']}\\n{node['status']}\\nown {node['successes']}/{node['successes'] + node['failures']} "
        f"clade {node['clade_successes']}/{node['clade_successes'] + node['clade_failures']}\\n"
        f"mean {node['mean']:.2f} bound {node['bound']:.2f}"
    )


def _dot_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\\\\n", "\\n") + '"'


def to_dot(view: dict) -> str:
    lines = ["digraph evolver_tree {", '  node [shape=box, style="rounded,filled", fontname="Helvetica"];']
    for node in view["nodes"]:
        fill = "#d0d0d0" if node["status"] == "invalid" else clade_color(node["clade_mean"])
        extra = ", penwidth=3" if node["id"] == view["incumbent"] else ""
        tooltip = (node["rationale"] or node["reason"] or "")[:300]
        lines.append(
            f'  {_dot_string(node["id"])} [label={_dot_string(_label(node))}, fillcolor="{fill}", '
            f"tooltip={_dot_string(tooltip)}{extra}];"
        )
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
.node .what { color: #000; font-weight: 600; }
details { margin: .2em 0 .6em 0; }
pre { background: #f6f6f6; padding: .6em; overflow-x: auto; font-size: 12px; }
pre .add { color: #116329; background: #dafbe1; display: block; }
pre .del { color: #82071e; background: #ffebe9; display: block; }
pre .hunk { color: #0550ae; display: block; }
dl.legend { display: grid; grid-template-columns: max-content auto; gap: .1em 1em; font-size: 13px; }
dl.legend dt { font-weight: 600; }
.swatch { display: inline-block; width: 1em; height: 1em; vertical-align: middle; border: 1px solid #888; }
"""

_LEGEND = [
    ("what changed", "the proposer's rationale for the node, in short (the root: the seed scaffold)"),
    ("own s/n", "the node's own evaluations on training tasks: successes of those recorded"),
    ("clade s/n", "the same counted over the node and all its descendants: how good what grows from it is"),
    ("mean", "the posterior mean of the node's own success rate, (1 + s) / (2 + n)"),
    ("held-out s/n", "its evaluations on held-out tasks, which alone decide promotion"),
    (
        "bound",
        "the low quantile of the held-out posterior: a candidate is promoted when its bound beats the incumbent's",
    ),
]


def _diff_html(diff: str) -> str:
    """A unified diff, its added and removed lines coloured."""
    lines = []
    for line in diff.splitlines():
        kind = (
            "add"
            if line.startswith("+") and not line.startswith("+++")
            else "del"
            if line.startswith("-") and not line.startswith("---")
            else "hunk"
            if line.startswith("@@")
            else ""
        )
        text = html.escape(line)
        lines.append(f'<span class="{kind}">{text}</span>' if kind else text + "\n")
    return "".join(lines)


def _what(node: dict) -> str:
    """A node's title: what changed, in the words of its rationale (its first sentence, clipped)."""
    if not node["parent_id"]:
        return "the seed scaffold"
    text = (node.get("rationale") or "").strip().split("\n")[0]
    first = text.split(". ")[0]
    return (first[:77] + "…") if len(first) > 80 else (first or "no rationale given")


def _node_html(node: dict, incumbent: str | None) -> str:
    fill = "#d0d0d0" if node["status"] == "invalid" else clade_color(node["clade_mean"])
    marker = " incumbent" if node["id"] == incumbent else ""
    own = node["successes"] + node["failures"]
    clade = node["clade_successes"] + node["clade_failures"]
    held = node["held_out_successes"] + node["held_out_failures"]
    summary = (
        f'<span class="node{marker}" style="background:{fill}" title="{html.escape(node["id"])}">'
        f'<span class="what">{html.escape(_what(node))}</span> '
        f"<small>{html.escape(node.get('short_id') or node['id'])} · {html.escape(node['status'])}"
        f"{' ★ incumbent' if marker else ''} · own "
        f"{node['successes']}/{own} · clade {node['clade_successes']}/{clade} · mean {node['mean']:.2f} · "
        f"held-out {node['held_out_successes']}/{held}, bound {node['bound']:.2f}</small></span>"
    )
    body = [f"<p><b>rationale:</b> {html.escape(node['rationale'] or '-')}</p>"]
    if node.get("reason"):
        body.append(f"<p><b>invalid:</b> {html.escape(node['reason'])}</p>")
    body.append(f"<p>scaffold {html.escape(node['scaffold_hash'])}, proposal cost ${node['cost_usd']:.4f}</p>")
    body.append(f"<p>node {html.escape(node['id'])}</p>")
    body.append(f"<pre>{_diff_html(node['diff']) if node.get('diff') else '(the root: no diff)'}</pre>")
    return f"<details><summary>{summary}</summary>{''.join(body)}</details>"


def to_html(view: dict) -> str:
    children: dict[str | None, list[dict]] = {}
    for node in view["nodes"]:
        children.setdefault(node["parent_id"], []).append(node)

    def grow(parent: str | None) -> str:
        items = children.get(parent, [])
        if not items:
            return ""
        return "<ul>" + "".join(f"<li>{_node_html(n, view['incumbent'])}{grow(n['id'])}</li>" for n in items) + "</ul>"

    tree = grow(None).replace("<ul>", '<ul class="tree">', 1)
    data = html.escape(json.dumps({"incumbent": view["incumbent"], "nodes": len(view["nodes"])}))
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<title>evolver: scaffold tree</title><style>{_STYLE}</style></head><body data-tree="{data}">'
        f"<h1>Scaffold tree</h1><p>{len(view['nodes'])} nodes. Click a node for its rationale and its diff "
        f"against its parent (added lines green, removed red).</p>{_legend(view)}{tree}</body></html>\n"
    )


def _legend(view: dict) -> str:
    swatches = " ".join(
        f'<span class="swatch" style="background:{clade_color(m)}"></span> {m:g}' for m in (0.0, 0.25, 0.5, 0.75, 1.0)
    )
    rows = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in _LEGEND)
    rows = rows.replace("the low quantile", f"the {view['quantile']:.0%} quantile", 1)
    return (
        f'<details open><summary>legend</summary><dl class="legend">{rows}'
        f"<dt>colour</dt><dd>the clade's posterior mean of success: {swatches}; "
        f'<span class="swatch" style="background:#d0d0d0"></span> invalid</dd>'
        f"<dt>outline</dt><dd>the incumbent (★), the node served now</dd></dl></details>"
    )
