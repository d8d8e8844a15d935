"""Hybrid retrieval: FTS5 keyword search, vector search, reciprocal rank fusion, filters."""

from __future__ import annotations

import re

import pytest

from memory import Filters, NewTrajectory, Store
from memory.search import MAX_TERMS, fuse, keyword_search, match_expression

FILLERS = [
    "bake a loaf of sourdough bread",
    "plant tomatoes in the spring garden",
    "book a train ticket to Vienna",
    "compute the monthly mortgage payment",
    "tune the guitar to drop D",
    "translate a poem from French to English",
    "write a cover letter for a job application",
    "plan a three day hiking trip",
    "choose a birthday present for a child",
    "knit a wool scarf",
    "brew a cup of green tea",
    "train a puppy to sit",
    "paint the bedroom walls blue",
    "summarize a news article about elections",
    "learn the rules of chess",
    "organize a bookshelf by color",
    "compose a short melody on the piano",
    "clean the kitchen oven",
    "budget for a family vacation",
    "identify a bird by its song",
    "sew a button onto a shirt",
    "make a paper airplane",
    "grow basil on a windowsill",
    "write a limerick about a cat",
    "knead pizza dough and let it rise",
    "make banana bread with walnuts",
    "bake chocolate chip cookies",
    "cook a pot of tomato soup",
    "roast a chicken with lemon and thyme",
    "make pancakes for breakfast",
    "bake a rye loaf in a dutch oven",
    "prepare a vegetable lasagna",
    "make fresh pasta by hand",
    "steam dumplings in a bamboo basket",
    "bake cinnamon rolls",
    "whip cream for a strawberry cake",
    "grill salmon fillets",
    "make a simple flatbread",
    "fry eggs sunny side up",
    "bake baguettes at home",
]
KEYWORD_ONLY = "file the quarterly zanzibar expense report"  # the only text with "zanzibar"
VECTOR_ONLY = "my automobile won't start, fix its engine"  # near "car motor repair", sharing no word
BOTH = "repair the car engine before the rally"  # near it and sharing words with it

RRF_K = 60


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, embedder):
    """A read-only corpus larger than the candidate lists, shared by this module's tests."""
    store = Store.open(tmp_path_factory.mktemp("corpus") / "data", embedder=embedder)
    ids = store.attempts.ingest([NewTrajectory(prompt=p) for p in [*FILLERS, KEYWORD_ONLY, VECTOR_ONLY, BOTH]])
    named = dict(zip([KEYWORD_ONLY, VECTOR_ONLY, BOTH], ids[-3:]))
    yield store, named
    store.close()


def vector_ranking(store: Store, vector) -> list[str]:
    return [i for i, _ in store.index.query("trajectories", vector, store.index.count("trajectories"))]


# --- fusion -------------------------------------------------------------------


def test_fuse_by_hand():
    fused = fuse([["a", "b", "c"], ["c", "d"]], k=60)
    assert [i for i, _ in fused] == ["c", "a", "b", "d"]
    scores = dict(fused)
    assert scores["c"] == pytest.approx(1 / 63 + 1 / 61)
    assert scores["a"] == pytest.approx(1 / 61)
    assert scores["b"] == pytest.approx(1 / 62)
    assert scores["d"] == pytest.approx(1 / 62)


def test_fuse_small_k_and_edges():
    fused = dict(fuse([["x", "y"], ["y", "x"], ["z"]], k=1))
    assert fused["x"] == pytest.approx(1 / 2 + 1 / 3)
    assert fused["y"] == pytest.approx(1 / 3 + 1 / 2)
    assert fused["z"] == pytest.approx(1 / 2)
    assert fuse([], k=60) == []
    assert fuse([[], []], k=60) == []
    # An item at the bottom of two lists beats one at the top of a single list.
    assert fuse([["solo", "a", "b", "pair"], ["c", "d", "e", "pair"]], k=60)[0][0] == "pair"


def test_match_expression():
    assert match_expression("How do I sort a list in Python?") == '"sort" OR "list" OR "python"'
    assert match_expression("the and of a") is None
    assert match_expression("") is None
    assert match_expression("sort sort SORT") == '"sort"'
    many = " ".join(f"word{i}" for i in range(30))
    assert match_expression(many).count(" OR ") == MAX_TERMS - 1
    # FTS5 syntax becomes plain, quoted words.
    assert match_expression('NEAR(foo bar) col:val "x" yy*') == '"near" OR "foo" OR "bar" OR "col" OR "val" OR "yy"'


# --- the two paths and their fusion ---------------------------------------------------


def test_keyword_only_match_is_found(corpus, embedder):
    store, named = corpus
    vector = embedder.embed_query("how do I bake bread at home")
    ranking = vector_ranking(store, vector)
    assert ranking.index(named[KEYWORD_ONLY]) >= 20  # far outside the vector candidates
    hits = store.retrieval.search_trajectories("zanzibar", k=5, vector=vector)
    found = {h.trajectory_id: h for h in hits}
    assert named[KEYWORD_ONLY] in found
    hit = found[named[KEYWORD_ONLY]]
    assert (hit.keyword_rank, hit.similarity, hit.prompt) == (1, None, KEYWORD_ONLY)
    assert hit.score == pytest.approx(1 / (RRF_K + 1))
    assert all(h.keyword_rank is None for h in hits if h.trajectory_id != hit.trajectory_id)


def test_vector_only_match_is_found(corpus):
    store, named = corpus
    hits = store.retrieval.search_trajectories("car motor repair", k=5)
    found = {h.trajectory_id: h for h in hits}
    hit = found[named[VECTOR_ONLY]]
    assert hit.keyword_rank is None  # no word in common
    assert hit.similarity > 0.4
    assert keyword_search(store.database.writer, "trajectories", "car motor repair", 50) == [named[BOTH]]


def test_an_item_in_both_lists_ranks_above_items_in_one(corpus, embedder):
    store, named = corpus
    query = "car motor repair"
    hits = store.retrieval.search_trajectories(query, k=5)
    assert hits[0].trajectory_id == named[BOTH]
    assert hits[0].keyword_rank == 1 and hits[0].similarity is not None
    assert all(h.score < hits[0].score for h in hits[1:])
    assert [h.trajectory_id for h in hits].index(named[VECTOR_ONLY]) == 1

    # Every fused score is the reciprocal-rank sum of the ranks the item holds.
    ranking = vector_ranking(store, embedder.embed_query(query))
    for hit in hits:
        expected = 0.0
        if hit.similarity is not None:
            expected += 1 / (RRF_K + ranking.index(hit.trajectory_id) + 1)
        if hit.keyword_rank is not None:
            expected += 1 / (RRF_K + hit.keyword_rank)
        assert hit.score == pytest.approx(expected, rel=1e-6)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_search_result_fields(corpus):
    store, named = corpus
    [hit] = store.retrieval.search_trajectories("zanzibar expense report", k=1)
    trajectory = store.attempts.get_trajectory(named[KEYWORD_ONLY])
    assert (hit.trajectory_id, hit.task_id, hit.prompt, hit.final_answer, hit.success) == (
        trajectory.id,
        trajectory.task_id,
        KEYWORD_ONLY,
        None,
        None,
    )
    assert len(store.retrieval.search_trajectories("bread", k=3)) == 3


@pytest.mark.parametrize(
    "query",
    [
        '"unbalanced quote',
        "it's",
        'say "hello" to "them"',
        "NEAR(car engine)",
        "NEAR(car engine, 2)",
        "car*",
        "*",
        "prompt:car",
        "final_answer:engine",
        "title:",
        "(car OR",
        ")",
        "car AND",
        "AND OR NOT",
        "NOT car",
        "-car",
        "+car",
        "^car",
        "{prompt final_answer}: car",
        "car:engine:repair",
        'ca"r',
        "''",
        "\\",
        ";DROP TABLE trajectories;--",
        "   ",
        "",
        "\x00",
        "車のエンジン修理",
        "🚗 repair",
    ],
)
def test_fts_syntax_in_a_query_is_searched_not_interpreted(corpus, query):
    store, named = corpus
    hits = store.retrieval.search_trajectories(query, k=5)
    assert isinstance(hits, list)
    store.retrieval.search_insights(query, k=3)
    store.retrieval.search_tools(query, k=3)
    assert store.database.writer.execute("SELECT count(*) FROM trajectories").fetchone()[0] == len(FILLERS) + 3
    if re.search(r"\bcar\b", query):  # the word survives as a plain search term
        assert named[BOTH] in keyword_search(store.database.writer, "trajectories", query, 50)


# --- filters on both paths -----------------------------------------------------------


@pytest.fixture(scope="module")
def filtered(tmp_path_factory, embedder):
    """Four similar trajectories across two nodes, three times and three outcomes."""
    data_dir = tmp_path_factory.mktemp("filtered") / "data"
    store = Store.open(data_dir, embedder=embedder)
    node_a, node_b = store.tree.add_node("ha", node_id="node_a"), store.tree.add_node("hb", node_id="node_b")
    spec = [  # (name, node, success, started_at)
        ("t1", node_a.id, True, 1000.0),
        ("t2", node_a.id, False, 2000.0),
        ("t3", node_b.id, True, 3000.0),
        ("t4", node_b.id, None, 4000.0),
    ]
    ids = store.attempts.ingest(
        [
            NewTrajectory(
                prompt=f"calibrate the widget sensor, batch {name}", success=success, node_id=node, started_at=started
            )
            for name, node, success, started in spec
        ]
    )
    yield store, dict(zip([s[0] for s in spec], ids)), data_dir
    store.close()


FILTER_CASES = [
    (Filters(success=True), {"t1", "t3"}),
    (Filters(success=False), {"t2"}),
    (Filters(since=1500.0, until=3500.0), {"t2", "t3"}),
    (Filters(since=3000.0), {"t3", "t4"}),
    (Filters(until=1000.0), {"t1"}),
    (Filters(node_id="node_a"), {"t1", "t2"}),
    (Filters(success=True, node_id="node_b"), {"t3"}),
    (Filters(success=False, node_id="node_b"), set()),
    (Filters(), {"t1", "t2", "t3", "t4"}),
]


@pytest.mark.parametrize("filters,expected", FILTER_CASES)
def test_filters_on_fused_vector_and_keyword_paths(filtered, embedder, filters, expected):
    store, named, data_dir = filtered
    by_id = {v: k for k, v in named.items()}
    query = "widget sensor calibration"

    fused = store.retrieval.search_trajectories(query, k=10, filters=filters)
    assert {by_id[h.trajectory_id] for h in fused} == expected

    # The vector path alone: a query with no searchable words and an explicit vector.
    vector_only = store.retrieval.search_trajectories("", k=10, filters=filters, vector=embedder.embed_query(query))
    assert all(h.keyword_rank is None and h.similarity is not None for h in vector_only)
    assert {by_id[h.trajectory_id] for h in vector_only} == expected

    # The keyword path alone: a reader while this store owns the index searches without it.
    with Store.open(data_dir, embedder=embedder, readonly=True) as reader:
        assert reader.index is None
        keyword_only = reader.retrieval.search_trajectories(query, k=10, filters=filters)
    assert all(h.similarity is None and h.keyword_rank is not None for h in keyword_only)
    assert {by_id[h.trajectory_id] for h in keyword_only} == expected

    for hit in fused:
        outcome = store.reports.outcome(hit.trajectory_id)
        assert hit.success == (None if outcome is None else outcome.success)


def test_vector_filters_reach_beyond_the_unfiltered_candidates(store, embedder):
    """Matches that the unfiltered nearest neighbours miss are still found, from index metadata."""
    store.tree.add_node("hx", node_id="node_x")
    near = store.attempts.ingest(
        [NewTrajectory(prompt=f"calibrate the widget sensor number {i}", started_at=1000.0) for i in range(30)]
    )
    far = store.attempts.ingest(
        [
            NewTrajectory(prompt=p, node_id="node_x", started_at=5000.0)
            for p in ("water the tomato plants", "repot the basil seedlings")
        ]
    )
    for trajectory_id in far:  # outcomes arrive later, as metadata-only index updates
        store.attempts.record_outcome(trajectory_id, success=True)
    vector = embedder.embed_query("calibrate widget sensor")
    assert set(far).isdisjoint(vector_ranking(store, vector)[:25])
    for filters in (
        Filters(success=True),
        Filters(node_id="node_x"),
        Filters(since=4000.0),
        Filters(success=True, since=4000.0, node_id="node_x"),
    ):
        hits = store.retrieval.search_trajectories("", k=2, filters=filters, vector=vector)
        assert {h.trajectory_id for h in hits} == set(far), filters
    assert store.retrieval.search_trajectories("", k=2, filters=Filters(success=False), vector=vector) == []
    assert len(near) == 30


def test_outcome_changes_are_seen_by_the_vector_filter(store, embedder):
    [trajectory_id] = store.attempts.ingest([NewTrajectory(prompt="defragment the disk")])
    vector = embedder.embed_query("defragment disk")
    success = Filters(success=True)
    assert store.retrieval.search_trajectories("", k=3, filters=success, vector=vector) == []
    store.attempts.record_outcome(trajectory_id, success=True)
    assert [h.trajectory_id for h in store.retrieval.search_trajectories("", k=3, filters=success, vector=vector)] == [
        trajectory_id
    ]
    store.attempts.record_outcome(trajectory_id, success=False)
    assert store.retrieval.search_trajectories("", k=3, filters=success, vector=vector) == []


# --- insights, tools, context ----------------------------------------------------------


def test_insight_and_tool_search(store):
    keep = store.insights.add_insight("Quote shell variables to survive spaces in file names", importance=4)
    store.insights.add_insight("Prefer ISO 8601 dates in reports")
    gone = store.insights.add_insight("Quote everything twice", importance=1)
    store.insights.update_insight(gone.id, status="retired")

    hits = store.retrieval.search_insights("bash quoting of variables", k=5)
    assert hits[0].insight_id == keep.id and hits[0].importance == 4
    assert gone.id not in {h.insight_id for h in hits}
    assert hits[0].similarity is not None and hits[0].keyword_rank == 1

    wc = store.tools.add_tool("word_count", description="Count the words in a text", code_hash="h1", origin="builtin")
    old = store.tools.add_tool(
        "csv_sum", description="Sum a column of a CSV file", code_hash="h2", origin="synthesized"
    )
    store.tools.set_tool_status(old.id, "retired")
    new = store.tools.add_tool(
        "csv_sum", description="Sum one column of a CSV file", code_hash="h3", origin="synthesized"
    )
    tools = store.retrieval.search_tools("add up the numbers in a spreadsheet column", k=5)
    assert tools[0].tool_id == new.id and (tools[0].name, tools[0].version) == ("csv_sum", 2)
    assert old.id not in {t.tool_id for t in tools}
    assert store.retrieval.search_tools("word_count", k=1)[0].tool_id == wc.id


def test_items_measured_to_help_come_first_among_the_relevant_but_not_from_beyond_them(store):
    from memory import Effect

    helps, unsure = (Effect("x", 6, 0, 0, 6), "helps"), (Effect("x", 1, 1, 1, 1), None)
    exact = store.insights.add_insight("Quote shell variables to survive spaces in file names")
    near = store.insights.add_insight("Quote shell arguments so that a glob is not expanded")
    far = store.insights.add_insight("Prefer ISO 8601 dates in weekly reports")
    query = "bash quoting of shell variables with spaces"
    assert [h.insight_id for h in store.retrieval.search_insights(query, k=3)] == [exact.id, near.id, far.id]
    store.exposures.record_measurements("insight", {str(near.id): helps, str(exact.id): unsure})
    assert [(h.insight_id, h.measured) for h in store.retrieval.search_insights(query, k=1)] == [(near.id, "helps")]
    assert [h.insight_id for h in store.retrieval.search_insights(query, k=2)] == [near.id, exact.id]
    # the third most relevant is beyond the reach of a search for one (two candidates): relevance first
    store.exposures.record_measurements("insight", {str(far.id): helps, str(near.id): unsure})
    assert [h.insight_id for h in store.retrieval.search_insights(query, k=1)] == [exact.id]

    store.tools.add_tool("csv_sum", description="Sum one column of a CSV file", code_hash="h1", origin="synthesized")
    store.tools.add_tool(
        "csv_mean", description="Average of a column in a CSV table", code_hash="h2", origin="synthesized"
    )
    assert store.retrieval.search_tools("sum a column of a CSV file", k=1)[0].name == "csv_sum"
    store.exposures.record_measurements("tool", {"csv_mean": helps})
    (tool,) = store.retrieval.search_tools("sum a column of a CSV file", k=1)
    assert (tool.name, tool.measured) == ("csv_mean", "helps")


def test_context_gathers_successful_examples_insights_and_tools(store):
    good, bad = store.attempts.ingest(
        [
            NewTrajectory(prompt="resize images to thumbnails", final_answer="used PIL", success=True),
            NewTrajectory(prompt="resize images to thumbnails quickly", final_answer="gave up", success=False),
        ]
    )
    insight = store.insights.add_insight("Use Pillow's thumbnail() to keep the aspect ratio")
    tool = store.tools.add_tool("image_resize", description="Resize an image file", code_hash="h", origin="builtin")
    context = store.retrieval.context("make thumbnails of these images", trajectories=3, insights=2, tools=2)
    assert context.vector_search is True
    assert [h.trajectory_id for h in context.trajectories] == [good]
    assert [h.insight_id for h in context.insights] == [insight.id]
    assert [h.tool_id for h in context.tools] == [tool.id]
    everything = store.retrieval.context("make thumbnails of these images", successful_only=False)
    assert {h.trajectory_id for h in everything.trajectories} == {good, bad}
