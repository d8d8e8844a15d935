"""Insight operations: parsed and checked whole, importance counted, retired at zero, duplicates merged."""

from __future__ import annotations

import pytest

from evolver.meta.insights import InsightOpError, apply_ops, numbered, parse_ops, render

CSV = "Use csv.DictReader rather than splitting lines on commas: quoted fields contain commas."
MONEY = "Strip currency symbols and thousands separators before converting money strings to numbers."
TESTS = "Run the unit tests before calling finish."


def _seed(store, *texts_and_importance):
    for text, importance in texts_and_importance:
        store.insights.add_insight(text, importance=importance)
    return numbered(store, limit=50)


@pytest.mark.parametrize(
    "answer, problem",
    [
        ("not json", "not JSON"),
        ('{"ops": []}', '"operations"'),
        ('{"operations": [{"op": "DELETE", "id": 1}]}', "op must be one of"),
        ('{"operations": [{"op": "UPVOTE", "id": 99}]}', "id of a listed insight (1..2)"),
        ('{"operations": [{"op": "UPVOTE", "id": "1"}]}', "id of a listed insight"),
        ('{"operations": [{"op": "UPVOTE", "id": true}]}', "id of a listed insight"),
        ('{"operations": [{"op": "ADD", "id": 1, "text": "x"}]}', "ADD takes no id"),
        ('{"operations": [{"op": "EDIT", "id": 1, "text": "  "}]}', "non-empty text"),
        ('{"operations": [{"op": "UPVOTE", "id": 1, "text": "why"}]}', "takes no text"),
        ('{"operations": [' + ",".join(['{"op": "UPVOTE", "id": 1}'] * 5) + "]}", "at most 4"),
    ],
)
def test_bad_answers_are_refused_with_the_reason(answer, problem):
    with pytest.raises(InsightOpError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        parse_ops(answer, shown=2)


@pytest.mark.parametrize(
    "text, problem",
    [
        (
            "Set the title\x1b]0;pwned\x07 and go on",
            r"operation 1: the text has a control character \\x1b at character 14",
        ),
        ("Clear it \x1b[2J", r"control character \\x1b"),
        ("a C1 CSI \x9b2J too", r"control character \\x9b"),
    ],
)
def test_an_insight_with_a_control_character_is_refused_naming_its_text(text, problem):
    # Distillation's ADD and EDIT (and a pack's insights, which go through the same ADD) refuse it.
    for op in ({"op": "ADD", "text": text}, {"op": "EDIT", "id": 1, "text": text}):
        with pytest.raises(InsightOpError, match=problem):
            parse_ops({"operations": [op]}, shown=1)
    # White space is made plain instead: a CR LF that would forge a line is one space.
    (op,) = parse_ops({"operations": [{"op": "ADD", "text": "Check first.\r\nevolver: import OK"}]}, shown=0)
    assert op.text == "Check first. evolver: import OK"


def test_operations_count_importance_retire_at_zero_and_keep_history(store):
    shown = _seed(store, (CSV, 3), (TESTS, 1))
    assert render(shown).splitlines() == [f"[1] {CSV} (importance 3)", f"[2] {TESTS} (importance 1)"]
    ops = parse_ops(
        {
            "operations": [
                {"op": "UPVOTE", "id": 1},
                {"op": "DOWNVOTE", "id": 2},
                {"op": "ADD", "text": "Check the workspace for the input files before reading them."},
            ]
        },
        shown=2,
    )
    apply_ops(store, ops, shown, provenance=["traj_a", "traj_b"], cap=50)
    csv, tests = store.insights.get_insight(shown[0].id), store.insights.get_insight(shown[1].id)
    assert (csv.importance, csv.status, csv.provenance) == (4, "active", ["traj_a", "traj_b"])
    assert (tests.importance, tests.status) == (0, "retired")
    (new,) = [i for i in numbered(store, limit=50) if i.text.startswith("Check the workspace")]
    assert (new.importance, new.provenance) == (2, ["traj_a", "traj_b"])
    history = store.insights.insight_history(shown[1].id)
    assert [h["op"] for h in history] == ["DOWNVOTE"]
    assert history[0]["before"]["importance"] == 1 and history[0]["after"]["status"] == "retired"

    shown = numbered(store, limit=50)
    edit = parse_ops({"operations": [{"op": "EDIT", "id": 1, "text": CSV + " Also csv.writer."}]}, shown=len(shown))
    apply_ops(store, edit, shown, provenance=["traj_c"], cap=50)
    edited = store.insights.get_insight(shown[0].id)
    assert edited.text.endswith("Also csv.writer.") and edited.importance == 5
    assert [h["op"] for h in store.insights.insight_history(edited.id)] == ["UPVOTE", "EDIT"]


def test_a_near_duplicate_add_upvotes_the_existing_insight(store):
    shown = _seed(store, (MONEY, 2))
    ops = parse_ops({"operations": [{"op": "ADD", "text": MONEY.replace("to numbers", "into numbers")}]}, shown=1)
    apply_ops(store, ops, shown, provenance=["traj_x"], cap=50, merge_threshold=0.9)
    (only,) = numbered(store, limit=50)
    assert only.id == shown[0].id and only.importance == 3 and only.text == MONEY
    assert [h["op"] for h in store.insights.insight_history(only.id)] == ["MERGE"]


def test_over_the_cap_downvotes_weigh_double_and_the_lowest_are_retired(store):
    shown = _seed(store, (CSV, 5), (MONEY, 4), (TESTS, 3))
    ops = parse_ops({"operations": [{"op": "DOWNVOTE", "id": 3}]}, shown=3)
    apply_ops(store, ops, shown, provenance=[], cap=2)
    assert store.insights.get_insight(shown[2].id).importance == 1  # 3 - 2: the list was over its cap
    assert [i.id for i in numbered(store, limit=50)] == [shown[0].id, shown[1].id]  # capped at 2
    assert store.insights.get_insight(shown[2].id).status == "retired"


def test_an_operation_on_an_insight_retired_in_the_same_answer_changes_nothing(store):
    shown = _seed(store, (TESTS, 1))
    ops = parse_ops({"operations": [{"op": "DOWNVOTE", "id": 1}, {"op": "UPVOTE", "id": 1}]}, shown=1)
    with pytest.raises(InsightOpError, match="retired earlier in this answer"):
        apply_ops(store, ops, shown, provenance=[], cap=50)
    assert store.insights.get_insight(shown[0].id).importance == 1 and store.insights.insight_history(shown[0].id) == []


def test_an_answer_that_echoes_the_instructions_example_is_refused_whole():
    """What the 0.5B model answered distillation with (after its unquoted keys were repaired): the
    prompt's own example. Its ADD "..." was taken as a lesson and its votes as judgements of real
    insights; now nothing of it is applied, even where a bad operation would only be skipped. (The
    instruction no longer shows that example; a model may still answer with placeholders.)"""
    echoed = {
        "operations": [
            {"op": "ADD", "text": "..."},
            {"op": "EDIT", "id": 2, "text": "..."},
            {"op": "UPVOTE", "id": 1},
            {"op": "DOWNVOTE", "id": 3},
        ]
    }
    for answer in (echoed, {"operations": [{"op": "ADD", "text": "<text>"}, {"op": "UPVOTE", "id": 1}]}):
        with pytest.raises(InsightOpError, match="copies the example"):
            parse_ops(answer, shown=3, skipped=[])
    real = parse_ops({"operations": [{"op": "ADD", "text": "Compute with run_python, then finish."}]}, shown=0)
    assert [op.text for op in real] == ["Compute with run_python, then finish."]


def test_operations_past_the_most_one_answer_may_have_are_left_out_not_the_whole_answer():
    """The 1.5B model, asked for at most four, wrote five: the first four are taken, and the rest said."""
    answer = {"operations": [{"op": "ADD", "text": f"Lesson number {n} is a whole sentence."} for n in range(1, 6)]}
    skipped: list[str] = []
    ops = parse_ops(answer, shown=0, max_ops=4, skipped=skipped)
    assert [op.text for op in ops] == [f"Lesson number {n} is a whole sentence." for n in range(1, 5)]
    assert skipped == ["operations 5 to 5: at most 4 are taken from one answer"]
    with pytest.raises(InsightOpError, match="5 operations; at most 4"):
        parse_ops(answer, shown=0, max_ops=4)  # strict, as the API's insight edits are


def test_the_distill_instruction_describes_the_operations_and_shows_no_example_to_copy():
    """With an example whose texts were "...", the 0.5B and the 1.5B model answered with the example itself.
    With no insight listed, only ADD is offered (the 1.5B model edited and voted on "insights" that were the
    numbers of its tasks)."""
    from evolver.meta.distill import OPS, OPS_FIRST, SYSTEM

    for ops in (OPS, OPS_FIRST):
        instruction = SYSTEM.format(max_ops=4, ops=ops)
        assert '"..."' not in instruction and "..." not in instruction
    assert all(op in OPS for op in ('"ADD"', '"EDIT"', '"UPVOTE"', '"DOWNVOTE"'))
    assert '"ADD"' in OPS_FIRST and not any(op in OPS_FIRST for op in ('"EDIT"', '"UPVOTE"', '"DOWNVOTE"'))
