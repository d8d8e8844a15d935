"""The daemon as a process: its private socket, one daemon per data dir, crashes, leases and graceful stops.

Each test that kills or stops a daemon starts its own; the others share one.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import sqlite3
import stat
import subprocess
import sys

import pytest

from evolver.testing.daemon import SLOW_STEP, DaemonProcess, make_root, remove_root, serving, wait_for, write_script

NOBODY = 65534
GRACE_S = 5

PEER_PROBE = r"""
import json, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(15)
try:
    s.connect(sys.argv[1])
except OSError as exc:
    print(json.dumps({"connected": False, "error": type(exc).__name__}))
    sys.exit(0)
reply = b""
try:
    s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: evolver\r\n\r\n")
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        reply += chunk
    print(json.dumps({"connected": True, "reply": reply.decode("latin-1"), "error": None}))
except OSError as exc:
    print(json.dumps({"connected": True, "reply": reply.decode("latin-1"), "error": type(exc).__name__}))
"""

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="connecting as another uid needs root")


@functools.cache
def nobody_python() -> str | None:
    """A Python that uid 65534 can run (this venv's may sit under root's private home)."""
    for candidate in (sys.executable, shutil.which("python3"), "/usr/bin/python3", "/usr/local/bin/python3"):
        if not candidate or not os.path.exists(candidate):
            continue
        try:
            ran = subprocess.run(
                [candidate, "-I", "-c", "pass"], user=NOBODY, group=NOBODY, cwd="/", capture_output=True, timeout=60
            )
        except OSError:
            continue
        if ran.returncode == 0:
            return candidate
    return None


def as_nobody(path) -> dict:
    """Connect to ``path`` as uid 65534, send GET /v1/health, and say what came back."""
    python = nobody_python()
    if python is None:
        pytest.skip(f"no Python here that uid {NOBODY} may run")
    result = subprocess.run(
        [python, "-I", "-c", PEER_PROBE, str(path)],
        user=NOBODY,
        group=NOBODY,
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def db_task(daemon: DaemonProcess, task_id: str) -> dict:
    """The task's row read straight from the database file (for when no daemon is up)."""
    db = sqlite3.connect(f"file:{daemon.data_dir / 'evolver.db'}?mode=ro", uri=True)
    db.row_factory = sqlite3.Row
    try:
        return dict(
            db.execute("SELECT status, attempts, lease_owner, error FROM tasks WHERE id = ?", [task_id]).fetchone()
        )
    finally:
        db.close()


def slow_model(root) -> str:
    return write_script(root, "slow", [{"match": "", **SLOW_STEP}])


def start_slow_task(daemon: DaemonProcess, http) -> str:
    """Submit a task that runs until stopped; return its id once it is running and has taken a step."""
    response = http.post("/v1/tasks", json={"prompt": "SLOW: What is (12 + 30) * 2?"})
    assert response.status_code == 201, response.text
    task_id = response.json()["id"]
    seen: dict = {}

    def stepped():
        seen.update(daemon.task(http, task_id))
        if seen["status"] not in ("queued", "running"):
            pytest.fail(
                f"the slow task ended before it could be stopped: {seen['status']} ({seen['error']})\n{daemon.log()}"
            )
        return seen["status"] == "running" and seen["trajectories"] and seen["trajectories"][-1]["steps"]

    try:
        wait_for(stepped, timeout_s=60, what=f"task {task_id} to run and take a step")
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}; it is {seen.get('status')} with "
            f"{[len(t['steps']) for t in seen.get('trajectories', [])]} steps\n{daemon.log()}"
        ) from None
    return task_id


@pytest.fixture(scope="module")
def shared():
    with serving(DaemonProcess(make_root())) as daemon:
        yield daemon


def test_the_socket_is_private_to_its_user(shared):
    path = shared.socket_path
    info = path.lstat()
    assert stat.S_ISSOCK(info.st_mode)
    assert stat.S_IMODE(info.st_mode) == 0o600
    assert info.st_uid == os.geteuid()
    assert stat.S_IMODE(path.parent.lstat().st_mode) == 0o700


@needs_root
def test_another_uid_is_kept_out_by_the_directory_and_refused_by_the_peer_check(shared):
    path = shared.socket_path
    # The 0700 runtime dir alone keeps another user from reaching the socket.
    assert as_nobody(path) == {"connected": False, "error": "PermissionError"}

    # With the file modes loosened, the daemon itself still refuses: closed before any HTTP reply.
    dir_mode, sock_mode = stat.S_IMODE(path.parent.stat().st_mode), stat.S_IMODE(path.stat().st_mode)
    try:
        path.parent.chmod(0o755)
        path.chmod(0o666)
        probe = as_nobody(path)
    finally:
        path.chmod(sock_mode)
        path.parent.chmod(dir_mode)
    assert probe["connected"] is True, probe
    assert probe["reply"] == "", probe  # not a byte of HTTP
    assert probe["error"] in (None, "ConnectionResetError", "BrokenPipeError"), probe
    assert f"refused a connection from uid {NOBODY}" in shared.log(200)

    # Its own user is still served.
    assert shared.healthy()


def test_a_second_daemon_on_the_same_data_dir_refuses_to_start(shared):
    second = DaemonProcess(shared.root, name="second")
    second.spawn()
    code = second.wait_exit(120)
    assert code != 0
    assert "already running" in second.log()
    # The first one did not notice.
    assert shared.proc.poll() is None and shared.healthy()
    assert shared.socket_path.exists()


def test_a_killed_daemons_stale_socket_is_replaced_and_its_task_is_reclaimed_after_the_lease():
    root = make_root()
    settings = {"EVOLVER_DAEMON_LEASE_S": 2, "EVOLVER_DAEMON_WORKERS": 1}
    first = DaemonProcess(root, model=slow_model(root), settings=settings, name="first")
    second = DaemonProcess(root, settings=settings, name="second")  # the demo script: it finishes the task
    try:
        first.start()
        with first.client() as http:
            task_id = start_slow_task(first, http)
        first.kill()  # SIGKILL: no cleanup at all

        # The socket file stays behind, but nothing answers on it.
        path = first.socket_path
        assert stat.S_ISSOCK(path.lstat().st_mode)
        with pytest.raises(ConnectionRefusedError):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.connect(str(path))
        assert db_task(first, task_id)["status"] == "running"  # still leased to the dead worker

        # A new daemon starts over the stale socket, and takes the task over once its lease expires.
        second.start()
        with second.client() as http:
            task = second.wait_task(http, task_id, ("done", "failed", "cancelled", "dead"), timeout_s=90)
            assert http.get("/v1/status").json()["pid"] == second.proc.pid
        assert task["status"] == "done", task
        assert task["claims"] == task["attempts"] == 2  # two workers' leases, an attempt each
        assert task["trajectories"][-1]["final_answer"] == "84"
        assert len(task["trajectories"]) == 2
    finally:
        first.kill()
        second.close()
        remove_root(root)


def _stopped_cleanly(daemon: DaemonProcess, task_id: str) -> None:
    code = daemon.wait_exit(GRACE_S + 30)
    assert code == 0, daemon.log()
    assert not daemon.socket_path.exists()
    # The unfinished task went back to the queue, its attempt refunded.
    row = db_task(daemon, task_id)
    assert row["status"] == "queued" and row["attempts"] == 0 and row["lease_owner"] is None, row


def test_sigterm_drains_the_running_task_back_to_the_queue_for_the_next_start():
    root = make_root()
    settings = {"EVOLVER_DAEMON_SHUTDOWN_GRACE_S": GRACE_S, "EVOLVER_DAEMON_WORKERS": 1}
    first = DaemonProcess(root, model=slow_model(root), settings=settings, name="first")
    second = DaemonProcess(root, settings=settings, name="second")
    try:
        first.start()
        with first.client() as http:
            task_id = start_slow_task(first, http)
        first.proc.terminate()  # SIGTERM
        _stopped_cleanly(first, task_id)
        assert "stopping: SIGTERM" in first.log()

        second.start()
        with second.client() as http:
            task = second.wait_task(http, task_id, ("done", "failed", "cancelled", "dead"), timeout_s=60)
        # The drained run was refunded (one claim), though its attempt is on record beside the new one.
        assert task["status"] == "done" and task["claims"] == 1 and task["attempts"] == 2, task
        assert task["trajectories"][-1]["final_answer"] == "84"
        assert second.terminate() == 0
    finally:
        first.kill()
        second.close()
        remove_root(root)


def test_the_shutdown_call_stops_the_daemon_the_same_way():
    root = make_root()
    daemon = DaemonProcess(
        root, model=slow_model(root), settings={"EVOLVER_DAEMON_SHUTDOWN_GRACE_S": GRACE_S, "EVOLVER_DAEMON_WORKERS": 1}
    )
    try:
        daemon.start()
        with daemon.client() as http:
            task_id = start_slow_task(daemon, http)
            response = http.post("/v1/shutdown")
            assert response.status_code == 202, response.text
            assert response.json() == {"stopping": True}
        _stopped_cleanly(daemon, task_id)
        assert "stopping: asked through the API" in daemon.log()
    finally:
        daemon.close()
        remove_root(root)
