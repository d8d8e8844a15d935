"""Which node to expand, which to evaluate, and which to trust: the tree search's choices.

After the Huxley-Gödel Machine (HGM): a node's promise as a *parent* is judged
by its whole clade (itself and every descendant), because a modest scaffold can
have strong descendants; its promise as an *answer* is judged by its own
results only. Both are Beta posteriors over integer success/failure counts,
and choices are Thompson samples from them, so a node is tried about as often
as it is likely to be the best.

Pure functions over ``NodeStats``: no store, no model, no clock. Randomness
comes from a ``numpy.random.Generator`` passed in, so a fixed seed gives a
fixed sequence of choices. The daemon's tree search and
``benchmarks/tree_policy_sim.py`` both call these.

With a finite budget the search ends in a race (``racing``, ``choose_racer``):
the tree stops growing and the last evaluations go where they sharpen the
choice between the leader and the node most likely to beat it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from scipy.special import betaincinv

__all__ = [
    "NodeStats",
    "clade_counts",
    "choose_parent",
    "choose_evaluee",
    "should_expand",
    "cool_down",
    "racing",
    "choose_racer",
    "lower_bound",
    "should_promote",
    "final_pick",
]


@dataclass(frozen=True)
class NodeStats:
    """One node's own counts, as the tree search sees them.

    ``in_flight`` is evaluations started and not yet finished. ``expandable``
    is False for an invalid or retired node: it is never chosen as a parent,
    evaluated or picked, but its results still count in its ancestors'
    clades, because they are evidence about what those ancestors produce.
    """

    id: str
    parent: str | None
    successes: int
    failures: int
    in_flight: int = 0
    expandable: bool = True

    def __post_init__(self) -> None:
        for name in ("successes", "failures", "in_flight"):
            if getattr(self, name) < 0:
                raise ValueError(f"node {self.id!r} has {name} = {getattr(self, name)}; counts cannot be negative")

    @property
    def evaluations(self) -> int:
        return self.successes + self.failures


def clade_counts(nodes: Iterable[NodeStats]) -> dict[str, tuple[int, int]]:
    """Return ``{id: (S, F)}``, the successes and failures of each node's subtree.

    Each node's own integers are added to its parent once, children before
    parents, in O(n). Pooling by appending result lists is how the public HGM
    code goes wrong (it extends a node's own list in place, so results are
    counted again on every call); sums of integers computed bottom-up
    cannot count anything twice.

    Refuses (``ValueError`` naming the node) a duplicate id, a parent that is
    not among the nodes, more than one root, and a cycle: each would make the
    counts silently wrong rather than merely odd.
    """
    by_id: dict[str, NodeStats] = {}
    for node in nodes:
        if node.id in by_id:
            raise ValueError(f"node {node.id!r} appears twice; ids must be unique")
        by_id[node.id] = node
    children: dict[str, list[str]] = {node_id: [] for node_id in by_id}
    roots = []
    for node in by_id.values():
        if node.parent is None:
            roots.append(node.id)
        elif node.parent not in by_id:
            raise ValueError(f"node {node.id!r} names parent {node.parent!r}, which is not in the tree")
        else:
            children[node.parent].append(node.id)
    if len(roots) > 1:
        raise ValueError(f"the tree has {len(roots)} roots ({', '.join(map(repr, roots))}); it must have exactly one")

    order = list(roots)  # breadth-first: every parent comes before its children
    for node_id in order:
        order.extend(children[node_id])
    if len(order) != len(by_id):
        stranded = sorted(set(by_id) - set(order))
        raise ValueError(f"node {stranded[0]!r} never reaches the root: its ancestors form a cycle")

    counts = {node_id: [by_id[node_id].successes, by_id[node_id].failures] for node_id in order}
    for node_id in reversed(order):
        parent = by_id[node_id].parent
        if parent is not None:
            counts[parent][0] += counts[node_id][0]
            counts[parent][1] += counts[node_id][1]
    return {node_id: (s, f) for node_id, (s, f) in counts.items()}


def _thompson(ids: list[str], successes, failures, rng: np.random.Generator, sharpness: float) -> str:
    """Draw θ ~ Beta(k(1+s), k(1+f)) for each candidate and return the argmax (first on a tie).

    Draws are made by inversion, one uniform per candidate, rather than by
    ``rng.beta`` (whose rejection sampler uses a varying number of uniforms):
    two searches fed the same seed then stay in step for as long as their
    posteriors agree, which is what makes comparisons between policies
    (common random numbers) precise.
    """
    if not ids:
        raise ValueError("no expandable node to choose from")
    if sharpness < 1:
        raise ValueError(f"sharpness is {sharpness}; it must be at least 1 (1 is the plain posterior)")
    a = sharpness * (1 + np.asarray(successes, dtype=float))
    b = sharpness * (1 + np.asarray(failures, dtype=float))
    return ids[int(np.argmax(betaincinv(a, b, rng.random(len(ids)))))]


def choose_parent(nodes: Iterable[NodeStats], rng: np.random.Generator, *, sharpness: float = 1.0) -> str:
    """The node to expand next: Thompson sampling on clade counts, θ ~ Beta(1+S, 1+F).

    Only expandable nodes are candidates; non-expandable ones still feed
    their ancestors' clades. ``sharpness`` (see ``cool_down``) multiplies
    both Beta parameters: the mean stays, the spread narrows, so late in a
    budget the search exploits the clades it already trusts.
    """
    nodes = list(nodes)
    clades = clade_counts(nodes)
    ids = [n.id for n in nodes if n.expandable]
    return _thompson(ids, [clades[i][0] for i in ids], [clades[i][1] for i in ids], rng, sharpness)


def choose_evaluee(nodes: Iterable[NodeStats], rng: np.random.Generator, *, sharpness: float = 1.0) -> str:
    """The node that gets the next evaluation task: θ ~ Beta(1+s, 1+f+in_flight) on its own counts.

    In-flight evaluations count as provisional failures (virtual loss): a
    node already being tested looks a little worse until its results come
    back, so parallel workers spread over the promising nodes instead of
    piling onto one. Only expandable nodes are candidates.
    """
    candidates = [n for n in nodes if n.expandable]
    ids = [n.id for n in candidates]
    return _thompson(
        ids, [n.successes for n in candidates], [n.failures + n.in_flight for n in candidates], rng, sharpness
    )


def should_expand(evaluations_spent: int, node_count: int, alpha: float = 0.6) -> bool:
    """Expand when t^alpha >= number of nodes, else evaluate (HGM's schedule).

    The tree grows sublinearly in evaluations, so each node gets more
    evidence as the search goes on. At t = 0 with only the root,
    0^alpha = 0 < 1: the root is evaluated before anything is built on it.
    """
    return evaluations_spent**alpha >= node_count


def cool_down(evaluations_spent: int, budget: int, power: float = 0.5) -> float:
    """The sharpness for a search ``evaluations_spent`` into a ``budget``: (B / (B - t))^power.

    1 at the start, 2^power at half the budget, growing without bound as the
    budget runs out (the remaining budget is floored at one evaluation).
    Multiplying both Beta parameters by it keeps each posterior's mean and
    divides its variance by about that factor: early on, uncertain nodes get
    their chance; at the end, evaluations go where they sharpen the final
    choice and expansions build on the clades that have proven themselves.
    """
    if budget <= 0:
        raise ValueError(f"budget is {budget}; it must be positive")
    remaining = max(budget - evaluations_spent, 1)
    return (budget / remaining) ** power


def racing(evaluations_spent: int, budget: int, start: float = 0.85) -> bool:
    """Whether a search ``evaluations_spent`` into a ``budget`` is in its final race.

    The race is the budget's last ``1 - start``: from ``start * budget`` on, the
    search no longer expands and evaluates with ``choose_racer`` instead of
    ``choose_evaluee``. A node built that late could not be tested enough to
    be picked, so its cost is better spent telling the best candidates apart.
    ``start`` 1 means no race. Without a finite budget (``budget`` 0, the
    daemon's default) there is no end to race towards: never racing.
    """
    if not 0 < start <= 1:
        raise ValueError(f"the race start is {start}; it must be a share of the budget, above 0 and at most 1")
    return budget > 0 and start < 1 and evaluations_spent >= start * budget


def choose_racer(nodes: Iterable[NodeStats], *, quantile: float = 0.05) -> str:
    """The node to evaluate during the race: the leader or its strongest challenger, whichever has less evidence.

    Best-arm identification by LUCB (Kalyanakrishnan et al., 2012). The
    leader is the node with the best ``quantile`` lower bound, the bound
    ``final_pick`` ranks by; the challenger is the one, among the
    others, with the best upper bound (the ``1 - quantile`` quantile), the
    node most likely to be better than it. Evaluating whichever of the two
    has fewer evaluations shrinks the interval that keeps them from being
    told apart: either the challenger falls under the leader and the next
    challenger is raced, or it rises and takes the lead. Thinly tested nodes
    have wide intervals, so a node the search abandoned after an unlucky
    start is challenged again, while nodes that are confidently worse than
    the leader get nothing.

    Deterministic (ties: the earlier node). Evaluations in flight count as
    failures in both bounds (virtual loss, as in ``choose_evaluee``) and as
    evidence when comparing the two, so parallel workers spread over the
    leader and its challengers. Only expandable nodes race.
    """
    candidates = [n for n in nodes if n.expandable]
    if not candidates:
        raise ValueError("no expandable node to choose from")
    lows = [lower_bound(n.successes, n.failures + n.in_flight, quantile) for n in candidates]
    leader = max(range(len(candidates)), key=lambda i: (lows[i], -i))
    others = [i for i in range(len(candidates)) if i != leader]
    if not others:
        return candidates[leader].id
    highs = {
        i: float(
            betaincinv(1 + candidates[i].successes, 1 + candidates[i].failures + candidates[i].in_flight, 1 - quantile)
        )
        for i in others
    }
    challenger = max(others, key=lambda i: (highs[i], -i))

    def evidence(i: int) -> int:
        return candidates[i].evaluations + candidates[i].in_flight

    return candidates[challenger if evidence(challenger) < evidence(leader) else leader].id


def lower_bound(successes: int, failures: int, quantile: float = 0.05) -> float:
    """The ``quantile`` of Beta(1+s, 1+f): a success rate the node beats with probability 1 - quantile.

    Unlike the mean, it rewards evidence: 3/3 has a posterior mean of 0.8 but
    a 5% bound of about 0.47, while 40/50 has a bound of about 0.69.
    """
    return float(betaincinv(1 + successes, 1 + failures, quantile))


def should_promote(
    candidate: tuple[int, int], incumbent: tuple[int, int], *, min_evaluations: int = 10, quantile: float = 0.05
) -> bool:
    """Whether a candidate with ``(s, f)`` should replace the incumbent with ``(s, f)``.

    Both sides are judged alike: each must have ``min_evaluations`` on the
    split, and the candidate's conservative bound must beat the incumbent's.
    Comparing bound to bound (not to the incumbent's mean) does not make a
    promotion stricter than the cost of a mistake (a rollback) warrants.
    Requiring the incumbent's evidence too is what makes it a comparison: an
    incumbent measured once is bounded by its prior, so any candidate at about
    half its tasks would beat it. A learning run promoted a child at 5 of 10
    over the seed at 1 of 1 (bounds 0.27 against 0.22), on no evidence that
    it was better; the search sends the incumbent to the split beside any
    contender there, so waiting costs only those evaluations.
    """
    s, f = candidate
    if s + f < min_evaluations or sum(incumbent) < min_evaluations:
        return False
    return lower_bound(s, f, quantile) > lower_bound(*incumbent, quantile)


def final_pick(nodes: Iterable[NodeStats], *, min_evaluations: int = 10, quantile: float = 0.05) -> str:
    """The node to serve at the end of a search: the best lower bound of its own posterior.

    Nodes with ``min_evaluations`` come first; when none has that many, the
    best bound among the rest is taken (the bound already discounts thin
    evidence). Non-expandable (invalid, retired) nodes are never picked. The
    highest mean would favour a lucky 2/2 over a tested 30/40; the winner's
    curse over many nodes makes that the typical mistake.
    """
    candidates = [n for n in nodes if n.expandable]
    if not candidates:
        raise ValueError("no expandable node to pick")

    def key(n: NodeStats) -> tuple[bool, float]:
        return n.evaluations >= min_evaluations, lower_bound(n.successes, n.failures, quantile)

    best = candidates[0]
    for n in candidates[1:]:
        if key(n) > key(best):
            best = n
    return best.id
