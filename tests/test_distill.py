"""Distillation rounds with the scripted model: applied whole or not at all, watermarked, budgeted."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from evolver.config import load_config
from evolver.engine import Engine
from evolver.llm import scripted
from evolver.llm.budget import BudgetExceeded
from evolver.meta.distill import WATERMARK_KEY, distill_round
from evolver.meta.insights import InsightOpError
from evolver.meta.jobs import Job, Jobs, builtin_jobs
from evolver.text import Unchanged
from memory import NewTrajectory

ADD = {"operations": [{"op": "ADD", "text": "Compute with run_python before answering a number."}]}


def _script(name: str, reply) -> str:
    scripted.register_script(
        name, {"rules": [{"match": "", "reply": reply if isinstance(reply, str) else json.dumps(reply)}]}
    )
    return f"scripted/{name}"


@pytest.fixture
def engine(open_store, sandbox, tmp_path):
    opened = []

    def make(reply, name: str, **env) -> Engine:
        config = load_config(env={"EVOLVER_MODEL_NAME": _script(name, reply), **env})
        e = Engine.open(config, data_dir=tmp_path / "d", store=open_store(tmp_path / "d"), sandbox=sandbox)
        opened.append(e)
        return e

    yield make


def _experience(store, n: int = 2) -> list[str]:
    return store.attempts.ingest(
        [
            NewTrajectory(prompt=f"What is {i} + {i}?", final_answer=str(2 * i + (i % 2)), success=i % 2 == 0)
            for i in range(n)
        ]
    )


def _ledger_rows(store) -> int:
    return store.database.one("SELECT count(*) AS n FROM ledger")["n"]


def test_a_round_applies_the_operations_records_evidence_and_moves_the_watermark(engine):
    e = engine(ADD, "distill-ok")
    ids = _experience(e.store)
    assert distill_round(e.store, e.model, e.config) == "1 operations (ADD) from 2 trajectories"
    (insight,) = e.store.insights.list_insights()
    assert insight.text == ADD["operations"][0]["text"] and sorted(insight.provenance) == sorted(ids)
    (event,) = e.store.reports.list_events(kind="distill")
    assert sorted(event.evidence) == sorted(ids)
    assert e.store.insights.insight_history(insight.id)[0]["event_id"] == event.id
    calls = _ledger_rows(e.store)
    assert distill_round(e.store, e.model, e.config) == "no new trajectories since the last round"
    assert _ledger_rows(e.store) == calls  # no model call for nothing new


@pytest.mark.parametrize(
    "reply, problem",
    [
        ("I think the agent should compute more.", "not JSON"),
        ({"operations": [{"op": "UPVOTE", "id": 7}]}, "id of a listed insight"),
        ({"operations": [{"op": "REWRITE", "id": 1}]}, "op must be one of"),
    ],
)
def test_bad_model_output_fails_the_round_and_changes_nothing(engine, reply, problem):
    e = engine(reply, f"distill-bad-{abs(hash(problem))}")
    _experience(e.store)
    with pytest.raises(InsightOpError, match=problem):
        distill_round(e.store, e.model, e.config)
    assert e.store.insights.list_insights(status=None) == [] and e.store.reports.list_events(kind="distill") == []
    assert e.store.get_meta(WATERMARK_KEY) is None  # the same trajectories are seen again next round


def test_the_watermark_survives_a_restart(engine, open_store, tmp_path):
    e = engine(ADD, "distill-restart")
    _experience(e.store)
    distill_round(e.store, e.model, e.config)
    e.store.close()
    again = engine(ADD, "distill-restart-2")  # a new store on the same data dir: a restarted daemon
    again.store.attempts.ingest([NewTrajectory(prompt="What is 10 + 10?", final_answer="20", success=True)])
    assert distill_round(again.store, again.model, again.config).endswith("from 1 trajectories")


def test_no_budget_for_background_work_stops_the_round_cleanly(engine):
    e = engine(
        ADD,
        "distill-broke",
        EVOLVER_BUDGET_TOKENS_PER_DAY="1000",
        EVOLVER_BUDGET_TOKENS_PER_TASK="100",
        EVOLVER_BUDGET_BACKGROUND_SHARE="0.01",
    )
    _experience(e.store)
    with pytest.raises(BudgetExceeded, match="background token share"):
        distill_round(e.store, e.model, e.config)
    assert e.store.insights.list_insights(status=None) == [] and e.store.get_meta(WATERMARK_KEY) is None


def test_a_failed_round_is_a_loud_job_failed_event(engine):
    e = engine("not json at all", "distill-job")
    _experience(e.store)
    daemon = SimpleNamespace(store=e.store, engine=e, config=e.config)
    jobs = Jobs(daemon, builtin_jobs(e.config))
    (round_,) = jobs.run_now("distill")
    assert round_.ok is False and "not JSON" in round_.summary
    (event,) = e.store.reports.list_events(kind="job_failed")
    assert event.payload["job"] == "distill" and "not JSON" in event.what
    assert jobs._blocked(jobs.jobs["distill"]) is None  # idle inbox, budget left: a scheduled round may run
    e.store.inbox.add_task("a person's task")
    assert jobs._blocked(jobs.jobs["distill"]) == "the inbox has work"


def test_reverting_a_distill_event_restores_the_insights_as_a_new_event(engine):
    from evolver.meta.insights import apply_ops, numbered, parse_ops
    from evolver.meta.revert import RevertError, revert_event

    e = engine(ADD, "distill-revert")
    kept = e.store.insights.add_insight("Read the task's files before answering.", importance=3)
    _experience(e.store)
    distill_round(e.store, e.model, e.config)
    (added,) = [i for i in e.store.insights.list_insights() if i.id != kept.id]
    shown = numbered(e.store, limit=50)
    vote = e.store.reports.append_event("distill", "by hand")
    apply_ops(
        e.store,
        parse_ops({"operations": [{"op": "UPVOTE", "id": 1}]}, shown=len(shown)),
        shown,
        provenance=[],
        cap=50,
        event_id=vote.id,
    )
    assert e.store.insights.get_insight(kept.id).importance == 4
    (first,) = e.store.reports.list_events(kind="distill", limit=2)[1:]
    with pytest.raises(RevertError, match="nothing to revert"):
        revert_event(e.store, e.store.reports.append_event("job", "reconcile: ok").id)

    undone = revert_event(e.store, vote.id, why="that vote was wrong")
    assert undone.reverts == vote.id and e.store.insights.get_insight(kept.id).importance == 3
    assert [h["op"] for h in e.store.insights.insight_history(kept.id)] == ["UPVOTE", "REVERT"]
    with pytest.raises(RevertError, match="already reverted"):
        revert_event(e.store, vote.id)

    revert_event(e.store, first.id)  # the ADD: the insight is retired, not deleted
    assert e.store.insights.get_insight(added.id).status == "retired"
    assert e.store.insights.list_insights() == [e.store.insights.get_insight(kept.id)]


def test_a_revert_that_fails_halfway_leaves_nothing_and_can_be_retried(engine, monkeypatch):
    from evolver.meta.revert import revert_event
    from memory import StoreError

    e = engine(ADD, "distill-revert-crash")
    _experience(e.store)
    distill_round(e.store, e.model, e.config)
    (event,) = e.store.reports.list_events(kind="distill")
    (added,) = e.store.insights.list_insights()

    def crash(*args, **kwargs):
        raise StoreError("the disk went away while the insights were put back")

    with monkeypatch.context() as m:  # the revert's event is written, its insight changes are not
        m.setattr(type(e.store.insights), "apply_insight_changes", crash)
        with pytest.raises(StoreError, match="disk went away"):
            revert_event(e.store, event.id)
    assert e.store.reports.list_events(kind="revert") == []  # no revert event stands for a revert that did not happen
    assert e.store.insights.get_insight(added.id).status == "active"
    undone = revert_event(e.store, event.id)  # so a retry is not refused as "already reverted"
    assert undone.reverts == event.id and e.store.insights.get_insight(added.id).status == "retired"
    assert [h["op"] for h in e.store.insights.insight_history(added.id)] == ["ADD", "REVERT"]
    assert e.store.insights.insight_changes_of(undone.id)[0]["insight_id"] == added.id


def test_failing_scheduled_rounds_back_off_doubling_to_a_cap_and_a_success_resets(engine):
    e = engine(ADD, "distill-backoff")
    daemon = SimpleNamespace(store=e.store, engine=e, config=e.config)
    outcomes = iter([False, False, False, False, False, False, False, True])

    def flaky(host) -> str:
        if not next(outcomes):
            raise ValueError("the answer is not JSON")
        return "fine"

    # Due on work every 30 s (the trigger) as the "evolve" job is: a failing round must not rerun at that pace.
    job = Job(
        "flaky",
        flaky,
        every_min=5.0,
        after=1,
        pending=lambda host: 1,
        waits_for_idle=False,
        description="a round that fails until it does not",
    )
    jobs = Jobs(daemon, [job])
    jobs.start()
    try:

        def delay() -> float:
            (run,) = jobs.next_runs()
            return run["next_run_at"] - time.time()

        waits = []
        for _ in range(7):
            jobs.run_one("flaky")  # the round that was due
            waits.append(delay())
            jobs._triggers()  # in backoff: neither the trigger nor a poke runs it early
            jobs._scheduled("flaky")
            assert len(e.store.reports.list_events(kind="job_failed")) == len(waits)
        minutes = [round(w / 60) for w in waits]
        assert minutes == [5, 10, 20, 40, 60, 60, 60]  # doubling from the interval, up to an hour
        assert jobs.next_runs()[0]["failures"] == 7
        jobs.run_now("flaky")  # a round by hand still runs; its success ends the backoff
        assert round(delay() / 60) == 5 and jobs.next_runs()[0]["failures"] == 0
    finally:
        jobs.stop()


def test_an_answer_with_its_final_brace_missing_is_repaired_and_applied(engine):
    # What a 0.5B model did: the right JSON in a fence, the last brace left off.
    e = engine("```json\n" + json.dumps(ADD)[:-1] + "\n```", "distill-repair")
    _experience(e.store)
    assert distill_round(e.store, e.model, e.config).startswith("1 operations (ADD)")


def test_with_structured_output_the_answer_is_asked_for_with_a_json_schema(engine, tmp_path):
    record = tmp_path / "sent.jsonl"
    scripted.register_script(
        "distill-schema", {"record": str(record), "rules": [{"match": "", "reply": json.dumps(ADD)}]}
    )
    config = load_config(
        env={"EVOLVER_MODEL_NAME": "scripted/distill-schema", "EVOLVER_MODEL_STRUCTURED_OUTPUT": "true"}
    )
    e = engine(ADD, "distill-schema-unused")
    _experience(e.store)
    distill_round(e.store, e.model.__class__(config.model, ledger=e.store.ledger, budget=e.model.budget), config)
    sent = json.loads(record.read_text().splitlines()[-1])
    schema = sent["response_format"]["json_schema"]["schema"]
    assert "operations" in schema["properties"] and sent["max_tokens"] == config.model.max_tokens_distill


def test_an_unreadable_answer_fails_the_round_saying_what_came_back(engine):
    e = engine('{"operations": [{"op": "ADD", "text": "unclosed}]', "distill-unreadable")
    _experience(e.store)
    with pytest.raises(InsightOpError, match=r"not JSON.*came back.*unclosed"):
        distill_round(e.store, e.model, e.config)


def _stuck(prompt: str, status: str, code: str, turns: int) -> NewTrajectory:
    """An attempt that ended without an answer: the same run_python call, turn after turn."""
    steps = []
    for i in range(turns):
        steps.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": f"c{i}", "name": "run_python", "arguments": {"code": code}}],
            }
        )
        steps.append({"role": "tool", "content": "NameError: name 'x' is not defined"})
    steps.append(
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "bad", "name": "finish", "arguments": None, "error": "arguments are not JSON", "raw": "{answer:"}
            ],
        }
    )
    return NewTrajectory(
        prompt=prompt, success=False, status=status, steps=steps, verifier_output="no final answer was given"
    )


def test_attempts_without_an_answer_are_distilled_with_what_the_model_kept_doing(engine, tmp_path):
    record = tmp_path / "distill-seen.jsonl"
    scripted.register_script(
        "distill-stuck", {"rules": [{"match": "", "reply": json.dumps(ADD)}], "record": str(record)}
    )
    e = engine(ADD, "distill-stuck-unused", EVOLVER_MODEL_NAME="scripted/distill-stuck")
    ids = e.store.attempts.ingest(
        [
            _stuck("What is x + 1?", "step_limit", "print(x + 1)", 4),
            _stuck("What is y * 2?", "repeating", "print(y * 2)", 6),
        ]
    )
    assert distill_round(e.store, e.model, e.config) == "1 operations (ADD) from 2 trajectories"
    (insight,) = e.store.insights.list_insights()
    assert sorted(insight.provenance) == sorted(ids)
    prompt = json.loads(record.read_text().splitlines()[0])["messages"][-1]["content"]
    assert (
        "What it did: hit the step limit after 5 model turns; calls: run_python x4; "
        "4 identical calls in a row; 1 call that could not be read; "
        "last result: NameError: name 'x' is not defined"
    ) in prompt
    assert "was stopped for repeating one call after 7 model turns" in prompt
    assert prompt.count("The verifier said: no final answer was given") == 2


def test_attempts_cut_short_by_something_else_teach_nothing_and_move_the_watermark(engine):
    e = engine(ADD, "distill-cut")
    e.store.attempts.ingest(
        [
            NewTrajectory(prompt="What is 1 + 1?", status="cancelled"),
            NewTrajectory(prompt="What is 2 + 2?", status="error"),
        ]
    )
    assert distill_round(e.store, e.model, e.config) == (
        "2 trajectories cut short (cancelled or an error); nothing to distill"
    )
    assert e.store.insights.list_insights() == [] and e.store.get_meta(WATERMARK_KEY) is not None


REAL = Path(__file__).parent / "data" / "real_model_failures.json"  # tests/data/record_real_failures.py


def real_failures() -> list[NewTrajectory]:
    """What the real 0.5B model did on training tasks of the basic pack, as recorded, where it ended
    without an answer."""
    recorded = json.loads(REAL.read_text(encoding="utf-8"))["recorded"]
    return [
        NewTrajectory(
            prompt=r["prompt"],
            success=False,
            status=r["status"],
            steps=r["steps"],
            verifier_output=r["verifier_output"],
        )
        for r in recorded
    ]


def test_the_real_models_attempts_without_an_answer_become_an_insight(engine, tmp_path):
    record = tmp_path / "distill-real.jsonl"
    scripted.register_script(
        "distill-real", {"rules": [{"match": "", "reply": json.dumps(ADD)}], "record": str(record)}
    )
    e = engine(ADD, "distill-real-unused", EVOLVER_MODEL_NAME="scripted/distill-real")
    attempts = real_failures()
    assert attempts and all(a.status in ("step_limit", "repeating") for a in attempts)
    ids = e.store.attempts.ingest(attempts)
    assert distill_round(e.store, e.model, e.config) == f"1 operations (ADD) from {len(ids)} trajectories"
    (insight,) = e.store.insights.list_insights()
    assert sorted(insight.provenance) == sorted(ids)
    prompt = json.loads(record.read_text().splitlines()[0])["messages"][-1]["content"]
    assert prompt.count("No answer (failed)") == len(ids) and prompt.count("What it did: ") == len(ids)
    assert prompt.count("The verifier said: ") == len(ids)


def test_one_bad_operation_of_a_weak_model_is_skipped_and_its_good_ones_applied(engine):
    """What the real 0.5B model answered for its own failures: a good ADD and an EDIT of an insight that
    is not listed. The ADD is applied; the EDIT is skipped, and the event says why."""
    reply = {
        "operations": [
            {"op": "ADD", "text": "Call finish with the answer once the code printed it."},
            {"op": "EDIT", "id": 2, "text": "Use run_python."},
        ]
    }
    e = engine(reply, "distill-partial")
    _experience(e.store)
    summary = distill_round(e.store, e.model, e.config)
    assert summary == (
        "1 operations (ADD; skipped 1: operation 2: EDIT needs the id of a listed insight "
        "(1..0), not 2) from 2 trajectories"
    )
    (insight,) = e.store.insights.list_insights()
    assert insight.text == "Call finish with the answer once the code printed it."
    (event,) = e.store.reports.list_events(kind="distill")
    assert event.payload["skipped"] == ["operation 2: EDIT needs the id of a listed insight (1..0), not 2"]


def test_a_poke_while_a_round_of_the_job_runs_is_not_lost(engine):
    """The daemon pokes "record" as each evaluation task ends; one that ends while a record round runs
    (after that round read the store) must still be recorded: the round runs once more."""
    import threading

    e = engine(ADD, "jobs-poke")
    first_started, release, rounds = threading.Event(), threading.Event(), []

    def slow(host) -> str:
        rounds.append(time.monotonic())
        if len(rounds) == 1:
            first_started.set()
            assert release.wait(30)
        return f"round {len(rounds)}"

    jobs = Jobs(
        SimpleNamespace(store=e.store, engine=e, config=e.config),
        [Job("record", slow, every_min=60.0, description="a slow round", waits_for_idle=False)],
    )
    jobs.start(schedule=False)
    try:
        jobs.poke("record")
        assert first_started.wait(30)
        jobs.poke("record")  # while the first round runs
        time.sleep(0.5)
        assert len(rounds) == 1
        release.set()
        deadline = time.monotonic() + 30
        while len(rounds) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(rounds) == 2
    finally:
        jobs.stop()


def test_stopping_the_jobs_waits_for_a_running_round_and_starts_none_after(engine):
    """The daemon closes the store after the jobs stop: a round running then is waited for (its event is
    written before stop returns), one that outlives the wait is named as cut, and no round starts after."""
    import threading

    e = engine(ADD, "jobs-stop")
    started, release = threading.Event(), threading.Event()

    def slow(host) -> str:
        started.set()
        assert release.wait(30)
        return "slow round"

    jobs = Jobs(
        SimpleNamespace(store=e.store, engine=e, config=e.config),
        [Job("record", slow, every_min=60.0, description="a slow round", waits_for_idle=False)],
    )
    jobs.start(schedule=False)
    jobs.poke("record")
    assert started.wait(30)
    assert jobs.stop(timeout_s=0.2) == ["record"]  # still running: cut, were the store closed now
    threading.Timer(0.2, release.set).start()
    assert jobs.stop(timeout_s=30) == []  # waited for
    assert [ev.what for ev in e.store.reports.list_events(kind="job")] == ["record: slow round"]
    (late,) = jobs.run_now("record")
    assert not late.ok and late.event_id is None and "stopping" in late.summary
    assert len(e.store.reports.list_events(kind="job")) == 1


def test_stopping_the_jobs_while_the_scheduler_hands_out_a_poke_leaves_the_scheduler_sound(engine, monkeypatch):
    """A stop that lands while the scheduler is handing a poke to its threads: APScheduler marks itself stopped
    at once, and its pass then failed to remove the poke it had handed out (JobLookupError, the scheduler's
    thread dead), a warning at every such daemon stop."""
    import threading

    from apscheduler.schedulers.base import STATE_STOPPED

    e = engine(ADD, "jobs-stop-race")
    jobs = Jobs(
        SimpleNamespace(store=e.store, engine=e, config=e.config),
        [Job("record", lambda host: "a round", every_min=60.0, description="a quick round", waits_for_idle=False)],
    )
    jobs.start(schedule=False)
    executor = jobs.scheduler._lookup_executor("default")
    handing_out, go_on = threading.Event(), threading.Event()
    submit = executor.submit_job

    def held_submit(job, run_times):
        handing_out.set()
        assert go_on.wait(30)
        return submit(job, run_times)

    monkeypatch.setattr(executor, "submit_job", held_submit)
    died = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_value))
    jobs.poke("record")
    assert handing_out.wait(30)
    stopper = threading.Thread(target=jobs.stop, kwargs={"timeout_s": 30})
    stopper.start()
    assert jobs._stopping.wait(30)
    deadline, pause = time.monotonic() + 30, threading.Event()
    while jobs.scheduler.state != STATE_STOPPED and time.monotonic() < deadline:
        pause.wait(0.01)  # until the stop has marked the scheduler stopped, the pass still under way
    assert jobs.scheduler.state == STATE_STOPPED
    go_on.set()
    stopper.join(30)
    assert not stopper.is_alive()
    assert died == []
    assert jobs.scheduler.state == STATE_STOPPED


def test_a_round_that_changes_nothing_is_telemetry_not_history(engine):
    """`evolver history` shows changes: a round that found nothing to do is no event, yet status still shows
    it as the job's last round."""
    e = engine(ADD, "jobs-quiet")
    answers = iter([Unchanged("nothing ended"), "recorded evaluation 1", Unchanged("nothing ended")])
    jobs = Jobs(
        SimpleNamespace(store=e.store, engine=e, config=e.config),
        [Job("record", lambda host: next(answers), every_min=5.0, description="record", waits_for_idle=False)],
    )
    jobs.start(schedule=False)
    try:
        quiet, changed, quiet_again = (jobs.run_now("record")[0] for _ in range(3))
        assert quiet.ok and quiet.event_id is None and quiet_again.event_id is None
        assert [ev.what for ev in e.store.reports.list_events(kind="job")] == ["record: recorded evaluation 1"]
        assert changed.event_id == e.store.reports.list_events(kind="job")[0].id
        (status,) = jobs.next_runs()
        assert status["last"]["summary"] == "record: nothing ended" and status["last"]["ok"]
    finally:
        jobs.stop()


def test_a_batch_the_model_keeps_answering_unusably_is_passed_after_three_tries(engine):
    """The 0.5B model echoed the instructions' example every round: the round failed and kept its
    watermark, so distillation stood at that batch for good. Now the third unusable answer for the same
    batch moves past it, as an event that names why; until then each failure changes nothing else."""
    from evolver.meta.distill import GIVE_UP_AFTER

    echo = {"operations": [{"op": "ADD", "text": "..."}, {"op": "UPVOTE", "id": 1}]}
    e = engine(echo, "distill-echo")
    ids = _experience(e.store)
    for _ in range(GIVE_UP_AFTER - 1):
        with pytest.raises(InsightOpError, match="copies the example"):
            distill_round(e.store, e.model, e.config)
        assert e.store.get_meta(WATERMARK_KEY) is None and not e.store.reports.list_events(kind="distill_skipped")
    summary = distill_round(e.store, e.model, e.config)
    assert summary.startswith(f"gave up on 2 trajectories after {GIVE_UP_AFTER} unusable answers")
    (event,) = e.store.reports.list_events(kind="distill_skipped")
    assert sorted(event.evidence) == sorted(ids) and "copies the example" in event.what
    assert e.store.insights.list_insights(status=None) == []
    assert distill_round(e.store, e.model, e.config) == "no new trajectories since the last round"
