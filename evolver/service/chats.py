"""Chat turns as the daemon waits for them: a chat turn is a task of the inbox's chat lane.

The turn's task is admitted like any task (``Admission.admit``, so a held-out text stays held out) at
the highest priority, queued, and claimed under a lease by a worker process's chat lane, which runs
beside its task lane so that a chat never waits behind a long task. Its steps are written to the store
by the worker and read back from there, as any live stream of a task reads them; the answer's pieces
come over the worker's pipe as the model writes them. A chat turn therefore has a leased task's
durability: when the worker process running it dies, the lease is handed back and another process runs
the turn again (the attempt counts), and the request goes on waiting for it.

``ChatTurns`` keeps the turns the daemon's requests wait for: the worker processes' readers tell it
what they heard (``wrote``, ``answered``), and ``wait`` returns the turn's ``TaskResult`` once its task
has ended, read from the store.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from memory import TERMINAL_STATUSES, Ending, Step, Task, TaskStatus

from ..agent.loop import TaskResult
from ..api.host import Stopping

__all__ = ["ChatTurns", "result_of"]

LOOK_S = 1.0  # a turn looks at its task unwoken this often: a wake-up lost to a worker's death is harmless


@dataclass
class _Turn:
    on_step: Callable[[Step], None] | None
    on_answer: Callable[[str], None] | None
    changed: threading.Event = field(default_factory=threading.Event)
    streaming: int | None = None  # the attempt whose answer is streamed: a retry's pieces would repeat it
    seen: int = 0  # the last step event read (``task_steps``)


class ChatTurns:
    def __init__(self, host, drain: threading.Event) -> None:
        """``host.store``: the daemon's store (opened after this is made)."""
        self.host, self.drain = host, drain
        self._turns: dict[str, _Turn] = {}
        self._lock = threading.Condition()

    def wait(
        self,
        task: Task,
        *,
        cancel: threading.Event,
        on_step: Callable[[Step], None] | None = None,
        on_answer: Callable[[str], None] | None = None,
    ) -> TaskResult:
        """Wait for the chat turn ``task`` (already queued) to end; its result. ``on_step`` gets its steps,
        ``on_answer`` its answer's pieces as they come. A ``cancel`` (the client went away) or a drain
        cancels the task; a drain then raises ``Stopping``."""
        turn = _Turn(on_step, on_answer)
        with self._lock:
            self._turns[task.id] = turn
        try:
            asked = False
            while True:
                turn.changed.clear()  # before looking: what a worker writes meanwhile wakes the next look
                self._read_steps(task.id, turn)
                now = self.host.store.inbox.get_task(task.id)
                if now.status in TERMINAL_STATUSES:
                    break
                if (cancel.is_set() or self.drain.is_set()) and (not asked or now.status is TaskStatus.QUEUED):
                    # A queued turn ends now, a running one at its next step (or, handed back by a worker
                    # killed after the drain's grace, here on the next look).
                    self.host.store.inbox.request_cancel(task.id)
                    asked = True
                turn.changed.wait(LOOK_S)
            self._read_steps(task.id, turn)
        finally:
            with self._lock:
                self._turns.pop(task.id, None)
                self._lock.notify_all()
        if self.drain.is_set() and not cancel.is_set() and now.status is TaskStatus.CANCELLED:
            raise Stopping("the daemon is stopping; send the chat again once it has restarted")
        return result_of(self.host.store, now)

    def _read_steps(self, task_id: str, turn: _Turn) -> None:
        while turn.on_step is not None:
            steps = self.host.store.inbox.task_steps(task_id, after_id=turn.seen)
            if not steps:
                return
            for event_id, _, step in steps:
                turn.seen = event_id
                turn.on_step(step)

    def wrote(self, task_id: str) -> None:
        """A worker wrote to ``task_id`` or its task ended: the turn waiting for it looks again."""
        with self._lock:
            turn = self._turns.get(task_id)
        if turn is not None:
            turn.changed.set()

    def answered(self, task_id: str, attempt: int, piece: str) -> None:
        """A piece of the answer of ``task_id``'s attempt ``attempt``. Only the first attempt that streams
        is passed on: a retry's answer comes whole at the end (``rest_of_reply`` says it was not kept)."""
        with self._lock:
            turn = self._turns.get(task_id)
        if turn is None or turn.on_answer is None:
            return
        if turn.streaming is None:
            turn.streaming = attempt
        if attempt == turn.streaming:
            turn.on_answer(piece)

    def wait_ended(self, timeout_s: float) -> None:
        """Wait until no request waits for a turn (shutdown: the drain ends them)."""
        with self._lock:
            self._lock.wait_for(lambda: not self._turns, timeout_s)


def result_of(store, task: Task) -> TaskResult:
    """The result of ``task``, which has ended, as the store holds it: its last attempt's answer."""
    trajectories = store.reports.trajectories_of(task.id)
    last = trajectories[-1] if trajectories else None
    outcome = store.reports.outcome(last.id) if last is not None else None
    return TaskResult(
        task_id=task.id,
        status="failed" if task.status is TaskStatus.DEAD else str(task.status),
        ending=task.ending or Ending.INTERRUPTED,
        answer=last.final_answer if last is not None else None,
        success=outcome.success if outcome is not None else None,
        attempts=task.attempts,
        trajectory_ids=[t.id for t in trajectories],
        error=task.error,
    )
