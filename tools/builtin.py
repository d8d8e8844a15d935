"""The built-in tools, and running any tool call of one task in the sandbox.

Built-ins are declared as typed stubs (so their schemas are derived exactly as a
synthesized tool's are) and carried out by the host through the sandbox:
Python in the task's persistent worker, shell commands in a fresh sandboxed
process, file access through helpers that never leave the workspace.
Synthesized tools are loaded into the same worker and called there.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sandbox import ExecResult, Limits, PythonWorker, Sandbox, SandboxError, list_dir, read_text, write_text

from .registry import ToolRegistry
from .session import USES_FUNCTION, session_prelude
from .spec import ToolSpec, spec_from_source

__all__ = ["BUILTIN_SOURCES", "builtin_specs", "Observation", "TaskTools"]

BUILTIN_SOURCES = {
    "run_python": '''
def run_python(code: str) -> str:
    """Run Python code in this task's persistent interpreter (names stay defined between calls);
    returns what it printed and the value of a final expression.

    Args:
        code: Python source; the workspace is the current directory.
    """
''',
    "run_shell": '''
def run_shell(command: str) -> str:
    """Run a shell command (sh -c) in the workspace; returns exit code, stdout and stderr.

    Args:
        command: the command line.
    """
''',
    "read_file": '''
def read_file(path: str) -> str:
    """Read a text file from the workspace.

    Args:
        path: relative to the workspace.
    """
''',
    "write_file": '''
def write_file(path: str, content: str) -> str:
    """Write a text file in the workspace, creating parent directories.

    Args:
        path: relative to the workspace.
        content: the whole new content.
    """
''',
    "list_files": '''
def list_files(path: str = ".") -> str:
    """List a directory of the workspace (name, kind, size).

    Args:
        path: relative to the workspace.
    """
''',
    "finish": '''
def finish(answer: str) -> str:
    """End the task with the final answer: only the answer itself, no explanation.

    Args:
        answer: the final answer.
    """
''',
}


def builtin_specs() -> list[ToolSpec]:
    specs = []
    for name, source in BUILTIN_SOURCES.items():
        spec = spec_from_source(source, name=name, origin="builtin")
        # Built-ins run on the host side; the stub is only where the schema comes from.
        specs.append(
            ToolSpec(name=spec.name, description=spec.description, parameters=spec.parameters, origin="builtin")
        )
    return specs


@dataclass(frozen=True)
class Observation:
    """What a tool call gave back, as the model will read it."""

    text: str
    ok: bool
    duration_ms: float
    finished: bool = False
    answer: str | None = None


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit} more characters cut]"


def _format_exec(result) -> str:
    parts = []
    if result.restarted and result.notice:
        parts.append(f"[note: {result.notice}]")
    if result.stdout:
        parts.append(result.stdout.rstrip("\n"))
    if result.stderr:
        parts.append(f"[stderr]\n{result.stderr.rstrip()}")
    if result.value is not None and result.ok:
        parts.append(result.value if isinstance(result.value, str) else json.dumps(result.value))
    if result.timed_out:
        parts.append("[timed out: the worker was killed; its state is gone]")
    if result.error:
        parts.append(f"[error]\n{result.error.rstrip()}")
    return "\n".join(parts) or "[no output]"


class TaskTools:
    """The tools of one task, bound to its workspace and sandbox."""

    def __init__(
        self,
        registry: ToolRegistry,
        sandbox: Sandbox,
        workspace: str | os.PathLike[str],
        *,
        limits: Limits | None = None,
        observation_chars: int = 4000,
        allowed: list[str] | None = None,
        on_use: Callable[[ToolSpec, bool], None] | None = None,
    ) -> None:
        self.registry = registry
        # Told of every call a synthesized tool carried out (its usage statistics).
        self.on_use = on_use
        # The tools offered to the model for this task; None offers every registered tool.
        self.allowed = None if allowed is None else set(allowed)
        self.sandbox = sandbox
        self.workspace = os.fspath(workspace)
        self.limits = limits
        self.observation_chars = observation_chars
        self._worker: PythonWorker | None = None

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()
            self._worker = None

    def __enter__(self) -> TaskTools:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def worker(self) -> PythonWorker:
        """The task's persistent session: the built-ins and the task's synthesized tools are functions in
        it from its start (``tools.session``), so code can call them as the model calls tools."""
        if self._worker is None:
            self._worker = self.sandbox.worker(self.workspace, self.limits, prelude=session_prelude(self.synthesized()))
        return self._worker

    def synthesized(self) -> list[ToolSpec]:
        """The task's tools that run as code in its session (not the built-ins, not an MCP server's)."""
        return [
            spec
            for spec in self.registry.specs()
            if spec.origin != "builtin" and spec.runner is None and (self.allowed is None or spec.name in self.allowed)
        ]

    def run_code(self, code: str) -> Observation:
        """Run one block of the model's code in the session (a code action). It ends the attempt when it
        calls ``finish(answer)``; each synthesized tool it called is counted as a call of the tool."""
        started = time.perf_counter()
        try:
            result, answer = self._execute(code)
        except SandboxError as exc:
            return Observation(
                text=f"[sandbox error] {exc}", ok=False, duration_ms=(time.perf_counter() - started) * 1000
            )
        text = _format_exec(result) if not result.finished or result.stdout or result.stderr else "finished"
        return Observation(
            text=_clip(text, self.observation_chars),
            ok=result.ok,
            finished=result.finished,
            answer=answer,
            duration_ms=(time.perf_counter() - started) * 1000,
        )

    def _execute(self, code: str) -> tuple[ExecResult, str | None]:
        """Code run in the session (a block, or run_python's): its result, the answer it finished with, if
        any; the synthesized tools it called are counted."""
        result = self.worker.execute(code)
        self._count_uses()
        return result, result.answer.strip() if result.answer is not None else None

    def _count_uses(self) -> None:
        if self.on_use is None or not self.synthesized() or not self.worker.alive:
            return
        uses = self.worker.call(USES_FUNCTION)
        for name, ok in (uses.value or []) if uses.ok else []:
            spec = self.registry.get(name)
            if spec is not None and spec.origin != "builtin":
                self.on_use(spec, bool(ok))

    def run(self, name: str, arguments: Any) -> Observation:
        """Carry out one call. A bad call is an observation telling the model what was wrong."""
        started = time.perf_counter()
        problems = self.registry.check_call(name, arguments)
        if self.allowed is not None and name not in self.allowed:
            offered = ", ".join(sorted(self.allowed))
            problems = [
                f"{'unknown tool' if self.registry.get(name) is None else 'tool'} {name!r} is not "
                f"available for this task; use one of: {offered}"
            ]
        if problems:
            return Observation(
                text="Tool call refused: " + "; ".join(problems),
                ok=False,
                duration_ms=(time.perf_counter() - started) * 1000,
            )
        spec = self.registry.get(name)
        assert spec is not None
        try:
            ok, text, finished, answer = self._dispatch(spec, arguments)
        except SandboxError as exc:
            ok, text, finished, answer = False, f"[sandbox error] {exc}", False, None
        if spec.origin != "builtin" and self.on_use is not None:
            self.on_use(spec, ok)
        return Observation(
            text=_clip(text, self.observation_chars),
            ok=ok,
            finished=finished,
            answer=answer,
            duration_ms=(time.perf_counter() - started) * 1000,
        )

    def _dispatch(self, spec: ToolSpec, args: dict) -> tuple[bool, str, bool, str | None]:
        if spec.runner is not None:  # carried out by the host (a user's MCP server), not in the sandbox
            ok, text = spec.runner(args)
            return ok, text, False, None
        if spec.origin != "builtin":
            return self._synthesized(spec, args)
        if spec.name == "finish":
            return True, "finished", True, str(args["answer"]).strip()
        if spec.name == "run_python":  # finish(answer) in the code ends the attempt, as the tool would
            result, answer = self._execute(args["code"])
            return result.ok, _format_exec(result), result.finished, answer
        if spec.name == "run_shell":
            result = self.sandbox.run(["/bin/sh", "-c", args["command"]], workspace=self.workspace, limits=self.limits)
            text = f"exit code {result.exit_code}" + (" (timed out)" if result.timed_out else "")
            if result.stdout:
                text += f"\n{result.stdout.rstrip()}"
            if result.stderr:
                text += f"\n[stderr]\n{result.stderr.rstrip()}"
            if result.error:
                text += f"\n[error] {result.error}"
            return result.ok, text, False, None
        if spec.name == "read_file":
            return (
                True,
                read_text(self.workspace, args["path"], max_bytes=max(self.observation_chars * 4, 65536)),
                False,
                None,
            )
        if spec.name == "write_file":
            written = write_text(self.workspace, args["path"], args["content"])
            return True, f"wrote {written} bytes to {args['path']}", False, None
        if spec.name == "list_files":
            entries = list_dir(self.workspace, args.get("path", "."))
            return True, "\n".join(f"{e.kind}\t{e.size}\t{e.name}" for e in entries) or "[empty]", False, None
        return False, f"built-in {spec.name} has no implementation", False, None

    def _synthesized(self, spec: ToolSpec, args: dict) -> tuple[bool, str, bool, str | None]:
        # Loaded by the session's prelude, in every fresh worker; the call's own count is the one kept.
        result = self.worker.call(spec.name, args)
        if self.worker.alive:
            self.worker.call(USES_FUNCTION)
        return result.ok, _format_exec(result), False, None
