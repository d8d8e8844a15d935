"""Verdicts the judged code cannot forge: a check's job, run by the judge's own runner in the sandbox.

The host makes two pipes per run. On the first it writes a fresh secret nonce and closes
its end; on the second it reads the runner's report. Both reach the runner
(``_judge_main.py``, started with ``python3 -I``) as descriptors, never as text on a command
line or in the environment, where the attempt's processes could read them. The runner
makes itself undumpable before any of the attempt's code starts, and starts that code
only as child processes that inherit neither pipe. A report counts only when it carries
the nonce; an exit status, or anything printed, never does.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
from dataclasses import dataclass, replace
from pathlib import Path

from .base import Sandbox
from .errors import SandboxError
from .limits import Limits
from .result import RunResult

__all__ = ["Judged", "run_judged"]

RUNNER = (Path(__file__).with_name("_judge_main.py")).read_text(encoding="utf-8")
_MARGIN_S = 5.0  # the runner's own start and report, beyond the check's time
_REPORT_BYTES = 16 << 20


@dataclass(frozen=True)
class Judged:
    report: dict | None
    """The runner's report when it carried this run's nonce; None otherwise."""
    problem: str
    """Why there is no report (empty when there is one)."""
    run: RunResult | None = None


class _Reader(threading.Thread):
    """Reads the report pipe while the runner works, so a long report cannot block it."""

    def __init__(self, fd: int) -> None:
        super().__init__(daemon=True, name="verdict-reader")
        self.fd, self.data, self.too_long = fd, bytearray(), False

    def run(self) -> None:
        try:
            while chunk := os.read(self.fd, 1 << 16):
                if len(self.data) + len(chunk) > _REPORT_BYTES:
                    self.too_long = True
                    continue
                self.data += chunk
        except OSError:
            pass


def run_judged(
    sandbox: Sandbox, workspace: str | os.PathLike[str], job: dict, *, timeout_s: float, limits: Limits | None = None
) -> Judged:
    """Run ``job`` (``kind``: python, command or tool) through the runner; never raises for the attempt."""
    python = getattr(sandbox, "python_executable", None)
    if not python:
        return Judged(None, "the sandbox has no Python interpreter to run the checker with")
    nonce = secrets.token_hex(16)
    nonce_r, nonce_w = os.pipe()
    try:
        os.write(nonce_w, nonce.encode())
    finally:
        os.close(nonce_w)
    verdict_r, verdict_w = os.pipe()
    reader = _Reader(verdict_r)
    reader.start()
    base = limits or Limits()
    budget = timeout_s + _MARGIN_S
    run_limits = replace(base, timeout_s=min(base.timeout_s, budget) if base.timeout_s else budget)
    payload = json.dumps({**job, "timeout_s": timeout_s, "source": RUNNER})
    try:
        result = sandbox.run(
            [python, "-I", "-c", RUNNER, "judge", str(nonce_r), str(verdict_w)],
            workspace=workspace,
            stdin=payload,
            limits=run_limits,
            pass_fds=(nonce_r, verdict_w),
        )
    except SandboxError as exc:
        reader.join(timeout=5)
        os.close(verdict_r)
        return Judged(None, f"the checker could not start: {exc}")
    reader.join(timeout=5)  # the runner and everything it started are gone: the pipe is at its end
    os.close(verdict_r)
    report = _report(bytes(reader.data), nonce)
    if report is None:
        if result.timed_out:
            problem = "timed out"
        elif reader.too_long:
            problem = "its report was too long"
        else:
            problem = result.stderr.strip()[-2000:] or result.error or f"exited {result.exit_code} without a report"
        return Judged(None, problem, result)
    return Judged(report, "", result)


def _report(data: bytes, nonce: str) -> dict | None:
    try:
        report = json.loads(data)
    except ValueError:
        return None
    if not isinstance(report, dict) or not secrets.compare_digest(str(report.get("nonce", "")), nonce):
        return None
    return report
