"""Every daemon-facing CLI command, against a real daemon started with `evolver up`."""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tests.test_cli import EVOLVER, run

ENGLISH_FAIL = "Name the capital of France, in one word."


@pytest.fixture(scope="module")
def env():
    # A short root: socket paths are limited to 107 bytes.
    root = Path(tempfile.mkdtemp(prefix="evc-", dir="/tmp"))
    values = {
        "EVOLVER_MODEL_NAME": "scripted/demo",
        "EVOLVER_DAEMON_DATA_DIR": str(root / "data"),
        "EVOLVER_DAEMON_RUNTIME_DIR": str(root / "run"),
        "HOME": str(root / "home"),
        # Distillation runs only when a test asks (`evolver evolve`), so what it adds is predictable.
        "EVOLVER_EVOLUTION_DISTILL_AFTER": "100000",
        "EVOLVER_EVOLUTION_EVALUATION_SLOTS": "0",
    }
    up = run("up", env=values)
    assert up.returncode == 0, up.stderr
    assert re.search(r"evolver daemon \d+ is up", up.stdout)
    yield values
    run("down", env=values)
    shutil.rmtree(root, ignore_errors=True)


def ok(*args: str, env: dict) -> subprocess.CompletedProcess:
    result = run(*args, env=env)
    assert result.returncode == 0, f"{args}: {result.stderr}"
    assert "Traceback" not in result.stderr
    return result


def test_up_again_says_it_already_runs_and_status_tells_what_it_does(env):
    again = ok("up", env=env)
    assert "already running" in again.stdout
    status = json.loads(ok("status", "--json", env=env).stdout)
    assert status["mood"] == "running" and status["workers"] >= 1 and status["incumbent"].startswith("node_")
    assert status["sandbox_isolated"] is True
    assert sorted(j["job"] for j in status["jobs"]) == [
        "distill",
        "evolve",
        "prune",
        "reconcile",
        "record",
        "synthesize",
    ]
    text = ok("status", env=env).stdout
    assert "running" in text and "incumbent node" in text and "reconcile" in text


def test_submit_wait_streams_the_steps_and_reports_the_check(env):
    solved = ok("submit", "What is (12 + 30) * 2?", "--check-answer", "84", "--wait", env=env)
    assert solved.stdout.strip() == "done (check passed): 84"
    assert "run_python" in solved.stderr and "finish" in solved.stderr  # the steps, live
    failed = run("submit", ENGLISH_FAIL, "--check-answer", "Paris", "--wait", env=env)
    assert failed.returncode == 1 and failed.stdout.startswith("failed (check failed)")
    assert "the verifier: answer" in failed.stdout and "is not expected 'Paris'" in failed.stdout  # and why


def test_submit_then_list_show_cancel_and_feedback(env):
    task_id = ok("submit", "What is 3 * (4 + 5) - 7?", "--check-numeric", "20", env=env).stdout.strip()
    assert task_id.startswith("task_")
    listed = json.loads(ok("tasks", "--json", "--limit", "1000", env=env).stdout)
    assert task_id in [t["id"] for t in listed["tasks"]]
    shown = json.loads(ok("show", task_id, "--json", env=env).stdout)
    assert shown["prompt"] == "What is 3 * (4 + 5) - 7?" and shown["check"]["expected"] == 20
    assert task_id in ok("show", task_id, env=env).stdout
    # Cancelling it is accepted whatever state it has reached; feedback needs an answer.
    assert ok("cancel", task_id, env=env).stdout.startswith(task_id)
    done = ok("submit", "What is 12.5% of 80?", "--wait", env=env)
    answered = json.loads(ok("tasks", "--json", "--status", "done", "--limit", "1", env=env).stdout)["tasks"][0]
    assert "10" in done.stdout
    assert (
        "recorded; you said good (right)" in ok("feedback", answered["id"], "--good", "--note", "right", env=env).stdout
    )
    detail = json.loads(ok("show", answered["id"], "--json", env=env).stdout)
    assert detail["trajectories"][-1]["outcome"]["success"] is True
    assert detail["trajectories"][-1]["outcome"]["feedback"] == "right"
    # The person's word where a check decided otherwise: both are kept and shown (it printed "recorded as
    # bad" for --good: a test failed before).
    assert run("submit", "What is 12.5% of 80?", "--check-answer", "11", "--wait", env=env).returncode == 1
    checked = json.loads(ok("tasks", "--json", "--status", "failed", "--limit", "1", env=env).stdout)["tasks"][0]
    said = ok("feedback", checked["id"], "--good", env=env).stdout
    assert "recorded; check failed; you said good" in said and "kept beside the check's verdict" in said
    outcome = json.loads(ok("show", checked["id"], "--json", env=env).stdout)["trajectories"][-1]["outcome"]
    assert (outcome["success"], outcome["person_good"]) == (False, True)
    shown = ok("show", checked["id"], env=env)
    assert "check failed; you said good" in shown.stdout and "the verifier: answer '10" in shown.stdout
    assert "finish" in shown.stdout  # the steps go to stdout (`show ID | less`), not to stderr


def test_idempotency_key_makes_a_retry_return_the_same_task(env):
    first = ok("submit", "What is 2 * (3 + 4)?", "--idempotency-key", "cli-retry-1", env=env).stdout.strip()
    again = ok("submit", "What is 2 * (3 + 4)?", "--idempotency-key", "cli-retry-1", env=env).stdout.strip()
    assert first == again


def test_chat_one_message_and_the_repl(env):
    assert ok("chat", "-m", "What is (12 + 30) * 2?", env=env).stdout.strip() == "84"
    repl = subprocess.run(
        [EVOLVER, "chat"],
        input="What is 17.5% of 2,340?\n/exit\n",
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env, "COLUMNS": "200"},
    )
    assert repl.returncode == 0, repl.stderr
    assert "409.5" in repl.stdout


def test_inspection_commands_through_the_daemon(env):
    tree = json.loads(ok("tree", "--json", env=env).stdout)
    (root,) = tree["nodes"]
    assert tree["incumbent"] == root["id"] and root["parent_id"] is None
    assert "★ incumbent" in ok("tree", env=env).stdout
    node = json.loads(ok("node", root["id"], "--json", env=env).stdout)
    assert node["incumbent"] is True and "finish" in node["scaffold"]["tools"]
    assert "parameters:" in ok("node", root["id"], env=env).stdout
    history = json.loads(ok("history", "--json", env=env).stdout)["events"]
    assert history[-1]["kind"] == "seed"
    assert "seed" in ok("history", env=env).stdout
    assert json.loads(ok("insights", "--json", env=env).stdout) == {"insights": []}
    ok("insights", env=env)
    tools = json.loads(ok("tools", "--json", env=env).stdout)
    assert {"run_python", "finish"} <= {t["name"] for t in tools["builtin"]}
    assert "run_python" in ok("tools", env=env).stdout
    found = json.loads(ok("memory", "search", "multiply two numbers", "--json", env=env).stdout)
    assert found["vector_search"] is True  # the daemon owns the index and searches it
    assert any("What is" in h["prompt"] for h in found["hits"])


def test_evolve_promote_and_rollback(env):
    evolved = ok("evolve", env=env)
    assert "reconcile: ok" in evolved.stdout
    assert re.search(r"distill: ok in [\d.]+ s: 1 operations \(ADD\) from \d+ trajectories", evolved.stdout)
    insights = json.loads(ok("insights", "--json", env=env).stdout)["insights"]
    assert [i["text"] for i in insights] == [
        "Compute arithmetic with run_python and answer with the printed result; never guess a number."
    ]
    assert re.search(r"synthesize: ok in [\d.]+ s: ", evolved.stdout)
    (distilled,) = json.loads(ok("history", "--json", "--kind", "distill", env=env).stdout)["events"]
    # The history names the insight ("1 insight operations: ADD" did not), and one event opens whole.
    assert "ADD 'Compute arithmetic with run_python" in distilled["what"]
    event = ok("history", "show", str(distilled["id"]), env=env).stdout
    assert f"event {distilled['id']} distill" in event and "ADD insight" in event
    assert "text: Compute arithmetic with run_python" in event
    assert f"evidence ({len(distilled['evidence'])}): {distilled['evidence'][0]}" in event
    assert distilled["evidence"][0].startswith("traj_")
    assert run("history", "show", "999999", env=env).returncode == 2
    missing = run("tools", "show", "nope", env=env)
    assert missing.returncode == 2 and "No synthesized tool named 'nope'" in missing.stderr
    reverted = ok("history", "revert", str(distilled["id"]), "--why", "not useful", env=env)
    assert f"reverted event {distilled['id']} (distill): 1 insights restored" in reverted.stdout
    assert json.loads(ok("insights", "--json", env=env).stdout) == {"insights": []}
    again = run("history", "revert", str(distilled["id"]), env=env)
    assert again.returncode == 7 and "already reverted" in again.stderr
    assert json.loads(ok("evolve", "--job", "reconcile", "--json", env=env).stdout)["rounds"][0]["ok"] is True
    unknown = run("evolve", "--job", "nope", env=env)
    assert unknown.returncode == 2 and "there is no job 'nope'" in unknown.stderr
    promote = run("promote", "node_nope", env=env)
    assert promote.returncode == 2 and "No node with id 'node_nope'" in promote.stderr
    rollback = run("rollback", env=env)
    assert rollback.returncode == 7 and "no earlier incumbent" in rollback.stderr


def test_bench_goes_through_the_daemon_workers(env):
    summary = json.loads(ok("bench", "demo", "--json", env=env).stdout)
    assert (summary["tasks"], summary["solved"]) == (5, 4)
    listed = json.loads(ok("tasks", "--json", "--limit", "1000", env=env).stdout)["tasks"]
    assert sum(t["metadata"].get("pack_task") == "demo-05" for t in listed) == 1
    # Each keeps its source and its pack's split through the daemon: demo-05 is held out.
    benched = {t["metadata"]["pack_task"]: t for t in listed if "pack_task" in t["metadata"]}
    assert {t["source"] for t in benched.values()} == {"bench"}
    assert {n: t["metadata"].get("split") for n, t in benched.items()} == {
        "demo-01": "train",
        "demo-02": "train",
        "demo-03": "train",
        "demo-04": "train",
        "demo-05": "test",
    }


def test_bad_arguments_are_one_line_and_exit_code_2(env):
    empty = run("submit", "   ", env=env)
    assert empty.returncode == 2 and "task text is empty" in empty.stderr and "Traceback" not in empty.stderr
    two = run("submit", "x", "--check-answer", "1", "--check-regex", "1", env=env)
    assert two.returncode == 2 and "at most one of" in two.stderr
    unknown = run("show", "task_nope", env=env)
    assert unknown.returncode == 2 and "No task with id 'task_nope'" in unknown.stderr


def test_service_install_prints_a_unit_that_runs_the_daemon_in_the_foreground(env):
    unit = ok("service", "install", "--print", env=env).stdout
    assert "ExecStart=" in unit and "up --foreground" in unit and "KillSignal=SIGTERM" in unit
    written = ok("service", "install", env=env)
    path = Path(env["HOME"]) / ".config" / "systemd" / "user" / "evolver.service"
    assert str(path) in written.stdout and path.read_text() == unit
    assert run("service", "install", env=env).returncode == 2  # never overwritten without --force


def test_a_socket_of_another_user_is_permission_denied_exit_6(env):
    # The runtime dir now belongs to someone else. The CLI runs as root here, so it is run without the
    # capabilities that let root pass file permissions: it meets them as any other user would.
    runtime = Path(env["EVOLVER_DAEMON_RUNTIME_DIR"])
    as_root = os.geteuid() == 0
    command = [EVOLVER, "submit", "hello"]
    if as_root:
        os.chown(runtime, 65534, 65534)
        command = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", *command]
    else:
        runtime.chmod(0o000)  # without the search bit its owner is refused like anyone else
    try:
        denied = subprocess.run(
            command, capture_output=True, text=True, timeout=120, env={**os.environ, **env, "COLUMNS": "200"}
        )
    finally:
        if as_root:
            os.chown(runtime, 0, 0)
        runtime.chmod(0o700)
    assert denied.returncode == 6, denied.stderr
    assert "permission denied" in denied.stderr and "Traceback" not in denied.stderr


def test_ids_can_be_shortened_and_a_trajectory_id_opens_its_task(env):
    """Ids wrapped even at 120 columns and no command took a prefix; evidence ids (traj_...) could not
    be opened; a task did not show what it was given from memory: tests failed before."""
    ok("submit", "What is 6 * 7?", "--check-answer", "42", "--wait", env=env)
    listed = json.loads(ok("tasks", "--json", "--limit", "5", env=env).stdout)["tasks"]
    newest = listed[0]
    short = newest["short_id"]
    assert newest["id"].startswith(short) and len(short) < len(newest["id"])
    table = ok("tasks", "--limit", "5", env={**env, "COLUMNS": "120"}).stdout
    assert short in table and newest["id"] not in table
    assert all(len(line) <= 120 for line in table.splitlines())
    shown = ok("show", short, "--memories", env=env).stdout
    assert shown.startswith(newest["id"]) and "given from memory:" in shown
    detail = json.loads(ok("show", short, "--json", env=env).stdout)
    trajectory = detail["trajectories"][-1]
    assert set(trajectory["memories"]) == {"examples", "insights", "tools"}
    by_trajectory = ok("show", trajectory["id"][:20], env=env).stdout  # a trajectory's prefix: its task
    assert by_trajectory.startswith(newest["id"]) and "← the trajectory asked for" in by_trajectory
    several = run("show", "task_", env=env)
    assert several.returncode == 2 and "starts several task ids" in several.stderr
    assert run("show", "task_ffffffff", env=env).returncode == 2  # none such: named, not a traceback
    node = json.loads(ok("tree", "--json", env=env).stdout)["nodes"][0]
    assert node["id"] in ok("node", node["short_id"], env=env).stdout
    wrong = run("node", short, env=env)
    assert wrong.returncode == 2 and "is a task id; this command takes a node id" in wrong.stderr


def test_logs_prints_the_last_lines_and_follows_new_ones(env):
    log = Path(env["EVOLVER_DAEMON_DATA_DIR"]) / "daemon.log"
    last = ok("logs", "-n", "2", env=env).stdout.splitlines()
    assert (
        len(last) == 2
        and last == log.read_text().splitlines()[-2:]
        and "serving" in "".join(log.read_text().splitlines())
    )
    # SIGINT at its default, as in a shell's foreground job, even in a suite started in the background.
    follower = subprocess.Popen(
        [EVOLVER, "logs", "-n", "0", "-f"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in follower.stdout], daemon=True).start()
    try:
        # When the follower starts reading is not known from outside (a cold start took over 1 s): write a
        # numbered line until one comes back, up to a deadline, instead of sleeping a guess first.
        deadline, written, seen = time.monotonic() + 60, 0, None
        while seen is None and time.monotonic() < deadline:
            written += 1
            with open(log, "a", encoding="utf-8") as handle:
                handle.write(f"a line written while followed {written}\n")
            try:
                seen = lines.get(timeout=0.5)
            except queue.Empty:
                continue
        assert seen is not None and re.fullmatch(r"a line written while followed \d+\n", seen), seen
    finally:
        follower.send_signal(signal.SIGINT)
        assert follower.wait(timeout=30) == 0  # Ctrl-C ends following quietly
    missing = run("logs", env={**env, "EVOLVER_DAEMON_DATA_DIR": "/tmp/evolver-no-such-dir"})
    assert missing.returncode == 2 and "there is no log at" in missing.stderr


def test_status_answers_whether_it_is_learning(env):
    """`evolver status` printed the all-time task counts as a raw dict labelled "queue" and each job's
    next interval round only (evolve "in 4 h" while its trigger ran it every 30 s): a test failed before."""
    ok("submit", "What is 6 * 7?", "--check-answer", "42", "--wait", env=env)
    run("submit", ENGLISH_FAIL, "--check-answer", "Paris", "--wait", env=env)
    ok("evolve", "--job", "reconcile", env=env)
    status = json.loads(ok("status", "--json", env=env).stdout)
    day = status["learning"]["windows"]["day"]
    tasks = json.loads(ok("tasks", "--json", "--limit", "1000", env=env).stdout)["tasks"]
    assert day["person"]["succeeded"] >= 1 and day["person"]["failed"] >= 1
    assert day["person"]["succeeded"] + day["person"]["failed"] + day["person"]["unjudged"] == len(
        [t for t in tasks if t["status"] in ("done", "failed") and t["attempts"]]
    )
    assert day["evaluations"] == {"succeeded": 0, "failed": 0, "unjudged": 0, "rate": None}
    assert day["spend"]["person"]["tokens"] > 0  # and the background's (an earlier test's distill) apart
    assert day["spend"]["person"]["tokens"] + day["spend"]["background"]["tokens"] == status["budget"]["tokens_today"]
    (reconcile,) = [j for j in status["jobs"] if j["job"] == "reconcile"]
    assert reconcile["last"]["ok"] and "index agrees" in reconcile["last"]["summary"]
    text = ok("status", env=env).stdout
    assert "{'" not in text and re.search(r"queue: \d+ queued, \d+ running \(so far: \d+ done, \d+ failed", text)
    assert "is it learning?" in text and re.search(r"your tasks[ │]+\d+/\d+ succeeded \(\d+%\)", text)
    assert re.search(r"record[ │]+every 5 min, or after 1 new", text)  # the trigger, not only the interval
    assert re.search(r"reconcile[ │]+every 30 min[ │]+\d+ s ago: index agrees", text)


def test_zz_down_then_inspection_still_reads_the_store(env):
    # Named to run last in this module: it stops the shared daemon.
    assert re.search(r"evolver daemon \d+ stopped", ok("down", env=env).stdout)
    assert "not running" in ok("down", env=env).stdout
    status = run("status", env=env)
    assert status.returncode == 5 and "not running" in status.stdout
    assert "is it learning?" in status.stdout and "your tasks" in status.stdout  # read from the store
    listed = json.loads(ok("tasks", "--json", env=env).stdout)["tasks"]
    assert listed and all(t["status"] in ("done", "failed", "cancelled") for t in listed)
    assert ok("show", listed[0]["id"], "--json", env=env)
    assert len(json.loads(ok("tree", "--json", env=env).stdout)["nodes"]) == 1
    assert json.loads(ok("history", "--json", env=env).stdout)["events"]
    for needs_daemon in (("submit", "x"), ("cancel", listed[0]["id"]), ("chat", "-m", "hi"), ("evolve",)):
        refused = run(*needs_daemon, env=env)
        assert refused.returncode == 5, needs_daemon
        assert "the daemon is not running" in refused.stderr and "evolver up" in refused.stderr
