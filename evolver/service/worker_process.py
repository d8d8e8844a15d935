"""Agent workers in processes of their own, so agent work never holds the daemon's API.

The daemon keeps the socket API, the inbox, the scheduler and the vector index
(one process writes Chroma). Each worker process opens the SQLite store without
the index, claims tasks with the inbox's leases and fencing like a worker
thread (``Worker``), and writes its steps durably itself; the rows it writes
wait in the index outbox until the daemon syncs them. What needs the index,
the retrieval context of a task, it asks the daemon for over its pipe.

Chat turns are answered in the worker processes too, each in a thread of its
own beside the process's inbox work: the daemon records the turn's task and
hands it over; the steps and the answer's pieces come back as they happen.

The pipe carries the typed messages of ``evolver.service.messages`` both ways, each side
reading them with one ``match``. A worker process looks in the inbox when the daemon says work
arrived (a submit, a task of the search, a lease handed back), and otherwise only every
``IDLE_LOOK_S`` for a lease that expired unannounced, with a read that takes no lock.

A worker process dies with the daemon (``PR_SET_PDEATHSIG``, and it exits when
its pipe closes without a drain). When a worker process dies on its own, the
daemon ends its lease at once (the attempt counts, its open trajectory ends as
interrupted), fails the chat turns it was answering (their requests get 503
``worker_lost``) and starts another in its place.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import itertools
import logging
import multiprocessing
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Protocol

from memory import Context, Lease, StoreError, Task

from ..agent.engine import Engine
from ..agent.mcp_tools import McpThrough, Offered
from ..api.host import WorkerLost
from ..config import Config
from ..storage import open_store
from .agents import Agents
from .messages import (
    ChatAsked,
    ChatCancelled,
    ChatDone,
    ChatPiece,
    ChatStep,
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

__all__ = ["WorkerDied", "WorkerProcess", "worker_main"]

log = logging.getLogger(__name__)

CONTEXT_TIMEOUT_S = 120.0  # the daemon embeds the query and searches; it answers in milliseconds when well
RESTART_BACKOFF_S = (1.0, 30.0)  # a worker that keeps dying at start is restarted ever more slowly
IDLE_LOOK_S = 5.0  # an idle worker looks in the inbox unasked this often: for a lease that expired unannounced


# --- the worker process's side ---------------------------------------------------------------------


class DaemonLink:
    """The worker process's end of its pipe: sends from any thread, one reader thread dispatching."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.drain = threading.Event()
        self.work = threading.Event()
        self._send_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._replies: dict[int, list] = {}
        self._replies_lock = threading.Lock()
        self.on_chat: Callable[[int, Task], None] | None = None  # set by worker_main
        self.chat_cancels: dict[int, threading.Event] = {}

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
                    self.work.set()
                case Drain():
                    self.drain.set()
                    self.work.set()
                    for cancel in list(self.chat_cancels.values()):  # chat turns stop at their next step
                        cancel.set()
                case ChatAsked(turn, task) if self.on_chat is not None:
                    self.chat_cancels[turn] = threading.Event()
                    self.on_chat(turn, task)
                case ChatCancelled(turn):
                    cancel = self.chat_cancels.get(turn)
                    if cancel is not None:
                        cancel.set()
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


class ContextFromDaemon:
    """The worker's store: SQLite written directly, the retrieval context asked of the daemon."""

    def __init__(self, store, link: DaemonLink) -> None:
        self._store = store
        self._link = link

    def context(self, query: str, **kwargs: Any) -> Context:
        return self._link.context(query, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


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


class ChatTurns:
    """The chat turns a worker process answers beside its inbox work, each in a thread of its own."""

    def __init__(self, link: DaemonLink, agents: Agents, store) -> None:
        self.link, self.agents, self.store = link, agents, store
        self._running = threading.Condition()
        self._count = 0

    def start(self, turn: int, task: Task) -> None:
        with self._running:
            self._count += 1
        threading.Thread(target=self._answer, args=(turn, task), name=f"chat-{turn}", daemon=True).start()

    def _answer(self, turn: int, task: Task) -> None:
        link, cancel = self.link, self.link.chat_cancels[turn]

        def step_seen(step) -> None:
            link.send(ChatStep(turn, step))
            link.send(Wrote(task.id))
            if link.drain.is_set() or self.store.cancel_requested(task.id):
                cancel.set()

        try:
            result = self.agents().run_task(
                task, cancel=cancel, on_step=step_seen, on_answer=lambda piece: link.send(ChatPiece(turn, piece))
            )
            link.send(ChatDone(turn, result=result))
        except BaseException as exc:  # noqa: BLE001  (the daemon raises it for the turn's request)
            link.send(ChatDone(turn, error=_portable(exc)))
        finally:
            link.chat_cancels.pop(turn, None)
            with self._running:
                self._count -= 1
                self._running.notify_all()

    def wait(self, timeout_s: float) -> None:
        with self._running:
            self._running.wait_for(lambda: self._count == 0, timeout_s)


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives the pipe (BudgetExceeded does), else a RuntimeError naming it."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001  (any failure to pickle means: send a plain one)
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def worker_main(
    config: Config,
    data_dir: str,
    owner: str,
    slot: int,
    slots: int,
    exclude_sources: tuple[str, ...],
    mcp: Offered,
    conn: Connection,
) -> None:
    """The worker process: claim and run tasks until drained. ``mcp``: the daemon's MCP tools."""
    _die_with_parent()
    # The daemon decides when its workers stop: a Ctrl-C or a SIGTERM sent to the whole group (systemd)
    # reaches the daemon, which drains us through the pipe.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(levelname)s %(name)s [{owner}]: %(message)s")
    link = DaemonLink(conn)
    threading.Thread(target=link.listen, name="daemon-link", daemon=True).start()
    config = own_uids(config, slot, slots)
    store = open_store(config, data_dir=Path(data_dir), index_owner=False)
    timeouts = {s.name: s.timeout_s for s in config.mcp.servers}
    engine = Engine.open(
        config,
        data_dir=Path(data_dir),
        store=ContextFromDaemon(store, link),  # type: ignore[arg-type]
        mcp=McpThrough(mcp, functools.partial(link.mcp_call, timeouts)),
    )
    d = config.daemon
    worker = Worker(
        Agents(engine),
        owner=owner,
        lease_s=d.lease_s,
        max_attempts=d.max_attempts,
        drain=link.drain,
        on_step=lambda task_id, step: link.send(Wrote(task_id)),
        on_end=lambda task_id: link.send(Ended(task_id)),
        on_claim=lambda lease: link.send(Claimed(lease)),
        store=engine.store,
        exclude_sources=exclude_sources,
    )
    chats = ChatTurns(link, worker.agent_for, engine.store)
    link.on_chat = chats.start
    gc.collect()  # what is loaded now lives as long as the process: the collector stops walking it (Daemon.serve)
    gc.freeze()
    try:
        link.send(Ready(os.getpid()))
        while not link.drain.is_set():
            link.work.clear()  # before looking: work that arrives while it looks is looked for again
            ran = None
            try:
                ran = worker.run_once()
            except Exception:  # a broken part must not end the worker: log, pause, go on
                log.exception("worker %s failed", owner)
                link.send(Idle())
                link.drain.wait(1.0)
            if ran is not None:
                link.send(Idle())
            elif not link.drain.is_set():
                link.work.wait(IDLE_LOOK_S)
        chats.wait(config.daemon.shutdown_grace_s)  # drained, they stop at their next step
    finally:
        engine.close()


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

    def task_submitted(self) -> None:
        """A task may be claimable now: the worker processes look in the inbox."""

    def mcp_offered(self) -> Offered:
        """The daemon's MCP tools, as a worker process offers them."""

    def mcp_call(self, name: str, arguments: dict) -> tuple[bool, str]:
        """A call of one of the daemon's MCP tools by its offered name."""


class WorkerDied(WorkerLost):
    """The worker process answering a chat turn ended before the turn did."""


class ChatTurn:
    """A chat turn a worker process is answering, as the daemon waits for it."""

    def __init__(self, task_id: str, on_step, on_answer) -> None:
        self.task_id = task_id
        self.on_step, self.on_answer = on_step, on_answer
        self.done = threading.Event()
        self.outcome = ChatDone(0, error=WorkerDied("the chat turn did not end"))

    def hear(self, message: ChatStep | ChatPiece | ChatDone) -> None:
        if self.done.is_set():
            return
        match message:
            case ChatStep(_, step) if self.on_step is not None:
                self.on_step(step)
            case ChatPiece(_, piece) if self.on_answer is not None:
                self.on_answer(piece)
            case ChatDone():
                self.outcome = message
                self.done.set()


class WorkerProcess:
    """The daemon's handle on one worker process: starts it, reads its pipe, restarts it when it dies.

    ``current`` and ``owner`` are what the daemon's status and shutdown read, as of a worker thread."""

    def __init__(self, daemon: WorkerHost, slot: int, slots: int, exclude_sources: tuple[str, ...]) -> None:
        self.daemon = daemon
        self.slot, self.slots = slot, slots
        self.exclude_sources = exclude_sources
        self.owner = ""  # a fresh one for each process started in this slot: its leases are exactly its own
        self.current: Lease | None = None
        self.ready = threading.Event()  # it has opened its engine and takes chat turns
        self.process: multiprocessing.process.BaseProcess | None = None
        self.conn: Connection | None = None
        self._send_lock = threading.Lock()
        self._reader: threading.Thread | None = None
        self._draining = False
        self.restarts = 0
        self.turns: dict[int, ChatTurn] = {}  # chat turns this process is answering
        self._turn_ids = itertools.count(1)
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
                case Claimed(lease):
                    self.current = lease
                case Idle():
                    self.current = None
                case Wrote(task_id):
                    d.worker_wrote(task_id)
                case Ended(task_id):
                    self.current = None
                    d.worker_wrote(task_id)
                    d.task_ended(task_id)
                case ContextAsked(request, query, options):
                    try:
                        d.store.sync_index()  # what the workers wrote so far is found (one SELECT when none is due)
                        self.send(ContextReply(request, context=d.store.context(query, **options)))
                    except Exception as exc:  # noqa: BLE001  (the worker's task gets the message)
                        self.send(ContextReply(request, error=str(exc)))
                case ChatStep(turn) | ChatPiece(turn) | ChatDone(turn):
                    waiting = self.turns.get(turn)
                    if waiting is not None:
                        waiting.hear(message)
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
        store = self.daemon.store
        for turn_id, turn in list(self.turns.items()):  # chat turns it was answering: they end here
            store.interrupt_task(turn.task_id, "interrupted: the worker process answering it died")
            self.daemon.worker_wrote(turn.task_id)
            how = f"{'exit code' if (code or 0) >= 0 else 'signal'} {abs(code or 0)}"
            turn.hear(
                ChatDone(
                    turn_id,
                    error=WorkerDied(f"the worker process answering this chat turn ended ({how}); send it again"),
                )
            )
            self.turns.pop(turn_id, None)
        if self._draining:
            # Drained in time, it released its task itself; killed after the grace, its task goes back
            # to the queue for the restart like a worker thread's (the attempt refunded).
            if lease is not None and store.release_task(lease):
                log.warning("task %s did not reach a step boundary in time; queued for the restart", lease.task.id)
            return
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with {code}"
        abandoned = store.abandon_leases(self.owner)  # the one it said it held, or one it had no time to name
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

    def chat(self, task: Task, *, cancel: threading.Event, on_step=None, on_answer=None):
        """Have this process answer one chat turn (its task already recorded); its TaskResult. Raises what
        the turn raised there, or ``WorkerDied``."""
        turn_id = next(self._turn_ids)
        turn = ChatTurn(task.id, on_step, on_answer)
        self.turns[turn_id] = turn
        try:
            if self.conn is None:
                raise WorkerDied("no worker process is running to answer the chat turn; send it again")
            self.send(ChatAsked(turn_id, task))
            told = False
            while not turn.done.wait(0.2):
                if cancel.is_set() and not told:  # the client went away, or the daemon drains
                    self.send(ChatCancelled(turn_id))
                    told = True
        finally:
            self.turns.pop(turn_id, None)
        if turn.outcome.error is not None:
            raise turn.outcome.error
        return turn.outcome.result

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
