"""The tree search's choices: clade counts, Thompson sampling, the schedule and the conservative picks."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
from scipy.stats import beta

from evolver.config import ConfigError, load_config
from evolver.tree.policy import (
    NodeStats,
    choose_evaluee,
    choose_parent,
    choose_racer,
    clade_counts,
    cool_down,
    final_pick,
    lower_bound,
    racing,
    should_expand,
    should_promote,
)


def node(id, parent, s=0, f=0, **kw):
    return NodeStats(id, parent, s, f, **kw)


def tally(choose, nodes, draws=2000, seed=7, **kw):
    rng = np.random.default_rng(seed)
    return Counter(choose(nodes, rng, **kw) for _ in range(draws))


# A root with two children; under "a" a chain two deep, and "b" retired.
TREE = [
    node("r", None, 1, 2),
    node("a", "r", 2, 1),
    node("b", "r", 0, 3, expandable=False),
    node("c", "a", 4, 0),
    node("d", "c", 1, 1),
]


def test_clade_counts_sum_each_subtree_once_including_retired_nodes():
    assert clade_counts(TREE) == {
        "d": (1, 1),
        "c": (5, 1),
        "a": (7, 2),
        "b": (0, 3),
        "r": (8, 7),
    }


def test_clade_counts_do_not_depend_on_the_order_nodes_come_in():
    shuffled = TREE[:]
    random.Random(3).shuffle(shuffled)
    assert clade_counts(shuffled) == clade_counts(TREE)


def test_a_long_chain_counts_every_evaluation_exactly_once():
    chain = [node("0", None, 1, 1)] + [node(str(i), str(i - 1), 1, 2) for i in range(1, 200)]
    counts = clade_counts(chain)
    assert counts["0"] == (200, 399)
    assert counts["100"] == (100, 200)
    assert counts["199"] == (1, 2)


@pytest.mark.parametrize(
    "nodes, named",
    [
        ([node("r", None), node("a", "b"), node("b", "a")], "'a'"),
        ([node("r", None), node("a", "r"), node("x", "nowhere")], "'x'"),
        ([node("r", None), node("s", None)], "'s'"),
        ([node("r", None), node("r", None)], "'r'"),
    ],
)
def test_malformed_trees_are_refused_naming_the_node(nodes, named):
    with pytest.raises(ValueError, match=named):
        clade_counts(nodes)


def test_a_cycle_and_an_unknown_parent_say_what_is_wrong():
    with pytest.raises(ValueError, match="cycle"):
        clade_counts([node("r", None), node("a", "b"), node("b", "a")])
    with pytest.raises(ValueError, match="'nowhere', which is not in the tree"):
        clade_counts([node("r", None), node("x", "nowhere")])


def test_negative_counts_are_refused():
    with pytest.raises(ValueError, match="'a' has failures = -1"):
        node("a", None, 1, -1)


def test_a_strong_clade_is_chosen_as_parent_far_more_often_than_a_weak_one():
    nodes = [node("r", None), node("good", "r", 30, 0), node("bad", "r", 0, 30)]
    counts = tally(choose_parent, nodes)
    assert counts["good"] > 1900
    assert counts["bad"] < 10


def test_a_weak_node_with_strong_descendants_is_a_likely_parent_but_an_unlikely_evaluee():
    nodes = [
        node("r", None, 0, 0),
        node("weak", "r", 0, 5),
        node("heir", "weak", 20, 0, expandable=False),  # retired, yet evidence about "weak"
        node("middling", "r", 4, 4),
    ]
    as_parent = tally(choose_parent, nodes)
    as_evaluee = tally(choose_evaluee, nodes)
    assert as_parent["weak"] > as_parent["middling"] * 2
    assert as_evaluee["weak"] * 5 < as_evaluee["middling"]


def test_a_fixed_seed_gives_a_fixed_sequence_of_choices():
    nodes = [node("r", None, 3, 3), node("a", "r", 2, 2), node("b", "r", 1, 1), node("c", "a", 0, 0)]

    def sequence(seed):
        rng = np.random.default_rng(seed)
        return [(choose_parent(nodes, rng), choose_evaluee(nodes, rng)) for _ in range(50)]

    assert sequence(11) == sequence(11)
    assert sequence(11) != sequence(12)


def test_evaluations_in_flight_count_as_failures_so_workers_spread_out():
    best, other = node("best", None, 8, 2), node("other", "best", 6, 4)
    idle = tally(choose_evaluee, [best, other])
    busy = tally(choose_evaluee, [node("best", None, 8, 2, in_flight=4), other])
    assert busy["other"] > 1.5 * idle["other"]
    assert busy["other"] > busy["best"]


def test_non_expandable_nodes_are_never_chosen_or_picked():
    nodes = [node("r", None, 5, 5), node("broken", "r", 50, 0, expandable=False), node("ok", "r", 3, 3)]
    assert "broken" not in tally(choose_parent, nodes, draws=300)
    assert "broken" not in tally(choose_evaluee, nodes, draws=300)
    assert final_pick(nodes) != "broken"
    assert clade_counts(nodes)["r"] == (58, 8)


def test_with_nothing_expandable_there_is_no_choice():
    nodes = [node("r", None, 1, 1, expandable=False)]
    rng = np.random.default_rng(0)
    for choose in (choose_parent, choose_evaluee):
        with pytest.raises(ValueError, match="no expandable node"):
            choose(nodes, rng)
    with pytest.raises(ValueError, match="no expandable node"):
        final_pick(nodes)


@pytest.mark.parametrize(
    "t, n, alpha, expand",
    [
        (0, 1, 0.6, False),  # 0^0.6 = 0 < 1: the root is evaluated before anything is built on it
        (1, 1, 0.6, True),  # 1 >= 1
        (1, 2, 0.6, False),
        (3, 2, 0.6, False),  # 1.93 < 2
        (4, 2, 0.6, True),  # 2.30 >= 2
        (100, 16, 0.6, False),  # 15.85 < 16
        (102, 16, 0.6, True),  # 16.03 >= 16
        (4, 2, 0.5, True),  # exactly 2 >= 2
        (3, 2, 0.5, False),
    ],
)
def test_expand_when_t_to_the_alpha_reaches_the_node_count(t, n, alpha, expand):
    assert should_expand(t, n, alpha) is expand


def test_cool_down_starts_at_one_and_sharpens_as_the_budget_runs_out():
    assert cool_down(0, 100) == 1.0
    assert cool_down(50, 100) == pytest.approx(2**0.5)
    assert cool_down(99, 100) == pytest.approx(10.0)
    assert cool_down(150, 100) == cool_down(99, 100)  # past the budget: floored at one evaluation left
    assert cool_down(50, 100, power=1.0) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        cool_down(0, 0)


def test_sharpness_keeps_the_means_and_favours_the_better_one():
    nodes = [node("r", None, 5, 5), node("better", "r", 6, 4)]
    plain = tally(choose_evaluee, nodes)
    sharp = tally(choose_evaluee, nodes, sharpness=100.0)
    assert plain["r"] > 400
    assert sharp["r"] < 50
    with pytest.raises(ValueError, match="at least 1"):
        choose_evaluee(nodes, np.random.default_rng(0), sharpness=0.5)


def test_the_race_is_the_last_part_of_a_finite_budget_only():
    assert not racing(84, 100, 0.85)
    assert racing(85, 100, 0.85)
    assert racing(150, 100, 0.85)  # past the budget: still racing
    assert not racing(99, 100, 1.0)  # a start of 1 means no race
    assert not racing(10_000, 0, 0.5)  # no budget (0): no end to race towards
    for start in (0, -0.1, 1.5):
        with pytest.raises(ValueError, match="share of the budget"):
            racing(50, 100, start)


@pytest.mark.parametrize(
    "value, allowed",
    [
        ("0", "greater than 0"),
        ("1.5", "less than or equal to 1"),
        ("half", "a valid number"),
    ],
)
def test_a_race_start_that_is_not_a_share_of_the_budget_is_refused_by_the_settings(value, allowed):
    with pytest.raises(ConfigError, match=rf"\[advanced.evolution\] race_start = .*{allowed}"):
        load_config(env={"EVOLVER_EVOLUTION_RACE_START": value})
    assert load_config(env={"EVOLVER_EVOLUTION_RACE_START": "1"}).evolution.race_start == 1.0


RACE = [
    node("r", None, 10, 40),
    node("leader", "r", 35, 15),  # the best bound (0.59)
    node("close", "r", 13, 7),  # fewer evaluations, an upper bound above the leader's lower
    node("worse", "leader", 10, 40),  # confidently below the leader
    node("retired", "r", 90, 0, expandable=False),
]


def test_the_race_evaluates_the_leader_or_its_challenger_whichever_has_less_evidence():
    assert choose_racer(RACE) == "close"
    # Once the challenger has as much evidence as the leader, the leader is tested again.
    even = [*RACE[:2], node("close", "r", 33, 17), *RACE[3:]]
    assert choose_racer(even) == "leader"


def test_a_thinly_tested_node_is_challenged_a_confidently_worse_one_never():
    thin = [*RACE, node("young", "close", 1, 1)]  # 1/2: a wide interval, reaching 0.87
    assert choose_racer(thin) == "young"
    settled = [node("r", None, 5, 45), node("best", "r", 40, 10), node("worse", "r", 20, 30)]
    assert choose_racer(settled) == "best"  # the only rival is far below: sharpen the leader


def test_the_race_ignores_non_expandable_nodes():
    assert "retired" not in {choose_racer(RACE), choose_racer(RACE[::-1])}
    only = [node("r", None, 3, 3), node("gone", "r", 50, 0, expandable=False)]
    assert choose_racer(only) == "r"
    with pytest.raises(ValueError, match="no expandable node"):
        choose_racer([node("r", None, 1, 1, expandable=False)])


def test_evaluations_in_flight_send_parallel_workers_to_the_next_contender():
    assert choose_racer(RACE) == "close"
    busy = [*RACE[:2], node("close", "r", 13, 7, in_flight=30), *RACE[3:]]
    assert choose_racer(busy) == "leader"


def test_a_race_concentrates_its_evaluations_on_the_best_candidates_and_finds_the_best():
    # Eight nodes with hidden rates, each with five results in; the race spends 300 evaluations.
    rates = {"a": 0.72, "b": 0.65, "c": 0.5, "d": 0.45, "e": 0.4, "f": 0.3, "g": 0.2, "h": 0.1}
    rng = np.random.default_rng(5)
    counts = {k: [int(s), 5 - int(s)] for k, s in zip(rates, rng.binomial(5, list(rates.values())))}
    spent = Counter()
    for _ in range(300):
        nodes = [node(k, None if k == "a" else "a", s, f) for k, (s, f) in counts.items()]
        chosen = choose_racer(nodes)
        spent[chosen] += 1
        counts[chosen][rng.random() >= rates[chosen]] += 1
    assert spent["a"] + spent["b"] > 200
    assert spent["g"] + spent["h"] < 20
    assert final_pick([node(k, None if k == "a" else "a", s, f) for k, (s, f) in counts.items()]) == "a"


@pytest.mark.parametrize("s, f, q", [(0, 0, 0.05), (3, 0, 0.05), (40, 10, 0.05), (7, 30, 0.2), (1, 1, 0.5)])
def test_lower_bound_is_the_beta_posterior_quantile(s, f, q):
    assert lower_bound(s, f, q) == pytest.approx(beta.ppf(q, 1 + s, 1 + f), abs=1e-9)


def test_lower_bound_rises_with_successes_and_evidence_and_falls_with_failures():
    assert lower_bound(5, 5) < lower_bound(6, 5) < lower_bound(7, 5)
    assert lower_bound(5, 5) > lower_bound(5, 6) > lower_bound(5, 7)
    assert lower_bound(3, 1) < lower_bound(30, 10) < lower_bound(300, 100)
    assert lower_bound(5, 5, 0.05) < lower_bound(5, 5, 0.2) < lower_bound(5, 5, 0.5)


def test_promotion_needs_a_better_bound_and_enough_evaluations():
    incumbent = (30, 20)
    assert should_promote((40, 10), incumbent)
    assert not should_promote((9, 0), incumbent)  # perfect, but only 9 of the 10 evaluations
    assert should_promote((10, 0), incumbent)
    assert not should_promote((25, 15), incumbent, min_evaluations=50)
    # Its mean (0.58) beats the incumbent's bound (0.41), its bound (0.33) does not.
    assert not should_promote((6, 4), (45, 45))
    assert not should_promote(incumbent, incumbent)  # a tie keeps the incumbent
    # An incumbent measured once is bounded by its prior (0.22 at 1/1): 5/10 (0.27) would have beaten it.
    assert not should_promote((5, 5), (1, 0)) and not should_promote((10, 0), (9, 0))
    assert should_promote((10, 0), (5, 5))


def test_final_pick_prefers_tested_nodes_and_the_best_bound():
    nodes = [
        node("r", None, 20, 20),
        node("lucky", "r", 2, 0),  # best mean, little evidence
        node("tested", "r", 30, 10),
        node("nearly", "r", 9, 0),  # a better bound, but short of min_evaluations
        node("gone", "r", 100, 0, expandable=False),
    ]
    assert final_pick(nodes) == "tested"
    assert final_pick(nodes, min_evaluations=5) == "nearly"
    # Both tested: 12/2 has the higher mean (0.81), 60/15 the higher bound (0.71 against 0.64).
    assert final_pick([node("r", None, 12, 2), node("steady", "r", 60, 15)]) == "steady"
    # No node has enough evaluations: the best bound still decides, not the best mean.
    young = [node("r", None, 5, 3), node("lucky", "r", 1, 0)]
    assert final_pick(young) == "r"
