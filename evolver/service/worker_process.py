"""Agent workers in processes of their own, so agent work never holds the daemon's API.

The daemon keeps the socket API, the inbox, the scheduler and the vector index
(one process writes Chroma). Each worker process opens the SQLite store without
the index, claims tasks with the inbox's leases and fencing like a worker
thread (``Worker``), and writes its steps durably itself; the rows it writes
wait in the index outbox until the daemon syncs them. What needs the index,
the retrieval context of a task, it asks the daemon for over its pipe.

Chat turns are tasks of the inbox's chat lane (``evolver.service.chats``): each
process claims them in lanes of their own, threads beside its task lane, so a
chat never waits behind a long task. The answer's pieces go to the daemon as the
model writes them.

The pipe carries the typed messages of ``evolver.service.messages`` both ways, each side
reading them with one ``match``. A worker process looks in the inbox when the daemon says work
arrived (a submit, a task of the search, a lease handed back), and otherwise only every
``IDLE_LOOK_S`` for a lease that expired unannounced, with a read that takes no lock.

A worker process dies with the daemon (``PR_SET_PDEATHSIG``, and it exits when
its pipe closes without a drain). When a worker process dies on its own, the
daemon ends its leases at once (the attempt counts, its open trajectories end as
interrupted), so its task and its chat turns run again in another process, and
starts another in its place.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import itertools
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Protocol

from memory import Context, Lease, StoreError, TaskKind

from ..agent.mcp_tools import McpThrough, Offered
from ..config import Config
from ..engine import Engine
from ..storage import open_store
from .agents import Agents
from .messages import (
    Answered,
    Claimed,
    ContextAsked,
    ContextReply,
    Drain,
    Ended,
    FromWorker,
    Idle,
    McpAnswer,
    McpCalled,
    Ready,
    ToWorker,
    WorkArrived,
    Wrote,
)
from .worker import Worker

__all__ = ["WorkerProcess", "worker_main"]

log = logging.getLogger(__name__)

CONTEXT_TIMEOUT_S = 120.0  # the daemon embeds the query and searches; it answers in milliseconds when well
RESTART_BACKOFF_S = (1.0, 30.0)  # a worker that keeps dying at start is restarted ever more slowly
IDLE_LOOK_S = 5.0  # an idle worker looks in the inbox unasked this often: for a lease that expired unannounced
# Agent work yields the CPU to the daemon's API (and the sandboxes it starts inherit it): a request is
# answered in milliseconds, an agent's task takes seconds to minutes and barely notices.
WORKER_NICENESS = 5


# --- the worker process's side ---------------------------------------------------------------------


class DaemonLink:
    """The worker process's end of its pipe: sends from any thread, one reader thread dispatching."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.drain = threading.Event()
        self.lanes: list[threading.Event] = []  # each lane's "look in the inbox" (its own: each clears it)
        self._send_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._replies: dict[int, list] = {}
        self._replies_lock = threading.Lock()

    def lane(self) -> threading.Event:
        """A new lane's wake-up: set when the daemon says work arrived, and on a drain."""
        wake = threading.Event()
        self.lanes.append(wake)
        return wake

    def send(self, message: FromWorker) -> None:
        with self._send_lock:
            self.conn.send(message)

    def listen(self) -> None:
        while True:
            try:
                message: ToWorker = self.conn.recv()
            except (EOFError, OSError):
                if not self.drain.is_set():
                    os._exit(70)  # the daemon died without draining us: so do we (the lease brings the task back)
                return
            match message:
                case WorkArrived():
                    for wake in self.lanes:
                        wake.set()
                case Drain():
                    self.drain.set()
                    for wake in self.lanes:
                        wake.set()
                case ContextReply(request) | McpAnswer(request):
                    with self._replies_lock:
                        waiting = self._replies.get(request)
                    if waiting is not None:
                        waiting[1] = message
                        waiting[0].set()
                case _:
                    log.error("the daemon sent a message this worker does not know: %r", message)

    def ask(self, make: Callable[[int], FromWorker], timeout_s: float, what: str):
        """Send the message ``make(request)`` and wait for the daemon's reply to ``request``."""
        request = next(self._ids)
        waiting: list = [threading.Event(), None]
        with self._replies_lock:
            self._replies[request] = waiting
        try:
            self.send(make(request))
            if not waiting[0].wait(timeout_s):
                raise StoreError(f"the daemon did not answer for {what} in {timeout_s:.0f} s")
        finally:
            with self._replies_lock:
                self._replies.pop(request, None)
        return waiting[1]

    def context(self, query: str, **options: Any) -> Context:
        reply: ContextReply = self.ask(
            lambda request: ContextAsked(request, query, options), CONTEXT_TIMEOUT_S, "a task's retrieval context"
        )
        if reply.context is None:
            raise StoreError(f"retrieving the task's context failed in the daemon: {reply.error}")
        return reply.context

    def mcp_call(self, timeouts: dict[str, float], name: str, arguments: dict) -> tuple[bool, str]:
        """A call of the user's MCP tool ``name``, by the daemon's servers (``timeouts``: each server's)."""
        server = name.split("__", 1)[0]
        wait = timeouts.get(server, 60.0) + 10.0  # the daemon's own call times out first and says so
        try:
            answer: McpAnswer = self.ask(lambda request: McpCalled(request, name, arguments), wait, f"MCP tool {name}")
        except StoreError as exc:
            return False, str(exc)
        return answer.ok, answer.text


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the pipe's EOF still ends us
        pass


def own_uids(config: Config, slot: int, slots: int) -> Config:
    """This worker's share of the sandbox's uid range: worker processes hand out uids independently,
    so each gets a part of its own and two tasks never run as one uid (see ``sandbox.uids``)."""
    s = config.sandbox
    share = s.task_uids // slots
    if share == 0:
        return config
    sandbox = s.model_copy(update={"task_uids": share, "task_uid_base": s.task_uid_base + slot * share})
    return config.model_copy(update={"sandbox": sandbox})


def _serve(worker: Worker, wake: threading.Event, link: DaemonLink, *, idle: bool) -> None:
    """One lane: claim and run its tasks until drained, looking when the daemon says work arrived and
    otherwise every ``IDLE_LOOK_S``. ``idle``: tell the daemon when a task ends (the task lane's status)."""
    while not link.drain.is_set():
        wake.clear()  # before looking: work that arrives while it looks is looked for again
        try:
            ran = worker.run_once()
        except Exception:  # a broken part must not end the lane: log, pause, go on
            log.exception("worker %s failed", worker.owner)
            if idle:
                link.send(Idle())
            link.drain.wait(1.0)
            continue
        if ran is not None and idle:
            link.send(Idle())
        if ran is None and not link.drain.is_set():
            wake.wait(IDLE_LOOK_S)


def worker_main(
    config: Config,
    data_dir: str,
    owner: str,
    slot: int,
    slots: int,
    exclude_sources: tuple[str, ...],
    chat_lanes: int,
    mcp: Offered,
    conn: Connection,
) -> None:
    """The worker process: claim and run tasks, in a task lane and ``chat_lanes`` chat lanes, until
    drained. ``mcp``: the daemon's MCP tools."""
    _die_with_parent()
    os.nice(WORKER_NICENESS)
    # The daemon decides when its workers stop: a Ctrl-C or a SIGTERM sent to the whole group (systemd)
    # reaches the daemon, which drains us through the pipe.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(levelname)s %(name)s [{owner}]: %(message)s")
    link = DaemonLink(conn)
    threading.Thread(target=link.listen, name="daemon-link", daemon=True).start()
    config = own_uids(config, slot, slots)
    # SQLite written directly; the retrieval context asked of the daemon, whose index it is.
    store = open_store(config, data_dir=Path(data_dir), index_owner=False, context_from=link.context)
    timeouts = {s.name: s.timeout_s for s in config.mcp.servers}
    engine = Engine.open(
        config,
        data_dir=Path(data_dir),
        store=store,
        mcp=McpThrough(mcp, functools.partial(link.mcp_call, timeouts)),
    )
    d = config.daemon
    chat = (TaskKind.CHAT.value,)

    def lane(name: str, **claims) -> Worker:
        return Worker(
            Agents(engine),
            owner=name,
            lease_s=d.lease_s,
            max_attempts=d.max_attempts,
            drain=link.drain,
            on_step=lambda task_id, step: link.send(Wrote(task_id)),
            on_end=lambda task_id: link.send(Ended(task_id)),
            on_claim=lambda lease: link.send(Claimed(lease)),
            store=engine.store,
            **claims,
        )

    def streamed(task, piece: str) -> None:  # a chat turn's answer, as the model writes it
        link.send(Answered(task.id, task.attempts, piece))

    tasks = lane(owner, exclude_sources=(*exclude_sources, *chat))
    chats = [
        threading.Thread(
            target=_serve,
            args=(lane(chat_lane_owner(owner, n), sources=chat, on_answer=streamed), link.lane(), link),
            kwargs={"idle": False},
            name=f"chat-lane-{n}",
            daemon=True,
        )
        for n in range(chat_lanes)
    ]
    wake = link.lane()
    gc.collect()  # what is loaded now lives as long as the process: the collector stops walking it (Daemon.serve)
    gc.freeze()
    try:
        link.send(Ready(os.getpid()))
        for thread in chats:
            thread.start()
        _serve(tasks, wake, link, idle=True)
        deadline = time.monotonic() + d.shutdown_grace_s
        for thread in chats:  # drained, their turns stop at their next step and go back to the queue
            thread.join(max(0.0, deadline - time.monotonic()))
    finally:
        engine.close()


def chat_lane_owner(owner: str, n: int) -> str:
    """The lease owner of the process ``owner``'s chat lane ``n``."""
    return f"{owner}.chat{n}"


# --- the daemon's side -----------------------------------------------------------------------------


class WorkerHost(Protocol):
    """What a worker process's handle needs of the daemon (kept by ``Daemon``)."""

    config: Config
    data_dir: Path
    owner_prefix: str  # unique to this run of the daemon: a worker process's leases are "<prefix>p<slot>.<n>"

    @property
    def store(self): ...

    def worker_wrote(self, task_id: str) -> None:
        """A worker process wrote to the task: wake its live streams, sync the index."""

    def task_ended(self, task_id: str) -> None:
        """A task ended (its live streams wake, the search reads its result)."""

    def task_answered(self, task_id: str, attempt: int, piece: str) -> None:
        """A piece of the answer of ``task_id``'s attempt ``attempt`` (a chat turn streams it)."""

    def task_submitted(self) -> None:
        """A task may be claimable now: the worker processes look in the inbox."""

    def mcp_offered(self) -> Offered:
        """The daemon's MCP tools, as a worker process offers them."""

    def mcp_call(self, name: str, arguments: dict) -> tuple[bool, str]:
        """A call of one of the daemon's MCP tools by its offered name."""


class WorkerProcess:
    """The daemon's handle on one worker process: starts it, reads its pipe, restarts it when it dies.

    ``current`` and ``owner`` are what the daemon's status and shutdown read, as of a worker thread."""

    def __init__(
        self, daemon: WorkerHost, slot: int, slots: int, exclude_sources: tuple[str, ...], chat_lanes: int
    ) -> None:
        self.daemon = daemon
        self.slot, self.slots = slot, slots
        self.exclude_sources = exclude_sources
        self.chat_lanes = chat_lanes
        self.owner = ""  # a fresh one for each process started in this slot: its leases are exactly its own
        self.current: Lease | None = None  # its task lane's
        self.chats: dict[str, Lease] = {}  # its chat lanes', by task id
        self.ready = threading.Event()  # it has opened its engine and takes work
        self.process: multiprocessing.process.BaseProcess | None = None
        self.conn: Connection | None = None
        self._send_lock = threading.Lock()
        self._reader: threading.Thread | None = None
        self._draining = False
        self.restarts = 0
        self._next_start = 0.0
        self._backoff = RESTART_BACKOFF_S[0]

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    def start(self) -> None:
        ctx = multiprocessing.get_context("spawn")  # never fork a process that holds threads and SQLite
        ours, theirs = ctx.Pipe()
        d = self.daemon
        self.owner = f"{d.owner_prefix}p{self.slot}.{self.restarts}"
        self.process = ctx.Process(
            target=worker_main,
            name=f"evolver-worker-{self.slot}",
            daemon=False,
            args=(
                d.config,
                str(d.data_dir),
                self.owner,
                self.slot,
                self.slots,
                self.exclude_sources,
                self.chat_lanes,
                d.mcp_offered(),
                theirs,
            ),
        )
        self.process.start()
        theirs.close()
        self.conn = ours
        self._started_at = time.monotonic()
        self._reader = threading.Thread(
            target=self._read, args=(ours, self.process), name=f"worker-link-{self.slot}", daemon=True
        )
        self._reader.start()

    def send(self, message: ToWorker) -> None:
        conn = self.conn
        if conn is None:
            return
        try:
            with self._send_lock:
                conn.send(message)
        except (OSError, ValueError):  # it died; the reader sees the EOF and deals with it
            pass

    def _read(self, conn: Connection, process) -> None:
        d = self.daemon
        while True:
            try:
                message: FromWorker = conn.recv()
            except (EOFError, OSError):
                break
            match message:
                case Claimed(lease) if lease.task.source is TaskKind.CHAT:
                    self.chats[lease.task.id] = lease
                case Claimed(lease):
                    self.current = lease
                case Idle():
                    self.current = None
                case Wrote(task_id):
                    d.worker_wrote(task_id)
                case Ended(task_id):
                    if self.chats.pop(task_id, None) is None:
                        self.current = None
                    d.worker_wrote(task_id)
                    d.task_ended(task_id)
                case Answered(task_id, attempt, piece):
                    d.task_answered(task_id, attempt, piece)
                case ContextAsked(request, query, options):
                    try:
                        d.store.sync_index()  # what the workers wrote so far is found (one SELECT when none is due)
                        self.send(ContextReply(request, context=d.store.retrieval.context(query, **options)))
                    except Exception as exc:  # noqa: BLE001  (the worker's task gets the message)
                        self.send(ContextReply(request, error=str(exc)))
                case McpCalled(request, name, arguments):  # a call may take its server's whole timeout
                    threading.Thread(
                        target=self._call_mcp, args=(request, name, arguments), name="mcp-call", daemon=True
                    ).start()
                case Ready(pid):
                    self.ready.set()
                    log.info("worker process %s (pid %d) is ready", self.owner, pid)
                case _:
                    log.error("worker process %s sent a message the daemon does not know: %r", self.owner, message)
        process.join(timeout=5.0)
        self._ended(process.exitcode)

    def _call_mcp(self, request: int, name: str, arguments: dict) -> None:
        try:
            ok, text = self.daemon.mcp_call(name, arguments)
        except Exception as exc:  # noqa: BLE001  (the worker's agent sees the failure as the call's result)
            ok, text = False, f"MCP tool {name} failed in the daemon: {type(exc).__name__}: {exc}"
        self.send(McpAnswer(request, ok, text))

    def _ended(self, code: int | None) -> None:
        self.ready.clear()
        lease, self.current = self.current, None
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        chats, self.chats = list(self.chats.values()), {}
        store = self.daemon.store
        if self._draining:
            # Drained in time, it released its task itself; killed after the grace, its task goes back
            # to the queue for the restart like a worker thread's (the attempt refunded).
            for held in [lease, *chats] if lease is not None else chats:
                if store.inbox.release_task(held):
                    log.warning("task %s did not reach a step boundary in time; queued for the restart", held.task.id)
            return
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with {code}"
        # The ones it said it held, or one it had no time to name: each lane's.
        abandoned = [task_id for owner in self.lane_owners() for task_id in store.inbox.abandon_leases(owner)]
        log.warning(
            "worker process %s %s%s",
            self.owner,
            how,
            f"; task {', '.join(abandoned)} runs again (the attempt counts)" if abandoned else "",
        )
        for task_id in abandoned:
            self.daemon.worker_wrote(task_id)
        if abandoned:  # claimable again at once, by the other processes, or by the one started in its place
            self.daemon.task_submitted()
        if time.monotonic() - self._started_at > 60.0:
            self._backoff = RESTART_BACKOFF_S[0]  # it had been working: restart at once next time
        self._next_start = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, RESTART_BACKOFF_S[1])

    def restart_if_dead(self) -> bool:
        """Start a new process in place of one that died (not while draining); True when it did."""
        if self._draining or self.process is None or self.alive() or self.conn is not None:
            return False
        if time.monotonic() < self._next_start:
            return False
        self.restarts += 1
        self.start()
        return True

    def lane_owners(self) -> list[str]:
        """The lease owners of this process's lanes: its task lane's, then its chat lanes'."""
        return [self.owner, *(chat_lane_owner(self.owner, n) for n in range(self.chat_lanes))]

    def drain(self) -> None:
        self._draining = True
        self.send(Drain())

    def stop(self, timeout_s: float) -> None:
        """Wait for a drained process to exit; kill it when it does not in time (its task is handed back)."""
        process = self.process
        if process is None:
            return
        process.join(max(0.0, timeout_s))
        if process.is_alive():
            process.kill()
            process.join(5.0)
        if self._reader is not None:
            self._reader.join(10.0)
