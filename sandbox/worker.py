"""A persistent sandboxed Python worker per task, kept warm like a notebook kernel.

One sandboxed interpreter runs the loop in ``_worker_main.py``; the host sends it
one JSON line per call and reads one back, so a call costs a pipe round trip, not
a sandbox start. Names defined by one call stay for the next. When a call runs
past its timeout the whole worker is killed (its state with it) and the call
reports ``timed_out``; the next call starts a fresh worker and says, in
``restarted`` and ``notice``, that earlier state is gone.
"""

from __future__ import annotations

import json
import os
import secrets
import selectors
import subprocess
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import IO, Any, Protocol

from .limits import Limits
from .process import signal_name, terminate
from .result import ExecResult


class WorkerHost(Protocol):
    """What a worker needs of the sandbox that starts it (``ProcessSandbox``), named here so this
    module does not import the one that imports it."""

    isolated: bool

    def _spawn_worker(self, workspace: str | os.PathLike[str], limits: Limits, stderr) -> subprocess.Popen[bytes]: ...


WORKER_SOURCE = (Path(__file__).parent / "_worker_main.py").read_text(encoding="utf-8")
_CRASH_TAIL = 2000  # characters of the worker's own stderr quoted when it dies


def worker_argv(python: str, limits: Limits) -> list[str]:
    """How the worker loop is started inside the sandbox: its source travels in ``-c``."""
    return [python, "-u", "-c", WORKER_SOURCE, str(limits.output_bytes)]


class PythonWorker:
    """A task's warm, sandboxed Python interpreter. One call at a time; thread-safe.

    The worker is started lazily by the first call. bubblewrap's --die-with-parent
    ties it to the *thread* that started it (Linux parent-death signals follow
    threads), so start workers from long-lived threads; a worker killed that way is
    replaced on the next call like any other dead worker, with a notice.
    """

    def __init__(
        self, sandbox: WorkerHost, workspace: str | os.PathLike[str], limits: Limits, prelude: str = ""
    ) -> None:
        self._sandbox = sandbox
        self._workspace = workspace
        self.limits = limits
        # Run in every fresh worker before its first call (the task's tools as functions): a worker that
        # was restarted has them again, though the names the calls defined are gone.
        self.prelude = prelude
        self._proc: subprocess.Popen[bytes] | None = None
        self._crash_log: IO[bytes] | None = None
        self._finalizer: weakref.finalize | None = None  # kills a worker whose owner forgot close()
        self._buffer = bytearray()
        self._lock = threading.Lock()
        self._started_once = False
        self._lost: str | None = None  # why the previous worker is gone, for the next call's notice

    # -- public --------------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def execute(self, code: str, timeout_s: float | None = None) -> ExecResult:
        """Run a cell; ``value`` is the repr of its final expression, if any."""
        return self._request({"op": "exec", "code": code}, timeout_s)

    def call(self, name: str, kwargs: dict[str, Any] | None = None, timeout_s: float | None = None) -> ExecResult:
        """Call ``name(**kwargs)`` defined in the worker; ``value`` is its JSON result."""
        return self._request({"op": "call", "name": name, "kwargs": kwargs or {}}, timeout_s)

    def close(self) -> None:
        """Kill the worker (and anything it started); a later call would start a fresh one."""
        with self._lock:
            self._stop()
            self._lost = None
            self._started_once = False

    def __enter__(self) -> PythonWorker:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the conversation ------------------------------------------------------------------------

    def _request(self, message: dict[str, Any], timeout_s: float | None) -> ExecResult:
        timeout = timeout_s if timeout_s is not None else self.limits.timeout_s
        with self._lock:
            restarted, notice = False, None
            if not self.alive:
                if self._proc is not None and self._lost is None:
                    self._lost = self._death_reason("the worker exited between calls")
                restarted = self._started_once
                if restarted:
                    notice = (
                        f"a fresh Python worker was started because {self._lost}; "
                        "names defined by earlier calls are gone"
                    )
                failure = self._start()
                if failure is not None:
                    return failure
            started = time.monotonic()
            try:
                line = self._exchange(message, started + timeout)
            except (BrokenPipeError, OSError):
                line = b""
            elapsed = round((time.monotonic() - started) * 1000, 3)
            if line is None:
                self._stop()
                self._lost = f"the previous call ran past its {timeout:g} s timeout and the worker was killed"
                return ExecResult(
                    ok=False,
                    timed_out=True,
                    killed_by="SIGKILL",
                    duration_ms=elapsed,
                    error=f"the call ran past its {timeout:g} s timeout; the worker was killed and its state is lost",
                    error_type="TimeoutError",
                    restarted=restarted,
                    notice=notice,
                )
            if not line:
                self._lost = self._death_reason("the worker died during the previous call")
                killed_by = self._stop()
                return ExecResult(
                    ok=False,
                    killed_by=killed_by,
                    duration_ms=elapsed,
                    error=f"{self._lost}; its state is lost",
                    error_type="WorkerDied",
                    restarted=restarted,
                    notice=notice,
                )
            reply = json.loads(line)
            finished = reply.get("finished") is True and isinstance(reply.get("answer"), str)
            return ExecResult(
                ok=bool(reply.get("ok")),
                stdout=reply.get("stdout", ""),
                stderr=reply.get("stderr", ""),
                stdout_truncated=bool(reply.get("stdout_truncated")),
                stderr_truncated=bool(reply.get("stderr_truncated")),
                value=reply.get("value"),
                error=reply.get("error"),
                error_type=reply.get("error_type"),
                duration_ms=elapsed,
                restarted=restarted,
                notice=notice,
                finished=finished,
                answer=reply["answer"] if finished else None,
            )

    def _exchange(self, message: dict[str, Any], deadline: float) -> bytes | None:
        """Send one request under a fresh id and read its reply: a line with another id (one the code
        wrote on the channel itself, or a reply left behind by one it forged) is dropped. The line
        itself, b"" when the worker closed its end, None past the deadline."""
        nonce = secrets.token_hex(8)
        assert self._proc is not None and self._proc.stdin is not None  # started (``_start``), with pipes
        self._proc.stdin.write(json.dumps({**message, "id": nonce}).encode() + b"\n")
        self._proc.stdin.flush()
        while True:
            line = self._read_line(deadline)
            if not line:
                return line
            try:
                reply = json.loads(line)
            except ValueError:
                continue
            if isinstance(reply, dict) and reply.get("id") == nonce:
                return line

    def _start(self) -> ExecResult | None:
        """Start a worker and wait for its ready line; a failure comes back as a result."""
        started = time.monotonic()
        self._buffer.clear()
        self._crash_log = tempfile.TemporaryFile()
        self._proc = self._sandbox._spawn_worker(self._workspace, self.limits, self._crash_log)
        self._finalizer = weakref.finalize(self, _reap, self._proc, self._sandbox.isolated, self._crash_log)
        line = self._read_line(started + self.limits.timeout_s)
        if line and json.loads(line).get("ready"):
            if self.prelude:
                try:
                    loaded = self._exchange({"op": "exec", "code": self.prelude}, started + self.limits.timeout_s)
                except (BrokenPipeError, OSError):
                    loaded = b""
                if not loaded or not json.loads(loaded).get("ok"):
                    reason = (json.loads(loaded).get("error") if loaded else None) or self._death_reason(
                        "the worker's prelude did not run"
                    )
                    self._stop()
                    return ExecResult(
                        ok=False,
                        error=f"the session's tools could not be loaded: {reason}",
                        error_type="WorkerDied",
                        duration_ms=round((time.monotonic() - started) * 1000, 3),
                    )
            self._started_once = True
            self._lost = None
            return None
        reason = self._death_reason("the Python worker did not start")
        killed_by = self._stop()
        return ExecResult(
            ok=False,
            killed_by=killed_by,
            error=reason,
            error_type="WorkerDied",
            duration_ms=round((time.monotonic() - started) * 1000, 3),
        )

    def _read_line(self, deadline: float) -> bytes | None:
        """The next line from the worker; b"" when it closed its end, None past the deadline."""
        assert self._proc is not None and self._proc.stdout is not None  # started (``_start``), with pipes
        fd = self._proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not sel.select(remaining):
                    return None
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    return b""
                self._buffer += chunk
        line, _, rest = bytes(self._buffer).partition(b"\n")
        self._buffer[:] = rest
        return line

    def _death_reason(self, what: str) -> str:
        proc = self._proc
        if proc is None:
            return what
        try:
            code = proc.wait(timeout=1)
        except Exception:  # noqa: BLE001 - still running: it only closed its pipe
            code = None
        signal = signal_name(code, isolated=self._sandbox.isolated)
        detail = f"killed by {signal}" if signal else f"exit status {code}"
        tail = ""
        if self._crash_log is not None:
            self._crash_log.seek(0)
            tail = self._crash_log.read().decode("utf-8", "replace")[-_CRASH_TAIL:].strip()
        return f"{what} ({detail})" + (f": {tail}" if tail else "")

    def _stop(self) -> str | None:
        """Kill the worker's whole process group; the signal that had ended it, if any."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        already = proc.poll()
        terminate(proc, isolated=self._sandbox.isolated)
        for stream in filter(None, (proc.stdin, proc.stdout)):
            try:
                stream.close()
            except OSError:
                pass
        if self._crash_log is not None:
            self._crash_log.close()
            self._crash_log = None
        return signal_name(already, isolated=self._sandbox.isolated)


def _reap(proc, isolated: bool, crash_log) -> None:
    """What ``close`` does, for a worker dropped without it."""
    if proc.poll() is None:
        terminate(proc, isolated=isolated)
    for stream in (proc.stdin, proc.stdout, crash_log):
        try:
            stream.close()
        except OSError:
            pass
