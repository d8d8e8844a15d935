"""The sandbox contains what model-written code tries, and reports it all as data.

Each containment test plays one attack from inside a real bubblewrap sandbox and
checks the host afterwards. When the tests run as root (as here), sandboxed code
runs as uid 65534, and the "secret" planted outside the workspace is one that
uid *could* read without the sandbox — a control run in the degraded mode shows
it. Offline, no timing assertions; timeouts are short but only bound the tests.
"""

from __future__ import annotations

import ast
import logging
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

import sandbox
from sandbox import (
    DegradedSandbox,
    Limits,
    RunResult,
    Sandbox,
    SandboxUnavailable,
    make_sandbox,
)

ROOT = os.geteuid() == 0
NOBODY = 65534
FAST = Limits(timeout_s=10)


@pytest.fixture(scope="module")
def degraded() -> DegradedSandbox:
    return DegradedSandbox(reason="a test asked for the degraded mode")


@pytest.fixture
def workspace(tmp_path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


@pytest.fixture
def outside():
    """A directory outside any workspace that the sandbox uid could read and write without a sandbox."""
    path = Path(tempfile.mkdtemp(prefix="evolver-sbx-outside-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def processes_with(marker: str) -> list[int]:
    """Host pids whose command line contains ``marker`` (this test process excluded)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(entry))
    return found


def py(code: str) -> str:
    return textwrap.dedent(code).strip() + "\n"


# -- the public surface -------------------------------------------------------------------------


def test_public_surface_is_curated():
    assert sorted(sandbox.__all__) == sorted(set(sandbox.__all__))
    for name in sandbox.__all__:
        assert hasattr(sandbox, name), name
    assert {
        "Limits",
        "RunResult",
        "Sandbox",
        "BubblewrapSandbox",
        "DegradedSandbox",
        "make_sandbox",
        "PythonWorker",
        "SandboxError",
        "SandboxUnavailable",
        "read_text",
        "write_text",
        "list_dir",
    } <= set(sandbox.__all__)


def test_package_uses_only_the_standard_library():
    for path in Path(sandbox.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names or top == "__future__", f"{path.name} imports {name}"


def test_limits_refuse_nonsense():
    with pytest.raises(ValueError, match="timeout_s"):
        Limits(timeout_s=0)
    assert Limits().memory_mb == 1024


def test_run_result_round_trips_as_json():
    result = RunResult(exit_code=0, stdout="ünïcode", stderr="", timed_out=False, duration_ms=1.5)
    assert RunResult.from_json(result.to_json()) == result
    with pytest.raises(ValueError, match="unknown fields"):
        RunResult.from_json('{"exit_code": 0, "pickle": "no"}')


def test_bubblewrap_sandbox_is_a_sandbox(box):
    assert isinstance(box, Sandbox)
    assert box.isolated is True


# -- ordinary runs --------------------------------------------------------------------------------


def test_python_runs_in_the_workspace_with_the_standard_library(box, workspace):
    (workspace / "helper.py").write_text("ANSWER = 42\n")
    result = box.python(
        py("""
        import json, os, sys, sqlite3
        import helper
        print(json.dumps({"cwd": os.getcwd(), "answer": helper.ANSWER, "prefix": sys.prefix}))
        open("made-inside.txt", "w").write("hi")
    """),
        workspace=workspace,
        limits=FAST,
    )
    assert result.ok, result
    assert '"cwd": "/workspace"' in result.stdout and '"answer": 42' in result.stdout
    assert (workspace / "made-inside.txt").read_text() == "hi"


def test_stdin_is_passed_and_exit_status_reported(box, workspace):
    result = box.run(["sh", "-c", "cat; exit 3"], workspace=workspace, stdin="fed\n", limits=FAST)
    assert (result.exit_code, result.stdout, result.killed_by) == (3, "fed\n", None)


def test_a_missing_command_is_data_not_an_exception(box, workspace):
    result = box.run(["no-such-command-here"], workspace=workspace, limits=FAST)
    assert not result.ok and result.exit_code != 0 and "no-such-command-here" in result.stderr


def test_output_is_capped_and_flagged(box, workspace):
    result = box.python("print('x' * 50_000)", workspace=workspace, limits=Limits(timeout_s=10, output_bytes=1000))
    assert len(result.stdout) == 1000 and result.stdout_truncated and not result.stderr_truncated


WHO_PY = """
import os
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
print(os.getuid(), os.geteuid(), os.getgid(), os.getgroups(),
      status["CapEff"].strip(), status["CapBnd"].strip(), status["NoNewPrivs"].strip())
"""


def test_multiprocessing_works_inside(box, workspace):
    result = box.python(
        py("""
        import multiprocessing
        with multiprocessing.Pool(2) as pool:
            print(pool.map(abs, [-1, -2, -3]))
    """),
        workspace=workspace,
        limits=Limits(timeout_s=30),
    )
    assert result.ok and result.stdout == "[1, 2, 3]\n", result


@pytest.mark.skipif(not ROOT, reason="only root switches to another uid")
def test_code_runs_as_its_workspaces_own_unprivileged_uid_without_capabilities(box, tmp_path):
    seen = {}
    for name in ("a", "b", "a"):
        workspace = tmp_path / name
        workspace.mkdir(exist_ok=True)
        result = box.python(WHO_PY, workspace=workspace, limits=FAST)
        uid, euid, gid, groups, *caps = result.stdout.split()
        assert uid == euid == gid and groups == "[]" and caps == ["0000000000000000", "0000000000000000", "1"]
        assert int(uid) in box.uids and int(uid) != 0, uid
        assert (workspace.stat().st_uid, workspace.stat().st_gid) == (int(uid), int(uid))  # handed to that uid
        seen.setdefault(name, set()).add(int(uid))
    assert len(seen["a"]) == 1  # a workspace seen again keeps its uid (its files stay its own)
    assert seen["a"] != seen["b"]  # another workspace gets another one


@pytest.mark.skipif(not ROOT, reason="only root switches to another uid")
def test_without_task_uids_every_sandbox_runs_as_the_one_unprivileged_uid(box, tmp_path):
    single = sandbox.BubblewrapSandbox(bwrap=box.bwrap, task_uids=0)
    for name in ("a", "b"):
        workspace = tmp_path / name
        workspace.mkdir()
        result = single.python(WHO_PY, workspace=workspace, limits=FAST)
        assert result.stdout.split()[:4] == [str(NOBODY), str(NOBODY), str(NOBODY), "[]"], result
        assert workspace.stat().st_uid == NOBODY


# -- containment ----------------------------------------------------------------------------------


def test_a_secret_file_outside_the_workspace_cannot_be_read(box, degraded, workspace, outside):
    secret = outside / "secret.txt"
    secret.write_text("the-secret-value")
    secret.chmod(0o644)
    project = Path(__file__).resolve().parent.parent
    code = py(f"""
        import os
        for path in [{str(secret)!r}, {str(project / "pyproject.toml")!r}, "/etc/passwd",
                     os.path.expanduser("~root"), "/home", "/var", "/run", "/sys"]:
            try:
                print(path, "READ", open(path).read()[:40] if os.path.isfile(path) else os.listdir(path))
            except OSError as exc:
                print(path, "REFUSED", type(exc).__name__)
        print(sorted(os.listdir("/")))
    """)
    result = box.python(code, workspace=workspace, limits=FAST)
    assert result.ok, result
    assert "READ" not in result.stdout and "the-secret-value" not in result.stdout
    assert "['bin', 'dev', 'etc', 'lib'" in result.stdout  # only the system dirs, /tmp, /workspace…
    for hidden in ("home", "var", "run", "sys", "work", "mnt", "opt"):
        assert f"'{hidden}'" not in result.stdout.splitlines()[-1]
    # The control: the same uid reads it fine when nothing isolates it.
    control = degraded.run(["cat", str(secret)], workspace=workspace, limits=FAST)
    assert control.stdout == "the-secret-value"


def test_the_parent_environment_does_not_leak(box, workspace, monkeypatch):
    key = "sk-evolver-test-" + secrets.token_hex(8)
    monkeypatch.setenv("OPENAI_API_KEY", key)
    monkeypatch.setenv("EVOLVER_TEST_SECRET", key)
    result = box.run(
        ["sh", "-c", "env; cat /proc/1/environ 2>/dev/null; cat /proc/self/environ"], workspace=workspace, limits=FAST
    )
    assert key not in result.stdout and "OPENAI_API_KEY" not in result.stdout
    names = {line.split("=", 1)[0] for line in result.stdout.splitlines() if "=" in line}
    assert names <= {"PATH", "HOME", "TMPDIR", "LANG", "PWD", "SHLVL", "_"}


def test_writes_outside_the_workspace_do_not_reach_the_host(box, workspace, outside):
    target = outside / "planted.txt"
    result = box.python(
        py(f"""
        for path in [{str(target)!r}, "/usr/planted.txt", "/etc/planted.txt", "/planted.txt",
                     "/tmp/planted.txt", "/workspace/ok.txt"]:
            try:
                open(path, "w").write("x")
                print(path, "WROTE")
            except OSError as exc:
                print(path, "REFUSED", type(exc).__name__)
    """),
        workspace=workspace,
        limits=FAST,
    )
    assert result.ok, result
    assert f"{target} REFUSED" in result.stdout and "/usr/planted.txt REFUSED" in result.stdout
    assert not target.exists() and not Path("/usr/planted.txt").exists()
    assert not Path("/etc/planted.txt").exists() and not Path("/planted.txt").exists()
    assert "/tmp/planted.txt WROTE" in result.stdout and not Path("/tmp/planted.txt").exists()  # private /tmp
    assert (workspace / "ok.txt").read_text() == "x"


def test_no_tcp_connection_to_a_host_listener(box, workspace):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        result = box.python(
            py(f"""
            import socket
            for host in ("127.0.0.1", "localhost", "10.0.2.2", "8.8.8.8"):
                try:
                    socket.create_connection((host, {port}), timeout=2).close()
                    print(host, "CONNECTED")
                except OSError as exc:
                    print(host, "REFUSED", type(exc).__name__)
        """),
            workspace=workspace,
            limits=FAST,
        )
        assert result.ok, result
        assert "CONNECTED" not in result.stdout
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing ever arrived


def test_no_connection_to_the_parents_unix_sockets(box, workspace, outside):
    path = str(outside / "daemon.sock")
    abstract = "\0evolver-sbx-test-" + secrets.token_hex(6)
    with socket.socket(socket.AF_UNIX) as named, socket.socket(socket.AF_UNIX) as hidden:
        named.bind(path)
        os.chmod(path, 0o777)
        named.listen()
        hidden.bind(abstract)
        hidden.listen()
        named.setblocking(False)
        hidden.setblocking(False)
        result = box.python(
            py(f"""
            import socket
            for address in ({path!r}, {abstract!r}):
                try:
                    socket.socket(socket.AF_UNIX).connect(address)
                    print(repr(address), "CONNECTED")
                except OSError as exc:
                    print(repr(address), "REFUSED", type(exc).__name__)
        """),
            workspace=workspace,
            limits=FAST,
        )
        assert result.ok, result
        assert "CONNECTED" not in result.stdout and result.stdout.count("REFUSED") == 2
        for listener in (named, hidden):
            with pytest.raises(BlockingIOError):
                listener.accept()


def test_a_fork_bomb_is_bounded_and_leaves_nothing_behind(box, workspace):
    marker = "evolver-fork-bomb-" + secrets.token_hex(6)
    code = py(f"""
        import os, sys, time
        said = False
        while True:
            try:
                os.fork()
            except OSError as exc:
                if not said:
                    print("LIMIT HIT", exc.errno, flush=True)
                    said = True
                time.sleep(0.01)
        # {marker}
    """)
    result = box.python(code, workspace=workspace, limits=Limits(timeout_s=2, max_processes=16))
    assert result.timed_out and result.killed_by == "SIGKILL"
    assert "LIMIT HIT" in result.stdout  # RLIMIT_NPROC stopped it before the timeout did
    assert processes_with(marker) == []
    assert subprocess.run(["true"]).returncode == 0  # the host can still start processes


def test_allocating_8_gb_fails_with_memory_error(box, workspace):
    result = box.python("block = bytearray(8 * 1024 ** 3)", workspace=workspace, limits=FAST)
    assert result.exit_code == 1 and "MemoryError" in result.stderr


def test_an_infinite_loop_is_killed_on_time_keeping_partial_output(box, workspace):
    result = box.python(
        "print('started', flush=True)\nwhile True:\n    pass", workspace=workspace, limits=Limits(timeout_s=1)
    )
    assert result.timed_out and result.killed_by == "SIGKILL" and not result.ok
    assert result.stdout == "started\n"


def test_cpu_seconds_are_limited(box, workspace):
    result = box.python("while True:\n    pass", workspace=workspace, limits=Limits(timeout_s=30, cpu_s=1))
    assert not result.timed_out and result.killed_by in {"SIGXCPU", "SIGKILL"}


def test_the_private_tmp_and_file_sizes_are_capped(box, workspace):
    result = box.python(
        py("""
        for path, size in (("/tmp/big", 3 << 20), ("/dev/shm/big", 3 << 20), ("/workspace/big", 3 << 20)):
            try:
                with open(path, "wb") as f:
                    f.write(b"x" * size)
                print(path, "WROTE")
            except OSError as exc:
                print(path, "REFUSED", exc.strerror)
    """),
        workspace=workspace,
        limits=Limits(timeout_s=10, tmp_mb=1, max_file_mb=2),
    )
    assert "/tmp/big REFUSED No space left on device" in result.stdout
    assert "/dev/shm/big REFUSED No space left on device" in result.stdout
    assert "/workspace/big REFUSED File too large" in result.stdout


def test_background_processes_do_not_outlive_the_run(box, workspace):
    marker = "evolver-bg-" + secrets.token_hex(6)
    result = box.python(
        py(f"""
        import os, subprocess, sys, time
        sleeper = "import sys, time; open('up-' + sys.argv[1], 'w').close(); time.sleep(60)"
        for n, session in ((1, False), (2, True)):
            subprocess.Popen([sys.executable, "-c", sleeper, str(n), {marker!r}], start_new_session=session)
        if os.fork() == 0:  # a double-forked daemon
            os.setsid()
            if os.fork() == 0:
                os.execv(sys.executable, [sys.executable, "-c", sleeper, "3", {marker!r}])
            os._exit(0)
        while len([name for name in os.listdir(".") if name.startswith("up-")]) < 3:
            time.sleep(0.01)
        print("left", flush=True)
    """),
        workspace=workspace,
        limits=FAST,
    )
    assert result.ok and result.stdout == "left\n", result
    assert sorted(p.name for p in workspace.glob("up-*")) == ["up-1", "up-2", "up-3"]  # all were running
    assert processes_with(marker) == []


def test_killing_the_parent_or_everything_does_not_reach_the_host(box, workspace):
    as_sandbox_uid = {"user": NOBODY, "group": NOBODY, "extra_groups": []} if ROOT else {}
    canary = subprocess.Popen(["sleep", "60"], **as_sandbox_uid)  # kill -1 would reach it without a sandbox
    parent = os.getppid()  # the tests' own parent: 1 already where the suite runs detached (nohup ... &)
    try:
        result = box.python(
            py("""
            import os, signal
            for target in (os.getppid(), 1, -1):
                try:
                    os.kill(target, signal.SIGKILL)
                    print(target, "SENT")
                except OSError as exc:
                    print(target, "REFUSED", type(exc).__name__)
        """),
            workspace=workspace,
            limits=FAST,
        )
        assert result.exit_code is not None and not result.timed_out
        assert canary.poll() is None  # same uid, but another pid namespace: unreachable
        assert os.getppid() == parent  # a killed parent would have left this process to another
    finally:
        canary.kill()
        canary.wait()


def test_only_standard_descriptors_are_inherited(box, workspace, outside):
    leaked = os.open(str(outside), os.O_RDONLY)
    os.set_inheritable(leaked, True)
    try:
        result = box.python(
            py("""
            import os
            open_fds = []
            for fd in range(1024):
                try:
                    os.fstat(fd)
                    open_fds.append(fd)
                except OSError:
                    pass
            print(open_fds)
        """),
            workspace=workspace,
            limits=FAST,
        )
    finally:
        os.close(leaked)
    assert result.stdout == "[0, 1, 2]\n"


# -- choosing the sandbox ---------------------------------------------------------------------------


def test_isolation_demanded_without_bubblewrap_is_refused():
    with pytest.raises(SandboxUnavailable, match="(?i)install.*bubblewrap"):
        make_sandbox(require_isolation=True, bwrap="/nonexistent/bwrap")


def test_without_bubblewrap_the_degraded_mode_is_chosen_and_logged(caplog, workspace, monkeypatch):
    monkeypatch.setenv("EVOLVER_TEST_SECRET", "do-not-leak")
    with caplog.at_level(logging.WARNING, logger="sandbox"):
        fallback = make_sandbox(require_isolation=False, bwrap="/nonexistent/bwrap")
    assert isinstance(fallback, DegradedSandbox) and fallback.isolated is False
    assert any("DEGRADED" in record.getMessage() for record in caplog.records)
    result = fallback.python(
        "import os; print(os.getcwd(), os.getuid(), 'EVOLVER_TEST_SECRET' in os.environ)",
        workspace=workspace,
        limits=FAST,
    )
    assert result.isolated is False
    # As root: the workspace's own uid from the pool; otherwise the daemon's user.
    assert result.stdout.split() == [str(workspace), str(workspace.stat().st_uid), "False"]
    assert (workspace.stat().st_uid in fallback.uids) if ROOT else workspace.stat().st_uid == os.getuid()


def test_the_degraded_mode_still_times_out_the_whole_group(degraded, workspace):
    marker = "evolver-degraded-" + secrets.token_hex(6)
    result = degraded.run(
        ["sh", "-c", f"sleep 60 & sleep 61 & echo go; wait # {marker}"], workspace=workspace, limits=Limits(timeout_s=1)
    )
    assert result.timed_out and result.stdout == "go\n" and not result.isolated
    assert processes_with(marker) == [] and processes_with("sleep 61") == []


def test_worker_in_the_degraded_mode_runs(degraded, workspace):
    with degraded.worker(workspace, limits=FAST) as worker:
        assert worker.execute("6 * 7").value == "42"


@pytest.mark.parametrize("ci, outcome", [("true", pytest.fail.Exception), ("", pytest.skip.Exception)])
def test_a_missing_bubblewrap_skips_its_tests_but_fails_them_on_ci(monkeypatch, ci, outcome):
    # A CI machine whose sandbox cannot start must never pass by skipping every test that needs it.
    from _helpers import without_bubblewrap

    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="bubblewrap cannot run"):
        without_bubblewrap(SandboxUnavailable("bwrap: No permissions to create new namespace"))
