"""A worker: claims tasks from the durable inbox under a lease and runs the agent on them.

While the agent works, a renewer keeps the lease alive; if the lease is lost
(the worker stalled past it and another worker took the task over) or someone
asks to cancel, the agent is stopped at its next step boundary. How the run
ended is recorded through the lease, so a stale worker's late result is refused
instead of overwriting the newer run's.

On shutdown the daemon sets ``drain``: the agent stops at its next step
boundary and the task goes back to the queue (its attempt refunded) to be
re-run after the restart, rather than being recorded as cancelled; ``on_end``
is not called for it, since it has not ended.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from memory import ExperienceStore, Lease, Step, Task

from ..agent.loop import Agent, TaskResult

__all__ = ["Worker", "WorkerResult"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerResult:
    result: TaskResult
    recorded: bool  # False when the lease was lost and the result was refused
    lease_lost: bool
    released: bool = False  # True when a drain sent the task back to the queue


class Worker:
    def __init__(
        self,
        agent: Agent | Callable[[Task], Agent],
        *,
        owner: str,
        lease_s: float,
        max_attempts: int,
        sources: tuple[str, ...] | None = None,
        drain: threading.Event | None = None,
        on_step: Callable[[str, Step], None] | None = None,
        on_end: Callable[[str], None] | None = None,
        store: ExperienceStore,
        exclude_sources: tuple[str, ...] = (),
        on_claim: Callable[[Lease], None] | None = None,
        on_answer: Callable[[Task, str], None] | None = None,
    ) -> None:
        # A callable is asked for an agent for each claimed task, so a newly promoted scaffold serves
        # the next task, and an evaluation task runs on the scaffold of the node it evaluates.
        self.agent_for = (lambda task: agent) if isinstance(agent, Agent) else agent
        self.store = store  # the inbox it claims from; the agent writes its attempt through ``store.agent``
        self.owner = owner
        self.lease_s = lease_s
        self.max_attempts = max_attempts
        self.sources = sources
        self.exclude_sources = exclude_sources
        self.drain = drain or threading.Event()
        self.on_step = on_step
        self.on_end = on_end
        self.on_claim = on_claim  # told the lease as soon as it is held (a worker process tells the daemon)
        self.on_answer = on_answer  # the answer's pieces as the model writes them (a chat turn streams them)
        self.current: Lease | None = None  # the lease being worked on, for status and shutdown

    def run_once(self) -> WorkerResult | None:
        """Claim and run the most urgent task; None when the inbox has nothing to claim."""
        lease = self.store.inbox.claim_task(
            self.owner,
            lease_s=self.lease_s,
            max_attempts=self.max_attempts,
            sources=self.sources,
            exclude_sources=self.exclude_sources,
        )
        if lease is None:
            return None
        self.current = lease
        ran: WorkerResult | None = None
        try:
            if self.on_claim is not None:
                self.on_claim(lease)
            ran = self._run(lease)
            return ran
        finally:
            self.current = None
            # A task a drain sent back to the queue has not ended: it runs again after the restart.
            if self.on_end is not None and not (ran is not None and ran.released):
                self.on_end(lease.task.id)

    def _run(self, lease: Lease) -> WorkerResult:
        cancel, lost, done = threading.Event(), threading.Event(), threading.Event()
        renewer = threading.Thread(
            target=self._renew, args=(lease, cancel, lost, done), name=f"lease-{lease.task.id}", daemon=True
        )
        renewer.start()

        def on_step(step: Step) -> None:
            if self.on_step is not None:
                self.on_step(lease.task.id, step)
            if self.drain.is_set() or self.store.inbox.cancel_requested(lease.task.id):
                cancel.set()

        try:
            # The task's kind decides its budget (the search's work is background work) and its hook policy.
            on_answer = self.on_answer
            result = self.agent_for(lease.task).run_task(
                lease.task,
                cancel=cancel,
                on_step=on_step,
                record_status=False,
                on_answer=None if on_answer is None else lambda piece: on_answer(lease.task, piece),
            )
        finally:
            done.set()
            renewer.join()
        if (
            result.status == "cancelled"
            and self.drain.is_set()
            and not self.store.inbox.cancel_requested(lease.task.id)
        ):
            released = self.store.inbox.release_task(lease)
            log.info("task %s: sent back to the queue for the restart", lease.task.id)
            return WorkerResult(result=result, recorded=False, lease_lost=not released, released=released)
        recorded = self.store.inbox.complete_task(lease, result.status, error=result.error, ending=result.ending)
        if not recorded:
            log.warning("task %s: lease lost; this worker's result (%s) was not recorded", lease.task.id, result.status)
        return WorkerResult(result=result, recorded=recorded, lease_lost=lost.is_set())

    def _renew(self, lease: Lease, cancel: threading.Event, lost: threading.Event, done: threading.Event) -> None:
        interval = self.lease_s / 3
        next_renewal = time.monotonic() + interval
        while not done.wait(min(0.2, interval)):
            if self.drain.is_set():
                cancel.set()  # the agent checks it at its next step boundary
            if time.monotonic() < next_renewal:
                continue
            renewed = self.store.inbox.renew_lease(lease, lease_s=self.lease_s)
            if renewed is None:  # expired and taken over, or ended elsewhere: stop working on it
                lost.set()
                cancel.set()
                return
            lease, next_renewal = renewed, time.monotonic() + interval
