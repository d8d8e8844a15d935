"""Leased workers: fenced completion, cancellation mid-run, and a lost lease."""

from __future__ import annotations

import threading
import time

import pytest

from evolver.config import load_config
from evolver.engine import Engine
from evolver.llm import scripted
from evolver.service.worker import Worker

LOOP = {
    "rules": [
        {"match": "^42$", "role": "tool", "tool": "finish", "arguments": {"answer": "42"}},
        {"match": "", "role": "user", "tool": "run_python", "arguments": {"code": "print(6 * 7)"}},
    ]
}
SLOW = {
    "rules": [  # two different calls a step: never one call repeated in a row, which would end the attempt
        {
            "match": "",
            "calls": [
                {"tool": "run_python", "arguments": {"code": f"import time; time.sleep(0.025); print({n})"}}
                for n in (1, 2)
            ],
        },
    ]
}


@pytest.fixture
def engine(open_store, sandbox, tmp_path):
    def make(script: dict, name: str) -> Engine:
        scripted.register_script(name, script)
        config = load_config(env={"EVOLVER_MODEL_NAME": f"scripted/{name}"})
        return Engine.open(config, data_dir=tmp_path / name, store=open_store(tmp_path / name), sandbox=sandbox)

    return make


def test_a_claimed_task_is_solved_and_recorded_through_its_lease(engine):
    e = engine(LOOP, "w-solve")
    task, _ = e.store.inbox.add_task("What is 6 * 7?", check={"type": "answer", "expected": "42"})
    worker = Worker(e.agent(), owner="w1", lease_s=30, max_attempts=3, store=e.store)
    outcome = worker.run_once()
    assert outcome.recorded and not outcome.lease_lost and outcome.result.success
    stored = e.store.inbox.get_task(task.id)
    assert (stored.status, stored.attempts, stored.lease_owner) == ("done", 1, None)
    assert worker.run_once() is None


def test_a_cancel_request_stops_the_run_at_a_step_boundary(engine):
    e = engine(SLOW, "w-cancel")
    task, _ = e.store.inbox.add_task("Work until told to stop")
    worker = Worker(e.agent(), owner="w1", lease_s=30, max_attempts=3, store=e.store)
    threading.Timer(0.3, e.store.inbox.request_cancel, args=[task.id]).start()
    outcome = worker.run_once()
    assert outcome.result.status == "cancelled" and outcome.recorded
    assert e.store.inbox.get_task(task.id).status == "cancelled"


def test_a_worker_that_loses_its_lease_stops_and_its_result_is_refused(engine):
    e = engine(SLOW, "w-lost")
    task, _ = e.store.inbox.add_task("Slow work")
    worker = Worker(e.agent(), owner="stalled", lease_s=0.6, max_attempts=3, store=e.store)
    taken: list = []

    def take_over():
        # The stalled worker's lease is made to expire; another worker claims the task.
        with e.store.database.write() as db:
            db.execute("UPDATE tasks SET lease_expires_at = ? WHERE id = ?", [time.time() - 1, task.id])
        taken.append(e.store.inbox.claim_task("rescuer", lease_s=30, max_attempts=3))

    threading.Timer(0.1, take_over).start()
    outcome = worker.run_once()
    assert outcome.lease_lost and not outcome.recorded
    stored = e.store.inbox.get_task(task.id)
    assert (stored.status, stored.lease_owner, stored.attempts) == ("running", "rescuer", 2)
    assert e.store.inbox.complete_task(taken[0], "done") is True
