"""The tree search inside a real daemon: evaluations run on its workers and are recorded; a killed
daemon's search resumes; `evolver tree` exports what the daemon serves."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from evolver.testing.daemon import (
    SLOW_STEP,
    DaemonProcess,
    demo_rules,
    make_root,
    remove_root,
    run_rounds,
    wait_for,
    write_script,
)

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


@pytest.fixture
def root():
    path = make_root()
    yield path
    remove_root(path)


def _daemon(root, name: str = "daemon", **extra: str) -> DaemonProcess:
    (root / "pack.jsonl").write_text(PACK)
    proposer = {
        "match": "You improve an agent by editing its scaffold",
        "on": "all",
        "reply": json.dumps({"rationale": "fewer steps", "edit": {"parameters": {"max_steps": 8}}}),
    }
    model = write_script(root, "script", [proposer, *demo_rules()])
    return DaemonProcess(
        root,
        model=model,
        name=name,
        settings={
            "EVOLVER_DAEMON_WORKERS": 2,
            "EVOLVER_EVOLUTION_EVALUATION_SLOTS": 2,
            "EVOLVER_EVOLUTION_PACKS": f'["{root / "pack.jsonl"}"]',
            **extra,
        },
    )


def _counts(http) -> dict[str, tuple[int, int, int]]:
    return {n["id"]: (n["successes"], n["failures"], n["in_flight"]) for n in http.get("/v1/tree").json()["nodes"]}


def _step(http) -> str:
    (round_,) = run_rounds(http, "evolve")
    assert round_["ok"], round_
    return round_["summary"]


def _recorded(http) -> int:
    return sum(s + f for s, f, _ in _counts(http).values())


def test_the_search_runs_on_the_daemons_workers_and_resumes_after_a_kill(root):
    daemon = _daemon(root)
    daemon.start()
    try:
        with daemon.client() as http:
            assert _step(http).startswith("queued 2 evaluations")  # t = 0: evaluate the root first
            wait_for(lambda: _recorded(http) == 2, timeout_s=60, what="two recorded evaluations")
            tasks = http.get("/v1/tasks", params={"source": "evaluation"}).json()["tasks"]
            assert len(tasks) == 2 and all(t["priority"] == -10 for t in tasks)
            assert "smoke task" in _step(http)  # t = 2: 2^0.6 >= 1 node; its smoke task goes to the workers
            assert len(_counts(http)) == 2
            # A worker runs the smoke task, and the "record" job the daemon pokes then validates the child.
            wait_for(
                lambda: {n["status"] for n in http.get("/v1/tree").json()["nodes"]} == {"promoted", "evaluating"},
                timeout_s=60,
                what="the child validated by its smoke task",
            )
            (smoke,) = http.get("/v1/tasks", params={"source": "smoke"}).json()["tasks"]
            assert smoke["status"] == "done" and smoke["priority"] == -10
            assert _step(http).startswith("queued 2 evaluations")  # t = 2 < 2 nodes ^ (1 / 0.6)
        daemon.proc.send_signal(signal.SIGKILL)  # with evaluations queued or running
        daemon.proc.wait(timeout=30)
    finally:
        daemon.close()
    # Only the recording the daemon pokes: a scheduled round could expand the tree once four are in.
    again = _daemon(root, name="daemon2", EVOLVER_EVOLUTION_ENABLED="false")
    again.start()
    try:
        with again.client() as http:
            # The restarted daemon runs the dead one's evaluation tasks and records each once.
            wait_for(lambda: _recorded(http) == 4, timeout_s=120, what="all four evaluations recorded")
            assert all(flight == 0 for _, _, flight in _counts(http).values())
            tasks = http.get("/v1/tasks", params={"source": "evaluation", "limit": 100}).json()["tasks"]
            assert len(tasks) == 4 and all(t["status"] == "done" for t in tasks)
        exported = subprocess.run(
            [sys.executable, "-m", "evolver", "tree", "--format", "dot"],
            env=again.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert exported.returncode == 0, exported.stderr
        assert exported.stdout.startswith("digraph evolver_tree {") and exported.stdout.count("->") == 1
    finally:
        again.close()


def test_an_evaluation_a_stop_drained_runs_again_after_the_restart_and_is_recorded_then(root):
    (root / "pack.jsonl").write_text(PACK)
    settings = {
        "EVOLVER_DAEMON_WORKERS": 1,
        "EVOLVER_EVOLUTION_EVALUATION_SLOTS": 1,
        "EVOLVER_EVOLUTION_ENABLED": "false",  # only the rounds asked for, and the record job poked
        "EVOLVER_DAEMON_SHUTDOWN_GRACE_S": 5,
        "EVOLVER_EVOLUTION_PACKS": f'["{root / "pack.jsonl"}"]',
    }
    first = DaemonProcess(
        root, model=write_script(root, "slow", [{"match": "", **SLOW_STEP}]), name="first", settings=settings
    )
    first.start()
    try:
        with first.client() as http:
            assert _step(http).startswith("queued 1 evaluations")
            (task,) = http.get("/v1/tasks", params={"source": "evaluation"}).json()["tasks"]

            def stepped():
                seen = first.task(http, task["id"])
                return seen["status"] == "running" and seen["trajectories"] and seen["trajectories"][-1]["steps"]

            wait_for(stepped, timeout_s=60, what="the evaluation task to run and take a step")
        first.proc.terminate()  # SIGTERM: the running evaluation goes back to the queue
        assert first.wait_exit(35) == 0, first.log()
    finally:
        first.close()
    second = DaemonProcess(root, model=write_script(root, "solver", demo_rules()), name="second", settings=settings)
    second.start()
    try:
        with second.client() as http:
            # The drained run counted for nothing: the evaluation ran again, and that result is the one recorded.
            ran = second.wait_task(http, task["id"], ("done", "failed", "cancelled", "dead"), timeout_s=60)
            assert ran["status"] == "done" and ran["claims"] == 1, ran
            wait_for(
                lambda: list(_counts(http).values()) == [(1, 0, 0)],
                timeout_s=60,
                what="the evaluation recorded once, as a success",
            )
            (node,) = http.get("/v1/tree").json()["nodes"]
            evaluations = http.get(f"/v1/nodes/{node['id']}").json()["evaluations"]
            assert [(ev["status"], ev["success"]) for ev in evaluations] == [("done", True)], evaluations
        assert second.terminate() == 0
    finally:
        second.close()


def test_an_evaluation_that_ended_unrecorded_before_a_kill_is_recorded_when_the_next_daemon_starts(root):
    """Its worker finished it and the daemon died before the "record" job read it: no worker will say
    so again, so the starting daemon looks (with scheduled rounds off, nothing else would)."""
    import numpy as np

    from evolver.config import load_config
    from evolver.engine import Engine
    from evolver.service.worker import Worker
    from evolver.tree.incumbent import ensure_root
    from evolver.tree.search import TreeSearch

    (root / "pack.jsonl").write_text(PACK)
    daemon = DaemonProcess(
        root,
        model=write_script(root, "solver", demo_rules()),
        settings={"EVOLVER_EVOLUTION_ENABLED": "false", "EVOLVER_EVOLUTION_PACKS": f'["{root / "pack.jsonl"}"]'},
    )
    engine = Engine.open(load_config(env=daemon.env), data_dir=daemon.data_dir)
    try:
        ensure_root(engine.store, engine.seed_scaffold())
        assert TreeSearch(engine, slots=1, rng=np.random.default_rng(0)).step().startswith("queued 1 evaluations")
        worker = Worker(
            lambda task: engine.agent(),
            owner="dead daemon",
            lease_s=60,
            max_attempts=1,
            store=engine.store,
            sources=("evaluation",),
        )
        assert worker.run_once() is not None  # the evaluation task ran and ended; nobody recorded it
        assert [e.status for e in engine.store.tree.running_evaluations()] == ["running"]
    finally:
        engine.close()
    daemon.start()
    try:
        with daemon.client() as http:
            wait_for(lambda: _recorded(http) == 1, timeout_s=60, what="the evaluation recorded at start")
            assert all(flight == 0 for _, _, flight in _counts(http).values())
    finally:
        daemon.close()


def test_a_hooks_only_child_changes_what_the_daemon_does_once_it_is_served(root):
    """The model hands in its answers as sentences; the proposer's only edit is a before_finish hook that
    hands in the number. The same task fails on the seed and succeeds on the child, through the daemon."""
    (root / "pack.jsonl").write_text(PACK)
    hook = (
        "import re\ndef before_finish(data):\n    found = re.findall('[0-9]+', data['answer'] or '')\n"
        "    return {'answer': found[-1]} if found else None\n"
    )
    rules = [
        {
            "match": "You improve an agent by editing its scaffold",
            "on": "all",
            "reply": json.dumps({"rationale": "hand in the number alone", "edit": {"hooks": hook}}),
        },
        {
            "match": r"What is (\d+) \+ (\d+)\?",
            "on": "last",
            "role": "user",
            "tool": "run_python",
            "arguments": {"code": r"print(\1 + \2)"},
        },
        {"match": r"^(\d+)\s*$", "role": "tool", "tool": "finish", "arguments": {"answer": r"The answer is \1."}},
    ]
    daemon = DaemonProcess(
        root,
        model=write_script(root, "wordy", rules),
        settings={
            "EVOLVER_EVOLUTION_ENABLED": "false",
            "EVOLVER_EVOLUTION_EVALUATION_SLOTS": 2,
            "EVOLVER_EVOLUTION_PACKS": f'["{root / "pack.jsonl"}"]',
        },
    )
    daemon.start()
    try:
        with daemon.client() as http:

            def solve() -> dict:
                submitted = http.post(
                    "/v1/tasks", json={"prompt": "What is 19 + 23?", "check": {"type": "answer", "expected": "42"}}
                ).json()
                return daemon.wait_task(http, submitted["id"], ("done", "failed"))

            seed = solve()
            assert seed["status"] == "failed" and "'The answer is 42.' is not expected '42'" in seed["error"]
            assert _step(http).startswith("queued 2 evaluations")
            wait_for(lambda: _recorded(http) == 2, timeout_s=60, what="the seed's evaluations")
            assert "smoke task" in _step(http)
            wait_for(
                lambda: {n["status"] for n in http.get("/v1/tree").json()["nodes"]} == {"promoted", "evaluating"},
                timeout_s=60,
                what="the hooks-only child validated",
            )
            (child,) = [n for n in http.get("/v1/tree").json()["nodes"] if n["status"] == "evaluating"]
            promoted = http.post("/v1/promote", json={"node_id": child["id"], "why": "test"})
            assert promoted.status_code == 200, promoted.text
            served = solve()
            assert served["status"] == "done", served
            steps = [s for t in served["trajectories"] for s in t["steps"]]
            assert [s["role"] for s in steps] == ["assistant", "tool", "assistant", "hook", "tool"]
        shown = subprocess.run(
            [sys.executable, "-m", "evolver", "node", child["id"]],
            env=daemon.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert shown.returncode == 0, shown.stderr
        assert "def before_finish(data):" in shown.stdout
        assert "before_finish changed something" in shown.stdout and "failed 0x" in shown.stdout
    finally:
        daemon.close()
