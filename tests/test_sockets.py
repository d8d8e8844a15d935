"""The daemon's socket: private mode, single instance, stale-file takeover, peer uid."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from evolver.service.sockets import DaemonRunning, SocketError, bind, peer_uid, prepare_runtime_dir, probe


@pytest.fixture
def runtime_dir():
    base = Path(tempfile.mkdtemp(prefix="evolver-run-"))
    yield base / "evolver"
    shutil.rmtree(base, ignore_errors=True)


def test_the_socket_is_private_and_its_directory_too(runtime_dir):
    bound = bind(runtime_dir / "evolver.sock")
    try:
        assert stat.S_IMODE(runtime_dir.stat().st_mode) == 0o700
        info = (runtime_dir / "evolver.sock").lstat()
        assert stat.S_ISSOCK(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600
        assert probe(runtime_dir / "evolver.sock")
    finally:
        bound.close()
    assert not (runtime_dir / "evolver.sock").exists()


def test_a_second_daemon_is_refused_while_the_first_answers(runtime_dir):
    first = bind(runtime_dir / "evolver.sock")
    try:
        with pytest.raises(DaemonRunning, match="already running"):
            bind(runtime_dir / "evolver.sock")
        assert probe(runtime_dir / "evolver.sock")  # the first one is untouched
    finally:
        first.close()


def test_a_stale_socket_left_by_a_dead_daemon_is_replaced(runtime_dir):
    prepare_runtime_dir(runtime_dir)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(runtime_dir / "evolver.sock"))
    dead.close()  # the file stays; nobody listens
    assert not probe(runtime_dir / "evolver.sock")
    bound = bind(runtime_dir / "evolver.sock")
    try:
        assert probe(runtime_dir / "evolver.sock")
    finally:
        bound.close()


def test_something_that_is_not_a_socket_is_never_removed(runtime_dir):
    prepare_runtime_dir(runtime_dir)
    (runtime_dir / "evolver.sock").write_text("precious")
    with pytest.raises(SocketError, match="is not a socket"):
        bind(runtime_dir / "evolver.sock")
    assert (runtime_dir / "evolver.sock").read_text() == "precious"


def test_cleanup_removes_only_the_socket_this_process_made(runtime_dir):
    bound = bind(runtime_dir / "evolver.sock")
    bound.sock.close()
    (runtime_dir / "evolver.sock").unlink()
    successor = bind(runtime_dir / "evolver.sock")
    try:
        bound.close()  # the old owner's cleanup must not remove the successor's socket
        assert probe(runtime_dir / "evolver.sock")
    finally:
        successor.close()


def test_peer_uid_is_the_connecting_process(runtime_dir):
    bound = bind(runtime_dir / "evolver.sock")
    try:
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(str(runtime_dir / "evolver.sock"))
        conn, _ = bound.sock.accept()
        assert peer_uid(conn) == os.geteuid()
        conn.close()
        client.close()
    finally:
        bound.close()


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to act as another uid")
def test_another_uid_cannot_connect(runtime_dir):
    bound = bind(runtime_dir / "evolver.sock")
    try:
        os.chmod(runtime_dir.parent, 0o755)  # even with the parent open, the 0700 dir and 0600 socket stop it
        code = (
            "import socket, sys\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            "try:\n    s.connect(sys.argv[1])\nexcept PermissionError:\n    print('refused')\n"
            "else:\n    print('connected')\n"
        )
        result = subprocess.run(
            [
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "/usr/bin/python3",
                "-c",
                code,
                str(runtime_dir / "evolver.sock"),
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert result.stdout.strip() == "refused", result.stderr
    finally:
        bound.close()


def test_a_runtime_dir_owned_by_someone_else_is_refused(runtime_dir):
    if os.geteuid() != 0:
        pytest.skip("needs root to give the directory away")
    runtime_dir.mkdir(parents=True)
    os.chown(runtime_dir, 65534, 65534)
    with pytest.raises(SocketError, match="belongs to uid 65534"):
        prepare_runtime_dir(runtime_dir)
