"""A real daemon in a child process for the socket tests: start, wait until healthy, talk, stop, kill.

The daemon is ``python -m evolver up --foreground`` with a clean environment
(only the ``EVOLVER_*`` settings a test gives), its data and runtime dirs in a
short temp dir (Unix socket paths are limited to 107 bytes) and its output in
a log file that failures show.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path

import httpx

import evolver
from evolver.cli.client import finished_rounds, server_events

# The directory the evolver package was imported from: the daemon runs there, so the child runs the same
# code as its parent (a checkout's, not an installed copy's).
SOURCE = Path(evolver.__file__).resolve().parent.parent
PYTHON = sys.executable

# One step that takes a while and never finishes: the task runs until cancelled, drained or its step limit.
# Two different calls a step, so no call is ever repeated in a row (that would end the attempt early).
SLOW_STEP = {
    "calls": [
        {"tool": "run_python", "arguments": {"code": f"import time; time.sleep(0.15); print({n})"}} for n in (1, 2)
    ]
}


def make_root() -> Path:
    """A short temp dir that other users may enter (its runtime dir inside stays the daemon's 0700)."""
    root = Path(tempfile.mkdtemp(prefix="evd-", dir="/tmp"))
    root.chmod(0o755)
    return root


def write_script(root: Path, name: str, rules: list[dict], *, record: Path | None = None) -> str:
    """Write a scripted-model script; returns the model name that makes a daemon answer from it.
    With ``record``, every conversation the model is sent is appended to that file (one JSON line each)."""
    path = root / f"{name}.json"
    path.write_text(json.dumps({"rules": rules, **({"record": str(record)} if record else {})}), encoding="utf-8")
    return "scripted/" + str(path.absolute())


def demo_rules() -> list[dict]:
    return json.loads((resources.files("evolver") / "data" / "demo_script.json").read_text(encoding="utf-8"))["rules"]


def wait_for(predicate: Callable[[], object], *, timeout_s: float, what: str, interval_s: float = 0.1):
    """Poll until ``predicate()`` is truthy and return it; fail naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)


class DaemonProcess:
    """One ``evolver up --foreground`` child on ``root/data`` with its socket under ``root/run``."""

    def __init__(
        self, root: Path, *, model: str | None = "scripted/demo", settings: dict | None = None, name: str = "daemon"
    ) -> None:
        """``model``: [model] name; None leaves it unset (as [model] local needs)."""
        self.root = Path(root)
        self.data_dir = self.root / "data"
        self.runtime_dir = self.root / "run"
        self.log_path = self.root / f"{name}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("EVOLVER_")}
        env.update({"EVOLVER_MODEL_NAME": model} if model is not None else {})
        env.update(
            {
                "EVOLVER_DAEMON_DATA_DIR": str(self.data_dir),
                "EVOLVER_DAEMON_RUNTIME_DIR": str(self.runtime_dir),
                "PYTHONUNBUFFERED": "1",
                # Idle, the tree search hands out evaluation tasks on its own; tests that count tasks
                # keep it off (tests/test_daemon_tree.py turns it on).
                "EVOLVER_EVOLUTION_EVALUATION_SLOTS": "0",
            }
        )
        env.update({k: str(v) for k, v in (settings or {}).items()})
        self.env = env
        self.proc: subprocess.Popen | None = None
        self._clients: list[httpx.Client] = []

    @property
    def socket_path(self) -> Path:
        from evolver.config import load_config
        from evolver.service.daemon import socket_path

        config = load_config(env=self.env)
        return socket_path(config, self.data_dir)

    # --- the process -------------------------------------------------------------------

    def spawn(self) -> subprocess.Popen:
        """Start the child (not waiting for it)."""
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [PYTHON, "-m", "evolver", "up", "--foreground"],
                cwd=str(SOURCE),
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        return self.proc

    def start(self, timeout_s: float = 120.0) -> DaemonProcess:
        """Start the child and wait until it answers /v1/health."""
        self.spawn()
        self.wait_healthy(timeout_s)
        return self

    def log(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def healthy(self) -> bool:
        """It answers, and it has left ``starting`` (its API answers before its jobs exist)."""
        try:
            with self.client(timeout_s=5.0) as http:
                return (
                    http.get("/v1/health").json() == {"ok": True}
                    and http.get("/v1/status").json().get("mood") != "starting"
                )
        except (httpx.TransportError, ValueError):
            return False

    def wait_healthy(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        path = self.socket_path
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"the daemon exited with {self.proc.returncode} while starting:\n{self.log()}")
            if path.exists() and self.healthy():
                return
            time.sleep(0.1)
        raise AssertionError(f"the daemon did not answer /v1/health within {timeout_s:g} s:\n{self.log()}")

    def wait_exit(self, timeout_s: float) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the daemon did not exit within {timeout_s:g} s:\n{self.log()}") from None

    def terminate(self, timeout_s: float = 60.0) -> int:
        """SIGTERM and wait for the exit status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait_exit(timeout_s)

    def kill(self) -> None:
        """SIGKILL the daemon's whole process group (its sandboxes too) and reap it."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(30)

    def close(self) -> None:
        """Stop whatever is left (gracefully, then hard) and close the clients."""
        for http in self._clients:
            http.close()
        self._clients.clear()
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.terminate(timeout_s=30.0)
            except AssertionError:
                self.kill()

    # --- talking to it -----------------------------------------------------------------

    def client(self, timeout_s: float = 60.0) -> httpx.Client:
        """An httpx client over the daemon's socket (base URL http://evolver)."""
        return httpx.Client(
            transport=httpx.HTTPTransport(uds=str(self.socket_path)), base_url="http://evolver", timeout=timeout_s
        )

    def task(self, http: httpx.Client, task_id: str) -> dict:
        response = http.get(f"/v1/tasks/{task_id}")
        assert response.status_code == 200, response.text
        return response.json()

    def wait_task(
        self, http: httpx.Client, task_id: str, statuses: tuple[str, ...], *, timeout_s: float = 60.0
    ) -> dict:
        """Poll a task until its status is one of ``statuses``; return it."""
        last: dict = {}

        def reached():
            last.update(self.task(http, task_id))
            return last["status"] in statuses

        try:
            wait_for(reached, timeout_s=timeout_s, what=f"task {task_id} to be {'/'.join(statuses)}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; it is {last.get('status')} ({last.get('error')})\n{self.log()}") from None
        return last


def run_rounds(http: httpx.Client, job: str | None = None) -> list[dict]:
    """``POST /v1/evolve`` (which queues the rounds on the job host) and the rounds once they finished."""
    response = http.post("/v1/evolve", json={"job": job})
    assert response.status_code == 202, response.text
    return finished_rounds(response.json()["rounds"], lambda path: http.get(path).json())


def read_events(response: httpx.Response) -> list[tuple[str, int | None, dict]]:
    """The server-sent events of a response as (event, id, data), up to and including ``end``."""
    return list(server_events(response))


def remove_root(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)


@contextmanager
def serving(daemon: DaemonProcess) -> Iterator[DaemonProcess]:
    """Start ``daemon``; on leaving, however that happens, stop it and remove its root."""
    try:
        daemon.start()
        yield daemon
    finally:
        daemon.close()
        remove_root(daemon.root)


def pids_whose_command_line(matches: Callable[[bytes], bool]) -> list[int]:
    """The pids of the live processes whose command line (``/proc/PID/cmdline``, NUL-separated) ``matches``."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if matches(cmdline.read_bytes()):
                pids.append(int(cmdline.parent.name))
        except OSError:  # it ended while we looked
            continue
    return pids


def free_port() -> int:
    """A loopback TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def list_tasks(http: httpx.Client) -> list[dict]:
    """Every task the daemon lists, through all of ``GET /v1/tasks``'s pages."""
    tasks, offset = [], 0
    while offset is not None:
        response = http.get("/v1/tasks", params={"limit": 1000, "offset": offset})
        assert response.status_code == 200, response.text
        tasks += response.json()["tasks"]
        offset = response.json()["next_offset"]
    return tasks


def assert_error(response: httpx.Response, status: int | tuple[int, ...], *words: str) -> dict:
    """A JSON error of the documented shape whose message names the problem."""
    assert response.status_code in ((status,) if isinstance(status, int) else status), (
        response.status_code,
        response.text[:500],
    )
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"type", "message", "param"}
    for word in words:
        assert word in error["message"], (word, error)
    return error
