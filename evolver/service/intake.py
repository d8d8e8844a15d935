"""Group commit for submitted tasks: the ones that arrive together share one durable transaction.

Every acknowledged task must be on disk (synchronous=FULL) before its 201, and
a commit (its wait for the write lock, its fsync) costs more than everything
else a submit does, beside workers that commit too. One writer
thread takes whatever submits are waiting, commits them in one transaction,
then answers each; while it commits, the next batch gathers. A submit waits
only for its own batch, never longer. The answers to a batch go back to the
event loop in one wake-up, not one per request: each wake-up is a write to
the loop's pipe, and the GIL won back from the busy loop after it.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from itertools import groupby

from memory import ExperienceStore, Task, TaskKind

from ..tree.split import Admission

__all__ = ["Intake"]

log = logging.getLogger(__name__)

_STOP = object()


class Intake:
    def __init__(
        self,
        store: ExperienceStore,
        *,
        on_committed: Callable[[], None] = lambda: None,
        max_batch: int = 256,
        admission: Admission | None = None,
    ) -> None:
        self.store = store
        self.admission = admission or Admission()  # the front door: each task's kind and split
        self.on_committed = on_committed
        self.max_batch = max_batch
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="intake", daemon=True)

    def start(self) -> None:
        self._thread.start()

    async def submit(self, kind: TaskKind, prompt: str, **item) -> tuple[Task, bool]:
        """Commit a task of ``kind`` (``add_task``'s other arguments in ``item``) with the others waiting;
        gives ``(task, new)`` once it is durable. It is admitted here (``Admission.admit``), so its split is
        decided before it is committed and no learner ever sees an attempt at a task that is held out."""
        task = self.admission.admit(kind, prompt, **item)
        loop = asyncio.get_running_loop()
        answer = loop.create_future()
        self._queue.put((task, (loop, answer)))
        return await answer

    def close(self) -> None:
        """Commit what is queued, then stop."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()

    def _run(self) -> None:
        stopping = False
        while not stopping:
            batch = [self._queue.get()]
            while len(batch) < self.max_batch:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if any(entry is _STOP for entry in batch):
                stopping = True
                batch = [entry for entry in batch if entry is not _STOP]
            if not batch:
                continue
            try:
                results = self.store.inbox.add_tasks([task for task, _ in batch])
            except BaseException as exc:  # each waiting request gets the error; nothing was committed
                log.warning("a batch of %d submitted tasks was refused: %s", len(batch), exc)
                _answer(batch, [exc] * len(batch))
                continue
            _answer(batch, results)
            self.on_committed()


def _answer(batch: list, outcomes: list) -> None:
    """Settle each waiting request, one wake-up per event loop."""
    waiting = [(loop, answer, outcome) for (_, (loop, answer)), outcome in zip(batch, outcomes)]
    for loop, settled in groupby(waiting, key=lambda w: w[0]):
        try:
            loop.call_soon_threadsafe(_settle, [(answer, outcome) for _, answer, outcome in settled])
        except RuntimeError:  # that loop has closed: nobody is left to answer
            pass


def _settle(settled: list) -> None:
    for answer, outcome in settled:
        if answer.done():  # the request went away (its client disconnected)
            continue
        if isinstance(outcome, BaseException):
            answer.set_exception(outcome)
        else:
            answer.set_result(outcome)
