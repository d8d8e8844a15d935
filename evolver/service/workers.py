"""The daemon's agent workers: a pool of worker processes (``WorkerProcess``), asked as one.

The daemon tells the pool when work arrives, hands it chat turns, asks what runs,
and drains and stops it; it never asks what a worker is. The pool keeps a dead
process's slot filled (``supervise``, from the daemon's main loop).
"""

from __future__ import annotations

import logging
import threading
import time

from memory import Task

from ..agent.loop import TaskResult
from ..api.host import Stopping, WorkerLost
from .messages import WorkArrived
from .worker_process import WorkerHost, WorkerProcess

__all__ = ["WorkerPool"]

log = logging.getLogger(__name__)

READY_WAIT_S = 120.0  # how long a chat turn waits for a worker process that is still starting


class WorkerPool:
    def __init__(self, host: WorkerHost, size: int, exclude_sources: tuple[str, ...], drain: threading.Event) -> None:
        self._drain = drain
        self.processes = [WorkerProcess(host, n, size, exclude_sources) for n in range(size)]

    def __len__(self) -> int:
        return len(self.processes)

    def start(self) -> None:
        for process in self.processes:
            process.start()

    def work_arrived(self) -> None:
        """A task may be claimable now: each idle process looks in the inbox."""
        for process in self.processes:
            process.send(WorkArrived())

    def supervise(self) -> None:
        """Start a new process in place of each one that died."""
        for process in self.processes:
            if process.restart_if_dead():
                log.info("started worker process %s in place of the one that died", process.owner)

    def chat(self, task: Task, *, cancel: threading.Event, on_step=None, on_answer=None) -> TaskResult:
        """Answer a chat turn (its task recorded) in the ready process answering the fewest turns."""
        return self._ready(cancel).chat(task, cancel=cancel, on_step=on_step, on_answer=on_answer)

    def _ready(self, cancel: threading.Event) -> WorkerProcess:
        deadline = time.monotonic() + READY_WAIT_S
        while True:
            ready = [p for p in self.processes if p.ready.is_set()]
            if ready:
                return min(ready, key=lambda p: len(p.turns))
            if self._drain.is_set():
                raise Stopping("the daemon is stopping; send the chat again once it has restarted")
            if cancel.is_set() or time.monotonic() > deadline:
                raise WorkerLost(
                    f"no worker process was ready to answer within {READY_WAIT_S:.0f} s; send the chat again"
                )
            time.sleep(0.1)

    def running(self) -> list[dict]:
        """The task each process works on, and the chat turns it answers."""
        running = []
        for process in self.processes:
            lease = process.current  # read once: the process's reader thread may clear it meanwhile
            if lease is not None:
                running.append({"task_id": lease.task.id, "worker": process.owner, "pid": process.pid})
            running += [
                {"task_id": turn.task_id, "worker": process.owner, "pid": process.pid, "chat": True}
                for turn in list(process.turns.values())
            ]
        return running

    def ready(self) -> int:
        """How many processes have opened their engine and take work."""
        return sum(process.ready.is_set() for process in self.processes)

    def pids(self) -> list[int | None]:
        return [process.pid for process in self.processes]

    def stop(self, deadline: float) -> None:
        """Drain every process (each stops at its next step boundary and sends its task back), wait for
        them until ``deadline`` (monotonic), kill those still running (their task goes back to the queue)."""
        for process in self.processes:
            process.drain()
        for process in self.processes:
            process.stop(deadline - time.monotonic())
