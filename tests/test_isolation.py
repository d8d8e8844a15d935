"""Isolation (issue 7): model-written code, run for real as uid 65534, against the host and the daemon.

tests/test_sandbox.py plays the classic attacks (a readable secret in /tmp,
/etc/passwd, the parent's environment, writes to /usr and /etc, TCP to a host
listener, the host's Unix and abstract sockets, a fork bomb, 8 GB, endless
loops and CPU, /tmp and file sizes, orphans, kill -1, an inherited
descriptor). This file adds what it leaves out, every attack from inside real
bubblewrap, and where it matters inside a real daemon (one child process for
the module, holding an API key in its environment):

- the host's private paths (the daemon's data dir, database and socket, the
  project, /etc/shadow, /root) are not merely refused but absent; /proc gives
  no way out (pid 1's root, cwd, environ, fds and memory; sysctls; new user,
  mount and network namespaces; mount, chroot, setuid); host processes are
  invisible and unreachable; the network namespace holds only loopback;
  descriptors run out at their limit;
- links planted by sandboxed code are never followed out of the workspace by
  the file tools, the workspace helpers, or the verifier writing a check's files;
- no descriptor of the host reaches sandboxed code: a shell has 0, 1, 2; the
  persistent worker adds only its own protocol pipes and capture files;
  inside the daemon, none of its database, index files or sockets;
- no secret of the daemon's environment reaches run_python, run_shell or a
  checker, through os.environ or any /proc/*/environ;
- another uid cannot connect to the daemon's socket (each of the 0700 dir and
  the 0600 file suffices alone), and with both opened, the peer-uid check
  closes even a pipelined shutdown before a byte; no TCP, UDP or abstract
  socket listens by default.

One test is a strict xfail: a hole found here whose fix lies outside the
sandbox (see its reason). No timing assertions; timeouts only bound the tests.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import socket
import sqlite3
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _helpers import REPO

from evolver.judge.checks import parse_check
from evolver.judge.verify import verify
from evolver.testing.daemon import DaemonProcess, make_root, serving, write_script
from sandbox import Limits, SandboxError, WorkspaceError, list_dir, read_bytes, read_text, write_text
from tools import TaskTools, ToolRegistry, builtin_specs

ROOT = os.geteuid() == 0
NOBODY = 65534
LIMITS = Limits(timeout_s=60)  # generous: the machine is shared; it only bounds a stuck test
SECRET = "sk-test-secret-" + secrets.token_hex(12)
TOKEN = "tcp-token-secret-" + secrets.token_hex(12)

needs_root = pytest.mark.skipif(not ROOT, reason="switching to another uid needs root")


def py(code: str) -> str:
    return textwrap.dedent(code).strip() + "\n"


def last_json(text: str):
    return json.loads(text.strip().splitlines()[-1])


@pytest.fixture
def workspace(tmp_path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


@pytest.fixture
def tools(box, workspace):
    with TaskTools(
        ToolRegistry(builtin_specs()), box, workspace, limits=LIMITS, observation_chars=20_000
    ) as task_tools:
        yield task_tools


# -- one real daemon for the module, with secrets in its environment ---------------------------------

# Code the scripted model runs inside the daemon's sandbox. No backslashes: the script expands them.
ENV_PY = py("""
    import json, os
    seen = {"environ": dict(os.environ), "ppid": os.getppid(), "proc": {}}
    for pid in sorted(p for p in os.listdir("/proc") if p.isdigit()):
        try:
            seen["proc"][pid] = open("/proc/" + pid + "/environ", "rb").read().decode("latin-1")
        except OSError as exc:
            seen["proc"][pid] = type(exc).__name__
    open("env-run_python.json", "w").write(json.dumps(seen))
    print(json.dumps(seen))
""")
ENV_SH = (
    '{ env; for f in /proc/[0-9]*/environ; do echo "== $f"; cat "$f"; echo; done; } '
    "> env-run_shell.txt 2>&1; cat env-run_shell.txt"
)
ENV_CHECK = py("""
    def check(answer, workspace):
        import json, os
        seen = {"environ": dict(os.environ), "proc": {}}
        for pid in (p for p in os.listdir("/proc") if p.isdigit()):
            try:
                seen["proc"][pid] = open("/proc/" + pid + "/environ", "rb").read().decode("latin-1")
            except OSError as exc:
                seen["proc"][pid] = type(exc).__name__
        open("env-checker.json", "w").write(json.dumps(seen))
        return True, "dumped"
""")
FDS_PY = py("""
    import json, os, socket
    fds = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            fds[name] = os.readlink("/proc/self/fd/" + name)
        except OSError:
            pass  # the descriptor that listed the directory, closed by now
    reach = {}
    for path in DAEMON_PATHS:
        try:
            if os.path.isdir(path):
                os.listdir(path)
            else:
                open(path, "rb").close()
            reach[path] = "OPENED"
        except OSError as exc:
            reach[path] = type(exc).__name__
    try:
        socket.socket(socket.AF_UNIX).connect(DAEMON_SOCKET)
        reach["connect"] = "CONNECTED"
    except OSError as exc:
        reach["connect"] = type(exc).__name__
    print(json.dumps({"fds": fds, "reach": reach}))
""")
FDS_SH = "ls -l /proc/$$/fd; true"  # the shell's own table ("; true" keeps sh from exec-ing ls)
RACE_PY = py("""
    import threading, time
    def keep_passing():
        while True:
            try:
                open("test_solution.py", "w").write("print('passed')")
            except OSError:
                pass
            time.sleep(0.001)
    threading.Thread(target=keep_passing, daemon=True).start()
    print("left running")
""")


TASK = "Task:\n[^\n]*"  # the task's own line: past tasks shown as examples read "- Task: ..."


def daemon_rules(data_dir: Path, socket_path: Path) -> list[dict]:
    paths = [str(data_dir), str(data_dir / "evolver.db"), str(data_dir / "chroma"), str(socket_path.parent)]
    fds_py = FDS_PY.replace("DAEMON_PATHS", json.dumps(paths)).replace("DAEMON_SOCKET", json.dumps(str(socket_path)))
    return [
        {"match": "Your previous attempt at this task failed", "role": "user", "reply": "The test changed; again."},
        {"match": "", "role": "tool", "tool": "finish", "arguments": {"answer": "done"}},
        {
            "match": TASK + "ISOLATION-ENV",
            "on": "task",
            "calls": [
                {"tool": "run_python", "arguments": {"code": ENV_PY}},
                {"tool": "run_shell", "arguments": {"command": ENV_SH}},
            ],
        },
        {
            "match": TASK + "ISOLATION-FDS",
            "on": "task",
            "calls": [
                {"tool": "run_python", "arguments": {"code": fds_py}},
                {"tool": "run_shell", "arguments": {"command": FDS_SH}},
            ],
        },
        {"match": TASK + "ISOLATION-RACE", "on": "task", "tool": "run_python", "arguments": {"code": RACE_PY}},
        {"match": "", "tool": "finish", "arguments": {"answer": "done"}},
    ]


@pytest.fixture(scope="module")
def daemon():
    root = make_root()
    proc = DaemonProcess(
        root,
        settings={
            "OPENAI_API_KEY": SECRET,
            "ANTHROPIC_API_KEY": SECRET,
            "ISOLATION_TCP_TOKEN": TOKEN,
            "EVOLVER_MODEL_API_KEY_ENV": "OPENAI_API_KEY",
            "EVOLVER_DAEMON_TCP_TOKEN_ENV": "ISOLATION_TCP_TOKEN",  # named, but no tcp_port: no listener
            "EVOLVER_AGENT_KEEP_WORKSPACES": "true",
            "EVOLVER_AGENT_OBSERVATION_CHARS": "100000",
        },
        name="isolation",
    )
    proc.env["EVOLVER_MODEL_NAME"] = write_script(root, "isolation", daemon_rules(proc.data_dir, proc.socket_path))
    with serving(proc):
        yield proc


def run_task(daemon: DaemonProcess, marker: str, check: dict | None = None) -> dict:
    with daemon.client() as http:
        body = {"prompt": f"{marker}: do as the script says."}
        if check:
            body["check"] = check
        response = http.post("/v1/tasks", json=body)
        assert response.status_code == 201, response.text
        return daemon.wait_task(http, response.json()["id"], ("done", "failed", "cancelled", "dead"), timeout_s=180)


def observations(task: dict) -> list[str]:
    """What the task's tool calls gave back, in order."""
    return [
        step["content"] for trajectory in task["trajectories"] for step in trajectory["steps"] if step["role"] == "tool"
    ]


# -- who runs, and what it can see ----------------------------------------------------------------

STATUS_PY = (
    "print(' '.join(l.split(':', 1)[1].split()[0] for l in open('/proc/self/status') "
    "if l.split(':')[0] in ('Uid', 'CapEff', 'NoNewPrivs')))"
)


@needs_root
def test_every_entry_point_runs_as_the_unprivileged_uid(box, tools, workspace):
    box.workspace_dir(workspace)
    uid = workspace.stat().st_uid  # the workspace's own sandbox uid
    assert uid in box.uids and uid != 0
    expected = f"{uid} 0000000000000000 1"
    assert box.run(["python3", "-c", STATUS_PY], workspace=workspace, limits=LIMITS).stdout.strip() == expected
    shell = tools.run("run_shell", {"command": f'python3 -c "{STATUS_PY}"'})
    assert shell.ok and shell.text.splitlines()[-1] == expected, shell.text
    worker = tools.run("run_python", {"code": STATUS_PY})
    assert worker.ok and worker.text.strip() == expected, worker.text


def test_host_paths_are_absent_not_merely_refused(box, workspace, daemon):
    hidden = [
        str(daemon.data_dir),
        str(daemon.data_dir / "evolver.db"),
        str(daemon.socket_path),
        str(daemon.runtime_dir),
        str(REPO),
        str(REPO / "pyproject.toml"),
        sys.prefix,
        "/etc/shadow",
        "/etc/hostname",
        "/root/.ssh",
        "/root/.bash_history",
        "/home",
        "/var/lib",
        "/run",
    ]
    assert (daemon.data_dir / "evolver.db").exists() and daemon.socket_path.exists()  # they are there to find
    result = box.python(
        py(f"""
        import json, os
        seen = {{}}
        for path in {hidden!r}:
            try:
                os.stat(path)
                seen[path] = "EXISTS"
            except OSError as exc:
                seen[path] = type(exc).__name__
        print(json.dumps({{"seen": seen, "root": sorted(os.listdir("/root")) if os.path.isdir("/root") else []}}))
    """),
        workspace=workspace,
        limits=LIMITS,
    )
    assert result.ok, result
    found = last_json(result.stdout)
    assert found["seen"] == {path: "FileNotFoundError" for path in hidden}
    # /root holds nothing but the way to the Python installation the sandbox binds read-only.
    prefix = Path(box.python_prefix)
    allowed = [prefix.parts[2]] if prefix.parts[1:2] == ("root",) else []
    assert found["root"] == allowed


def test_proc_and_namespaces_give_no_way_out(box, workspace):
    result = box.python(
        py("""
        import ctypes, json, os, subprocess
        libc = ctypes.CDLL(None, use_errno=True)
        out = {}
        for path in ("/proc/1/root/", "/proc/1/cwd/", "/proc/1/environ", "/proc/1/fd/", "/proc/1/mem",
                     "/proc/1/maps", "/proc/kcore", "/proc/self/root/../../etc/shadow"):
            try:
                os.listdir(path) if path.endswith("/") else open(path, "rb").read(1)
                out[path] = "READ"
            except OSError as exc:
                out[path] = type(exc).__name__
        for path in ("/proc/sys/kernel/hostname", "/proc/sys/vm/drop_caches", "/proc/sysrq-trigger",
                     "/proc/1/oom_score_adj"):
            try:
                open(path, "w").write("1")
                out["write " + path] = "WROTE"
            except OSError as exc:
                out["write " + path] = type(exc).__name__
        def call(name, *args):
            ok = getattr(libc, name)(*args) == 0
            out[name + repr(args)] = "DONE" if ok else os.strerror(ctypes.get_errno())
        call("unshare", 0x10000000)  # CLONE_NEWUSER: "root" in a namespace of its own
        call("unshare", 0x00020000)  # CLONE_NEWNS
        call("unshare", 0x40000000)  # CLONE_NEWNET
        call("setuid", 0)
        call("chroot", b"/tmp")
        call("mount", b"none", b"/tmp", b"tmpfs", 0, None)
        call("ptrace", 16, 1, None, None)  # PTRACE_ATTACH to the sandbox's pid 1 (root-owned bwrap)
        ran = subprocess.run(["unshare", "--user", "--map-root-user", "id", "-u"], capture_output=True, text=True)
        out["unshare -Ur"] = "DONE" if ran.returncode == 0 else "REFUSED"
        print(json.dumps(out))
    """),
        workspace=workspace,
        limits=LIMITS,
    )
    assert result.ok, result
    out = last_json(result.stdout)
    assert [k for k, v in out.items() if v in ("READ", "WROTE", "DONE")] == [], out
    assert out["unshare(268435456,)"] == "Operation not permitted"  # refused, not merely unsupported


def test_host_processes_are_invisible_and_unreachable(box, workspace):
    marker = "evolver-iso-canary-" + secrets.token_hex(6)
    as_nobody = {"user": NOBODY, "group": NOBODY, "extra_groups": []} if ROOT else {}
    canary = subprocess.Popen(
        [sys.executable if not ROOT else "/usr/bin/python3", "-c", "import time; time.sleep(120)", marker], **as_nobody
    )
    try:
        result = box.python(
            py(f"""
            import json, os, signal
            pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
            cmdlines = [open(f"/proc/{{p}}/cmdline", "rb").read().decode("latin-1") for p in pids]
            try:
                os.kill({canary.pid}, signal.SIGKILL)
                kill = "SENT"
            except OSError as exc:
                kill = type(exc).__name__
            print(json.dumps({{"pids": pids, "cmdlines": cmdlines, "kill": kill}}))
        """),
            workspace=workspace,
            limits=LIMITS,
        )
        assert result.ok, result
        seen = last_json(result.stdout)
        assert len(seen["pids"]) <= 3, seen  # bwrap's pid 1, the code, maybe a helper: nothing of the host's
        assert not any(marker in line for line in seen["cmdlines"]), seen
        assert seen["kill"] == "ProcessLookupError"
        assert canary.poll() is None
    finally:
        canary.kill()
        canary.wait()


def test_the_network_namespace_holds_only_loopback(box, workspace):
    with socket.socket() as listener:
        listener.bind(("0.0.0.0", 0))  # every host address, not only loopback
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        host_addresses = (
            sorted(
                {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)} - {"127.0.0.1"}
            )
            if _resolvable()
            else []
        )
        result = box.python(
            py(f"""
            import json, socket
            out = {{"interfaces": [name for _, name in socket.if_nameindex()]}}
            for address in {host_addresses!r} + ["172.17.0.1", "10.0.2.2"]:
                try:
                    socket.create_connection((address, {port}), timeout=3).close()
                    out[address] = "CONNECTED"
                except OSError as exc:
                    out[address] = type(exc).__name__
            try:
                socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("8.8.8.8", 53))
                out["udp"] = "SENT"
            except OSError as exc:
                out["udp"] = type(exc).__name__
            for name, args in (("raw", (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)),
                               ("packet", (socket.AF_PACKET, socket.SOCK_RAW, 0))):
                try:
                    socket.socket(*args).close()
                    out[name] = "OPENED"
                except OSError as exc:
                    out[name] = type(exc).__name__
            try:
                socket.getaddrinfo("example.com", 80)
                out["dns"] = "RESOLVED"
            except OSError as exc:
                out["dns"] = type(exc).__name__
            print(json.dumps(out))
        """),
            workspace=workspace,
            limits=LIMITS,
        )
        assert result.ok, result
        out = last_json(result.stdout)
        assert out.pop("interfaces") == ["lo"]
        assert not {"CONNECTED", "SENT", "OPENED", "RESOLVED"} & set(out.values()), out
        with pytest.raises(BlockingIOError):
            listener.accept()


def _resolvable() -> bool:
    try:
        socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
        return True
    except OSError:
        return False


def test_descriptors_run_out_at_their_limit(box, workspace):
    result = box.python(
        py("""
        import os
        opened = []
        try:
            while True:
                opened.append(os.open("/dev/null", os.O_RDONLY))
        except OSError as exc:
            print(len(opened) + 3, exc.strerror)
    """),
        workspace=workspace,
        limits=Limits(timeout_s=60, max_open_files=64),
    )
    assert result.stdout.split(None, 1) == ["64", "Too many open files\n"]


@needs_root
def test_one_sandbox_cannot_use_up_anothers_processes(box, tmp_path):
    attacker_ws, victim_ws = tmp_path / "a", tmp_path / "b"
    attacker_ws.mkdir()
    victim_ws.mkdir()
    # 24, below the default 64 that other sandboxes on this machine run with, so they keep working.
    limits = Limits(timeout_s=60, max_processes=24)
    with box.worker(attacker_ws, limits) as worker:
        held = worker.execute(
            py("""
            import subprocess
            children = []
            while True:
                try:
                    children.append(subprocess.Popen(["sleep", "120"]))
                except OSError:
                    break
            len(children)
        """)
        )
        assert held.ok and int(held.value) > 0, held
        victim = box.run(["sh", "-c", "true & wait && echo forked"], workspace=victim_ws, limits=limits)
    assert victim.stdout == "forked\n", victim


# -- links planted in the workspace ---------------------------------------------------------------

PLANT = (
    "ln -s /etc/passwd passwd && ln -s {data} data && ln -s {data}/evolver.db db && "
    "ln -s {data}/canary.txt canary && ln -s passwd hop && ln -s /workspace/../../etc etc && "
    "mkdir sub && ln -s ../.. sub/up && echo planted"
)


def test_file_tools_refuse_links_that_sandboxed_code_pointed_outside(tools, workspace, daemon):
    data = daemon.data_dir
    canary = data / "canary.txt"
    canary.write_text("the host's own file")
    db_before = (data / "evolver.db").read_bytes()[:16]
    planted = tools.run("run_shell", {"command": PLANT.format(data=data)})
    assert planted.ok and planted.text.endswith("planted"), planted.text
    links = ["passwd", "/workspace/passwd", "data/evolver.db", "db", "canary", "hop", "etc/passwd", "sub/up/etc/passwd"]
    for path in links:
        for name, args in (("read_file", {"path": path}), ("write_file", {"path": path, "content": "PWNED"})):
            seen = tools.run(name, args)
            assert not seen.ok and seen.text.startswith("[sandbox error]"), (name, path, seen.text)
            assert "outside the workspace" in seen.text, (name, path, seen.text)
            assert "root:" not in seen.text and "the host's own file" not in seen.text
        for helper in (
            read_bytes,
            read_text,
            lambda ws, p: write_text(ws, p, "PWNED"),
            lambda ws, p: write_text(ws, p + "/below", "PWNED"),
        ):  # the helpers, not only the tools
            with pytest.raises(SandboxError, match="outside the workspace"):
                helper(workspace, path)
    for path in ("data", "sub/up", "etc"):
        listing = tools.run("list_files", {"path": path})
        assert not listing.ok and "outside the workspace" in listing.text, (path, listing.text)
        with pytest.raises(WorkspaceError):
            list_dir(workspace, path)
    # The workspace listing shows the links as links, sized as links, not as what they point at.
    kinds = {line.split("\t")[2]: line.split("\t")[:2] for line in tools.run("list_files", {}).text.splitlines()}
    assert kinds["db"] == ["symlink", str(len(f"{data}/evolver.db"))]
    assert canary.read_text() == "the host's own file"
    assert (data / "evolver.db").read_bytes()[:16] == db_before == b"SQLite format 3\x00"
    assert b"PWNED" not in (data / "evolver.db").read_bytes()
    assert "PWNED" not in Path("/etc/passwd").read_text()


@pytest.mark.parametrize("kind", ["command", "python"])
def test_the_verifier_does_not_write_check_files_through_planted_links(box, workspace, tmp_path, kind):
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / "host_file.py"
    target.write_text("ORIGINAL = True\n")
    planted = box.run(
        ["sh", "-c", f"ln -s {target} test_solution.py && ln -s {outside} tests"], workspace=workspace, limits=LIMITS
    )
    assert planted.ok, planted
    for path in ("test_solution.py", "tests/test_more.py"):  # a linked file, a linked directory
        files = {path: "raise SystemExit(0)\n"}
        check = parse_check(
            {"type": "command", "command": f"python3 {path}", "files": files}
            if kind == "command"
            else {"type": "python", "code": "def check(answer, workspace):\n    return True", "files": files}
        )
        verdict = verify(check, answer="x", sandbox=box, workspace=workspace, limits=LIMITS)
        assert verdict.success is False, verdict
        assert "could not put the check's file" in verdict.output, verdict
        assert "outside the workspace" in verdict.output, verdict
    assert target.read_text() == "ORIGINAL = True\n"
    assert sorted(p.name for p in outside.iterdir()) == ["host_file.py"]


# -- inherited descriptors ---------------------------------------------------------------------------


def _fds(listing: str) -> dict[int, str]:
    """The '... N -> target' lines of ``ls -l /proc/PID/fd`` as {N: target}."""
    found = {}
    for line in listing.splitlines():
        if " -> " in line:
            before, target = line.split(" -> ", 1)
            found[int(before.split()[-1])] = target.strip()
    return found


def test_no_host_descriptor_reaches_the_shell_or_the_worker(box, tools, tmp_path):
    # Host descriptors that a careless spawn would pass on: marked inheritable on purpose.
    db = sqlite3.connect(tmp_path / "host.db")
    db.execute("CREATE TABLE t (x)")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(tmp_path / "host.sock"))
    listener.listen()
    handle = open(tmp_path / "host.txt", "w")
    for fd in (listener.fileno(), handle.fileno()):
        os.set_inheritable(fd, True)
    try:
        shell = tools.run("run_shell", {"command": FDS_SH})
        worker = tools.run(
            "run_python",
            {
                "code": py("""
            import json, os, subprocess
            fds = {}
            for name in os.listdir("/proc/self/fd"):
                try:
                    st = os.fstat(int(name))
                    fds[name] = [os.readlink("/proc/self/fd/" + name), os.get_inheritable(int(name)),
                                 st.st_dev == os.stat("/tmp").st_dev, st.st_ino]
                except OSError:
                    pass  # the descriptor that listed the directory, closed by now
            child = subprocess.run("ls /proc/$$/fd; true", shell=True, capture_output=True, text=True).stdout.split()
            print(json.dumps({"fds": fds, "child": child}))
        """)
            },
        )
        protocol = {
            os.fstat(tools.worker._proc.stdin.fileno()).st_ino,
            os.fstat(tools.worker._proc.stdout.fileno()).st_ino,
        }
    finally:
        db.close()
        listener.close()
        handle.close()
    assert shell.ok, shell.text
    fds = _fds(shell.text)
    assert sorted(fds) == [0, 1, 2] and fds[0] == "/dev/null", shell.text
    assert all(fds[n].startswith("pipe:[") for n in (1, 2)), shell.text

    assert worker.ok, worker.text
    seen = last_json(worker.text)
    fds = {int(n): v for n, v in seen["fds"].items()}
    assert fds[0][0] == "/dev/null"
    # 1 and 2 capture output in files on the sandbox's private /tmp (5 and 6 are the originals)…
    captures = [n for n, (target, _, on_tmp, _) in fds.items() if on_tmp]
    assert sorted(captures) == [1, 2, 5, 6], fds
    # …and the only other two are the worker's own protocol pipes with the host, kept from its children.
    pipes = {n: ino for n, (target, inheritable, _, ino) in fds.items() if target.startswith("pipe:[")}
    assert set(pipes.values()) == protocol and len(pipes) == 2, fds
    assert not any(fds[n][1] for n in pipes), fds
    assert sorted(fds) == [0, 1, 2, *sorted(pipes), 5, 6]
    assert seen["child"] == ["0", "1", "2"]  # what code started from the worker inherits


def test_code_run_by_the_daemon_reaches_none_of_its_files_or_sockets(daemon):
    held = {os.readlink(f"/proc/{daemon.proc.pid}/fd/{n}") for n in os.listdir(f"/proc/{daemon.proc.pid}/fd")}
    # The daemon does hold what must not leak: its database, its listening socket.
    assert str(daemon.data_dir / "evolver.db") in held and any(t.startswith("socket:[") for t in held)
    task = run_task(daemon, "ISOLATION-FDS")
    assert task["status"] == "done", task
    python_out, shell_out = observations(task)[:2]
    seen = last_json(python_out)
    assert set(seen["reach"].values()) == {"FileNotFoundError"}, seen["reach"]
    targets = seen["fds"]
    assert targets["0"] == "/dev/null" and not any(t.startswith(("socket:", "anon_inode:")) for t in targets.values())
    assert all(t == "/dev/null" or t.startswith(("pipe:[", "/tmp/#")) for t in targets.values()), targets
    assert sorted(map(int, targets)) == [0, 1, 2, 3, 4, 5, 6], targets
    fds = _fds(shell_out)
    assert sorted(fds) == [0, 1, 2] and fds[0] == "/dev/null", shell_out
    assert all(fds[n].startswith("pipe:[") for n in (1, 2)), shell_out


# -- the daemon's secrets ----------------------------------------------------------------------------------


def test_no_secret_of_the_daemons_environment_reaches_sandboxed_code(daemon):
    environ = Path(f"/proc/{daemon.proc.pid}/environ").read_bytes().decode("latin-1")
    assert SECRET in environ and TOKEN in environ  # the daemon really holds them
    task = run_task(daemon, "ISOLATION-ENV", check={"type": "python", "code": ENV_CHECK})
    assert task["status"] == "done", task
    workspace = daemon.data_dir / "workspaces" / task["id"]
    dumps = {
        name: (workspace / name).read_text()
        for name in ("env-run_python.json", "env-run_shell.txt", "env-checker.json")
    }
    python_dump = json.loads(dumps["env-run_python.json"])
    assert set(python_dump["environ"]) <= {"PATH", "HOME", "TMPDIR", "LANG", "PWD", "SHLVL", "_", "LC_CTYPE"}
    assert python_dump["proc"] and "PATH=" in dumps["env-run_shell.txt"]  # they did look
    assert python_dump["proc"][str(python_dump["ppid"])] == "PermissionError"  # the parent: root's bwrap
    checker_dump = json.loads(dumps["env-checker.json"])
    assert set(checker_dump["environ"]) <= {"PATH", "HOME", "TMPDIR", "LANG", "PWD", "SHLVL", "_", "LC_CTYPE"}
    everything = "\n".join([*dumps.values(), json.dumps(task), *observations(task)])
    for leaked in (SECRET, TOKEN, "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "EVOLVER_"):
        assert leaked not in everything, leaked


def test_code_left_running_in_the_worker_cannot_rewrite_the_checks_files(daemon):
    task = run_task(
        daemon,
        "ISOLATION-RACE",
        check={
            "type": "command",
            "command": "python3 test_solution.py",
            "files": {"test_solution.py": "raise SystemExit('the real test fails')\n"},
        },
    )
    assert task["status"] == "failed", task["status"]


# -- the daemon's socket and ports --------------------------------------------------------------------

PEER_PROBE = r"""
import json, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(30)
try:
    s.connect(sys.argv[1])
except OSError as exc:
    print(json.dumps({"connected": False, "error": type(exc).__name__}))
    sys.exit(0)
reply, error = b"", None
try:
    s.sendall(sys.argv[2].encode())
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        reply += chunk
except OSError as exc:
    error = type(exc).__name__
print(json.dumps({"connected": True, "reply": reply.decode("latin-1"), "error": error}))
"""
_SUBMIT = json.dumps({"prompt": "submitted by another uid"})
SHUTDOWN_AND_SUBMIT = (
    "POST /v1/shutdown HTTP/1.1\r\nHost: evolver\r\nContent-Length: 0\r\n\r\n"
    "POST /v1/tasks HTTP/1.1\r\nHost: evolver\r\nContent-Type: application/json\r\n"
    f"Content-Length: {len(_SUBMIT)}\r\n\r\n{_SUBMIT}"
)


@functools.cache
def nobody_python() -> str | None:
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3", sys.executable):
        try:
            ran = subprocess.run(
                [candidate, "-I", "-c", "pass"], user=NOBODY, group=NOBODY, cwd="/", capture_output=True, timeout=60
            )
        except OSError:
            continue
        if ran.returncode == 0:
            return candidate
    return None


def connect_as_nobody(path: Path, payload: str) -> dict:
    python = nobody_python()
    if python is None:
        pytest.skip(f"no Python here that uid {NOBODY} may run")
    ran = subprocess.run(
        [python, "-I", "-c", PEER_PROBE, str(path), payload],
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    return last_json(ran.stdout)


def with_modes(path: Path, dir_mode: int, sock_mode: int, action):
    old = stat.S_IMODE(path.parent.stat().st_mode), stat.S_IMODE(path.stat().st_mode)
    try:
        path.parent.chmod(dir_mode)
        path.chmod(sock_mode)
        return action()
    finally:
        path.chmod(old[1])
        path.parent.chmod(old[0])


def task_count(daemon: DaemonProcess) -> int:
    db = sqlite3.connect(f"file:{daemon.data_dir / 'evolver.db'}?mode=ro", uri=True)
    try:
        return db.execute("SELECT count(*) FROM tasks").fetchone()[0]
    finally:
        db.close()


@needs_root
def test_each_file_mode_alone_keeps_another_uid_out(daemon):
    path = daemon.socket_path
    probe = functools.partial(connect_as_nobody, path, "GET /v1/health HTTP/1.1\r\nHost: evolver\r\n\r\n")
    assert with_modes(path, 0o700, 0o666, probe) == {"connected": False, "error": "PermissionError"}  # the dir
    assert with_modes(path, 0o755, 0o600, probe) == {"connected": False, "error": "PermissionError"}  # the file


@needs_root
def test_the_peer_check_closes_even_a_pipelined_shutdown_before_a_byte(daemon):
    before = task_count(daemon)
    seen = with_modes(
        daemon.socket_path, 0o755, 0o666, lambda: connect_as_nobody(daemon.socket_path, SHUTDOWN_AND_SUBMIT)
    )
    assert seen["connected"] is True and seen["reply"] == "", seen
    assert seen["error"] in (None, "ConnectionResetError", "BrokenPipeError"), seen
    assert f"refused a connection from uid {NOBODY}" in daemon.log(400)
    assert daemon.proc.poll() is None and daemon.healthy()  # not shut down
    assert task_count(daemon) == before  # and nothing was submitted
    assert "stopping" not in daemon.log(400)


def listeners(pid: int) -> dict[str, set[str]]:
    """The TCP listeners, bound UDP sockets and listening Unix sockets that ``pid`` holds (from /proc)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found: dict[str, set[str]] = {"tcp": set(), "udp": set(), "unix": set()}
    for table in ("tcp", "tcp6", "udp", "udp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes and (table.startswith("udp") or fields[3] == "0A"):  # 0A: LISTEN
                found[table.rstrip("6")].add(fields[1])
    for line in Path(f"/proc/{pid}/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[6] in inodes and int(fields[3], 16) & 0x10000:  # __SO_ACCEPTCON: listening
            found["unix"].add(fields[7] if len(fields) > 7 else "")
    return found


def test_no_tcp_udp_or_abstract_socket_listens_by_default(daemon):
    # The reader works: it sees this process's own listeners of each kind.
    abstract = "evolver-iso-" + secrets.token_hex(6)
    with (
        socket.socket() as tcp,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp,
        socket.socket(socket.AF_UNIX) as unix,
    ):
        tcp.bind(("127.0.0.1", 0))
        tcp.listen()
        udp.bind(("127.0.0.1", 0))
        unix.bind("\0" + abstract)
        unix.listen()
        mine = listeners(os.getpid())
        assert mine["tcp"] and mine["udp"] and "@" + abstract in mine["unix"], mine
    # The daemon: its one Unix socket (file modes and the peer check guard it), nothing else.
    assert listeners(daemon.proc.pid) == {"tcp": set(), "udp": set(), "unix": {str(daemon.socket_path)}}
