"""The optional TCP listener: loopback only, and never without its bearer token."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from evolver.testing.daemon import free_port


@pytest.fixture
def root():
    path = Path(tempfile.mkdtemp(prefix="evt-", dir="/tmp"))  # short: socket paths are limited
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _env(root: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVOLVER_")}
    env.update(
        {
            "EVOLVER_MODEL_NAME": "scripted/demo",
            "EVOLVER_DAEMON_DATA_DIR": str(root / "data"),
            "EVOLVER_DAEMON_RUNTIME_DIR": str(root / "run"),
        },
        **extra,
    )
    return env


def test_tcp_requests_need_the_token_and_the_listener_is_loopback_only(root):
    port = free_port()
    env = _env(
        root,
        EVOLVER_DAEMON_TCP_PORT=str(port),
        EVOLVER_DAEMON_TCP_TOKEN_ENV="DAEMON_TEST_TOKEN",
        DAEMON_TEST_TOKEN="s3cret-token",
    )
    daemon = subprocess.Popen(
        [sys.executable, "-m", "evolver", "up", "--foreground"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{base}/v1/health", headers={"Authorization": "Bearer s3cret-token"}).is_success:
                    break
            except httpx.TransportError:
                pass
            assert daemon.poll() is None, daemon.stdout.read()
            assert time.monotonic() < deadline, "the daemon did not answer over TCP"
            time.sleep(0.2)
        assert httpx.get(f"{base}/v1/health").status_code == 401
        wrong = httpx.get(f"{base}/v1/tasks", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "unauthorized"
        right = httpx.post(
            f"{base}/v1/tasks",
            json={"prompt": "What is (12 + 30) * 2?"},
            headers={"Authorization": "Bearer s3cret-token"},
        )
        assert right.status_code == 201
        listening = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True)
        if listening.returncode == 0 and listening.stdout.strip():
            assert all("127.0.0.1:" in line for line in listening.stdout.splitlines())
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(60) == 0


def test_a_tcp_port_without_its_token_refuses_to_start(root):
    env = _env(root, EVOLVER_DAEMON_TCP_PORT=str(free_port()), EVOLVER_DAEMON_TCP_TOKEN_ENV="NO_SUCH_DAEMON_TOKEN")
    result = subprocess.run(
        [sys.executable, "-m", "evolver", "up", "--foreground"], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    assert "$NO_SUCH_DAEMON_TOKEN is empty or unset" in result.stderr and "Traceback" not in result.stderr
    assert not list((root / "run").glob("*.sock"))  # nothing left behind
