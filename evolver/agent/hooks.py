"""Scaffold policy hooks: Python the meta-agent writes, called at four points of the agent loop.

A scaffold's ``hooks`` source defines any of these top-level functions; each takes one
argument, ``data`` (plain JSON), and returns ``None`` (change nothing) or a JSON object:

``before_model(data)``
    data: ``task``, ``attempt``, ``step``, ``messages`` (the conversation about to be sent,
    ``[{"role", "content", ...}]``), ``tools`` (the tool names about to be offered).
    returns: ``{"messages": [...]}`` to send other messages for this call (the loop's own
    conversation is not changed), ``{"tools": [...]}`` to offer only some of the tools.
``after_tool(data)``
    data: ``task``, ``attempt``, ``step``, ``name``, ``arguments``, ``result`` (the text the
    model would see), ``ok``, ``calls`` (this attempt's calls so far, ``[name, arguments]``,
    this one last).
    returns: ``{"result": "..."}``: the text the model sees instead.
``before_finish(data)``
    data: ``task``, ``attempt``, ``step``, ``answer``.
    returns: ``{"answer": "..."}`` to hand in another answer, ``{"reject": "why"}`` to refuse
    the finish (the model is told why and goes on).
``on_failure(data)``
    data: ``task``, ``attempt``, ``answer``, ``feedback`` (what the verifier may tell a
    learner: never the expected output), ``reflection``.
    returns: ``{"note": "..."}``: added to what the next attempt is told.

Why this shape: hooks are the safe form of self-modification by code. They run in a
sandboxed interpreter of their own, one per task (started on first use, kept warm, state
kept between calls), in an empty scratch directory: not in the daemon, not in the task's
Python worker (where the model's own code could redefine them), never near the store, the
check or its files. Only JSON crosses, both ways. A call that raises, runs past its time
limit, or returns something malformed is recorded on the trajectory and ignored: the
agent goes on as if the hook were not there.
"""

from __future__ import annotations

import ast
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox import Limits, PythonWorker, Sandbox

from ..text import clip

__all__ = [
    "HOOK_POINTS",
    "HOOKS_GUIDE",
    "HookOutcome",
    "Hooks",
    "HookCalls",
    "HookError",
    "hook_points",
    "check_reply",
    "SAMPLE_DATA",
]

HOOK_POINTS = ("before_model", "after_tool", "before_finish", "on_failure")
MAX_REPLY_CHARS = 1_000_000  # a hook's answer, as JSON; more is malformed

# One call per point, as validation sends them: a child's hooks must answer these before it can serve.
SAMPLE_DATA: dict[str, dict[str, Any]] = {
    "before_model": {
        "task": "What is 2 + 3?",
        "attempt": 1,
        "step": 1,
        "messages": [
            {"role": "system", "content": "You are an agent."},
            {"role": "user", "content": "Task:\nWhat is 2 + 3?"},
        ],
        "tools": ["run_python", "finish"],
    },
    "after_tool": {
        "task": "What is 2 + 3?",
        "attempt": 1,
        "step": 2,
        "name": "run_python",
        "arguments": {"code": "print(2 + 3)"},
        "result": "5",
        "ok": True,
        "calls": [["run_python", {"code": "print(2 + 3)"}]],
    },
    "before_finish": {"task": "What is 2 + 3?", "attempt": 1, "step": 3, "answer": "5"},
    "on_failure": {
        "task": "What is 2 + 3?",
        "attempt": 1,
        "answer": "6",
        "feedback": "answer '6' is not the expected answer",
        "reflection": "I added wrongly.",
    },
}

HOOKS_GUIDE = (
    "Hooks are Python functions (standard library only) run in a sandbox at points of the agent loop. "
    "Define any of: before_model(data) -> {'messages': [...]} or {'tools': [...]}; "
    "after_tool(data) -> {'result': str} (data has name, arguments, result, ok, calls = this attempt's "
    "[name, arguments] pairs so far, this one last); before_finish(data) -> {'answer': str} or {'reject': str}; "
    "on_failure(data) -> {'note': str} (data has answer, feedback, reflection). Every data has task, "
    "attempt, step. Return None to change nothing. Example, a repeated-call guard:\n"
    "def after_tool(data):\n"
    "    if [data['name'], data['arguments']] in data['calls'][:-1]:\n"
    "        return {'result': data['result'] + '\\nYou made this exact call before; use its result or "
    "call finish.'}\n"
)


class HookError(ValueError):
    """Hooks source that cannot serve: the message says why."""


def hook_points(source: str, *, require: bool = True) -> list[str]:
    """The hook points ``source`` defines (top-level functions); raises HookError if it is not Python
    or (with ``require``) defines none. Parsing runs nothing."""
    if "\x00" in source:
        raise HookError("the hooks contain a NUL character, which Python source cannot hold")
    try:
        tree = ast.parse(source, "<hooks>")
    except SyntaxError as exc:
        raise HookError(f"the hooks are not valid Python: line {exc.lineno}: {exc.msg}") from None
    defined = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in HOOK_POINTS]
    if not defined and require:
        raise HookError(f"the hooks define none of the hook points ({', '.join(HOOK_POINTS)})")
    return sorted(set(defined), key=HOOK_POINTS.index)


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise HookError(f"{what} must be a string, not {type(value).__name__}")
    return value


def check_reply(point: str, reply: Any, data: dict[str, Any]) -> dict[str, Any] | None:
    """The hook's reply if it is well-formed for ``point`` (None: no change); raises HookError naming
    what is wrong otherwise."""
    if reply is None or reply == {}:
        return None
    if not isinstance(reply, dict):
        raise HookError(f"{point} returned {type(reply).__name__}; it returns None or a JSON object")
    allowed = {
        "before_model": {"messages", "tools"},
        "after_tool": {"result"},
        "before_finish": {"answer", "reject"},
        "on_failure": {"note"},
    }[point]
    unknown = set(reply) - allowed
    if unknown:
        raise HookError(
            f"{point} returned unknown key(s) {', '.join(sorted(unknown))}; it may return {', '.join(sorted(allowed))}"
        )
    if len(json.dumps(reply)) > MAX_REPLY_CHARS:
        raise HookError(f"{point} returned over {MAX_REPLY_CHARS:,} characters")
    if "messages" in reply:
        messages = reply["messages"]
        if not isinstance(messages, list) or not messages:
            raise HookError("before_model's messages must be a non-empty list")
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or message.get("role") not in ("system", "user", "assistant", "tool"):
                raise HookError(f"before_model's message {i} needs a role of system, user, assistant or tool")
            if message.get("content") is not None and not isinstance(message["content"], str):
                raise HookError(f"before_model's message {i} has content that is not a string")
    if "tools" in reply:
        tools = reply["tools"]
        offered = data.get("tools") or []
        if not isinstance(tools, list) or not tools or not all(isinstance(t, str) for t in tools):
            raise HookError("before_model's tools must be a non-empty list of tool names")
        extra = [t for t in tools if t not in offered]
        if extra:
            raise HookError(f"before_model may only narrow the tools offered; {', '.join(extra)} was not offered")
    for key in ("result", "answer", "reject", "note"):
        if key in reply:
            _text(reply[key], f"{point}'s {key}")
    if "answer" in reply and "reject" in reply:
        raise HookError("before_finish returned both answer and reject")
    return reply


@dataclass(frozen=True)
class HookOutcome:
    """One hook call: what it changed (a checked reply), or why it was ignored."""

    point: str
    change: dict[str, Any] | None = None
    error: str | None = None

    def record(self) -> dict[str, Any]:
        """How the call is kept on the trajectory's step (``tool_results``)."""
        return {"hook": self.point, "changed": self.change is not None, "error": self.error}


class Hooks:
    """One task's hooks: a warm sandboxed interpreter of their own, started by the first call."""

    def __init__(self, source: str, *, sandbox: Sandbox, scratch: Path, limits: Limits, timeout_s: float) -> None:
        self.source = source
        try:  # a child's hooks were checked before it could serve; a seed file's may still be broken
            self.points, self.problem = set(hook_points(source, require=False)), None
        except HookError as exc:
            self.points, self.problem = set(), str(exc)
        self.sandbox = sandbox
        self.scratch = Path(scratch)
        self.limits = limits
        self.timeout_s = timeout_s
        self._worker: PythonWorker | None = None

    def defines(self, point: str) -> bool:
        return point in self.points

    def call(self, point: str, data: dict[str, Any]) -> HookOutcome:
        """Call the hook at ``point`` (which must be defined); never raises for what the hook did."""
        problem = self._ready()
        if problem is not None:
            return HookOutcome(point, error=problem)
        assert self._worker is not None  # started by _ready
        result = self._worker.call(point, {"data": data}, timeout_s=self.timeout_s)
        if not result.ok:
            return HookOutcome(point, error=f"{point} failed: {_last_line(result.error)}")
        try:
            return HookOutcome(point, change=check_reply(point, result.value, data))
        except HookError as exc:
            return HookOutcome(point, error=str(exc))

    def _ready(self) -> str | None:
        """Start the interpreter and load the source, again after a call killed it; or say why not."""
        if self._worker is not None and self._worker.alive:
            return None
        if self._worker is None:
            self.scratch.mkdir(parents=True, exist_ok=True)
            self.sandbox.workspace_dir(self.scratch)
            self._worker = self.sandbox.worker(self.scratch, self.limits)
        loaded = self._worker.execute(self.source, timeout_s=self.timeout_s)
        if not loaded.ok:
            self._worker.close()
            self.points = set()  # one failure to record, not a sandbox start and a failure at every call
            return f"the hooks did not load: {_last_line(loaded.error)}"
        return None

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()
            self._worker = None
        shutil.rmtree(self.scratch, ignore_errors=True)

    def __enter__(self) -> Hooks:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class HookCalls:
    """A task's hooks as the loop calls them: each change and each failure becomes a ``hook`` step of
    the trajectory, and failures are kept (an evaluation with one counts as failed)."""

    def __init__(self, hooks: Hooks | None) -> None:
        self.hooks = hooks
        self.failures: list[str] = []
        self._told = False

    def unusable(self, record: Callable[..., None]) -> None:
        """Record, once, that the hooks cannot run at all (their source does not parse)."""
        if self.hooks is not None and self.hooks.problem and not self._told:
            self._told = True
            self.failures.append(self.hooks.problem)
            record(
                "hook",
                f"the hooks were ignored: {self.hooks.problem}",
                tool_results=[{"hook": None, "changed": False, "error": self.hooks.problem}],
            )

    def __call__(self, point: str, data: dict[str, Any], record: Callable[..., None]) -> dict[str, Any] | None:
        if self.hooks is None or not self.hooks.defines(point):
            return None
        outcome = self.hooks.call(point, data)
        if outcome.error is not None:
            self.failures.append(outcome.error)
            record("hook", f"{point} ignored: {outcome.error}", tool_results=[outcome.record()])
        elif outcome.change is not None:
            what = (
                "refused the finish" if "reject" in outcome.change else f"changed {', '.join(sorted(outcome.change))}"
            )
            record(
                "hook",
                f"{point} {what}: {clip(json.dumps(outcome.change, ensure_ascii=False), 2000)}",
                tool_results=[outcome.record()],
            )
        return outcome.change


def _last_line(error: str | None) -> str:
    """The exception line of a traceback (or the whole message when it is one line)."""
    lines = [line for line in (error or "no detail").strip().splitlines() if line.strip()]
    return lines[-1][:500] if lines else "no detail"
