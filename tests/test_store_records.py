"""Round trips of every entity the store keeps, through the typed records."""

from __future__ import annotations

import sqlite3
import time

import pytest

from memory import (
    Evaluation,
    Event,
    Insight,
    LedgerEntry,
    NewTrajectory,
    Node,
    NotFound,
    Outcome,
    Step,
    StoreError,
    Task,
    ToolRecord,
    Trajectory,
)

# --- tasks -----------------------------------------------------------------


def test_task_round_trip(store):
    check = {"kind": "answer", "expected": "42", "nested": {"tolerance": 0.5, "tags": ["a", "b"]}}
    metadata = {"client": "cli", "attempts": 3, "unicode": "naïve ✓"}
    before = time.time()
    task, new = store.inbox.add_task(
        "What is six times seven?",
        check=check,
        priority=7,
        source="bench",
        metadata=metadata,
        idempotency_key="req-1",
    )
    assert new is True
    assert isinstance(task, Task)
    assert task.id.startswith("task_")
    assert (task.prompt, task.check, task.priority, task.source, task.metadata) == (
        "What is six times seven?",
        check,
        7,
        "bench",
        metadata,
    )
    assert (task.status, task.idempotency_key, task.finished_at, task.error) == ("queued", "req-1", None, None)
    assert before <= task.created_at == task.updated_at <= time.time()
    assert store.inbox.get_task(task.id) == task


def test_task_defaults(store):
    task, _ = store.inbox.add_task("plain")
    assert (task.check, task.metadata, task.priority, task.source, task.idempotency_key) == (None, {}, 0, "inbox", None)


def test_idempotency_key_returns_the_same_task(store):
    first, new_first = store.inbox.add_task("do it once", idempotency_key="client-retry-7", priority=1)
    again, new_again = store.inbox.add_task("do it once (retried)", idempotency_key="client-retry-7", priority=9)
    assert (new_first, new_again) == (True, False)
    assert again == first  # the earlier task, unchanged: not the retry's prompt or priority
    assert store.database.writer.execute("SELECT count(*) FROM tasks").fetchone()[0] == 1
    other, new_other = store.inbox.add_task("do it once", idempotency_key="client-retry-8")
    assert new_other is True and other.id != first.id


def test_a_batch_keeps_each_idempotency_key_to_one_task_within_it_and_across_batches(store):
    """A batch (the daemon's group commit) is one statement per kind of work, yet each key still names one task:
    a key seen earlier gives the earlier task, a key twice in the batch gives its first, none is duplicated; a
    batch with a task that cannot be stored (no prompt) commits none of them."""
    ((earlier, _),) = store.inbox.add_tasks([{"prompt": "submitted before", "idempotency_key": "k0"}])
    results = store.inbox.add_tasks(
        [
            {"prompt": "a retry of the earlier one", "idempotency_key": "k0"},
            {"prompt": "new", "idempotency_key": "k1"},
            {"prompt": "the same client again, in the same batch", "idempotency_key": "k1"},
            {"prompt": "no key"},
            {"prompt": "no key"},
        ]
    )
    (again, again_new), (first, first_new), (second, second_new), (plain, plain_new), (twin, twin_new) = results
    assert (again, again_new) == (earlier, False)
    assert first_new and (second, second_new) == (first, False)
    assert plain_new and twin_new and plain.id != twin.id
    assert sorted(t.prompt for t in store.inbox.list_tasks(limit=10)) == ["new", "no key", "no key", "submitted before"]
    with pytest.raises(ValueError):
        store.inbox.add_tasks([{"prompt": "would be fine", "idempotency_key": "k2"}, {"prompt": " "}])
    assert len(store.inbox.list_tasks(limit=10)) == 4


def test_task_needs_a_prompt(store):
    for prompt in ("", "   \n"):
        with pytest.raises(ValueError):
            store.inbox.add_task(prompt)
    assert store.inbox.list_tasks() == []


def test_task_status_and_listing(store):
    a, _ = store.inbox.add_task("first")
    b, _ = store.inbox.add_task("second")
    running = store.inbox.set_task_status(a.id, "running")
    assert (running.status, running.finished_at) == ("running", None)
    failed = store.inbox.set_task_status(a.id, "failed", error="boom")
    assert (failed.status, failed.error) == ("failed", "boom")
    assert failed.finished_at is not None and failed.updated_at >= a.updated_at
    assert [t.id for t in store.inbox.list_tasks(status="failed")] == [a.id]
    assert [t.id for t in store.inbox.list_tasks(status="queued")] == [b.id]
    assert {t.id for t in store.inbox.list_tasks()} == {a.id, b.id}
    assert len(store.inbox.list_tasks(limit=1)) == 1
    with pytest.raises(NotFound, match="task_nope"):
        store.inbox.set_task_status("task_nope", "done")
    with pytest.raises(NotFound):
        store.inbox.get_task("task_nope")
    with pytest.raises(KeyError):  # NotFound is a KeyError too
        store.inbox.get_task("task_nope")


# --- trajectories, steps, outcomes ------------------------------------------


def test_trajectory_and_steps_round_trip(store):
    node = store.tree.add_node("hash-root", status="promoted")
    task, _ = store.inbox.add_task("list the files")
    trajectory = store.attempts.start_trajectory(task.id, node_id=node.id, attempt=2)
    assert isinstance(trajectory, Trajectory)
    assert (trajectory.task_id, trajectory.node_id, trajectory.prompt, trajectory.status, trajectory.attempt) == (
        task.id,
        node.id,
        "list the files",
        "running",
        2,
    )
    calls = [{"id": "call_1", "name": "shell", "arguments": {"cmd": "ls -la", "timeout": 5}}]
    results = [{"call_id": "call_1", "ok": True, "output": "a.txt\nb.txt", "exit": 0}]
    s1 = store.attempts.add_step(
        trajectory.id,
        role="assistant",
        content="I'll look.",
        tool_calls=calls,
        tokens_in=120,
        tokens_out=30,
        cost_usd=0.0015,
        duration_ms=812.5,
    )
    s2 = store.attempts.add_step(trajectory.id, role="tool", content="", tool_results=results, duration_ms=40.0)
    s3 = store.attempts.add_step(
        trajectory.id, role="assistant", content="Two files.", tokens_in=200, tokens_out=8, cost_usd=0.002
    )
    assert [s.seq for s in (s1, s2, s3)] == [1, 2, 3]
    stored = store.reports.steps(trajectory.id)
    assert stored == [s1, s2, s3]
    assert all(isinstance(s, Step) for s in stored)
    assert stored[0].tool_calls == calls and stored[0].tool_results is None
    assert stored[1].tool_results == results and stored[1].tool_calls is None
    assert (stored[0].tokens_in, stored[0].tokens_out, stored[0].cost_usd, stored[0].duration_ms) == (
        120,
        30,
        0.0015,
        812.5,
    )
    assert store.reports.steps(trajectory.id, after_seq=1) == [s2, s3]
    assert store.reports.steps(trajectory.id, after_seq=1, limit=1) == [s2]

    finished = store.attempts.finish_trajectory(trajectory.id, status="finished", final_answer="a.txt, b.txt")
    assert (finished.status, finished.final_answer) == ("finished", "a.txt, b.txt")
    assert finished.finished_at is not None and finished.finished_at >= finished.started_at
    # The trajectory keeps running totals of its steps.
    assert (finished.tokens_in, finished.tokens_out) == (320, 38)
    assert finished.cost_usd == pytest.approx(0.0035)
    assert store.attempts.get_trajectory(trajectory.id) == finished
    assert store.reports.trajectories_of(task.id) == [finished]


def test_step_of_unknown_trajectory_is_refused(store):
    with pytest.raises(NotFound, match="traj_missing"):
        store.attempts.add_step("traj_missing", role="assistant", content="orphan")
    task, _ = store.inbox.add_task("t")
    trajectory = store.attempts.start_trajectory(task.id)
    with pytest.raises(StoreError, match="NOT NULL") as caught:  # a bad step, not a missing trajectory
        store.attempts.add_step(trajectory.id, role="assistant", content=None)
    assert not isinstance(caught.value, NotFound)
    assert store.database.writer.execute("SELECT count(*) FROM steps").fetchone()[0] == 0
    with pytest.raises(NotFound):
        store.attempts.finish_trajectory("traj_missing", status="finished")
    with pytest.raises(NotFound):
        store.attempts.start_trajectory("task_missing")


def test_ingest_round_trip(store):
    node = store.tree.add_node("hash-n")
    [trajectory_id] = store.attempts.ingest(
        [
            NewTrajectory(
                prompt="convert celsius to fahrenheit",
                final_answer="F = C * 9/5 + 32",
                success=True,
                node_id=node.id,
                started_at=1_700_000_000.0,
                check={"expected": "212"},
                steps=[
                    {
                        "role": "assistant",
                        "content": "compute",
                        "tool_calls": [{"name": "python", "arguments": {"code": "100*9/5+32"}}],
                        "tokens_in": 50,
                        "tokens_out": 10,
                        "cost_usd": 0.001,
                        "duration_ms": 300.0,
                    },
                    {"role": "tool", "content": "212.0", "tool_results": [{"ok": True, "output": "212.0"}]},
                ],
            )
        ]
    )
    trajectory = store.attempts.get_trajectory(trajectory_id)
    assert (trajectory.prompt, trajectory.final_answer, trajectory.node_id, trajectory.started_at) == (
        "convert celsius to fahrenheit",
        "F = C * 9/5 + 32",
        node.id,
        1_700_000_000.0,
    )
    task = store.inbox.get_task(trajectory.task_id)
    assert (task.status, task.source, task.check) == ("done", "import", {"expected": "212"})
    steps = store.reports.steps(trajectory_id)
    assert [(s.seq, s.role, s.content) for s in steps] == [(1, "assistant", "compute"), (2, "tool", "212.0")]
    assert steps[0].tool_calls == [{"name": "python", "arguments": {"code": "100*9/5+32"}}]
    assert steps[1].tool_results == [{"ok": True, "output": "212.0"}]
    # The accounting of imported steps is kept, and summed on the trajectory.
    assert (steps[0].tokens_in, steps[0].tokens_out, steps[0].cost_usd, steps[0].duration_ms) == (50, 10, 0.001, 300.0)
    assert (trajectory.tokens_in, trajectory.tokens_out, trajectory.cost_usd) == (50, 10, 0.001)
    assert store.reports.outcome(trajectory_id).success is True


def test_ingest_is_one_transaction(store):
    with pytest.raises(ValueError):
        store.attempts.ingest([NewTrajectory(prompt="fine"), NewTrajectory(prompt="  ")])
    assert store.database.writer.execute("SELECT count(*) FROM trajectories").fetchone()[0] == 0
    assert store.database.writer.execute("SELECT count(*) FROM tasks").fetchone()[0] == 0


def test_outcome_round_trip(store):
    task, _ = store.inbox.add_task("add 2 and 2")
    trajectory = store.attempts.start_trajectory(task.id)
    assert store.reports.outcome(trajectory.id) is None
    outcome = store.attempts.record_outcome(
        trajectory.id, success=False, score=0.25, verifier="expected_answer", verifier_output="expected '4', got '5'"
    )
    assert isinstance(outcome, Outcome)
    assert (outcome.success, outcome.score, outcome.verifier, outcome.verifier_output, outcome.feedback) == (
        False,
        0.25,
        "expected_answer",
        "expected '4', got '5'",
        None,
    )
    # A person's feedback is kept, but a verifier's verdict stands.
    after = store.reports.add_feedback(trajectory.id, good=True, note="close enough for me")
    assert (after.success, after.feedback, after.verifier) == (False, "close enough for me", "expected_answer")
    assert after.person_good is True  # and the person's word is kept as they gave it, beside the verdict
    # A re-verification replaces the verdict and keeps the feedback.
    again = store.attempts.record_outcome(
        trajectory.id, success=True, score=1.0, verifier="expected_answer", verifier_output="ok"
    )
    assert (again.success, again.score, again.verifier_output, again.feedback) == (
        True,
        1.0,
        "ok",
        "close enough for me",
    )
    assert store.reports.outcome(trajectory.id) == again
    with pytest.raises(NotFound):
        store.attempts.record_outcome("traj_missing", success=True)


def test_feedback_decides_where_no_verifier_did(store):
    task, _ = store.inbox.add_task("write a haiku")
    trajectory = store.attempts.start_trajectory(task.id)
    unknown = store.attempts.record_outcome(trajectory.id, success=None)
    assert unknown.success is None
    liked = store.reports.add_feedback(trajectory.id, good=True)
    assert (liked.success, liked.feedback) == (True, "good")
    # The person changes their mind: with no verifier, their latest verdict decides.
    changed = store.reports.add_feedback(trajectory.id, good=False, note="not a haiku")
    assert (changed.success, changed.feedback) == (False, "not a haiku")

    other = store.attempts.start_trajectory(task.id, attempt=2)
    fresh = store.reports.add_feedback(other.id, good=False)
    assert (fresh.success, fresh.feedback, fresh.verifier) == (False, "bad", None)


# --- insights ----------------------------------------------------------------


def test_insight_round_trip_and_update(store):
    provenance = [{"trajectory": "traj_a", "op": "ADD"}, {"trajectory": "traj_b", "op": "UPVOTE"}]
    insight = store.insights.add_insight("Run the tests before answering.", importance=3, provenance=provenance)
    assert isinstance(insight, Insight)
    assert (insight.text, insight.importance, insight.status, insight.provenance, insight.node_id) == (
        "Run the tests before answering.",
        3,
        "active",
        provenance,
        None,
    )
    assert store.insights.get_insight(insight.id) == insight
    assert store.index.all_ids("insights") == {str(insight.id)}

    edited = store.insights.update_insight(insight.id, text="Run the whole test suite before answering.", importance=5)
    assert (edited.text, edited.importance, edited.status, edited.provenance) == (
        "Run the whole test suite before answering.",
        5,
        "active",
        provenance,
    )
    assert edited.updated_at >= insight.updated_at and edited.created_at == insight.created_at
    more = provenance + [{"trajectory": "traj_c", "op": "EDIT"}]
    assert store.insights.update_insight(insight.id, provenance=more).provenance == more

    low = store.insights.add_insight("Prefer tabs.", importance=1)
    assert [i.id for i in store.insights.list_insights()] == [insight.id, low.id]  # most important first
    retired = store.insights.update_insight(low.id, importance=0, status="retired")
    assert retired.status == "retired"
    assert [i.id for i in store.insights.list_insights()] == [insight.id]
    assert {i.id for i in store.insights.list_insights(status=None)} == {insight.id, low.id}
    assert store.index.all_ids("insights") == {str(insight.id)}  # a retired insight leaves the index
    with pytest.raises(NotFound):
        store.insights.update_insight(999, text="nothing")
    with pytest.raises(ValueError):
        store.insights.add_insight("  ")


# --- tools -----------------------------------------------------------------


def test_tool_versions_status_and_usage(store):
    v1 = store.tools.add_tool("csv_sum", description="Sum a column of a CSV file", code_hash="h1", origin="synthesized")
    v2 = store.tools.add_tool(
        "csv_sum", description="Sum a column of a CSV file, skipping blanks", code_hash="h2", origin="synthesized"
    )
    other = store.tools.add_tool(
        "word_count", description="Count the words in a text", code_hash="h3", origin="builtin"
    )
    assert all(isinstance(t, ToolRecord) for t in (v1, v2, other))
    assert [(t.name, t.version) for t in (v1, v2, other)] == [("csv_sum", 1), ("csv_sum", 2), ("word_count", 1)]
    assert (v2.description, v2.code_hash, v2.origin, v2.status) == (
        "Sum a column of a CSV file, skipping blanks",
        "h2",
        "synthesized",
        "active",
    )
    assert (v2.uses, v2.successes, v2.failures) == (0, 0, 0)
    assert store.tools.get_tool(v2.id) == v2
    with pytest.raises(StoreError, match="UNIQUE"):
        store.tools.add_tool("csv_sum", description="dup", code_hash="h4", origin="synthesized", version=2)
    explicit = store.tools.add_tool("csv_sum", description="jump", code_hash="h5", origin="synthesized", version=10)
    assert explicit.version == 10
    assert store.tools.add_tool("csv_sum", description="next", code_hash="h6", origin="synthesized").version == 11

    store.tools.record_tool_use(v2.id, ok=True)
    store.tools.record_tool_use(v2.id, ok=True)
    used = store.tools.record_tool_use(v2.id, ok=False)
    assert (used.uses, used.successes, used.failures) == (3, 2, 1)

    retired = store.tools.set_tool_status(v1.id, "retired")
    assert retired.status == "retired"
    assert v1.id not in {t.id for t in store.tools.list_tools()}
    assert v1.id in {t.id for t in store.tools.list_tools(status=None)}
    assert [t.id for t in store.tools.list_tools(status="retired")] == [v1.id]
    assert str(v1.id) not in store.index.all_ids("tools")
    assert str(v2.id) in store.index.all_ids("tools")
    with pytest.raises(NotFound):
        store.tools.set_tool_status(12345, "retired")
    with pytest.raises(NotFound):
        store.tools.record_tool_use(12345, ok=True)


# --- nodes and evaluations -------------------------------------------------------


def test_nodes_and_evaluations(store):
    root = store.tree.add_node("hash-root", status="promoted", rationale="the seed scaffold", node_id="node_root")
    child = store.tree.add_node(
        "hash-child", parent_id=root.id, diff="--- a\n+++ b\n", rationale="plan first", cost_usd=0.12, tokens=3400
    )
    assert isinstance(child, Node)
    assert (root.id, root.parent_id, root.status) == ("node_root", None, "promoted")
    assert (
        child.parent_id,
        child.scaffold_hash,
        child.status,
        child.diff,
        child.rationale,
        child.cost_usd,
        child.tokens,
    ) == (root.id, "hash-child", "proposed", "--- a\n+++ b\n", "plan first", 0.12, 3400)
    assert store.tree.get_node(child.id) == child
    assert store.tree.set_node_status(child.id, "evaluating").status == "evaluating"
    assert [n.id for n in store.tree.list_nodes()] == [root.id, child.id]
    with pytest.raises(NotFound):
        store.tree.set_node_status("node_missing", "retired")
    with pytest.raises(StoreError, match="FOREIGN KEY"):
        store.tree.add_node("h", parent_id="node_missing")

    task, _ = store.inbox.add_task("eval task")
    trajectory = store.attempts.start_trajectory(task.id, node_id=child.id)
    e1 = store.tree.start_evaluation(child.id, "pack/arith#3", split="heldout")
    e2 = store.tree.start_evaluation(child.id, "pack/arith#4")
    assert isinstance(e1, Evaluation)
    assert (e1.node_id, e1.task_ref, e1.split, e1.status, e1.success, e1.finished_at) == (
        child.id,
        "pack/arith#3",
        "heldout",
        "running",
        None,
        None,
    )
    done = store.tree.finish_evaluation(e1.id, success=True, trajectory_id=trajectory.id)
    assert (done.status, done.success, done.trajectory_id) == ("done", True, trajectory.id)
    assert done.finished_at is not None
    failed = store.tree.finish_evaluation(e2.id, success=False)
    assert failed.success is False  # a bool, not 0
    assert store.tree.evaluations_of(child.id) == [done, failed]
    assert store.tree.evaluations_of(root.id) == []
    with pytest.raises(NotFound):
        store.tree.finish_evaluation(999, success=True)


# --- ledger and events -----------------------------------------------------------


def test_ledger_and_spent(store):
    start = time.time()
    task, _ = store.inbox.add_task("t")
    e1 = store.ledger.record_call(
        model="gpt-x", purpose="task", tokens_in=100, tokens_out=20, cost_usd=0.01, latency_ms=350.0, task_id=task.id
    )
    store.ledger.record_call(
        model="gpt-x", purpose="task", tokens_in=50, tokens_out=5, cost_usd=0.005, latency_ms=100.0, task_id=task.id
    )
    store.ledger.record_call(
        model="claude-y",
        purpose="distill",
        tokens_in=1000,
        tokens_out=200,
        cost_usd=0.2,
        latency_ms=900.0,
        node_id="node_1",
    )
    assert isinstance(e1, LedgerEntry)
    assert (e1.model, e1.purpose, e1.tokens_in, e1.tokens_out, e1.cost_usd, e1.latency_ms, e1.task_id, e1.node_id) == (
        "gpt-x",
        "task",
        100,
        20,
        0.01,
        350.0,
        task.id,
        None,
    )
    assert e1.at >= start
    tokens, usd = store.ledger.spent()
    assert tokens == 1375 and usd == pytest.approx(0.215)
    assert store.ledger.spent(purpose="distill") == (1200, pytest.approx(0.2))
    tokens, usd = store.ledger.spent(task_id=task.id)
    assert tokens == 175 and usd == pytest.approx(0.015)
    assert store.ledger.spent(since=time.time() + 60) == (0, 0.0)
    assert store.ledger.spent(purpose="nothing") == (0, 0.0)


def test_events_round_trip_and_append_only(store):
    first = store.reports.append_event(
        "insight",
        "ADD insight 1",
        why="three failures on timeouts",
        evidence=["traj_a", "traj_b"],
        cost_usd=0.02,
        node_id="node_1",
        payload={"insight_id": 1, "op": "ADD"},
    )
    second = store.reports.append_event("revert", "undo insight 1", reverts=first.id)
    assert isinstance(first, Event)
    assert (
        first.kind,
        first.what,
        first.why,
        first.evidence,
        first.cost_usd,
        first.node_id,
        first.payload,
        first.reverts,
    ) == (
        "insight",
        "ADD insight 1",
        "three failures on timeouts",
        ["traj_a", "traj_b"],
        0.02,
        "node_1",
        {"insight_id": 1, "op": "ADD"},
        None,
    )
    assert (second.reverts, second.evidence, second.payload) == (first.id, [], {})
    assert store.reports.list_events() == [second, first]  # newest first
    assert store.reports.list_events(kind="insight") == [first]
    assert store.reports.list_events(limit=1) == [second]

    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        store.database.writer.execute("UPDATE events SET what = 'rewritten' WHERE id = ?", [first.id])
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        store.database.writer.execute("DELETE FROM events WHERE id = ?", [first.id])
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        store.database.writer.execute("DELETE FROM events")
    assert store.reports.list_events() == [second, first]


def test_everything_survives_reopening(open_store):
    store = open_store()
    node = store.tree.add_node("h")
    task, _ = store.inbox.add_task("persist me", metadata={"k": 1})
    trajectory = store.attempts.start_trajectory(task.id, node_id=node.id)
    step = store.attempts.add_step(trajectory.id, role="assistant", content="hi", tool_calls=[{"name": "x"}])
    outcome = store.attempts.record_outcome(trajectory.id, success=True, verifier="v")
    insight = store.insights.add_insight("an insight", provenance=[trajectory.id])
    tool = store.tools.add_tool("t", description="d", code_hash="c", origin="builtin")
    evaluation = store.tree.start_evaluation(node.id, "ref")
    entry = store.ledger.record_call(model="m", purpose="p", tokens_in=1, tokens_out=2, cost_usd=0.5, latency_ms=1.0)
    event = store.reports.append_event("k", "w", evidence=[1, 2])
    store.close()

    again = open_store()
    assert again.tree.get_node(node.id) == node
    assert again.inbox.get_task(task.id) == task
    assert again.attempts.get_trajectory(trajectory.id).node_id == node.id
    assert again.reports.steps(trajectory.id) == [step]
    assert again.reports.outcome(trajectory.id) == outcome
    assert again.insights.get_insight(insight.id) == insight
    assert again.tools.get_tool(tool.id) == tool
    assert again.tree.get_evaluation(evaluation.id) == evaluation
    assert again.reports.list_events() == [event]
    assert again.ledger.spent() == (3, 0.5)
    assert entry.id == 1


def test_a_transaction_indexes_its_rows_once_committed_and_none_of_a_rolled_back_one(store):
    with pytest.raises(RuntimeError):
        with store.transaction():
            store.insights.add_insight("Rolled back: never indexed.")
            raise RuntimeError("the caller fails after the write")
    assert store.index.count("insights") == 0
    assert store.database.writer.execute("SELECT count(*) FROM index_outbox").fetchone()[0] == 0
    with store.transaction():
        store.insights.add_insight("Committed with the rest of the transaction.")
        assert store.index.count("insights") == 0, "indexed before its transaction committed"
    assert store.index.count("insights") == 1
    assert [h.text for h in store.retrieval.search_insights("committed transaction", k=1)] == [
        "Committed with the rest of the transaction."
    ]


def test_the_last_attempt_is_the_newest_even_when_a_restart_numbers_attempts_again(store):
    """A drained task runs again after the restart with attempts numbered from 1: the newest one,
    not the highest number, is its last (verdicts, feedback and the CLI's answer all read it)."""
    task, _ = store.inbox.add_task("What is 2 + 2?")
    before_restart = []
    for attempt in (1, 2):
        trajectory = store.attempts.start_trajectory(task.id, attempt=attempt)
        store.attempts.finish_trajectory(trajectory.id, status="finished", final_answer="5")
        store.attempts.record_outcome(trajectory.id, success=False, verifier="answer")
        before_restart.append(trajectory.id)
    time.sleep(0.01)
    after = store.attempts.start_trajectory(task.id, attempt=1)
    store.attempts.finish_trajectory(after.id, status="finished", final_answer="4")
    store.attempts.record_outcome(after.id, success=True, verifier="answer")

    assert store.reports.last_trajectory(task.id).id == after.id
    assert store.reports.last_verdict(task.id) == (after.id, True)
    assert [t.id for t in store.reports.trajectories_of(task.id)] == [*before_restart, after.id]


def test_the_tree_records_write_through_the_stores_database_and_join_its_transactions(store):
    """``store.tree`` is a part of its own, composed over the store's one database object: its writes and
    another part's in one transaction commit together or not at all, and an evaluation exists only with
    the inbox task that runs it."""
    assert store.tree.database is store.database
    with pytest.raises(RuntimeError):
        with store.transaction():
            node = store.tree.add_node("h1")
            store.inbox.add_task("queued beside the node")
            raise RuntimeError("the caller fails after both writes")
    assert store.tree.list_nodes() == [] and store.inbox.list_tasks() == []

    with store.transaction():
        node = store.tree.add_node("h2")
        task, _ = store.inbox.add_task("queued beside the node")
    assert store.tree.list_nodes() == [node] and store.inbox.list_tasks() == [task]

    def refuse(evaluation_id: int) -> dict:
        raise ValueError(f"no task for evaluation {evaluation_id}")

    with pytest.raises(ValueError, match="no task for evaluation"):
        store.tree.start_evaluation(node.id, "ref", task_for=refuse)
    assert store.tree.evaluations_of(node.id) == [] and store.inbox.list_tasks() == [task]

    evaluation = store.tree.start_evaluation(node.id, "ref", task_for=lambda i: {"prompt": f"evaluation {i}"})
    queued = store.inbox.get_task(evaluation.task_id)
    assert queued.prompt == f"evaluation {evaluation.id}"
    assert store.tree.running_evaluations() == [evaluation]


def test_every_part_writes_through_the_stores_database_and_joins_its_transactions(store):
    """Each role is a part composed over the store's one database object: the agent's writes (through
    ``store.agent``, the parts that answer it) and what is learned, made in one transaction, commit
    together or not at all."""
    parts = [store.inbox, store.tree, store.reports, store.attempts, store.insights, store.tools]
    parts += [store.exposures, store.retrieval, store.ledger]
    assert all(part.database is store.database for part in parts)
    task, _ = store.inbox.add_task("a task its attempt and what it learned are written beside")

    def write_everything():
        trajectory = store.agent.start_trajectory(task.id)
        store.agent.add_step(trajectory.id, role="assistant", content="a step")
        insight = store.insights.add_insight("an insight learned beside the attempt")
        store.tools.add_tool("a_tool", description="a tool", code_hash="h", origin="synthesized")
        store.agent.record_exposures(trajectory.id, {"insight": [str(insight.id)], "tool": ["a_tool"]})
        store.agent.record_call(
            model="m", purpose="task", tokens_in=1, tokens_out=2, cost_usd=0.0, latency_ms=1.0, task_id=task.id
        )
        store.agent.record_outcome(trajectory.id, success=True)
        return trajectory, insight

    with pytest.raises(RuntimeError):
        with store.transaction():
            write_everything()
            raise RuntimeError("the caller fails after every write")
    assert store.reports.trajectories_of(task.id) == []
    assert store.insights.list_insights() == [] and store.tools.list_tools() == []
    assert store.ledger.spent(task_id=task.id) == (0, 0.0)

    with store.transaction():
        trajectory, insight = write_everything()
    assert [t.id for t in store.reports.trajectories_of(task.id)] == [trajectory.id]
    assert [s.content for s in store.reports.steps(trajectory.id)] == ["a step"]
    assert store.exposures.exposures_of(trajectory.id) == {"insight": [str(insight.id)], "tool": ["a_tool"]}
    assert [t.name for t in store.agent.list_tools()] == ["a_tool"]
    assert store.agent.spent(task_id=task.id) == (3, 0.0)
    assert store.reports.outcome(trajectory.id).success is True


def test_reads_of_more_ids_than_sqlite_binds_at_once_still_answer_for_each(store):
    """A list of ids past what SQLite binds in one statement is read in chunks (``Database.all_in``), not
    refused with "too many SQL variables": a person's batch of keyed tasks, and the counts a view asks of
    them. Debian's SQLite binds 250,000; SQLite's own default (since 3.32), which other builds keep, 32,766."""
    for connection in (store.database.writer.conn, store.database.reader().conn):
        connection.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 32_766)
    many = 33_000
    keyed = [{"prompt": f"task {n}", "idempotency_key": f"k{n}"} for n in range(many)]
    made = store.inbox.add_tasks(keyed)
    assert all(new for _, new in made)
    again = store.inbox.add_tasks(keyed)  # each key is found again: the same tasks, none made twice
    assert [task.id for task, _ in again] == [task.id for task, _ in made] and not any(new for _, new in again)
    first = made[0][0]
    trajectory = store.attempts.start_trajectory(first.id)
    store.attempts.finish_trajectory(trajectory.id, status="finished", final_answer="done")
    counts = store.reports.trajectory_counts([task.id for task, _ in made])
    assert len(counts) == many and counts[first.id] == 1 and sum(counts.values()) == 1
    unknown = [f"traj_{n}" for n in range(many)]
    assert store.attempts.learnable([*unknown, trajectory.id]) == {trajectory.id}
