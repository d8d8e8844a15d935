"""Background jobs of the daemon, run by APScheduler on intervals and on demand.

A job is a named function of the daemon that returns a one-line summary. Each
round is recorded as an evolution event ("job", or "job_failed" with the
reason), never overlaps itself (a per-job lock), and a missed run is coalesced
into one. A job may also be due after ``after`` new items of work (its
``pending`` count, read from a watermark in the database, so a restart neither
repeats nor skips work); a trigger checks that every 30 s. Scheduled rounds wait
while the inbox has work (``[advanced.evolution] wait_for_idle``) and while the budget
for background work is spent. ``run_now`` runs rounds in the caller's thread
in the caller's thread, without those gates (tests, the foreground). ``submit``
queues rounds on the job host, for `evolver evolve` through the API, which
answers 202 with their ids at once (``round`` tells how each went). ``poke`` asks
for a scheduled round now: the daemon pokes ``record`` when one of the search's
tasks ends, so the search reads it on the job host, never in a worker's thread.

A failing round backs off: the job's next scheduled round waits its interval, then twice that after
each further failure, up to ``BACKOFF_CAP_S`` (or the interval, when longer), and the trigger leaves it
alone meanwhile; a round that succeeds (by hand too) ends the backoff. ``next_runs`` shows it.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from apscheduler.jobstores.base import JobLookupError
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.base import STATE_STOPPED

from memory import ExperienceStore

from ..config import Config
from ..engine import Engine
from ..llm.budget import BudgetExceeded
from ..text import Unchanged
from ..tree.search import SEARCH_SOURCES, TreeSearch

__all__ = ["Job", "JobRound", "Jobs", "JobError", "JobHost", "SubmittedRound", "builtin_jobs"]

log = logging.getLogger(__name__)

KEEP_ROUNDS = 500  # submitted rounds remembered, newest, for their callers to read
# A round that fails every time (a model whose every answer is unparseable) must not be retried every
# 30 s by the trigger forever, nor wait so long that a fixed cause goes unnoticed for a day.
BACKOFF_CAP_S = 3600.0


class JobHost(Protocol):
    """What a job works with: the daemon keeps this (the jobs never import the service that runs them)."""

    config: Config
    engine: Engine
    tree: TreeSearch | None

    @property
    def store(self) -> ExperienceStore: ...


class JobError(ValueError):
    """An unknown job, or one already running."""


@dataclass
class Job:
    name: str
    run: Callable[[JobHost], str]  # a summary; an ``Unchanged`` one when the round changed nothing
    every_min: float
    description: str
    after: int | None = None  # also due after this many new items of work...
    pending: Callable[[JobHost], int] | None = None  # ...as counted by this (up to ``after``)
    purpose: str | None = None  # the budget purpose its model calls are charged to
    waits_for_idle: bool = True  # False: cheap bookkeeping that never waits for the inbox
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


@dataclass
class SubmittedRound:
    """A round asked for through the API: queued, running, then done or failed (``ok`` says which)."""

    id: str
    job: str
    status: str = "queued"
    ok: bool | None = None
    summary: str = ""
    seconds: float | None = None
    event_id: int | None = None


@dataclass(frozen=True)
class JobRound:
    job: str
    ok: bool
    summary: str
    seconds: float
    event_id: int | None


def _reconcile(host: JobHost) -> str:
    fixed = host.store.reconcile()
    # Rows waiting in the outbox are normal (worker processes leave theirs for the daemon): synced, not repaired.
    synced = fixed.get("outbox", 0)
    repaired = sum(n for collection, n in fixed.items() if collection != "outbox")
    summary = f"index agrees with the database; repaired {repaired} entries" + (
        f" (and synced {synced} waiting in the outbox)" if synced else ""
    )
    return summary if repaired else Unchanged(summary)


def _distill(host: JobHost) -> str:
    from .distill import distill_round

    return distill_round(host.store, host.engine.meta, host.config)


def _synthesize(host: JobHost) -> str:
    from .synthesize import synthesize_round

    return synthesize_round(host.engine)


def _prune(host: JobHost) -> str:
    from .probation import probation_round
    from .prune import prune_round

    # Insights on probation first: one that leaves it is then measured like the rest.
    return "; ".join([*probation_round(host.store, host.config), prune_round(host.store, host.config)])


def _new_for_synthesis(limit: int) -> Callable[[JobHost], int]:
    def count(host: JobHost) -> int:
        from .synthesize import pending_trajectories

        return pending_trajectories(host.store, limit)

    return count


def _evolve(host: JobHost) -> str:
    return host.tree.step()


def _record(host: JobHost) -> str:
    return host.tree.record_ended()


def _ended_evaluations(host: JobHost) -> int:
    return host.tree.ended_unrecorded() if host.tree is not None else 0


def _free_evaluation_slots(host: JobHost) -> int:
    """The tree search may act when an evaluation slot is free (or a proposed node awaits validation)."""
    store = host.store
    if any(n.status == "proposed" for n in store.tree.list_nodes()):
        return 1
    return max(0, host.config.evolution.evaluation_slots - len(store.tree.running_evaluations()))


def _new_trajectories(limit: int) -> Callable[[JobHost], int]:
    def count(host: JobHost) -> int:
        from .distill import watermark

        return len(host.store.attempts.finished_since(watermark(host.store), limit=limit))

    return count


def builtin_jobs(config: Config) -> list[Job]:
    """The daemon's jobs, in the order `evolver evolve` runs them."""
    e = config.evolution
    return [
        Job(
            "reconcile",
            _reconcile,
            every_min=30.0,
            description="check the vector index against the database and repair any difference",
        ),
        Job(
            "distill",
            _distill,
            every_min=e.distill_every_min,
            after=e.distill_after,
            pending=_new_trajectories(e.distill_after),
            purpose="distill",
            description="contrast new trajectories with similar past ones and update the insights",
        ),
        Job(
            "synthesize",
            _synthesize,
            every_min=e.synthesize_every_min,
            after=e.synthesize_after,
            pending=_new_for_synthesis(e.synthesize_after),
            purpose="synthesize",
            description="turn code repeated across tasks, and capabilities failures lacked, into tested tools",
        ),
        Job(
            "prune",
            _prune,
            every_min=60.0,
            description="measure each insight and tool against the attempts without it; retire those that "
            "hurt or never help, and let an imported insight on probation in once it helps",
        ),
        Job(
            "record",
            _record,
            every_min=5.0,
            after=1,
            pending=_ended_evaluations,
            waits_for_idle=False,
            description="record the evaluations whose tasks ended (and consider a promotion), and judge a "
            "proposed node whose smoke task ended",
        ),
        Job(
            "evolve",
            _evolve,
            every_min=e.evolve_every_min,
            after=1 if e.evaluation_slots else None,
            pending=_free_evaluation_slots,
            purpose="propose",
            description="one step of the self-modification tree search: expand a node or evaluate one",
        ),
    ]


class _Scheduler(BackgroundScheduler):
    """APScheduler's, sound through a stop that lands mid-pass.

    Its stop marks it stopped before taking the lock its scheduling pass holds; a pass under way then
    removes the one-off job it just handed out (a poke) from the stopped scheduler's pending list, where
    it is not, and its thread dies of a JobLookupError, a warning at every such daemon stop. The job was
    handed out: there is nothing left to remove."""

    def remove_job(self, job_id, jobstore=None):
        try:
            super().remove_job(job_id, jobstore)
        except JobLookupError:
            if self.state != STATE_STOPPED:
                raise


class Jobs:
    def __init__(self, host: JobHost, jobs: list[Job]) -> None:
        self.host = host
        self.jobs = {job.name: job for job in jobs}
        self.scheduler = _Scheduler(job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 3600})
        self._rounds: OrderedDict[str, SubmittedRound] = OrderedDict()
        self._round_numbers = itertools.count(1)
        self._rounds_lock = threading.Lock()
        self._failures: dict[str, int] = {}  # failed rounds in a row, by job
        self._resume_at: dict[str, float] = {}  # no scheduled round of the job before this time
        self._wanted: set[str] = set()  # jobs asked for while a round of theirs was running
        self._wanted_lock = threading.Lock()
        self._pokes = itertools.count(1)
        self._stopping = threading.Event()  # no round starts once set
        self._quiet: dict[str, dict] = {}  # each job's last round that changed nothing (not an event)

    def start(self, *, schedule: bool = True) -> None:
        """Start the job host; with ``schedule`` also the intervals and triggers (``[evolution] enabled``).
        Without, it still runs the rounds it is poked for."""
        if schedule:
            for job in self.jobs.values():
                self.scheduler.add_job(self._scheduled, "interval", args=[job.name], id=job.name, minutes=job.every_min)
            if any(job.after for job in self.jobs.values()):
                self.scheduler.add_job(self._triggers, "interval", id="triggers", seconds=30)
        self.scheduler.start()

    def poke(self, name: str) -> None:
        """A scheduled round of ``name`` as soon as a thread is free (gates apply). A poke while a round
        of the job runs is never lost: that round runs once more when it ends, because what it was
        poked for (an evaluation task that just ended) may have ended after the round read the store."""
        if self.scheduler.running:
            self.scheduler.add_job(self._scheduled, args=[name], id=f"poke-{name}-{next(self._pokes)}")

    def submit(self, name: str | None = None) -> list[dict]:
        """Queue one round of ``name`` (or of every job, in order) on the job host; returns them, queued."""
        if name is not None and name not in self.jobs:
            raise JobError(f"there is no job {name!r}; jobs are: {', '.join(self.jobs)}")
        with self._rounds_lock:
            rounds = [
                SubmittedRound(id=f"round-{next(self._round_numbers)}", job=n)
                for n in ([name] if name else list(self.jobs))
            ]
            for r in rounds:
                self._rounds[r.id] = r
            while len(self._rounds) > KEEP_ROUNDS:
                self._rounds.popitem(last=False)
            queued = [asdict(r) for r in rounds]
        self.scheduler.add_job(self._run_submitted, args=[rounds], id=rounds[0].id)
        return queued

    def round(self, round_id: str) -> dict | None:
        """A submitted round as it stands, or None when this daemon has none by that id."""
        with self._rounds_lock:
            found = self._rounds.get(round_id)
            return None if found is None else asdict(found)

    def _run_submitted(self, rounds: list[SubmittedRound]) -> None:
        for r in rounds:
            job = self.jobs[r.job]
            with job.lock:  # after a scheduled round of the same job, never beside it
                with self._rounds_lock:
                    r.status = "running"
                done = self._round(job)
            with self._rounds_lock:
                r.status, r.ok, r.summary = ("done" if done.ok else "failed"), done.ok, done.summary
                r.seconds, r.event_id = done.seconds, done.event_id
            with self._wanted_lock:
                wanted = r.job in self._wanted
            if wanted:  # poked while this round held the job: the poke's round runs now
                self._scheduled(r.job)

    def _triggers(self) -> None:
        for job in self.jobs.values():
            if job.after and job.pending is not None and not job.lock.locked() and not self._backing_off(job.name):
                if job.pending(self.host) >= job.after:
                    self._scheduled(job.name)

    def _blocked(self, job: Job) -> str | None:
        """Why a scheduled round should wait, or None."""
        if self.host.config.evolution.wait_for_idle and job.waits_for_idle:
            # The search's own tasks are not a person's work: they never hold a job.
            depth = self.host.store.inbox.queue_depth(excluding=SEARCH_SOURCES)
            if depth.get("queued") or depth.get("running"):
                return "the inbox has work"
        if job.purpose is not None:
            try:
                self.host.engine.model.budget.check(purpose=job.purpose, tokens=1)
            except BudgetExceeded as exc:
                return str(exc)
        return None

    def stop(self, timeout_s: float = 0.0) -> list[str]:
        """Start no more rounds, and wait up to ``timeout_s`` for the running ones to end, so the store is not
        closed under them. Returns the jobs whose round outlived the wait: cut by the shutdown, such a round
        runs again after the restart, as every round takes up from what the store holds (its marks move only
        when what they cover is written)."""
        self._stopping.set()
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)
        deadline = time.monotonic() + timeout_s
        cut = []
        for job in self.jobs.values():
            if job.lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
                job.lock.release()
            else:
                cut.append(job.name)
        return cut

    def next_runs(self) -> list[dict]:
        """Each job as `evolver status` shows it: its interval, the work that also makes it due (``after``
        items), whether a round runs now, its last round (from the events) and its next scheduled one. A
        job with ``after`` runs whenever that much work waits, so its interval is only its slowest pace."""
        if not self.scheduler.running:
            return []
        scheduled = {j.id: j for j in self.scheduler.get_jobs()}
        last: dict[str, dict] = {}
        for kind in ("job", "job_failed"):
            for event in self.host.store.reports.list_events(kind=kind, limit=500):
                name = (event.payload or {}).get("job")
                if name in self.jobs and (name not in last or event.at > last[name]["at"]):
                    last[name] = {"at": event.at, "ok": kind == "job", "summary": event.what}
        for name, quiet in list(self._quiet.items()):
            if name not in last or quiet["at"] > last[name]["at"]:
                last[name] = quiet
        out = []
        for name, job in self.jobs.items():
            entry = scheduled.get(name)
            out.append(
                {
                    "job": name,
                    "every_min": job.every_min,
                    "after": job.after,
                    "running": job.lock.locked(),
                    "last": last.get(name),
                    "next_run_at": entry.next_run_time.timestamp() if entry and entry.next_run_time else None,
                    "failures": self._failures.get(name, 0),
                }
            )
        return out

    def _backing_off(self, name: str) -> bool:
        # A second of slack: the interval's own run, set to the end of the backoff, may fire a hair early.
        return self._resume_at.get(name, 0.0) - time.time() > 1.0

    def _note(self, job: Job, ok: bool) -> float | None:
        """Count a round's outcome; after a failure, move the job's next scheduled round out and return
        the seconds until then."""
        if ok:
            if self._failures.pop(job.name, 0):
                self._resume_at.pop(job.name, None)
                self._reschedule(job.name, job.every_min * 60)
            return None
        failures = self._failures[job.name] = self._failures.get(job.name, 0) + 1
        interval = job.every_min * 60
        delay = min(interval * 2 ** (failures - 1), max(BACKOFF_CAP_S, interval))
        self._resume_at[job.name] = time.time() + delay
        self._reschedule(job.name, delay)
        return delay

    def _reschedule(self, name: str, seconds: float) -> None:
        if self.scheduler.running and self.scheduler.get_job(name) is not None:
            self.scheduler.modify_job(name, next_run_time=datetime.fromtimestamp(time.time() + seconds, UTC))

    def _scheduled(self, name: str) -> None:
        if self._backing_off(name):  # a poke, or a trigger that raced the failure
            log.info("job %s waits: it failed %d times in a row", name, self._failures.get(name, 0))
            return
        reason = self._blocked(self.jobs[name])
        if reason is not None:
            log.info("job %s waits: %s", name, reason)
            return
        with self._wanted_lock:
            self._wanted.add(name)
        while True:
            with self._wanted_lock:
                if name not in self._wanted:
                    return
                self._wanted.discard(name)
            try:
                self.run_one(name)
            except JobError as exc:  # a round is running: it runs once more when it ends (_wanted)
                log.info("%s; it runs again when that round ends", exc)
                with self._wanted_lock:
                    self._wanted.add(name)
                return

    def run_now(self, name: str | None = None) -> list[JobRound]:
        """One round of one job (or of every job, in order), in this thread."""
        if name is not None and name not in self.jobs:
            raise JobError(f"there is no job {name!r}; jobs are: {', '.join(self.jobs)}")
        return [self.run_one(n) for n in ([name] if name else list(self.jobs))]

    def run_one(self, name: str) -> JobRound:
        job = self.jobs[name]
        if not job.lock.acquire(blocking=False):
            raise JobError(f"job {name!r} is already running")
        try:
            return self._round(job)
        finally:
            job.lock.release()

    def _round(self, job: Job) -> JobRound:
        """One round of ``job`` (its lock held), recorded as an event; none once the jobs are stopping."""
        if self._stopping.is_set():
            return JobRound(
                job=job.name, ok=False, summary="not run: the daemon is stopping", seconds=0.0, event_id=None
            )
        started = time.perf_counter()
        changed = True
        try:
            result = job.run(self.host)
            summary, ok, changed = str(result), True, not isinstance(result, Unchanged)
        except Exception as exc:  # a failed round is loud and recorded, never silent
            log.exception("job %s failed", job.name)
            summary, ok = f"{type(exc).__name__}: {exc}", False
        seconds = time.perf_counter() - started
        retry_in = self._note(job, ok)
        if not changed:
            self._quiet[job.name] = {"at": time.time(), "ok": True, "summary": f"{job.name}: {summary}"}
            return JobRound(job=job.name, ok=True, summary=summary, seconds=seconds, event_id=None)
        payload = {"job": job.name, "seconds": round(seconds, 3)}
        if retry_in is not None:
            payload |= {"failures": self._failures[job.name], "retry_in_s": round(retry_in)}
        event = self.host.store.reports.append_event(
            "job" if ok else "job_failed", f"{job.name}: {summary}", why=job.description, payload=payload
        )
        return JobRound(job=job.name, ok=ok, summary=summary, seconds=seconds, event_id=event.id)
