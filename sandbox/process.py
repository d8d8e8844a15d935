"""Run one command to the end and return what happened as data (never raise for it).

The command starts in its own session, so its process group can be killed as a
whole: on the wall-clock timeout, and again after it exits (a background child
left in the group must not outlive the run). Output is read as it comes, capped
per stream, so a chatty program cannot fill the daemon's memory; what was read
before a kill is kept.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Any

from .limits import Limits
from .result import RunResult

_POLL_S = 0.1  # how often a silent process is checked for having exited
_DRAIN_S = 0.5  # how long to keep reading after exit, from children that still hold the pipes
_TEARDOWN_S = 5.0  # how long a killed sandbox may take to empty its pid namespace


def spawn(
    argv: Sequence[str],
    *,
    cwd: str,
    env: dict[str, str],
    stdin: int | None,
    stdout: int,
    stderr,
    preexec_fn: Callable[[], None] | None = None,
    user: int | None = None,
    group: int | None = None,
    pass_fds: Sequence[int] = (),
) -> subprocess.Popen:
    """Start ``argv`` in a new session with no inherited descriptors but 0, 1, 2 and ``pass_fds``.

    ``pass_fds`` (bubblewrap's seccomp program) are handed over: they are closed
    here once the child has them, or when it could not start.
    """
    extra: dict[str, Any] = {}
    if user is not None:
        extra = {"user": user, "group": group, "extra_groups": []}
    try:
        return subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=env,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            close_fds=True,
            pass_fds=tuple(pass_fds),
            start_new_session=True,
            preexec_fn=preexec_fn,
            **extra,
        )
    finally:
        for fd in pass_fds:
            os.close(fd)


def signal_name(returncode: int | None, *, isolated: bool) -> str | None:
    """The signal that ended a process, from its return code.

    bubblewrap reports a sandboxed command killed by signal N as exit status
    128 + N, so for isolated runs those codes are read as signals too.
    """
    if returncode is None:
        return None
    number = -returncode if returncode < 0 else (returncode - 128 if isolated and 128 < returncode < 160 else 0)
    if number <= 0:
        return None
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid``; a group already gone is fine."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def terminate(proc: subprocess.Popen, *, isolated: bool) -> None:
    """Kill a run and everything it started, and return only once they are gone.

    Killing the outer bubblewrap would return at once while the sandbox's pid 1
    (its child, which --die-with-parent kills a moment later) is still tearing the
    namespace down. So the sandbox's pid 1 is killed first: the kernel then kills
    every process of the namespace, and the outer bwrap exits after that. The
    group kill afterwards covers the degraded mode and anything unexpected.
    """
    if isolated and proc.poll() is None:
        for child in _children(proc.pid):
            try:
                os.kill(child, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            proc.wait(timeout=_TEARDOWN_S)
        except subprocess.TimeoutExpired:
            pass
    kill_group(proc.pid)
    proc.wait()


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as handle:
            return [int(child) for child in handle.read().split()]
    except OSError:
        return []


def has_exited(pid: int) -> bool:
    """True once ``pid`` has exited; it is left unreaped, so its group id cannot be reused yet."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None


def collect(
    proc: subprocess.Popen, *, stdin: bytes | None, limits: Limits, started: float, isolated: bool
) -> RunResult:
    """Feed ``stdin``, read capped output until the process ends or time runs out, clean up."""
    cap = limits.output_bytes
    deadline = started + limits.timeout_s
    out, err = bytearray(), bytearray()
    sizes = {"out": 0, "err": 0}
    assert proc.stdout is not None and proc.stderr is not None  # started with pipes for both (``run_process``)
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, ("out", out))
    sel.register(proc.stderr, selectors.EVENT_READ, ("err", err))
    pending = memoryview(stdin or b"")
    if proc.stdin is not None:
        if pending:
            os.set_blocking(proc.stdin.fileno(), False)
            sel.register(proc.stdin, selectors.EVENT_WRITE, None)
        else:
            proc.stdin.close()

    timed_out = False
    drain_until: float | None = None
    while sel.get_map():
        now = time.monotonic()
        if now >= deadline:
            timed_out = True
            break
        if drain_until is not None and now >= drain_until:
            break
        events = sel.select(min(deadline - now, _POLL_S))
        if not events:
            if drain_until is None and has_exited(proc.pid):
                kill_group(proc.pid)  # whatever it left behind in its group
                drain_until = time.monotonic() + _DRAIN_S
            continue
        for key, _ in events:
            if key.data is None:  # stdin is writable
                try:
                    written = os.write(key.fd, pending[:65536])
                    pending = pending[written:]
                except (BrokenPipeError, OSError):
                    pending = pending[:0]
                if not pending:
                    sel.unregister(key.fileobj)
                    assert proc.stdin is not None  # the one file registered for writing
                    proc.stdin.close()
                continue
            name, buf = key.data
            chunk = os.read(key.fd, 65536)
            if not chunk:
                sel.unregister(key.fileobj)
                continue
            sizes[name] += len(chunk)
            room = cap - len(buf)
            if room > 0:
                buf += chunk[:room]

    while not timed_out and not has_exited(proc.pid):
        if time.monotonic() >= deadline:  # it closed its output but kept running
            timed_out = True
        else:
            time.sleep(0.01)
    if timed_out:
        terminate(proc, isolated=isolated)
    else:
        kill_group(proc.pid)  # it exited; this only reaches what it left in its group
    for key in list(sel.get_map().values()):  # keep whatever is already in the pipes
        if key.data is not None:
            _drain_ready(key.fd, key.data[1], cap, sizes, key.data[0])
        sel.unregister(key.fileobj)
    sel.close()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None and not stream.closed:
            stream.close()
    returncode = proc.wait()
    return RunResult(
        exit_code=returncode,
        stdout=bytes(out).decode("utf-8", "replace"),
        stderr=bytes(err).decode("utf-8", "replace"),
        stdout_truncated=sizes["out"] > cap,
        stderr_truncated=sizes["err"] > cap,
        timed_out=timed_out,
        killed_by=signal_name(returncode, isolated=isolated),
        duration_ms=round((time.monotonic() - started) * 1000, 3),
        isolated=isolated,
    )


def _drain_ready(fd: int, buf: bytearray, cap: int, sizes: dict[str, int], name: str) -> None:
    """Read what is already waiting in a pipe, without blocking on writers still alive."""
    os.set_blocking(fd, False)
    while True:
        try:
            chunk = os.read(fd, 65536)
        except (BlockingIOError, OSError):
            return
        if not chunk:
            return
        sizes[name] += len(chunk)
        room = cap - len(buf)
        if room > 0:
            buf += chunk[:room]


def run_process(
    argv: Sequence[str],
    *,
    cwd: str,
    env: dict[str, str],
    stdin: bytes | None,
    limits: Limits,
    isolated: bool,
    preexec_fn: Callable[[], None] | None = None,
    user: int | None = None,
    group: int | None = None,
    pass_fds: Sequence[int] = (),
) -> RunResult:
    """Start ``argv``, collect its result; a command that cannot start is a result too."""
    started = time.monotonic()
    try:
        proc = spawn(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=preexec_fn,
            user=user,
            group=group,
            pass_fds=pass_fds,
        )
    except OSError as exc:
        return RunResult(
            exit_code=None,
            isolated=isolated,
            duration_ms=round((time.monotonic() - started) * 1000, 3),
            error=f"could not start {argv[0]!r}: {exc}",
        )
    return collect(proc, stdin=stdin, limits=limits, started=started, isolated=isolated)
