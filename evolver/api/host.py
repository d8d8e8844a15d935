"""What the API asks of the process that serves it, as protocols.

The daemon (``evolver.service.daemon.Daemon``) keeps these; the API never
imports it, so the arrow points one way (service → api) and a test can serve
the API over any object that keeps them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

from memory import ExperienceStore, Step, Task, TaskKind

from ..agent.loop import TaskResult
from ..config import Config
from ..meta.jobs import Jobs

__all__ = ["ServiceHost", "StepFeed", "TaskIntake", "Starting", "Stopping"]


class Stopping(Exception):
    """The daemon is stopping and takes no new work (the API answers 503)."""


class Starting(Exception):
    """The daemon answers but has not started what the request needs yet (the API answers 503)."""


class StepFeed(Protocol):
    """Wakes the readers of a task's live steps."""

    closed: threading.Event

    def publish(self, task_id: str) -> None: ...

    async def wait(self, task_id: str, timeout: float) -> None: ...


class TaskIntake(Protocol):
    """Commits submitted tasks: ``(task, new)`` once the task is durable."""

    async def submit(self, kind: TaskKind, prompt: str, **item: Any) -> tuple[Task, bool]: ...


class ServiceHost(Protocol):
    config: Config
    started_at: float
    feed: StepFeed
    intake: TaskIntake
    jobs: Jobs

    @property
    def store(self) -> ExperienceStore: ...

    def status(self) -> dict: ...

    def request_stop(self, reason: str) -> None: ...

    def call_tool(self, name: str, arguments: dict) -> dict: ...

    def mcp_tools(self) -> list[dict]: ...

    def chat(
        self,
        prompt: str,
        *,
        on_step: Callable[[Step], None] | None = None,
        metadata: dict | None = None,
        task_id: str | None = None,
        cancel: threading.Event | None = None,
        on_answer: Callable[[str], None] | None = None,
    ) -> TaskResult: ...
