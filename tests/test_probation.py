"""An imported insight is on probation: no person's task is shown it until a person approves it or it is
measured to help on the promotion split; an approval is an event a revert undoes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from evolver.agent.loop import shows_probation
from evolver.agent.scaffold import default_scaffold
from evolver.config import load_config
from evolver.engine import Engine
from evolver.llm import scripted
from evolver.meta import packs
from evolver.meta.jobs import builtin_jobs
from evolver.meta.probation import ApprovalError, approve_insight, probation_round
from evolver.meta.revert import revert_event
from memory import Task, TaskKind, TaskStatus, new_id
from tests.test_prune import HARMFUL, RULES  # an insight that makes every task answer "red", and that model


@pytest.fixture
def engine(open_store, sandbox, tmp_path):
    scripted.register_script("probation", {"rules": RULES})
    opened = []

    def make(name: str) -> Engine:
        config = load_config(
            env={"EVOLVER_MODEL_NAME": "scripted/probation", "EVOLVER_EVOLUTION_RETIRE_AFTER_EXPOSURES": "4"}
        )
        e = Engine.open(config, data_dir=tmp_path / name, store=open_store(tmp_path / name), sandbox=sandbox)
        opened.append(e)
        return e

    yield make
    for e in opened:
        e.close()


def _scaffold():
    base = default_scaffold()
    return base.model_copy(
        update={
            "parameters": base.parameters.model_copy(update={"insights": 5, "reflect_retry": False, "max_attempts": 1})
        }
    )


def _imported(make) -> tuple[Engine, int]:
    """A store that imported a pack whose one insight makes every task here fail."""
    source = make("source")
    source.store.insights.record_insight_changes(
        "distill", "one insight", [{"op": "ADD", "text": HARMFUL, "importance": 2}]
    )
    data, _ = packs.export_pack(source.store, insights=True)
    target = make("target")
    report = packs.import_pack(target, data)
    assert report["probation"] == 1 and report["items"][0]["reason"] == "on probation"
    (insight,) = target.store.insights.list_insights(status="probation")
    return target, insight.id


def _task(engine: Engine, n: int, **kwargs):
    task, _ = engine.store.inbox.add_task(
        f"Say the word blue, please (number {n}).", check={"type": "answer", "expected": "blue"}, **kwargs
    )
    return task


def _solve(engine: Engine, task):
    return engine.agent(_scaffold()).run_task(task)


def _shown(store, result) -> list[str]:
    """The insights an attempt was shown (its prompt's, as recorded for measuring them)."""
    return store.exposures.exposures_of(result.trajectory_ids[0]).get("insight", [])


def _promotion_task(engine: Engine, n: int, shown: bool):
    """An evaluation task of the promotion split (as the tree queues one), on the side of the coin asked for."""
    while True:
        probe = Task(
            new_id("task"), "", TaskStatus.QUEUED, 0.0, 0.0, source=TaskKind.EVALUATION, metadata={"split": "test"}
        )
        if shows_probation(probe) == shown:
            ((task, _),) = engine.store.inbox.add_tasks(
                [
                    {
                        "id": probe.id,
                        "prompt": f"Say the word blue, please ({n}).",
                        "check": {"type": "answer", "expected": "blue"},
                        "source": "evaluation",
                        "metadata": {"split": "test"},
                    }
                ]
            )
            return task


def test_an_imported_insight_reaches_no_task_of_a_person_until_approved_and_a_revert_takes_approval_back(engine):
    target, insight_id = _imported(engine)
    store = target.store
    before = _solve(target, _task(target, 1))
    assert before.success is True and before.answer == "blue"
    assert _shown(store, before) == []  # not in its prompt
    held = _solve(target, _task(target, 2, metadata={"split": "test"}))  # a person's held-out task: not either
    assert held.success is True and _shown(store, held) == []

    event = approve_insight(store, insight_id, cap=target.config.evolution.max_insights)
    assert event.kind == "insight_approved" and store.insights.get_insight(insight_id).status == "active"
    after = _solve(target, _task(target, 3))
    assert after.success is False and after.answer == "red"
    assert _shown(store, after) == [str(insight_id)]
    with pytest.raises(ApprovalError, match=f"insight {insight_id} is active, not on probation"):
        approve_insight(store, insight_id, cap=50)

    revert_event(store, event.id)
    assert store.insights.get_insight(insight_id).status == "probation"
    again = _solve(target, _task(target, 4))
    assert again.success is True and _shown(store, again) == []


def test_half_the_promotion_split_sees_it_and_the_measure_there_retires_it_or_lets_it_in(engine):
    target, insight_id = _imported(engine)
    store = target.store
    shown = [_solve(target, _promotion_task(target, n, shown=True)) for n in range(6)]
    hidden = [_solve(target, _promotion_task(target, n, shown=False)) for n in range(6)]
    assert [r.answer for r in shown] == ["red"] * 6 and [r.answer for r in hidden] == ["blue"] * 6
    assert all(_shown(store, r) == [str(insight_id)] for r in shown)
    assert all(_shown(store, r) == [] for r in hidden)
    # Measured there by the prune job (the same tasks with and without it), it hurts: retired, never
    # having reached a person.
    (prune,) = [j for j in builtin_jobs(target.config) if j.name == "prune"]
    host = SimpleNamespace(config=target.config, engine=target, tree=None, store=store)
    assert prune.run(host) == (
        f"retired insight {insight_id} on probation (hurts); every learned item is still helping or not yet measured"
    )
    assert store.insights.get_insight(insight_id).status == "retired"
    (event,) = store.reports.list_events(kind="insight_retired")
    assert "0 of 6 attempts with it succeeded, against 6 of 6 without it" in event.why
    assert probation_round(store, target.config) == []


def test_one_that_helps_on_the_promotion_split_earns_its_place(engine):
    target, insight_id = _imported(engine)
    store = target.store
    for n in range(6):  # synthetic outcomes: with it the promotion tasks pass, without it they fail
        for shown in (True, False):
            task = _promotion_task(target, n, shown=shown)
            trajectory = store.attempts.start_trajectory(task.id)
            store.attempts.finish_trajectory(trajectory.id, status="done", final_answer="x")
            store.attempts.record_outcome(trajectory.id, success=shown)
            store.exposures.record_exposures(trajectory.id, {"insight": [str(insight_id)] if shown else []})
    assert probation_round(store, target.config) == [f"insight {insight_id} left probation (helps)"]
    assert store.insights.get_insight(insight_id).status == "active"
    (event,) = store.reports.list_events(kind="insight_earned")
    assert "6 of 6 attempts with it succeeded, against 0 of 6 without it" in event.why
    revert_event(store, event.id)
    assert store.insights.get_insight(insight_id).status == "probation"
