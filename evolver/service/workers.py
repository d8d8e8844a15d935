"""The daemon's agent workers: a pool of worker processes (``WorkerProcess``), asked as one.

The daemon tells the pool when work arrives (a task or a chat turn: both are in the
inbox), asks what runs, and drains and stops it; it never asks what a worker is.
The pool keeps a dead process's slot filled (``supervise``, from the daemon's main loop).
"""

from __future__ import annotations

import logging
import time

from .messages import WorkArrived
from .worker_process import WorkerHost, WorkerProcess

__all__ = ["WorkerPool", "chat_lanes"]

log = logging.getLogger(__name__)


def chat_lanes(workers: int) -> int:
    """Chat turns the daemon answers at once, beside its ``workers`` task lanes: two, or one per worker when
    there are more."""
    return max(2, workers)


class WorkerPool:
    def __init__(self, host: WorkerHost, size: int, exclude_sources: tuple[str, ...], chats: int) -> None:
        """``size`` processes, which answer up to ``chats`` chat turns at once between them (each has
        that share of chat lanes, at least one) beside one task each."""
        lanes = max(1, -(-chats // size))
        self.processes = [WorkerProcess(host, n, size, exclude_sources, lanes) for n in range(size)]

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

    def running(self) -> list[dict]:
        """The task each process works on, and the chat turns it answers."""
        running = []
        for process in self.processes:
            lease = process.current  # read once: the process's reader thread may clear it meanwhile
            if lease is not None:
                running.append({"task_id": lease.task.id, "worker": process.owner, "pid": process.pid})
            running += [
                {"task_id": task_id, "worker": process.owner, "pid": process.pid, "chat": True}
                for task_id in list(process.chats)
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
