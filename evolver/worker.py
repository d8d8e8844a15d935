"""A worker: claims tasks from the durable inbox under a lease and runs the agent on them.

While the agent works, a renewer keeps the lease alive; if the lease is lost
(the worker stalled past it and another worker took the task over) or someone
asks to cancel, the agent is stopped at its next step boundary. How the run
ended is recorded through the lease, so a stale worker's late result is refused
instead of overwriting the newer run's.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from memory import Lease, Step

from .agent import Agent, TaskResult

__all__ = ["Worker", "WorkerResult"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerResult:
    result: TaskResult
    recorded: bool  # False when the lease was lost and the result was refused
    lease_lost: bool


class Worker:
    def __init__(self, agent: Agent, *, owner: str, lease_s: float, max_attempts: int,
                 sources: tuple[str, ...] | None = None) -> None:
        self.agent = agent
        self.store = agent.store
        self.owner = owner
        self.lease_s = lease_s
        self.max_attempts = max_attempts
        self.sources = sources

    def run_once(self) -> WorkerResult | None:
        """Claim and run the most urgent task; None when the inbox has nothing to claim."""
        lease = self.store.claim_task(self.owner, lease_s=self.lease_s, max_attempts=self.max_attempts,
                                      sources=self.sources)
        if lease is None:
            return None
        cancel, lost, done = threading.Event(), threading.Event(), threading.Event()
        renewer = threading.Thread(target=self._renew, args=(lease, cancel, lost, done),
                                   name=f"lease-{lease.task.id}", daemon=True)
        renewer.start()

        def on_step(step: Step) -> None:
            if self.store.cancel_requested(lease.task.id):
                cancel.set()

        try:
            result = self.agent.run_task(lease.task, cancel=cancel, on_step=on_step, record_status=False)
        finally:
            done.set()
            renewer.join()
        recorded = self.store.complete_task(lease, result.status, error=result.error)
        if not recorded:
            log.warning("task %s: lease lost; this worker's result (%s) was not recorded", lease.task.id,
                        result.status)
        return WorkerResult(result=result, recorded=recorded, lease_lost=lost.is_set())

    def _renew(self, lease: Lease, cancel: threading.Event, lost: threading.Event, done: threading.Event) -> None:
        interval = self.lease_s / 3
        while not done.wait(interval):
            renewed = self.store.renew_lease(lease, lease_s=self.lease_s)
            if renewed is None:  # expired and taken over, or ended elsewhere: stop working on it
                lost.set()
                cancel.set()
                return
            lease = renewed
