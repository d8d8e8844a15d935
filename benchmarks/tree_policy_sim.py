"""Simulate self-improvement trees and compare search policies at equal evaluation budgets; prints JSON.

    python benchmarks/tree_policy_sim.py [--landscapes 200] [--budgets 50,100,200,400] [--seeds 0]
        [--workers 1] [--expand-cost 0] [--race-start 0.85] [--policies greedy,dgm,hgm,evolver]

No model: each node of a landscape has a hidden true success rate, and an
evaluation is one Bernoulli draw of it.

The landscape. The root's rate is uniform in [0.15, 0.45]. Every lineage
carries a hidden *drift* (its metaproductivity): the mean change of rate
from parent to child. A child inherits its parent's drift plus a small
mutation, and its rate is its parent's plus its drift plus noise, clipped to
[0, 1]; one child in six is broken (its rate drops to a fraction of the
parent's) but keeps the drift. So a node's own rate and its lineage's
promise differ: an unlucky child of a productive lineage is weak and has
strong descendants, and a lucky child of an unproductive one is the reverse.
Drifts start slightly negative on average: most self-modifications do not help.

A landscape is fixed by (seed, landscape index): the k-th child of a node,
and the j-th evaluation of a node, are the same draws whichever policy asks
for them and in whatever order. All policies therefore search the same
landscapes with common random numbers, and the differences between them are
the policies', not the dice's.

Budget. An evaluation costs 1 of the budget and an expansion (one proposer
call) ``--expand-cost`` (default 0: free, as the figures before it had); an
expansion that would leave no evaluation in the budget is not made. Every
policy ends with about the same number of nodes, B^0.6 for a budget of B
evaluations when expanding is free, fewer when it costs. hgm and evolver expand when t^0.6 >= number of
nodes (t = evaluations started, expansions not counted); greedy and dgm, like DGM itself, evaluate
each new node on a fixed batch of round(B^0.4) evaluations and then expand.
Equal budgets then mean equal evaluations and about equal tree sizes, and
the policies differ in which parent they expand, which node they evaluate
and which node they finally pick. The policies:

* greedy: expand the node with the best own empirical mean; evaluate the
  newest node on its batch; pick the best empirical mean (ties: more
  evaluations).
* dgm: the Darwin Gödel Machine's parent rule, weight proportional to
  sigmoid(10 (score - 0.5)) / (1 + children), score = own empirical mean
  (the paper's lambda = 10, alpha_0 = 0.5); evaluate the newest node on its
  batch; pick the best empirical mean.
* hgm: the Huxley-Gödel Machine: Thompson sampling on clade counts to
  expand, on own counts to evaluate, no cool-down (its default); pick the
  best posterior mean, (1 + s) / (2 + s + f), our reading of its
  "best-belief" final choice.
* evolver: ``evolver.tree.policy``: the same two Thompson samplers with
  virtual loss (inert when sequential) and the cool-down sharpness
  (B / (B - t))^0.5 on both (t: budget spent); from ``--race-start`` of the
  budget on (default 0.85, the [advanced.evolution] race_start default; 1: no race)
  it stops expanding and races: ``choose_racer`` evaluates the node with the
  best 5% lower bound or its challenger with the best 95% upper bound,
  whichever has fewer evaluations; and ``final_pick``, the best 5% lower
  bound among nodes with at least 10 evaluations (the [evolution] defaults).

With ``--workers W`` evaluations are started W at a time and their results
arrive together, as on parallel workers; in-flight evaluations are what
virtual loss sees. The default (1) is sequential.

``--seeds`` takes a list: ``--landscapes`` landscapes are drawn from each, and
the figures pool them, so seeds used to tune a policy can be kept apart from
the seeds it is measured on.

Output (stdout): {budget: {policy: {final_true_mean, ratio_to_own_best,
ratio_to_global_best, regret}}, "run": {seeds, landscapes_per_seed,
expand_cost, race_start, workers}}, means over landscapes of the final pick's
true rate, that rate over the best true rate the policy generated, over the
best true rate any of the four policies generated on that landscape at that
budget, and the gap to that global best. Run information goes to stderr,
with the evolver-minus-hgm difference in final true rate per budget (mean
and standard error over landscapes), so a margin can be told from noise.
The benchmark reports; it never asserts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evolver.tree.policy import (  # noqa: E402
    NodeStats,
    choose_evaluee,
    choose_parent,
    choose_racer,
    cool_down,
    final_pick,
    racing,
    should_expand,
)

POLICIES = ("greedy", "dgm", "hgm", "evolver")
ALPHA = 0.6
MIN_EVALUATIONS = 10
QUANTILE = 0.05
RACE_START = 0.85  # [advanced.evolution] race_start's default


@dataclasses.dataclass(frozen=True)
class LandscapeModel:
    root_low: float = 0.15
    root_high: float = 0.45
    drift_mean: float = -0.01
    """Mean of the root lineage's drift: most modifications do not help."""
    drift_spread: float = 0.03
    drift_mutation: float = 0.015
    """Drift changes slowly from parent to child: productive lineages stay productive."""
    rate_noise: float = 0.05
    broken_chance: float = 1 / 6
    """A broken child keeps only a uniform fraction in [0, 0.5] of its parent's rate."""


class Landscape:
    """One hidden tree of true rates, built lazily and identically for every policy."""

    def __init__(self, seed: int, index: int, model: LandscapeModel = LandscapeModel()):
        self.key = (seed, index)
        self.model = model
        rng = np.random.default_rng([seed, index, 0])
        root = ()
        self.rate = {root: float(rng.uniform(model.root_low, model.root_high))}
        self.drift = {root: float(rng.normal(model.drift_mean, model.drift_spread))}
        self._draws: dict[tuple, tuple[np.random.Generator, list[float]]] = {}

    def child(self, parent: tuple, k: int) -> tuple:
        """The k-th child of ``parent`` (a path of child indices from the root)."""
        path = parent + (k,)
        if path not in self.rate:
            m = self.model
            rng = np.random.default_rng([*self.key, 1, len(path), *path])
            drift = self.drift[parent] + rng.normal(0, m.drift_mutation)
            if rng.random() < m.broken_chance:
                rate = self.rate[parent] * rng.uniform(0, 0.5)
            else:
                rate = self.rate[parent] + drift + rng.normal(0, m.rate_noise)
            self.rate[path] = float(min(max(rate, 0.0), 1.0))
            self.drift[path] = float(drift)
        return path

    def outcome(self, path: tuple, j: int) -> bool:
        """The j-th evaluation of the node at ``path``: success with its true rate."""
        if path not in self._draws:
            self._draws[path] = (np.random.default_rng([*self.key, 2, len(path), *path]), [])
        rng, draws = self._draws[path]
        while len(draws) <= j:
            draws.extend(rng.random(64).tolist())
        return draws[j] < self.rate[path]


class Search:
    """One policy's tree on one landscape: paths, own counts and the NodeStats the policy sees."""

    def __init__(self, landscape: Landscape):
        self.landscape = landscape
        self.paths: list[tuple] = [()]
        self.stats: list[NodeStats] = [NodeStats("0", None, 0, 0)]
        self.children: list[int] = [0]
        self.started: list[int] = [0]  # evaluations started per node: the index of its next draw

    def expand(self, parent: int) -> None:
        path = self.landscape.child(self.paths[parent], self.children[parent])
        self.children[parent] += 1
        self.paths.append(path)
        self.children.append(0)
        self.started.append(0)
        self.stats.append(NodeStats(str(len(self.stats)), self.stats[parent].id, 0, 0))

    def start(self, i: int) -> int:
        """Begin an evaluation of node i; return its draw index."""
        self.started[i] += 1
        self.stats[i] = dataclasses.replace(self.stats[i], in_flight=self.stats[i].in_flight + 1)
        return self.started[i] - 1

    def finish(self, i: int, j: int) -> None:
        win = self.landscape.outcome(self.paths[i], j)
        n = self.stats[i]
        self.stats[i] = dataclasses.replace(
            n, successes=n.successes + win, failures=n.failures + (not win), in_flight=n.in_flight - 1
        )

    def true_rate(self, i: int) -> float:
        return self.landscape.rate[self.paths[i]]


def _empirical(n: NodeStats) -> float:
    return n.successes / n.evaluations if n.evaluations else -1.0


class Greedy:
    def expand_now(self, t, n, spent, budget):
        return t >= n * max(1, round(budget ** (1 - ALPHA)))

    def parent(self, search, rng, spent, budget):
        return max(range(len(search.stats)), key=lambda i: _empirical(search.stats[i]))

    def evaluee(self, search, rng, spent, budget):
        return len(search.stats) - 1

    def pick(self, search):
        return max(range(len(search.stats)), key=lambda i: (_empirical(search.stats[i]), search.stats[i].evaluations))


class DGM(Greedy):
    def parent(self, search, rng, spent, budget):
        scored = [i for i, n in enumerate(search.stats) if n.evaluations]
        if not scored:  # parallel workers, nothing back yet: build on the root
            return 0
        weights = np.array(
            [1 / (1 + math.exp(-10 * (_empirical(search.stats[i]) - 0.5))) / (1 + search.children[i]) for i in scored]
        )
        return scored[int(rng.choice(len(scored), p=weights / weights.sum()))]


class HGM:
    """Clade Thompson sampling without virtual loss or cool-down; best posterior mean at the end."""

    def expand_now(self, t, n, spent, budget):
        return should_expand(t, n, ALPHA)

    def parent(self, search, rng, spent, budget):
        return int(choose_parent(search.stats, rng))

    def evaluee(self, search, rng, spent, budget):
        # No virtual loss: in-flight evaluations are invisible to the sampler.
        stats = search.stats
        if any(n.in_flight for n in stats):
            stats = [dataclasses.replace(n, in_flight=0) for n in stats]
        return int(choose_evaluee(stats, rng))

    def pick(self, search):
        return max(
            range(len(search.stats)), key=lambda i: (1 + search.stats[i].successes) / (2 + search.stats[i].evaluations)
        )


class Evolver:
    """This project's policy, straight from evolver.tree.policy."""

    def __init__(self, race_start: float = RACE_START):
        self.race_start = race_start

    def expand_now(self, t, n, spent, budget):
        return not racing(spent, budget, self.race_start) and should_expand(t, n, ALPHA)

    def parent(self, search, rng, spent, budget):
        return int(choose_parent(search.stats, rng, sharpness=cool_down(spent, budget)))

    def evaluee(self, search, rng, spent, budget):
        if racing(spent, budget, self.race_start):
            return int(choose_racer(search.stats, quantile=QUANTILE))
        return int(choose_evaluee(search.stats, rng, sharpness=cool_down(spent, budget)))

    def pick(self, search):
        return int(final_pick(search.stats, min_evaluations=MIN_EVALUATIONS, quantile=QUANTILE))


RUNNERS = {"greedy": Greedy(), "dgm": DGM(), "hgm": HGM(), "evolver": Evolver()}


def run(
    policy: str, landscape: Landscape, budget: int, rng: np.random.Generator, workers: int, expand_cost: int = 0
) -> Search:
    """Spend ``budget``, ``workers`` evaluations at a time, expanding on the policy's schedule.

    An evaluation costs 1 of the budget and an expansion ``expand_cost``; an expansion that would
    overrun the budget is not made. The schedules count evaluations (``t``), the cool-down and the
    race count the budget spent (``spent``).
    """
    runner = RUNNERS[policy]
    search = Search(landscape)
    t = spent = 0
    while spent < budget:
        batch = []
        for _ in range(workers):
            while spent + expand_cost < budget and runner.expand_now(t, len(search.stats), spent, budget):
                search.expand(runner.parent(search, rng, spent, budget))
                spent += expand_cost
            if spent >= budget:
                break
            i = runner.evaluee(search, rng, spent, budget)
            batch.append((i, search.start(i)))
            t += 1
            spent += 1
        for i, j in batch:
            search.finish(i, j)
    return search


def simulate(
    landscapes: int,
    budgets: list[int],
    seeds: list[int],
    workers: int,
    expand_cost: int = 0,
    policies: tuple[str, ...] = POLICIES,
) -> tuple[dict, dict]:
    """Return the report and, per budget, the evolver-minus-hgm difference of final true rates (mean, s.e.).

    ``landscapes`` landscapes per seed; the figures are means over all of them.
    """
    rows = {b: {p: [] for p in policies} for b in budgets}  # per landscape: pick, own best, global best
    for seed in seeds:
        for index in range(landscapes):
            landscape = Landscape(seed, index)
            for budget in budgets:
                searches = {}
                for policy in policies:
                    # The same stream for every policy: hgm and evolver draw alike until their posteriors part.
                    rng = np.random.default_rng([seed, index, 3, budget])
                    searches[policy] = run(policy, landscape, budget, rng, workers, expand_cost)
                best = {p: max(s.true_rate(i) for i in range(len(s.paths))) for p, s in searches.items()}
                global_best = max(best.values())
                for policy, search in searches.items():
                    picked = search.true_rate(RUNNERS[policy].pick(search))
                    rows[budget][policy].append((picked, best[policy], global_best))
    report, paired = {}, {}
    for b in budgets:
        report[str(b)] = {}
        for p in policies:
            picked, own_best, global_best = np.array(rows[b][p]).T
            report[str(b)][p] = {
                "final_true_mean": round(float(picked.mean()), 4),
                "ratio_to_own_best": round(float((picked / own_best).mean()), 4),
                "ratio_to_global_best": round(float((picked / global_best).mean()), 4),
                "regret": round(float((global_best - picked).mean()), 4),
            }
        if "evolver" in policies and "hgm" in policies:
            diff = np.array(rows[b]["evolver"])[:, 0] - np.array(rows[b]["hgm"])[:, 0]
            paired[str(b)] = [round(float(diff.mean()), 4), round(float(diff.std(ddof=1) / np.sqrt(len(diff))), 4)]
    return report, paired


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--landscapes", type=int, default=200, help="landscapes per seed")
    parser.add_argument("--budgets", default="50,100,200,400", help="comma-separated budgets, in evaluations")
    parser.add_argument("--seeds", "--seed", default="0", help="comma-separated landscape seeds")
    parser.add_argument("--workers", type=int, default=1, help="evaluations started together (parallel workers)")
    parser.add_argument(
        "--expand-cost", type=int, default=0, help="evaluations of budget one expansion (a proposer call) costs"
    )
    parser.add_argument(
        "--race-start",
        type=float,
        default=RACE_START,
        help="share of the budget after which evolver races (1: no race)",
    )
    parser.add_argument(
        "--policies", default=",".join(POLICIES), help="comma-separated subset of " + ", ".join(POLICIES)
    )
    args = parser.parse_args(argv)
    budgets, seeds = _ints(args.budgets), _ints(args.seeds)
    policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    if args.landscapes < 1 or args.workers < 1 or not budgets or min(budgets) < 1 or not seeds:
        parser.error("--landscapes, --workers and every budget must be positive, and a seed is needed")
    if args.expand_cost < 0:
        parser.error("--expand-cost cannot be negative")
    if not policies or set(policies) - set(POLICIES):
        parser.error(f"--policies must name some of {', '.join(POLICIES)}")
    if not 0 < args.race_start <= 1:
        parser.error("--race-start must be above 0 and at most 1")
    RUNNERS["evolver"] = Evolver(args.race_start)
    began = time.perf_counter()
    report, paired = simulate(args.landscapes, budgets, seeds, args.workers, args.expand_cost, policies)
    report["run"] = {
        "seeds": seeds,
        "landscapes_per_seed": args.landscapes,
        "expand_cost": args.expand_cost,
        "race_start": args.race_start,
        "workers": args.workers,
    }
    print(json.dumps(report, indent=2))
    print(
        json.dumps(
            {
                "landscapes": args.landscapes,
                "budgets": budgets,
                "seeds": seeds,
                "expand_cost": args.expand_cost,
                "workers": args.workers,
                "seconds": round(time.perf_counter() - began, 1),
                "evolver_minus_hgm_mean_se": paired,
            }
        ),
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
