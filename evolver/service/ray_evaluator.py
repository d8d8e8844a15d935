"""The Ray backend of the evaluator: candidate scaffolds' evaluations run as Ray tasks on a Ray cluster.

The daemon claims the tree search's tasks (sources ``SEARCH_SOURCES``) under a
lease, as a worker would, and ships each as a ``Shipment``: the task, the
node's scaffold, the settings, and a snapshot of what the agent will read
(the retrieval context the daemon computes for it, the ledger's totals, the
active synthesized tools with their code, since a node cannot read the
daemon's disk). On whichever Ray node it lands, ``evaluate`` builds the same
``Engine`` and ``Agent`` as the daemon's workers, with the sandbox the
settings ask for and a fresh data dir, against a ``RecordingStore``; it
returns the recorded writes with the ``TaskResult``. The daemon replays them
into its store in one transaction with the task's completion, fenced by the
lease, so it stays the single writer of the store and the index: a result
whose lease was lost meanwhile is refused whole.

A node that cannot isolate model-written code (no working bubblewrap) while
``[sandbox] require_isolation`` holds refuses before the model is asked
anything; the task fails with a message naming the node. A Ray task that
fails (its worker or node died, an exception) gives its task back at once with
the attempt counted, so it runs again, and is dead-lettered after
``[advanced.daemon] max_attempts``. A cancel request stops the Ray task; the task ends
cancelled, without the attempt's steps (they are on the node).

What a node does not get: the user's MCP servers (they run on the daemon's
host with the user's rights) and secrets (a node reads its model API key from
its own environment).
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from memory import Ending, ExperienceStore, Lease, Task
from sandbox import Sandbox, SandboxUnavailable, make_sandbox
from tools import ToolFiles

from .. import __version__
from ..agent.loop import TaskResult, task_context
from ..agent.recording import (
    RecordingStore,
    ReplayError,
    Snapshot,
    Write,
    replay,
    spent_key,
)
from ..agent.scaffold import Scaffold
from ..config import Config, ConfigError, McpSettings
from ..engine import Engine, sandbox_limits
from ..llm.budget import BACKGROUND_PURPOSES, start_of_day
from ..tree.incumbent import incumbent, scaffold_of
from ..tree.search import SEARCH_SOURCES

__all__ = ["RayEvaluator", "RayHost", "Returned", "Shipment", "evaluate", "settle", "ship"]

log = logging.getLogger(__name__)

# Ray reports nothing home, from the daemon or from the processes it starts.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@dataclass(frozen=True)
class Shipment:
    """One evaluation as it travels to a Ray node (everything in it pickles)."""

    task: Task
    node_id: str
    scaffold: Scaffold
    config: Config
    snapshot: Snapshot
    tool_files: list[tuple[str, int, str, str]] = field(default_factory=list)  # name, version, code, tests
    version: str = __version__


@dataclass(frozen=True)
class Returned:
    """What comes back from a node: the result and the writes that produced it, or why it refused."""

    task_id: str
    node: str  # "hostname (ip)", for messages
    writes: list[Write] = field(default_factory=list)
    result: TaskResult | None = None
    refused: str | None = None
    isolated: bool = True
    took_s: float = 0.0


# --- on the Ray node --------------------------------------------------------------------------------------

_sandboxes: dict[tuple, Sandbox] = {}  # one proven sandbox per settings, for the life of the node's worker


def _node_name() -> str:
    host = socket.gethostname()
    import ray

    # Outside Ray (a test calls evaluate directly) the host name says enough.
    return f"{host} ({ray.util.get_node_ip_address()})" if ray.is_initialized() else host


def _sandbox(config: Config, factory: Callable[..., Sandbox]) -> Sandbox:
    s = config.sandbox
    key = (factory, s.require_isolation, s.unprivileged_uid, s.task_uids, s.task_uid_base, sandbox_limits(config))
    if key not in _sandboxes:
        _sandboxes[key] = factory(
            require_isolation=s.require_isolation,
            unprivileged_uid=s.unprivileged_uid,
            limits=sandbox_limits(config),
            task_uids=s.task_uids,
            task_uid_base=s.task_uid_base,
        )
    return _sandboxes[key]


class _NodeStore:
    """The store a node's engine holds: only the agent's role, and the ledger it extends, both the
    recording. Nothing to close: the recording is handed back with the result."""

    def __init__(self, recording: RecordingStore) -> None:
        self.agent = self.ledger = recording

    def close(self) -> None:
        pass


def evaluate(shipment: Shipment, *, sandbox_factory: Callable[..., Sandbox] = make_sandbox) -> Returned:
    """Run one shipped evaluation here, as the daemon's workers would, recording what it writes.
    The Ray task's body; ``sandbox_factory`` is ``make_sandbox`` (a test hands in one that finds no
    bubblewrap)."""
    started = time.perf_counter()
    node = _node_name()
    task = shipment.task

    def refuse(why: str) -> Returned:
        return Returned(
            task_id=task.id,
            node=node,
            refused=f"the Ray node {node} refused the evaluation: {why}",
            took_s=time.perf_counter() - started,
        )

    if shipment.version != __version__:
        return refuse(
            f"it runs evolver {__version__}, the daemon {shipment.version}; install the same version on every node"
        )
    try:
        sandbox = _sandbox(shipment.config, sandbox_factory)
    except SandboxUnavailable as exc:  # before anything model-written runs, or the model is even asked
        return refuse(f"it cannot isolate model-written code: {exc}")
    # The user's MCP servers stay on the daemon's host: a node offers the agent the other tools.
    config = shipment.config.model_copy(update={"mcp": McpSettings()})
    recording = RecordingStore(shipment.snapshot)
    data_dir = Path(tempfile.mkdtemp(prefix="evolver-ray-"))
    try:
        files = ToolFiles(data_dir / "tools")
        for name, version, code, tests in shipment.tool_files:
            files.write(name, version, code, tests)
        engine = Engine.open(config, data_dir=data_dir, store=_NodeStore(recording), sandbox=sandbox)  # type: ignore[arg-type]
        try:
            agent = engine.agent(shipment.scaffold, node_id=shipment.node_id)
            result = agent.run_task(task, record_status=False)
        finally:
            engine.close()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    return Returned(
        task_id=task.id,
        node=node,
        writes=recording.writes,
        result=result,
        isolated=sandbox.isolated,
        took_s=time.perf_counter() - started,
    )


# --- in the daemon ----------------------------------------------------------------------------------------


def ship(engine: Engine, task: Task) -> Shipment:
    """The shipment for a claimed search task: what its agent will read, taken now from the daemon's store."""
    store = engine.store
    # The node it tests; the incumbent for one that names none (as the daemon's workers choose).
    node = store.tree.get_node(task.metadata["node"]) if task.metadata.get("node") else incumbent(store)
    scaffold = scaffold_of(store, node)
    context = task_context(store.agent, task, scaffold.parameters)  # exactly the agent's query (Agent.run_task)
    day = start_of_day()
    spent = {
        spent_key(None, None): store.ledger.spent(since=day),
        spent_key(BACKGROUND_PURPOSES, None): store.ledger.spent(since=day, purpose=BACKGROUND_PURPOSES),
        spent_key(None, task.id): store.ledger.spent(task_id=task.id),
    }
    engine.toolbox.refresh()
    offered = {s.tool_id for s in engine.registry.specs() if s.origin == "synthesized"}
    tools = [t for t in store.tools.list_tools(status="active") if t.origin == "synthesized" and t.id in offered]
    files = ToolFiles(engine.data_dir / "tools")
    tool_files = [(t.name, t.version, *files.read(t.name, t.version, t.code_hash)) for t in tools]
    return Shipment(
        task=task,
        node_id=node.id,
        scaffold=scaffold,
        config=engine.config,
        snapshot=Snapshot(context=context, spent=spent, tools=tools),
        tool_files=tool_files,
    )


def settle(
    store: ExperienceStore,
    lease: Lease,
    returned: Returned,
    *,
    lease_s: float,
    tool_use: Callable[[int, bool], object] | None = None,
) -> str:
    """Record what came back for ``lease``; returns what was done, for the log. The writes and the task's
    end go in one transaction that first renews the lease: a lost lease records nothing. ``tool_use``
    counts a synthesized tool's call (``replay``)."""
    if returned.refused is not None:
        # Not the scaffold's fault (a smoke task that ends so runs again; an evaluation counts for nothing).
        ended = store.inbox.complete_task(lease, "failed", error=returned.refused, ending=Ending.INTERRUPTED)
        return "refused: " + returned.refused if ended else "refused, and the lease was lost meanwhile"
    result = returned.result
    if result is None:
        raise ReplayError(f"{returned.node} sent back neither a result nor a refusal")
    with store.transaction():
        if store.inbox.renew_lease(lease, lease_s=lease_s) is None:
            return f"the lease was lost; the result ({result.status}) was not recorded"
        replay(store.agent, returned.writes, task_id=lease.task.id, tool_use=tool_use)
        store.inbox.complete_task(lease, result.status, error=result.error, ending=result.ending)
    return f"{result.status} in {returned.took_s:.3f} s on {returned.node}"


class RayHost(Protocol):
    """What the evaluator needs of the daemon that runs it (kept by ``Daemon``)."""

    config: Config
    engine: Engine | None
    owner_prefix: str  # unique to this run of the daemon: the evaluator's leases are "<prefix>ray"
    drain: threading.Event  # set when the daemon stops taking work

    @property
    def store(self) -> ExperienceStore: ...

    def task_ended(self, task_id: str) -> None:
        """A task ended (its live streams wake, the search reads its result)."""


@dataclass
class _Flight:
    lease: Lease
    ref: object  # the Ray ObjectRef of its result
    renew_at: float  # monotonic: when its lease is renewed next
    looked_at: float = 0.0  # monotonic: when a cancel request was last looked for


class RayEvaluator:
    """Claims the search's tasks, ships them to Ray, and records what comes back (see the module)."""

    def __init__(self, daemon: RayHost) -> None:
        self.daemon = daemon
        self.settings = daemon.config.evaluator
        self.owner = f"{daemon.owner_prefix}ray"
        self._flights: dict[object, _Flight] = {}  # by the result's ObjectRef
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._deadline: float | None = None
        self._thread: threading.Thread | None = None
        self._nodes_degraded: set[str] = set()
        self._ray = None
        self._remote = None

    # --- the Evaluator protocol ---------------------------------------------------------------------

    def start(self) -> None:
        try:
            import ray
        except ImportError as exc:
            raise ConfigError(
                "[evaluator] backend = \"ray\" needs Ray, which is not installed: pip install 'evolver[ray]'"
            ) from exc
        self._ray = ray
        address = self.settings.address
        if not address and not any(
            os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
        ):
            # A private instance: Ray's ports listen on every interface, so only holders of a token, the
            # daemon and the processes Ray starts for it, may use it. Ray turns token authentication on for
            # a new local instance; this token, in the environment they inherit, keeps ~/.ray untouched.
            os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
        # ray.init takes over SIGTERM (to exit at once) and SIGINT: the daemon's own handlers, which drain
        # the work first and then close this evaluator, are put back.
        handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            ray.init(
                address=address or "local",
                namespace="evolver",
                log_to_driver=False,
                logging_level=logging.WARNING,
                **({} if address else {"_node_ip_address": "127.0.0.1", "include_dashboard": False}),
            )
        except Exception as exc:
            where = f"the Ray cluster at {address}" if address else "a private local Ray instance"
            raise ConfigError(f'[evaluator] backend = "ray": cannot join {where}: {type(exc).__name__}: {exc}') from exc
        finally:
            if threading.current_thread() is threading.main_thread():
                for sig, handler in handlers.items():
                    if handler is not None:
                        signal.signal(sig, handler)
        # No retry by Ray itself: a lost worker gives the task back to the inbox, where the attempt counts.
        self._remote = ray.remote(num_cpus=1, max_retries=0)(evaluate)
        self._thread = threading.Thread(target=self._dispatch, name="ray-evaluator", daemon=True)
        self._thread.start()
        log.info(
            "evaluations run on Ray (%s), %d at a time", address or "a private local instance", self.settings.in_flight
        )

    def close(self, grace_s: float) -> None:
        """Stop claiming; record what comes back within ``grace_s``, give the rest back to the queue."""
        self._deadline = time.monotonic() + grace_s
        self._closing.set()
        if self._thread is not None:
            self._thread.join(grace_s + 10.0)
        if self._ray is not None:
            self._ray.shutdown()

    def running(self) -> list[dict]:
        with self._lock:
            return [{"task_id": f.lease.task.id, "worker": self.owner} for f in self._flights.values()]

    # --- the dispatcher thread ----------------------------------------------------------------------

    def _dispatch(self) -> None:
        while True:
            try:
                if self._closing.is_set() and (not self._flights or time.monotonic() >= (self._deadline or 0)):
                    break
                claimed = self._claim()
                if self._flights:
                    self._land(timeout_s=0.05 if claimed else 0.25)
                    self._keep_leases()
                elif not claimed:
                    self._idle()
            except Exception:  # a broken part must not stop the evaluations for good: log, pause, go on
                log.exception("the Ray evaluator's dispatcher failed")
                self._closing.wait(1.0)
        self._give_back()

    def _accepting(self) -> bool:
        return not (self._closing.is_set() or self.daemon.drain.is_set())

    def _idle(self) -> None:
        self._closing.wait(0.25)  # as often as an idle worker looks; the search queues its tasks in batches

    def _claim(self) -> bool:
        claimed = False
        while self._accepting() and len(self._flights) < self.settings.in_flight:
            d = self.daemon.config.daemon
            lease = self.daemon.store.inbox.claim_task(
                self.owner, lease_s=d.lease_s, max_attempts=d.max_attempts, sources=SEARCH_SOURCES
            )
            if lease is None:
                break
            claimed = True
            try:
                ref = self._remote.remote(ship(self.daemon.engine, lease.task))
            except Exception as exc:  # the node's scaffold or tool files cannot be read, Ray refused it
                log.exception("task %s could not be shipped to Ray", lease.task.id)
                if self.daemon.store.inbox.complete_task(
                    lease, "failed", error=f"not shipped to Ray: {exc}", ending=Ending.INTERNAL_ERROR
                ):
                    self.daemon.task_ended(lease.task.id)
                continue
            with self._lock:
                self._flights[ref] = _Flight(
                    lease, ref, renew_at=time.monotonic() + d.lease_s / 3, looked_at=time.monotonic()
                )
        return claimed

    def _land(self, timeout_s: float) -> None:
        ray = self._ray
        ready, _ = ray.wait(list(self._flights), num_returns=1, timeout=timeout_s)
        if ready:
            ready, _ = ray.wait(list(self._flights), num_returns=len(self._flights), timeout=0)
        for ref in ready:
            flight = self._flights[ref]
            task = flight.lease.task
            try:
                returned = ray.get(ref)
            except ray.exceptions.TaskCancelledError:
                returned = None
            except Exception as exc:  # noqa: BLE001 - the worker or its node died, or evaluate raised
                self._forget(ref)
                self.daemon.store.inbox.abandon_lease(flight.lease)  # runs again; the attempt counts
                log.error(
                    "evaluation task %s failed on Ray and goes back to the queue: %s",
                    task.id,
                    str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__,
                )
                continue
            self._forget(ref)
            if returned is None:  # stopped on a cancel request: its steps stay on the node
                if self.daemon.store.inbox.complete_task(
                    flight.lease, "cancelled", error="cancelled", ending=Ending.CANCELLED
                ):
                    self.daemon.task_ended(task.id)
                continue
            if not returned.isolated and returned.node not in self._nodes_degraded:
                self._nodes_degraded.add(returned.node)
                log.warning(
                    "SANDBOX DEGRADED on the Ray node %s: bubblewrap is unavailable there; model-written "
                    "code runs as a plain subprocess with limits",
                    returned.node,
                )
            try:
                what = settle(
                    self.daemon.store,
                    flight.lease,
                    returned,
                    lease_s=self.daemon.config.daemon.lease_s,
                    tool_use=self._count_tool_use,
                )
            except ReplayError as exc:
                self.daemon.store.inbox.abandon_lease(flight.lease)
                log.error(
                    "evaluation task %s: what %s sent back cannot be recorded (%s); it runs again",
                    task.id,
                    returned.node,
                    exc,
                )
                continue
            except Exception:  # the store refused the write (full, locked): nothing of it was recorded
                log.exception("evaluation task %s: recording what came back failed; it runs again", task.id)
                self.daemon.store.inbox.abandon_lease(flight.lease)
                continue
            (log.warning if returned.refused else log.info)("evaluation task %s: %s", task.id, what)
            self.daemon.task_ended(task.id)

    def _count_tool_use(self, tool_id: int, ok: bool) -> None:
        engine = self.daemon.engine
        spec = next((s for s in engine.registry.specs() if s.tool_id == tool_id), None)
        if spec is not None:
            engine.toolbox.record_use(spec, ok)  # counts it, and marks a tool that keeps failing for retirement
        else:  # retired or replaced since it was shipped: its record still counts the call
            self.daemon.store.tools.record_tool_use(tool_id, ok=ok)

    def _forget(self, ref) -> None:
        with self._lock:
            self._flights.pop(ref, None)

    def _keep_leases(self) -> None:
        """Renew the leases due (every third of ``lease_s``), stop the Ray tasks whose lease was lost, and
        about once a second, those whose task someone asked to cancel."""
        now = time.monotonic()
        lease_s = self.daemon.config.daemon.lease_s
        store = self.daemon.store
        for ref, flight in list(self._flights.items()):
            task_id = flight.lease.task.id
            if now >= flight.renew_at:
                renewed = store.inbox.renew_lease(flight.lease, lease_s=lease_s)
                if renewed is None:  # taken over or ended elsewhere: whatever comes back would be refused
                    log.warning("evaluation task %s: the lease was lost; its Ray task is stopped", task_id)
                    self._forget(ref)
                    self._ray.cancel(ref)
                    continue
                flight.lease, flight.renew_at = renewed, now + lease_s / 3
            if now - flight.looked_at >= 1.0:
                flight.looked_at = now
                if store.inbox.cancel_requested(task_id):
                    self._ray.cancel(ref)  # it comes back as cancelled (or with its result, if it was done)

    def _give_back(self) -> None:
        """What has not come back by the deadline goes back to the queue (the attempt refunded)."""
        for ref, flight in list(self._flights.items()):
            self._forget(ref)
            self._ray.cancel(ref)
            if self.daemon.store.inbox.release_task(flight.lease):
                log.warning(
                    "evaluation task %s did not come back from Ray in time; queued for the restart",
                    flight.lease.task.id,
                )
