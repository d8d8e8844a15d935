"""Evaluations on Ray: a real daemon ships the tree search's evaluations to a real Ray cluster, and records what
comes back in its store; a node that cannot isolate model-written code refuses; a late result is refused."""

from __future__ import annotations

import json
import os
import secrets
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from evolver.agent.recording import ReplayError, Write, replay
from evolver.config import load_config
from evolver.engine import Engine
from evolver.llm import scripted
from evolver.testing.daemon import (
    DaemonProcess,
    demo_rules,
    free_port,
    make_root,
    pids_whose_command_line,
    remove_root,
    run_rounds,
    wait_for,
    write_script,
)
from evolver.tree.incumbent import ensure_root
from sandbox import make_sandbox

try:
    import ray  # noqa: F401  (the optional dependency these tests are about)
except ImportError:
    if os.environ.get("CI"):
        raise  # CI installs .[test], which carries Ray: never pass there by skipping
    pytest.skip("Ray is not installed: pip install 'evolver[ray]'", allow_module_level=True)

from evolver.service.ray_evaluator import evaluate, settle, ship

RAY = str(Path(sys.executable).parent / "ray")
PACK = (
    "\n".join(
        json.dumps(t)
        for t in [
            {"id": "e1", "prompt": "What is 2 + 3?", "check": {"type": "answer", "expected": "5"}},
            {"id": "e2", "prompt": "What is 10 + 4?", "check": {"type": "answer", "expected": "14"}},
        ]
    )
    + "\n"
)
SOLVE = {
    "rules": [  # one sandboxed call, then the answer it printed
        {"match": "^42$", "role": "tool", "tool": "finish", "arguments": {"answer": "42"}},
        {"match": "", "role": "user", "tool": "run_python", "arguments": {"code": "print(6 * 7)"}},
    ]
}


@pytest.fixture
def root():
    path = make_root()
    yield path
    remove_root(path)


@contextmanager
def ray_head(root: Path) -> Iterator[tuple[str, dict]]:
    """A one-node Ray cluster of this test's own (``ray start --head --block`` in a session of its own), with
    token authentication; yields its address and the environment a client needs to join it. Stopped by
    signalling that session, never with ``ray stop`` (which would stop every Ray on the machine)."""
    port = free_port()
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32), "RAY_USAGE_STATS_ENABLED": "0"}
    log_path = root / "ray-head.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                RAY,
                "start",
                "--head",
                "--block",
                "--node-ip-address",
                "127.0.0.1",
                "--port",
                str(port),
                "--include-dashboard=false",
                "--num-cpus",
                "2",
                "--disable-usage-stats",
                "--temp-dir",
                str(root / "ray"),
            ],
            env={**os.environ, **auth},
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:

        def started() -> bool:
            assert proc.poll() is None, f"ray start exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}"
            return "Ray runtime started" in log_path.read_text(errors="replace")

        wait_for(started, timeout_s=90, what="the Ray head to start", interval_s=0.2)
        yield f"127.0.0.1:{port}", auth
    finally:
        for sig, wait_s in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(wait_s)
                break
            except subprocess.TimeoutExpired:
                continue


def _tree_counts(http) -> dict[str, tuple[int, int, int]]:
    return {n["id"]: (n["successes"], n["failures"], n["in_flight"]) for n in http.get("/v1/tree").json()["nodes"]}


def _recorded(http) -> int:
    return sum(s + f for s, f, _ in _tree_counts(http).values())


def _daemon(root: Path, rules: list[dict] | None = None, **settings) -> DaemonProcess:
    (root / "pack.jsonl").write_text(PACK)
    return DaemonProcess(
        root,
        model=write_script(root, "script", demo_rules() if rules is None else rules),
        settings={
            "EVOLVER_DAEMON_WORKERS": 1,
            "EVOLVER_EVOLUTION_EVALUATION_SLOTS": 2,
            "EVOLVER_EVOLUTION_ENABLED": "false",  # only the rounds the test asks for
            "EVOLVER_EVOLUTION_PACKS": f'["{root / "pack.jsonl"}"]',
            "EVOLVER_EVALUATOR_BACKEND": "ray",
            **settings,
        },
    )


def _evaluate_through(daemon: DaemonProcess, evaluations: int) -> list[dict]:
    """Queue ``evaluations`` evaluations of the root with one search round, wait until the tree has recorded
    them, and check what the store holds of each; returns their tasks."""
    with daemon.client() as http:
        # Healthy is not yet running: the API answers while the evaluator joins Ray and the jobs start.
        wait_for(lambda: http.get("/v1/status").json()["mood"] == "running", timeout_s=60, what="the daemon running")
        (round_,) = run_rounds(http, "evolve")
        assert round_["ok"] and round_["summary"].startswith(f"queued {evaluations} evaluations"), round_
        # A person's task meanwhile: the daemon's own worker takes it, and leaves the evaluations to Ray.
        mine = http.post("/v1/tasks", json={"prompt": "What is 7 + 8?", "check": {"type": "answer", "expected": "15"}})
        assert mine.status_code == 201, mine.text
        assert daemon.wait_task(http, mine.json()["id"], ("done", "failed"))["status"] == "done"
        wait_for(lambda: _recorded(http) == evaluations, timeout_s=120, what=f"{evaluations} recorded evaluations")
        (root_node,) = http.get("/v1/tree").json()["nodes"]
        assert _tree_counts(http)[root_node["id"]] == (evaluations, 0, 0)
        tasks = http.get("/v1/tasks", params={"source": "evaluation"}).json()["tasks"]
        assert len(tasks) == evaluations
        for task in tasks:
            shown = daemon.task(http, task["id"])
            assert (shown["status"], shown["ending"], shown["attempts"]) == ("done", "answered", 1), shown
            (trajectory,) = shown["trajectories"]
            assert trajectory["node_id"] == root_node["id"] and trajectory["status"] == "finished"
            assert trajectory["outcome"]["success"] is True and trajectory["tokens_in"] > 0
            roles = [s["role"] for s in trajectory["steps"]]
            assert roles[:2] == ["assistant", "tool"] and trajectory["steps"][1]["tool_results"][0]["ok"], roles
        evaluations_of = http.get(f"/v1/nodes/{root_node['id']}").json()["evaluations"]
        assert sorted((e["status"], e["success"]) for e in evaluations_of) == [("done", True)] * evaluations
    log = daemon.log_path.read_text(errors="replace")
    for task in tasks:  # settled by the Ray evaluator (the only writer of this line), as it came back from a node
        assert f"evaluation task {task['id']}: done in " in log, daemon.log(80)
    assert "failed on Ray" not in log and "refused" not in log, daemon.log(80)
    with sqlite3.connect(daemon.data_dir / "evolver.db") as db:  # every model call the node made is in the ledger
        rows = db.execute(
            f"SELECT purpose, count(*) FROM ledger WHERE task_id IN ({','.join('?' * len(tasks))}) GROUP BY purpose",
            [t["id"] for t in tasks],
        ).fetchall()
    assert dict(rows) == {"evaluate": 2 * evaluations}
    return tasks


def test_evaluations_run_on_a_ray_cluster_and_the_daemon_records_their_results(root):
    with ray_head(root) as (address, auth):
        daemon = _daemon(root, EVOLVER_EVALUATOR_ADDRESS=f'"{address}"', **auth)
        daemon.start()
        try:
            _evaluate_through(daemon, 2)
            assert daemon.terminate() == 0, daemon.log()
        finally:
            daemon.close()


def test_without_an_address_the_daemon_starts_a_private_ray_of_its_own(root):
    daemon = _daemon(root, EVOLVER_EVOLUTION_EVALUATION_SLOTS=1)
    daemon.env = {k: v for k, v in daemon.env.items() if not k.startswith("RAY_")}  # no cluster, no token given
    daemon.start()
    try:
        _evaluate_through(daemon, 1)
        assert daemon.terminate() == 0, daemon.log()  # and its Ray instance with it
    finally:
        daemon.close()


# --- the parts, in this process (the sandbox is the real one) ------------------------------------------------


@pytest.fixture
def engine(open_store, sandbox, tmp_path):
    scripted.register_script("ray-solve", {**SOLVE, "record": str(tmp_path / "asked.jsonl")})
    config = load_config(env={"EVOLVER_MODEL_NAME": "scripted/ray-solve"})
    return Engine.open(config, data_dir=tmp_path / "data", store=open_store(), sandbox=sandbox)


def _claimed(engine: Engine):
    root = ensure_root(engine.store, engine.seed_scaffold())
    engine.store.inbox.add_task(
        "What is 6 * 7?", check={"type": "answer", "expected": "42"}, source="evaluation", metadata={"node": root.id}
    )
    return engine.store.inbox.claim_task("daemon-ray", lease_s=30, max_attempts=3, sources=("evaluation",))


def test_a_node_without_bubblewrap_refuses_before_the_model_is_asked(engine, tmp_path):
    lease = _claimed(engine)

    def no_bubblewrap(**settings):
        return make_sandbox(bwrap=str(tmp_path / "no-such-bwrap"), **settings)

    returned = evaluate(ship(engine, lease.task), sandbox_factory=no_bubblewrap)
    assert returned.result is None and returned.writes == []
    assert returned.refused.startswith(f"the Ray node {returned.node} refused the evaluation: it cannot isolate")
    assert "bubblewrap" in returned.refused and "require_isolation" in returned.refused
    assert not (tmp_path / "asked.jsonl").exists()  # the model was never asked, so nothing it wrote ran
    assert settle(engine.store, lease, returned, lease_s=30).startswith("refused: ")
    task = engine.store.inbox.get_task(lease.task.id)
    # Failed, and not the scaffold's fault: a smoke task that ended so runs again, an evaluation counts nothing.
    assert (task.status, task.ending.value, task.error) == ("failed", "interrupted", returned.refused)
    assert engine.store.reports.trajectories_of(task.id) == []


def test_a_shipped_evaluation_is_recorded_as_a_worker_would_and_a_late_one_is_refused(engine):
    lease = _claimed(engine)
    returned = evaluate(ship(engine, lease.task))
    assert returned.isolated and returned.result.status == "done" and returned.result.success
    assert settle(engine.store, lease, returned, lease_s=30).startswith("done in ")
    task = engine.store.inbox.get_task(lease.task.id)
    assert (task.status, task.ending.value, task.lease_owner) == ("done", "answered", None)
    (trajectory,) = engine.store.reports.trajectories_of(task.id)
    assert (trajectory.status, trajectory.final_answer, trajectory.attempt) == ("finished", "42", 1)
    assert engine.store.reports.outcome(trajectory.id).success is True
    assert [s.role for s in engine.store.reports.steps(trajectory.id)] == ["assistant", "tool", "assistant", "tool"]
    assert engine.store.ledger.spent(task_id=task.id)[0] == trajectory.tokens_in + trajectory.tokens_out > 0

    # The next one's lease expires while it is away and another worker takes the task over: what comes back
    # is refused whole, not one step of it recorded.
    late = _claimed(engine)
    returned = evaluate(ship(engine, late.task))
    with engine.store.database.write() as db:
        db.execute("UPDATE tasks SET lease_expires_at = ? WHERE id = ?", [time.time() - 1, late.task.id])
    rescuer = engine.store.inbox.claim_task("rescuer", lease_s=30, max_attempts=3)
    assert settle(engine.store, late, returned, lease_s=30).startswith("the lease was lost")
    assert engine.store.reports.trajectories_of(late.task.id) == []
    assert engine.store.inbox.get_task(late.task.id).lease_owner == "rescuer" and rescuer is not None


def test_a_replay_makes_only_the_writes_a_recording_may_hold(engine):
    lease = _claimed(engine)
    task_id = lease.task.id
    with pytest.raises(ReplayError, match="may not hold 'add_node'"):
        replay(engine.store.agent, [Write("add_node", {"scaffold_hash": "x"})], task_id=task_id)
    with pytest.raises(ReplayError, match="writes about task other"):
        replay(engine.store.agent, [Write("start_trajectory", {"task_id": "other"}, "recorded-1")], task_id=task_id)
    with pytest.raises(ReplayError, match="never started"):
        replay(
            engine.store.agent,
            [Write("add_step", {"trajectory_id": "traj_elsewhere", "role": "assistant", "content": "x"})],
            task_id=task_id,
        )
    assert engine.store.reports.trajectories_of(task_id) == []


SLOW = [  # an evaluation that takes a while in the sandbox: long enough to kill the Ray worker running it
    {
        "match": r"What is (?P<a>\d+) \+ (?P<b>\d+)\?",
        "on": "task",
        "role": "user",
        "tool": "run_python",
        "arguments": {"code": r"import time; time.sleep(4); print(\g<a> + \g<b>)"},
    },
    {"match": r"^(?P<n>\d+)$", "role": "tool", "tool": "finish", "arguments": {"answer": r"\g<n>"}},
]


def _ray_workers_running(function: str) -> list[int]:
    """The pids of the Ray worker processes now running ``function`` (Ray titles such a process ray::NAME)."""
    return pids_whose_command_line(lambda cmdline: cmdline.startswith(f"ray::{function}".encode()))


def test_a_ray_worker_killed_mid_evaluation_sends_its_task_back_to_the_queue_and_it_is_counted_once(root):
    daemon = _daemon(root, SLOW, EVOLVER_EVOLUTION_EVALUATION_SLOTS=1)
    daemon.env = {k: v for k, v in daemon.env.items() if not k.startswith("RAY_")}  # a private Ray
    daemon.start()
    try:
        with daemon.client() as http:
            wait_for(lambda: http.get("/v1/status").json()["mood"] == "running", timeout_s=60, what="the daemon")
            (round_,) = run_rounds(http, "evolve")
            assert round_["summary"].startswith("queued 1 evaluations"), round_
            (task,) = http.get("/v1/tasks", params={"source": "evaluation"}).json()["tasks"]
            wait_for(lambda: _ray_workers_running("evaluate"), timeout_s=120, what="a Ray worker running it")
            for pid in _ray_workers_running("evaluate"):
                os.kill(pid, signal.SIGKILL)
            done = daemon.wait_task(http, task["id"], ("done", "failed", "dead"), timeout_s=180)
            # Claimed twice (the lost run counts against its attempts); one attempt recorded, the one that came
            # back (a Ray node's records are replayed in the store only when its run returns).
            assert (done["status"], done["claims"], done["attempts"]) == ("done", 2, 1), (done, daemon.log(60))
            wait_for(lambda: _recorded(http) == 1, timeout_s=60, what="the evaluation recorded")
            (node,) = http.get("/v1/tree").json()["nodes"]
            assert _tree_counts(http)[node["id"]] == (1, 0, 0)  # one evaluation, counted once
            evaluations = http.get(f"/v1/nodes/{node['id']}").json()["evaluations"]
            assert [(e["status"], e["success"]) for e in evaluations] == [("done", True)]
        log = daemon.log_path.read_text(errors="replace")
        assert f"evaluation task {task['id']} failed on Ray and goes back to the queue" in log, daemon.log(80)
        assert daemon.terminate() == 0, daemon.log()
    finally:
        daemon.close()
