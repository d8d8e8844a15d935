"""The daemon: one process that owns the store, serves the socket API and runs the workers.

After supervisord, signals and the shutdown API call only change the daemon's
mood; one loop in the main thread acts on it. On SIGTERM (or `evolver down`)
the daemon stops taking work, lets running tasks reach a step boundary within
``[advanced.daemon] shutdown_grace_s``, sends what is unfinished back to the queue for
the next start, stops the API and exits 0. The socket is the single-instance
lock: ``evolver.service.sockets.bind`` refuses when a live daemon answers on it.
"""

from __future__ import annotations

import enum
import gc
import hashlib
import logging
import os
import signal
import socket
import threading
import time
from pathlib import Path

from memory import ExperienceStore, IndexBusy, TaskKind

from ..agent.loop import TaskResult
from ..agent.mcp_tools import McpServers, Offered
from ..api.host import Stopping
from ..config import Config
from ..engine import Engine
from ..llm.budget import start_of_day
from ..meta.jobs import Jobs, builtin_jobs
from ..tree.incumbent import ensure_root, incumbent
from ..tree.search import TreeSearch
from ..tree.split import Admission
from .chats import ChatTurns
from .evaluator import Evaluator, local_exclusions, open_evaluator
from .feed import Feed
from .intake import Intake
from .sockets import SocketError, bind
from .workers import WorkerPool, chat_lanes

__all__ = ["Daemon", "Mood", "socket_path"]

log = logging.getLogger(__name__)


class Mood(str, enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


def socket_path(config: Config, data_dir: Path | None = None) -> Path:
    """Where the daemon for ``data_dir`` listens: one socket (and one daemon) per data dir."""
    data_dir = Path(data_dir or config.data_dir).expanduser().absolute()
    if data_dir == config.data_dir.expanduser().absolute() and not config.daemon.data_dir:
        return config.runtime_dir / "evolver.sock"
    digest = hashlib.sha256(str(data_dir).encode()).hexdigest()[:12]
    return config.runtime_dir / f"evolver-{digest}.sock"


class Daemon:
    def __init__(self, config: Config, *, data_dir: Path | None = None) -> None:
        self.config = config
        self.data_dir = Path(data_dir or config.data_dir).expanduser()
        self.socket_path = socket_path(config, self.data_dir)
        self.mood = Mood.STARTING
        self.stop_reason = ""
        self.started_at = time.time()
        self.feed = Feed()
        self.drain = threading.Event()
        self._wake = threading.Event()
        self._index_due = threading.Event()
        self._index_sync: threading.Thread | None = None
        self.engine: Engine | None = None
        self.jobs: Jobs | None = None
        self.tree: TreeSearch | None = None
        self.intake: Intake | None = None
        self.evaluator: Evaluator | None = None
        self.chats = ChatTurns(self, self.drain)
        self.owner_prefix = f"{os.getpid()}-{int(self.started_at)}-"  # unique to this run, even if pids repeat
        # Its processes start once the store is open; a chat turn that comes sooner waits in the inbox.
        # Two chat turns at once, or one per worker when there are more: chat lanes beside the task lanes.
        workers = config.daemon.workers
        self.workers = WorkerPool(self, workers, local_exclusions(self), chats=chat_lanes(workers))

    @property
    def store(self) -> ExperienceStore:
        assert self.engine is not None, "the daemon has not opened its store"
        return self.engine.store

    # --- the state machine -------------------------------------------------------------

    def request_stop(self, reason: str) -> None:
        """Ask the main loop to shut down (safe from signal handlers and other threads)."""
        if self.mood in (Mood.STARTING, Mood.RUNNING):
            self.stop_reason = reason
            self.mood = Mood.STOPPING
        self._wake.set()

    def serve(self, *, on_ready=None) -> int:
        """Run in the foreground until asked to stop; returns the exit status."""
        bound = bind(self.socket_path)  # raises DaemonRunning when another daemon answers there
        server = tcp = None
        try:
            self._install_signals()  # a SIGTERM while starting stops the daemon once it has started
            tcp = self._tcp_listener()
            self.engine = self._open_engine()  # with [model] local, it starts the model's server first
            self.config = self.engine.config  # what the workers get: pointed at that server
            self._recover()
            # Load the embedding model now, not inside the first task (seconds of imports).
            self.store.embedder.embed_documents(["warm up"])
            self.store.embedder.embed_query("warm up")
            # What is loaded now (torch, Chroma, litellm: millions of objects) lives as long as the daemon;
            # frozen, the collector stops walking it, so a full collection no longer stalls every request.
            gc.collect()
            gc.freeze()
            ensure_root(self.store, self.engine.seed_scaffold())
            self.intake = Intake(self.store, on_committed=self.task_submitted, admission=Admission.of(self.config))
            self.intake.start()
            from ..api import create_app
            from .server import ApiServer

            server = ApiServer(create_app(self), [bound.sock] + ([tcp] if tcp else []))
            server.start()
            self.tree = TreeSearch(
                self.engine, slots=self.config.evolution.evaluation_slots, on_queued=self.task_submitted
            )
            self._start_workers()
            self.evaluator = open_evaluator(self)
            if self.evaluator is not None:
                self.evaluator.start()
            self.jobs = Jobs(self, builtin_jobs(self.config))
            self.jobs.start(schedule=self.config.evolution.enabled)
            if self.tree.ended_unrecorded():  # ended before a kill, unread: no worker will say so again
                self.jobs.poke("record")
            if self.mood is Mood.STARTING:
                self.mood = Mood.RUNNING
            log.info(
                "evolver daemon %d serving %s on %s with %d workers",
                os.getpid(),
                self.data_dir,
                self.socket_path,
                len(self.workers),
            )
            if on_ready is not None:
                on_ready(self)
            while self.mood is Mood.RUNNING:
                self._wake.wait(1.0)
                self._wake.clear()
                self.workers.supervise()
                if self.engine.local_models is not None:
                    self.engine.local_models.supervise()
                if server.error is not None:
                    self.request_stop(f"the API server failed: {server.error}")
            log.info("stopping: %s", self.stop_reason)
            self._shutdown()
            return 0
        finally:
            if self.jobs is not None:
                self.jobs.stop()
            self.feed.close()
            if server is not None:
                server.stop()
            if self.intake is not None:
                self.intake.close()  # after the server: every acknowledged submit is committed
            if self.engine is not None:
                self.engine.close()
            if tcp is not None:
                tcp.close()
            bound.close()
            self.mood = Mood.STOPPED

    def _tcp_listener(self) -> socket.socket | None:
        """A loopback TCP listener, only when configured, and never without its token."""
        d = self.config.daemon
        if not d.tcp_port:
            return None
        if not os.environ.get(d.tcp_token_env):
            raise SocketError(
                f"[advanced.daemon] tcp_port is {d.tcp_port} but ${d.tcp_token_env} is empty or unset: "
                "a TCP listener needs its bearer token there."
            )
        try:
            return socket.create_server(("127.0.0.1", d.tcp_port))
        except OSError as exc:
            raise SocketError(f"cannot listen on 127.0.0.1:{d.tcp_port}: {exc.strerror or exc}") from exc

    def _open_engine(self) -> Engine:
        # A read-only CLI command may hold the index lock for a moment: wait for it.
        deadline = time.monotonic() + 10.0
        while True:
            try:
                return Engine.open(self.config, data_dir=self.data_dir)
            except IndexBusy:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def _recover(self) -> None:
        """Pick up after a daemon that died: the attempts it left open end as interrupted, its leased
        tasks are claimable at once (the attempt counts), and its chat turns, whose requests died with
        it, end as failed (a running task without a lease, from a daemon before chat had a lane, too)."""
        interrupted = self.store.inbox.close_interrupted_trajectories()
        if interrupted:
            log.warning("%d trajectories were cut off by a daemon that died; marked interrupted", interrupted)
        # Only the queued chat turns and the running tasks are read: a start never walks a long queue of tasks.
        queued_turns = self.store.inbox.list_tasks(status="queued", source="chat", limit=10_000)
        running = self.store.inbox.list_tasks(status="running", limit=10_000)
        for task in queued_turns + [t for t in running if t.source is TaskKind.CHAT or t.lease_owner is None]:
            self.store.inbox.interrupt_task(task.id, "interrupted: the daemon stopped before the chat turn ended")
        expired = self.store.inbox.expire_leases(except_owner_prefix=self.owner_prefix)
        if expired:
            log.warning("%d tasks were running in a daemon that died; they run again now", expired)

    def _install_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # a daemon embedded in a test thread is stopped with request_stop
        signal.signal(signal.SIGTERM, lambda *_: self.request_stop("SIGTERM"))
        signal.signal(signal.SIGINT, lambda *_: self.request_stop("SIGINT"))

    def _shutdown(self) -> None:
        self.drain.set()
        if self.jobs is not None:
            self.jobs.stop()  # no new round; the running ones are waited for below, with the workers'
        deadline = time.monotonic() + self.config.daemon.shutdown_grace_s
        self.workers.stop(deadline)  # killed after the grace, a worker's task goes back to the queue
        if self._index_sync is not None:
            self._index_sync.join(max(0.0, deadline - time.monotonic()))
        # Drained, the chat turns' requests end; the store outlives them.
        self.chats.wait_ended(max(0.0, deadline - time.monotonic()))
        if self.evaluator is not None:
            self.evaluator.close(max(0.0, deadline - time.monotonic()))
        if self.jobs is not None:  # the store closes after this: a round still running then is cut
            for name in self.jobs.stop(max(0.0, deadline - time.monotonic())):
                log.warning("a %s round did not end within the grace; it runs again after the restart", name)

    # --- workers -----------------------------------------------------------------------

    def task_ended(self, task_id: str) -> None:
        self.feed.publish(task_id)
        self.chats.wrote(task_id)
        self._index_due.set()  # its attempt ended: the trajectory enters the index now
        # The search reads its tasks' results itself, on the job host: the worker only says one ended.
        if self.jobs is not None and self.store.inbox.get_task(task_id).source.searched:
            self.jobs.poke("record")

    def worker_wrote(self, task_id: str) -> None:
        """A worker process wrote to ``task_id``: wake its live streams and bring the index up to date."""
        self.feed.publish(task_id)
        self.chats.wrote(task_id)
        self._index_due.set()

    def task_answered(self, task_id: str, attempt: int, piece: str) -> None:
        self.chats.answered(task_id, attempt, piece)

    def _start_workers(self) -> None:
        self._index_sync = threading.Thread(target=self._keep_index, name="index-sync", daemon=True)
        self._index_sync.start()
        self.workers.start()

    def _keep_index(self) -> None:
        """Worker processes write SQLite only; their rows wait in the outbox until this syncs them."""
        while not self.drain.is_set():
            self._index_due.wait(1.0)
            self._index_due.clear()
            try:
                self.store.sync_index()
            except Exception:  # the rows stay in the outbox; the next round tries again
                log.exception("syncing the vector index failed")

    def task_submitted(self) -> None:
        self.workers.work_arrived()

    # --- what the API asks of the daemon -----------------------------------------------------

    def chat(
        self,
        prompt: str,
        *,
        on_step=None,
        metadata: dict | None = None,
        task_id: str | None = None,
        cancel: threading.Event | None = None,
        on_answer=None,
    ) -> TaskResult:
        """One chat turn: the incumbent agent answers. The turn is a task of kind chat (``task_id``: the id
        it gets, chosen by the caller), queued at the highest priority for the workers' chat lanes
        (``evolver.service.chats``). The turn stops at its next step when ``cancel`` is set (a client
        that went away), when someone cancels its task, or when the daemon drains. ``on_step`` gets its
        steps, ``on_answer`` the answer in pieces as the model writes it."""
        if self.drain.is_set():
            raise Stopping("the daemon is stopping; send the chat again once it has restarted")
        # A chat turn comes in by the same door as any task: the text of a held-out task stays held out.
        admission = self.intake.admission if self.intake else Admission.of(self.config)
        item = admission.admit(TaskKind.CHAT, prompt, metadata=metadata, id=task_id)
        ((task, _),) = self.store.inbox.add_tasks([item])
        self.task_submitted()
        try:
            return self.chats.wait(task, cancel=cancel or threading.Event(), on_step=on_step, on_answer=on_answer)
        finally:
            self.feed.publish(task.id)

    def call_tool(self, name: str, arguments: dict) -> dict:
        """Run an active synthesized tool in the sandbox for a caller outside any task (``Engine.call_tool``)."""
        assert self.engine is not None, "the daemon has not opened its store"
        return self.engine.call_tool(name, arguments)

    def mcp_offered(self) -> Offered:
        """The daemon's MCP tools, which its worker processes offer and call through it."""
        servers = self.engine.mcp if self.engine is not None else None
        return servers.offered() if isinstance(servers, McpServers) else Offered()

    def mcp_call(self, name: str, arguments: dict) -> tuple[bool, str]:
        servers = self.engine.mcp if self.engine is not None else None
        if not isinstance(servers, McpServers):
            return False, "the daemon runs no MCP servers"
        return servers.call_offered(name, arguments)

    def mcp_tools(self) -> list[dict]:
        """The tools of the user's MCP servers the agent is offered, and servers left out (with why)."""
        servers = self.engine.mcp if self.engine is not None else None
        if servers is None:
            return []
        offered = [
            {"name": s.name, "server": s.name.split("__")[0], "description": s.description} for s in servers.specs
        ]
        return offered + [
            {"name": None, "server": name, "description": f"left out: {why}"} for name, why in servers.problems.items()
        ]

    def _running(self) -> list[dict]:
        return self.workers.running() + (self.evaluator.running() if self.evaluator else [])

    def status(self) -> dict:
        day = start_of_day()
        tokens, usd = self.store.ledger.spent(since=day)
        node = incumbent(self.store)
        b = self.config.budget
        return {
            "pid": os.getpid(),
            "mood": self.mood.value,
            "uptime_s": round(time.time() - self.started_at, 1),
            "data_dir": str(self.data_dir),
            "socket": str(self.socket_path),
            "model": self.config.model.name,
            "meta_model": self.config.meta.name or self.config.model.name,
            "local_models": self.engine.local_models.health() if self.engine and self.engine.local_models else [],
            "queue": self.store.inbox.queue_depth(),
            "workers": len(self.workers),
            "worker_pids": self.workers.pids(),
            "workers_ready": self.workers.ready(),
            "running": self._running(),
            "budget": {
                "tokens_today": tokens,
                "usd_today": round(usd, 6),
                "tokens_per_day": b.tokens_per_day,
                "usd_per_day": b.usd_per_day,
                "by_model": {
                    m: {"tokens": t, "usd": round(u, 6)}
                    for m, (t, u) in self.store.reports.spent_by_model(since=day).items()
                },
            },
            "incumbent": node.id if node else None,
            "jobs": self.jobs.next_runs() if self.jobs else [],
            "sandbox_isolated": bool(self.engine and self.engine.sandbox.isolated),
        }
