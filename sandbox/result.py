"""What a sandboxed run gives back: plain data, exchanged as JSON (never pickle)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any


class _JsonRecord:
    """``to_json``/``from_json`` for a flat dataclass; unknown keys are refused."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str | bytes):
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"{cls.__name__}.from_json expects a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"{cls.__name__}.from_json got unknown fields {sorted(unknown)}")
        return cls(**data)


@dataclass(frozen=True)
class RunResult(_JsonRecord):
    """The outcome of one sandboxed command.

    ``exit_code`` is the command's status (negative: the signal that ended it, as
    ``subprocess`` reports it); ``killed_by`` names that signal ("SIGKILL",
    "SIGXCPU", …) or is None; ``timed_out`` says the wall-clock limit was hit and
    the whole process group was killed, keeping what had been printed so far.
    ``error`` is set only when the command could not be started at all.
    """

    exit_code: int | None
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    timed_out: bool = False
    killed_by: str | None = None
    duration_ms: float = 0.0
    isolated: bool = True
    error: str | None = None

    @property
    def ok(self) -> bool:
        """True when the command ran to the end and exited 0."""
        return self.exit_code == 0 and not self.timed_out and self.error is None


@dataclass(frozen=True)
class ExecResult(_JsonRecord):
    """The outcome of one call into a persistent ``PythonWorker``.

    ``value`` is the repr of the cell's final expression (``execute``) or the JSON
    value the function returned (``call``). ``error`` holds the traceback as text
    and ``error_type`` the exception's name. ``restarted`` says a fresh worker had
    to be started for this call, so names defined by earlier calls are gone;
    ``notice`` explains why. ``finished`` says the code called ``finish(answer)``
    (or ``final_answer``), which ended the cell and handed in ``answer``.
    """

    ok: bool
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    value: Any = None
    error: str | None = None
    error_type: str | None = None
    timed_out: bool = False
    killed_by: str | None = None
    duration_ms: float = 0.0
    restarted: bool = False
    notice: str | None = None
    finished: bool = False
    answer: str | None = None
