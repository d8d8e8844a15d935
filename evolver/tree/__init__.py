"""The self-modification tree (after the Huxley-Gödel Machine).

``search`` runs one step of the search (expand or hand out evaluations, record
results, consider promotion); ``policy`` is the arithmetic (clade counts,
Thompson sampling, the expand rule, Beta bounds); ``proposer`` asks the model
for a child scaffold and validates it; ``incumbent`` is the served node,
promotion and rollback; ``export`` draws the tree as Graphviz or HTML; ``split``
decides, once, which split a task from outside is in (held out or not).

Imports: ``agent``, ``judge``, ``llm``, ``evolver.config`` and ``memory``;
never the meta-agent, the service, the API or the CLI.
"""

from .incumbent import (
    IncumbentError,
    ensure_root,
    incumbent,
    promote,
    rollback,
    scaffold_of,
)
from .search import TreeSearch, node_stats, tree_view

__all__ = [
    "TreeSearch",
    "node_stats",
    "tree_view",
    "IncumbentError",
    "ensure_root",
    "incumbent",
    "promote",
    "rollback",
    "scaffold_of",
]
