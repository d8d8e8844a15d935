"""Agent workers in processes of their own (``evolver.service.worker_process``), against a real daemon.

The daemon keeps the API, the inbox and the index; its workers are separate
processes that write SQLite themselves and ask the daemon for retrieval
context. A worker process that is killed loses only its current attempt,
which its lease brings back at once, and another takes its place.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import threading
import time

import pytest

from evolver.testing.daemon import DaemonProcess, make_root, remove_root, wait_for, write_script
from evolver.testing.durability import durable_settings, script_rules
from evolver.tree.split import CHAT_PRIORITY


@pytest.fixture(scope="module")
def daemon():
    root = make_root()
    record = root / "record.jsonl"
    daemon = DaemonProcess(
        root,
        model=write_script(root, "script", script_rules(), record=record),
        settings={
            **durable_settings(root),
            "EVOLVER_DAEMON_SHUTDOWN_GRACE_S": 10,
            # No evaluations: their trajectories would compete for the few
            # examples a task's context shows.
            "EVOLVER_EVOLUTION_EVALUATION_SLOTS": 0,
            # No held-out tasks: one in five checked tasks would be, at random
            # (by the hash of its id), and a held-out attempt is never shown.
            "EVOLVER_EVOLUTION_HELD_OUT_SHARE": 0,
        },
    )
    daemon.record = record
    daemon.start(timeout_s=300)
    yield daemon
    daemon.close()
    remove_root(root)


@pytest.fixture
def http(daemon):
    with daemon.client() as client:
        yield client


def _status(http) -> dict:
    response = http.get("/v1/status")
    assert response.status_code == 200, response.text
    return response.json()


def _children(pid: int) -> set[int]:
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.add(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _submit(http, prompt: str, **body) -> dict:
    response = http.post("/v1/tasks", json={"prompt": prompt, **body})
    assert response.status_code == 201, response.text
    return response.json()


def test_tasks_run_in_worker_processes_that_ask_the_daemon_for_their_context(daemon, http):
    status = _status(http)
    pids = status["worker_pids"]
    assert len(pids) == 2 and status["pid"] not in pids
    assert set(pids) <= _children(status["pid"]), "the workers are the daemon's own child processes"
    first = _submit(http, "What is 17.5% of 2,340?", check={"type": "answer", "expected": "409.5"})
    done = daemon.wait_task(http, first["id"], ("done", "failed", "dead"), timeout_s=120)
    assert done["status"] == "done", done
    assert done["metadata"]["split"] == "train", done  # a held-out attempt is never shown to another task
    # A worker process ran it (its log lines carry its owner, "<daemon pid>-<start>-p<slot>.<n>") and wrote its
    # steps to SQLite itself.
    assert re.search(rf"\[{status['pid']}-\d+-p[01]\.0\]", daemon.log(400)), daemon.log(40)
    db = sqlite3.connect(f"file:{daemon.data_dir / 'evolver.db'}?mode=ro", uri=True)
    try:
        (steps,) = db.execute(
            "SELECT count(*) FROM steps s JOIN trajectories t ON t.id = s.trajectory_id WHERE t.task_id = ?",
            [first["id"]],
        ).fetchone()
    finally:
        db.close()
    assert steps >= 2
    # The daemon, the index's one writer, indexed what the worker wrote: a similar task's context holds it,
    # found by the daemon's search and shown to the model by the worker's agent.
    found = http.post("/v1/memory/search", json={"text": "17.5% of 2,340", "kind": "trajectories"})
    assert found.status_code == 200 and first["id"] in found.text, found.text
    # Alike enough to be shown as a worked example (cosine similarity 0.86; "12.5% of 80" is 0.59, under
    # the loop's EXAMPLE_SIMILARITY).
    second = _submit(http, "What is 12.5% of 2,340?", check={"type": "answer", "expected": "292.5"})
    assert daemon.wait_task(http, second["id"], ("done", "failed", "dead"), timeout_s=120)["status"] == "done"
    shown = [json.loads(line) for line in daemon.record.read_text().splitlines()]
    prompts = [
        m["content"]
        for c in shown
        for m in c["messages"]
        if m["role"] in ("system", "user") and isinstance(m.get("content"), str)
    ]
    assert any("12.5% of 2,340" in p for p in prompts) and any(
        "17.5% of 2,340" in p and "12.5% of 2,340" in p for p in prompts
    ), [p for p in prompts if "12.5" in p]


def test_a_killed_worker_process_loses_only_its_attempt_and_is_replaced(daemon, http):
    task = _submit(http, "SLOW: What is 7 * 3?", check={"type": "answer", "expected": "21"})
    wait_for(
        lambda: any(r["task_id"] == task["id"] for r in _status(http)["running"]),
        timeout_s=60,
        what="the task to be running",
    )
    wait_for(
        lambda: (daemon.task(http, task["id"])["trajectories"] or [{}])[-1].get("steps"),
        timeout_s=60,
        what="the task's first step",
    )
    running = next(r for r in _status(http)["running"] if r["task_id"] == task["id"])
    os.kill(running["pid"], signal.SIGKILL)
    # The API answers throughout; the task runs again from a fresh attempt and ends done.
    done = daemon.wait_task(http, task["id"], ("done", "failed", "dead"), timeout_s=120)
    assert done["status"] == "done" and done["claims"] == 2, done  # the killed attempt counts
    statuses = [t["status"] for t in done["trajectories"]]
    assert statuses[0] == "interrupted" and statuses[-1] == "finished", statuses
    # Another process took the dead one's place.
    wait_for(
        lambda: (
            len(_status(http)["worker_pids"]) == 2
            and running["pid"] not in _status(http)["worker_pids"]
            and all(_alive(p) for p in _status(http)["worker_pids"])
        ),
        timeout_s=60,
        what="a new worker process",
    )
    assert "killed by signal 9" in daemon.log(200)


def test_a_chat_turn_is_a_leased_task_and_a_worker_killed_under_it_only_costs_an_attempt(daemon, http):
    reply = http.post(
        "/v1/chat/completions",
        json={"model": "evolver", "messages": [{"role": "user", "content": "What is 17.5% of 2,340?"}]},
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"].strip() == "409.5"
    first = daemon.task(http, reply.json()["evolver"]["task_id"])
    assert first["source"] == "chat" and first["attempts"] == 1 and first["priority"] == CHAT_PRIORITY

    outcome: dict = {}

    def chat() -> None:
        with daemon.client() as other:
            outcome["response"] = other.post(
                "/v1/chat/completions",
                json={"model": "evolver", "messages": [{"role": "user", "content": "SLOW: What is 2 * 4?"}]},
            )

    thread = threading.Thread(target=chat)
    thread.start()
    turn = wait_for(
        lambda: next((r for r in _status(http)["running"] if r.get("chat")), None),
        timeout_s=60,
        what="the chat turn in a worker process",
    )
    assert turn["pid"] in _status(http)["worker_pids"]
    wait_for(
        lambda: (daemon.task(http, turn["task_id"])["trajectories"] or [{}])[-1].get("steps"),
        timeout_s=60,
        what="the chat turn's first step",
    )
    os.kill(turn["pid"], signal.SIGKILL)
    thread.join(120)
    # The request never knew: the lease came back, another process ran the turn again and answered.
    response = outcome["response"]
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"].strip() == "8"
    task = daemon.task(http, turn["task_id"])
    assert task["status"] == "done" and task["attempts"] == 2, task
    assert [t["status"] for t in task["trajectories"]] == ["interrupted", "finished"], task["trajectories"]
    assert "killed by signal 9" in daemon.log(200)
    wait_for(
        lambda: len(_status(http)["worker_pids"]) == 2 and turn["pid"] not in _status(http)["worker_pids"],
        timeout_s=60,
        what="a new worker process",
    )


def test_sigterm_drains_the_worker_processes_and_sends_their_task_back(daemon, http):
    task = _submit(http, "SLOW: What is 5 * 5?", check={"type": "answer", "expected": "25"})
    wait_for(
        lambda: (daemon.task(http, task["id"])["trajectories"] or [{}])[-1].get("steps"),
        timeout_s=60,
        what="the task's first step",
    )
    pids = _status(http)["worker_pids"]
    assert daemon.terminate(timeout_s=60) == 0
    assert not [p for p in pids if _alive(p)], "a worker process outlived the daemon"
    db = sqlite3.connect(f"file:{daemon.data_dir / 'evolver.db'}?mode=ro", uri=True)
    try:
        status, attempts = db.execute("SELECT status, attempts FROM tasks WHERE id = ?", [task["id"]]).fetchone()
    finally:
        db.close()
    assert (status, attempts) in (("queued", 0), ("done", 1)), (status, attempts)
    daemon.start(timeout_s=300)  # the module's daemon serves on for the tests after this one
    with daemon.client() as again:
        done = daemon.wait_task(again, task["id"], ("done",), timeout_s=120)
        # The drained attempt was handed back with its claim refunded: one claim, the restart's.
        assert done["claims"] == 1 and done["trajectories"][-1]["status"] == "finished", (done, daemon.log(80))


def test_worker_processes_die_with_a_killed_daemon(daemon, http):
    pids = _status(http)["worker_pids"]
    os.kill(daemon.proc.pid, signal.SIGKILL)  # the daemon alone, not its process group
    daemon.proc.wait(30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    assert not [p for p in pids if _alive(p)], "worker processes outlived a killed daemon"
