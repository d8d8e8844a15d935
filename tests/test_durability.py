"""Durability: what an acknowledgement promises survives kill -9, a power cut and a lost reply.

Each test runs real daemons (``evolver/testing/durability.py`` has the drills and the
checks); ``benchmarks/reliability_durability.py`` runs the same drills with
many more kills.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time

import pytest
from _helpers import read_line

from evolver.testing.daemon import DaemonProcess, make_root, remove_root, wait_for
from evolver.testing.durability import (
    build_shim,
    durable_settings,
    kill_loop,
    power_loss,
    power_loss_image,
    shim_env,
    sync_counts,
)

KILLS = 6  # one daemon start each (seconds apiece): 6 covers every phase once
SEED = 20250307


@pytest.fixture
def root():
    path = make_root()
    yield path
    remove_root(path)


@pytest.fixture
def shim(root):
    built = build_shim(root)
    if built is None:
        pytest.skip("gcc is not installed: the power-loss model is a small C library built by the test")
    return built


@pytest.mark.timeout(900)  # seven daemon starts: minutes on a busy machine
def test_kill_nine_at_random_points_loses_no_acknowledged_task_and_reruns_no_finished_one(root):
    """Six SIGKILLs at seeded random moments: while clients submit with idempotency keys, while a task is
    between its steps, of a worker process alone in the middle of a chat turn (its request is still
    answered, right, by the turn run again) and of one in the middle of a task, then of the daemon, during a
    distillation round, a tree-search step and a tool-synthesis round; a
    restart after each. After every kill: the database passes integrity_check, every task acknowledged
    so far is there under its key, a task whose end was recorded has not changed since (no new
    trajectory or step: it never ran again), only validated nodes were ever served, and every active
    synthesized tool has files matching its hash. After the last restart and the work drains: every
    task ended done, failed or dead-lettered with its reason, no attempt is left open, each key names
    one task, the jobs run again, and the vector index agrees with SQLite."""
    report = kill_loop(root, kills=KILLS, seed=SEED, clients=3, burst=1)
    detail = json.dumps({k: v for k, v in report.items() if k != "kill_log"}, indent=1)
    assert report["violations"] == [], detail + "\n" + (root / "daemon.log").read_text(errors="replace")[-6000:]
    assert report["kills"] == KILLS and set(report["phases"]) == {
        "submits",
        "steps",
        "worker",
        "distill",
        "evolve",
        "synthesize",
    }
    assert any(k.get("worker_killed") for k in report["kill_log"]), report["kill_log"]
    assert any((k.get("chat") or {}).get("worker_killed") for k in report["kill_log"]), report["kill_log"]
    assert report["acknowledged"] >= KILLS * 3 and report["lost"] == 0 and report["completed_twice"] == 0, detail
    assert report["integrity"] == "ok" and report["tasks"].get("done", 0) > 0, detail
    assert report["index_after_stop"]["repaired"] == 0, detail


def test_attempts_a_dead_daemon_left_open_end_as_interrupted_when_the_next_one_starts(store):
    """What the daemon's recovery does first (the kill loop checks it end to end): a trajectory still
    'running' was cut off, so it ends 'interrupted' at its last step; finished ones are left alone."""
    task, _ = store.inbox.add_task("What is 1 + 1?")
    finished = store.attempts.start_trajectory(task.id)
    store.attempts.finish_trajectory(finished.id, status="finished", final_answer="2")
    stepped = store.attempts.start_trajectory(task.id, attempt=2)
    last = store.attempts.add_step(stepped.id, role="assistant", content="thinking")
    bare = store.attempts.start_trajectory(task.id, attempt=3)
    assert store.inbox.close_interrupted_trajectories() == 2
    assert store.attempts.get_trajectory(finished.id).status == "finished"
    for trajectory, ended_at in ((stepped, last.created_at), (bare, bare.started_at)):
        now = store.attempts.get_trajectory(trajectory.id)
        assert (now.status, now.finished_at) == ("interrupted", ended_at)
    assert store.inbox.close_interrupted_trajectories() == 0


class _Killed(BaseException):
    """The process dies here: nothing after this point is written."""


def test_a_kill_between_a_distill_rounds_commits_does_not_repeat_the_round(open_store, sandbox, tmp_path, monkeypatch):
    from evolver.config import load_config
    from evolver.engine import Engine
    from evolver.llm import scripted
    from evolver.meta.distill import WATERMARK_KEY, distill_round
    from memory import NewTrajectory

    add = {"operations": [{"op": "ADD", "text": "Compute with run_python before answering a number."}]}
    scripted.register_script("durability-distill", {"rules": [{"match": "", "reply": json.dumps(add)}]})
    config = load_config(env={"EVOLVER_MODEL_NAME": "scripted/durability-distill"})
    store = open_store(tmp_path / "d")
    engine = Engine.open(config, data_dir=tmp_path / "d", store=store, sandbox=sandbox)
    store.attempts.ingest(
        [NewTrajectory(prompt=f"What is {i} + {i}?", final_answer=str(2 * i), success=i % 2 == 0) for i in range(2)]
    )
    set_meta = store.set_meta

    def killed_before_the_watermark(key, value):
        if key == WATERMARK_KEY:
            raise _Killed()
        set_meta(key, value)

    monkeypatch.setattr(store, "set_meta", killed_before_the_watermark)
    with pytest.raises(_Killed):
        distill_round(store, engine.model, config)
    monkeypatch.setattr(store, "set_meta", set_meta)  # the next daemon
    distill_round(store, engine.model, config)
    assert len(store.reports.list_events(kind="distill")) == 1, "the round ran again on the same trajectories"
    (insight,) = store.insights.list_insights()
    assert insight.importance == 2, "its operations were applied twice"


def test_the_power_loss_model_catches_commits_that_were_never_synced(root, shim):
    """The model is not vacuous: SQLite with synchronous=NORMAL (the WAL is synced only at checkpoints)
    loses acknowledged commits in the rebuilt image, and with FULL, the daemon's setting, loses none."""
    child = r"""
import sqlite3, sys
db = sqlite3.connect(sys.argv[1] + "/t.db", isolation_level=None)
db.execute("PRAGMA journal_mode = WAL")
db.execute("PRAGMA synchronous = FULL")
db.execute("CREATE TABLE t (i INTEGER PRIMARY KEY)")  # synced either way: the rows are what is judged
db.execute("PRAGMA synchronous = " + sys.argv[2])
for i in range(200):
    db.execute("INSERT INTO t VALUES (?)", [i])  # one commit each, then its acknowledgement
    print(i, flush=True)
sys.stdin.read()  # wait for the power cut
"""
    lost = {}
    for mode in ("NORMAL", "FULL"):
        data, snapshots, image = root / mode / "data", root / mode / "snapshots", root / mode / "image"
        env = {**os.environ, **shim_env(shim, data, snapshots)}
        proc = subprocess.Popen(
            [sys.executable, "-c", child, str(data.resolve()), mode],
            env=env,
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        try:
            acked = [int(read_line(proc.stdout, timeout_s=60, what=f"acknowledgement {n}")) for n in range(200)]
        finally:
            proc.kill()
            proc.wait(30)
        power_loss_image(snapshots, image)
        db = sqlite3.connect(image / "t.db")
        try:
            assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            present = {r[0] for r in db.execute("SELECT i FROM t")}
        finally:
            db.close()
        lost[mode] = len(set(acked) - present)
        assert sync_counts(snapshots)["t.db"] >= 1  # the shim ran in the child
    assert lost["NORMAL"] > 0 and lost["FULL"] == 0, lost


def test_acknowledged_tasks_survive_a_power_cut(root, shim):
    """The daemon runs under the fsync-snapshot model while four clients submit (and workers run the
    tasks, so the WAL checkpoints into the database file); a SIGKILL at a random moment after a
    checkpoint is the power cut. The data dir rebuilt from what was fsynced alone opens as a store,
    passes integrity_check and holds every task that got its 201."""
    report = power_loss(root, shim, seed=SEED)
    assert report["acknowledged"] > 0 and report["wal_syncs"] > 0, report
    assert report["lost"] == 0 and report["integrity"] == "ok" and report["store_check"] == ["ok"], report
    assert report["readable_through_the_store"] == report["acknowledged"], report


def _raw_submit(path, body: dict, key: str) -> bytes:
    payload = json.dumps(body).encode()
    return (
        f"POST /v1/tasks HTTP/1.1\r\nHost: evolver\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nIdempotency-Key: {key}\r\n\r\n"
    ).encode() + payload


KILLED_CLIENT = r"""
import os, signal, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
s.sendall(sys.stdin.buffer.read())
os.kill(os.getpid(), signal.SIGKILL)  # dies with the reply unread
"""


def test_a_retry_after_a_lost_reply_gets_the_one_task_the_commit_made(root):
    """A client sends a submit and never reads the reply — it hangs up, or it is killed — after the
    commit landed. Retrying with the same Idempotency-Key returns that task (200, replayed), and there
    is exactly one task. (The kill loop covers replies lost because the daemon died.)"""
    daemon = DaemonProcess(root, settings=durable_settings(root))
    daemon.start()
    try:
        path = str(daemon.socket_path)
        with daemon.client() as http:
            for how in ("hung-up", "killed"):
                key, body = f"lost-reply-{how}", {"prompt": f"[{how}] What is 20 + 22?"}
                request = _raw_submit(path, body, key)
                if how == "hung-up":
                    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                        s.connect(path)
                        s.sendall(request)
                    # closed here without reading a byte of the reply
                else:
                    client = subprocess.run(
                        [sys.executable, "-c", KILLED_CLIENT, path], input=request, capture_output=True, timeout=60
                    )
                    assert client.returncode == -signal.SIGKILL, client.stderr

                def committed(body=body):
                    tasks = http.get("/v1/tasks", params={"source": "api", "limit": 1000}).json()["tasks"]
                    return [t for t in tasks if t["prompt"] == body["prompt"]]

                (landed,) = wait_for(committed, timeout_s=60, what=f"the {how} client's task to be committed")
                retry = http.post("/v1/tasks", json=body, headers={"Idempotency-Key": key})
                assert retry.status_code == 200, retry.text
                assert retry.headers.get("Idempotent-Replayed") == "true"
                assert retry.json()["id"] == landed["id"]
                time.sleep(0.2)
                assert [t["id"] for t in committed()] == [landed["id"]]
                daemon.wait_task(http, landed["id"], ("done",), timeout_s=60)
    finally:
        daemon.close()
