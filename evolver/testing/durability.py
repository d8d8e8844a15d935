"""Durability drills against a real daemon: kill -9 at random points, and a modelled power loss.

``kill_loop`` runs one daemon on one data dir and SIGKILLs it many times, each
time at a seeded random moment of one kind of work — clients submitting with
idempotency keys, a task between its steps, a distillation round, a
tree-search step, a tool-synthesis round — and restarts it. In the "worker"
phase it first kills, on its own, the worker process answering a chat turn
between its steps (the turn runs again in another and its request is answered,
``_chat_through_a_kill``), then the one running a task between its steps (the
daemon goes on and runs the task again), then the daemon. After every kill
it reads the dead daemon's database and checks what must already hold; after
the last restart it lets the work drain, stops the daemon cleanly and checks
everything (``Invariants``). It returns a report; its ``violations`` must be
empty. ``tests/test_durability.py`` runs a few kills, and
``benchmarks/reliability_durability.py`` many.

``power_loss`` models a power cut. A small LD_PRELOAD library (``SHIM``,
compiled with gcc) copies each file under the data dir, every time an
fsync/fdatasync of it succeeds, into a snapshot directory. Writes to those
files wait while a sync and its copy run, so a copy holds exactly what that
sync made durable. After a SIGKILL, the data dir rebuilt from the copies alone
(``power_loss_image``) is what the disk could hold after the power went out:
nothing written without a later fsync survives. SQLite in WAL mode with
``synchronous=FULL`` fsyncs the WAL at every commit and the database file at
every checkpoint; the ``-shm`` index is rebuilt from the WAL by the next open,
and the vector index from SQLite, so neither is carried over.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import threading
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from evolver.testing.daemon import DaemonProcess, demo_rules, run_rounds, wait_for, write_script

__all__ = [
    "kill_loop",
    "power_loss",
    "build_shim",
    "shim_env",
    "power_loss_image",
    "sync_counts",
    "Submitters",
    "Invariants",
    "read_state",
    "index_check",
    "durable_settings",
    "script_rules",
    "PHASES",
    "TERMINAL",
]

PHASES = ("submits", "steps", "worker", "distill", "evolve", "synthesize")
TERMINAL = ("done", "failed", "dead")  # how a task may end here (nobody cancels one)
MAX_ATTEMPTS = 3  # the daemon's default, which these drills keep
# After the phase's work has begun, the kill comes this many seconds later (uniform).
KILL_WINDOW = {
    "submits": (0.0, 0.6),
    "steps": (0.0, 1.2),
    "worker": (0.0, 1.5),
    "distill": (0.05, 1.5),
    "evolve": (0.05, 2.0),
    "synthesize": (0.05, 1.5),
}
PERCENT_TASKS = ("What is 17.5% of 2,340?", "What is 12.5% of 80?")

PACK = [
    {"id": "e1", "prompt": "What is 2 + 3?", "check": {"type": "answer", "expected": "5"}},
    {"id": "e2", "prompt": "What is 10 + 4?", "check": {"type": "answer", "expected": "14"}},
    {"id": "h1", "prompt": "What is 6 * 7?", "check": {"type": "answer", "expected": "42"}, "split": "test"},
    {"id": "h2", "prompt": "What is 9 - 4?", "check": {"type": "answer", "expected": "5"}, "split": "test"},
]


# --- the daemon's script and settings ---------------------------------------------------------


def _percent_tool_rule(demo_rule: dict, calls: int) -> dict:
    """The demo's percent_of answer, generalized to ``calls`` recorded calls (a task re-run after a kill
    records its call again, so a synthesis round may see more than the demo's two)."""
    head, _, _ = demo_rule["match"].partition("[\\s\\S]*Recorded call 1:")
    one = (
        "[\\s\\S]*Recorded call {n}:\\n```python\\nprint\\(round\\((?P<p{n}>[\\d.]+) / 100 \\* "
        "float\\('(?P<n{n}>[\\d.,]+)'"
    )
    replays = ", ".join(
        f'{{"call": {n}, "arguments": {{"percent": \\g<p{n}>, "value": "\\g<n{n}>"}}}}' for n in range(1, calls + 1)
    )
    before, _, rest = demo_rule["reply"].partition('"replays": [')
    _, _, after = rest.partition("]")
    return {
        **demo_rule,
        "match": head + "".join(one.format(n=n) for n in range(1, calls + 1)),
        "reply": before + '"replays": [' + replays + "]" + after,
    }


def script_rules() -> list[dict]:
    """The demo script, plus: proposer answers that lower max_steps along one lineage (20, 12, 10, ...;
    a sibling repeats its twin and is invalid), percent_of for up to six recorded calls, and SLOW tasks
    that take three sandboxed steps of 0.4 s before they answer."""
    demo = demo_rules()
    tool = next((r for r in demo if r["match"].startswith("You write one reusable tool[\\s\\S]*Recorded call 1")), None)
    assert tool is not None, "the demo script's percent_of rule changed: update this"
    chain = (20, 12, 10, 8, 6, 5, 4)
    proposers = [
        {
            "match": rf'You improve an agent by editing its scaffold[\s\S]*"max_steps": {a},',
            "on": "all",
            "reply": json.dumps({"rationale": f"{b} steps are enough", "edit": {"parameters": {"max_steps": b}}}),
        }
        for a, b in zip(chain, chain[1:])
    ]
    proposers.append(
        {
            "match": "You improve an agent by editing its scaffold",
            "on": "all",
            "reply": json.dumps({"rationale": "fewer steps", "edit": {"parameters": {"max_steps": 8}}}),
        }
    )
    slow = [
        {
            "match": r"\ATask:\n[^\n]*?SLOW: What is",
            "on": "task",
            "role": "user",
            "tool": "run_python",
            "arguments": {"code": "import time; time.sleep(0.4); print('tick-a')"},
        },
        {
            "match": r"^tick-a\s*$",
            "role": "tool",
            "tool": "run_python",
            "arguments": {"code": "import time; time.sleep(0.4); print('tick-b')"},
        },
        {
            "match": r"Task:\n[^\n]*?SLOW: What is (?P<expr>[\d\s.+*/()-]+[\d)])\s*\?[\s\S]*tick-b\s*\Z",
            "on": "all",
            "role": "tool",
            "tool": "run_python",
            "arguments": {"code": "import time; time.sleep(0.4); print(round(\\g<expr>, 6))"},
        },
    ]
    return [*proposers, *[_percent_tool_rule(tool, k) for k in range(6, 2, -1)], *slow, *demo]


def durable_settings(root: Path) -> dict:
    """Two workers; jobs only when asked (POST /v1/evolve), so each drill decides when they run; a pack
    with held-out tasks and one held-out evaluation enough to promote, so promotions can happen; and
    evaluations ahead of the clients' tasks, so the search gets past its first evaluations between kills."""
    pack = root / "pack.jsonl"
    pack.write_text("".join(json.dumps(t) + "\n" for t in PACK))
    return {
        "EVOLVER_DAEMON_WORKERS": 2,
        "EVOLVER_DAEMON_SHUTDOWN_GRACE_S": 3,
        "EVOLVER_DAEMON_MAX_ATTEMPTS": MAX_ATTEMPTS,
        "EVOLVER_EVOLUTION_ENABLED": "false",
        "EVOLVER_EVOLUTION_EVALUATION_SLOTS": 2,
        "EVOLVER_EVOLUTION_PACKS": json.dumps([str(pack)]),
        "EVOLVER_EVOLUTION_MIN_EVALUATIONS": 1,
        "EVOLVER_EVOLUTION_EVALUATION_PRIORITY": 10,
    }


# --- clients that submit with idempotency keys, retrying across kills -------------------------


@dataclass
class Submission:
    key: str
    body: dict
    acked: list[str] = field(default_factory=list)  # the task id of every 200/201 reply
    codes: list[int] = field(default_factory=list)
    tries: int = 0
    unexpected: str | None = None


class Submitters:
    """Client threads, each submitting when given a token and retrying the same Idempotency-Key after any
    transport error (the daemon died, or had not started yet) until a reply comes back."""

    def __init__(self, daemon: DaemonProcess, *, clients: int, seed: int, slow_share: float = 0.3) -> None:
        self.daemon = daemon
        self.socket = str(daemon.socket_path)
        self.clients = clients
        self.seed = seed
        self.slow_share = slow_share
        self.tokens = threading.Semaphore(0)
        self.no_more = threading.Event()  # no new submissions; pending retries go on
        self.abort = threading.Event()  # stop now, retries too
        self.submissions: list[Submission] = []
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, args=(n,), name=f"submitter-{n}", daemon=True) for n in range(clients)
        ]

    def start(self) -> Submitters:
        for thread in self._threads:
            thread.start()
        return self

    def release(self, n: int) -> None:
        for _ in range(n):
            self.tokens.release()

    def finish(self, timeout_s: float) -> None:
        """No new submissions; wait until every pending one is acknowledged."""
        self.no_more.set()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in self._threads):
            self.abort.set()
            raise AssertionError(f"submissions were still unacknowledged after {timeout_s:g} s:\n{self.daemon.log()}")

    def stop(self) -> None:
        self.abort.set()
        self.no_more.set()
        for thread in self._threads:
            thread.join(30)

    def _client(self) -> httpx.Client:
        return httpx.Client(transport=httpx.HTTPTransport(uds=self.socket), base_url="http://evolver", timeout=60)

    def new(self, body: dict, key: str) -> Submission:
        submission = Submission(key=key, body=body)
        with self._lock:
            self.submissions.append(submission)
        return submission

    def send(self, http: httpx.Client, submission: Submission) -> bool:
        """One try; True once a reply came back."""
        submission.tries += 1
        try:
            response = http.post("/v1/tasks", json=submission.body, headers={"Idempotency-Key": submission.key})
        except httpx.TransportError:
            return False
        submission.codes.append(response.status_code)
        if response.status_code in (200, 201):
            submission.acked.append(response.json()["id"])
        else:
            submission.unexpected = f"{response.status_code}: {response.text[:300]}"
        return True

    def submit_now(self, body: dict, key: str, timeout_s: float = 120.0) -> Submission:
        """Submit from the calling thread, retrying until acknowledged."""
        submission = self.new(body, key)
        deadline = time.monotonic() + timeout_s
        with self._client() as http:
            while not self.send(http, submission):
                if time.monotonic() > deadline:
                    raise AssertionError(f"{key} was not acknowledged within {timeout_s:g} s:\n{self.daemon.log()}")
                time.sleep(0.2)
        return submission

    def _body(self, rng: random.Random, key: str) -> dict:
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        if rng.random() < self.slow_share:
            return {"prompt": f"[{key}] SLOW: What is {a} * {b}?", "check": {"type": "answer", "expected": str(a * b)}}
        return {"prompt": f"[{key}] What is {a} + {b}?", "check": {"type": "answer", "expected": str(a + b)}}

    def _run(self, n: int) -> None:
        rng = random.Random(self.seed * 1000 + n)
        http = self._client()
        count = 0
        try:
            while not self.abort.is_set():
                if not self.tokens.acquire(timeout=0.1):
                    if self.no_more.is_set():
                        return
                    continue
                key = f"c{n}-{count}"
                count += 1
                submission = self.new(self._body(rng, key), key)
                time.sleep(rng.uniform(0.0, 0.3))
                while not self.abort.is_set() and not self.send(http, submission):
                    http.close()  # its pooled connection went with the daemon
                    http = self._client()
                    time.sleep(0.2)
        finally:
            http.close()

    def acknowledged(self) -> list[Submission]:
        with self._lock:
            return [s for s in self.submissions if s.acked]


# --- what the dead (or stopped) daemon left -----------------------------------------------------


def read_state(data_dir: Path) -> dict:
    """Everything the checks need, read-only from the database (a daemon must not be running on it)."""
    db = sqlite3.connect(f"file:{data_dir / 'evolver.db'}?mode=ro", uri=True, timeout=30)
    try:

        def rows(sql: str) -> list[tuple]:
            return db.execute(sql).fetchall()

        state = {
            "integrity": [r[0] for r in rows("PRAGMA integrity_check")],
            "tasks": {
                r[0]: {
                    "status": r[1],
                    "attempts": r[2],
                    "error": r[3],
                    "finished_at": r[4],
                    "key": r[5],
                    "source": r[6],
                }
                for r in rows("SELECT id, status, attempts, error, finished_at, idempotency_key, source FROM tasks")
            },
            # per task: trajectories, steps, when its last trajectory started
            "runs": {
                r[0]: (r[1], r[2], r[3])
                for r in rows(
                    "SELECT t.task_id, count(DISTINCT t.id), count(s.seq), max(t.started_at) FROM trajectories t "
                    "LEFT JOIN steps s ON s.trajectory_id = t.id GROUP BY t.task_id"
                )
            },
            "open_trajectories": [r[0] for r in rows("SELECT id FROM trajectories WHERE status = 'running'")],
            "outbox": rows("SELECT count(*) FROM index_outbox")[0][0],
            "incumbent": (rows("SELECT value FROM meta WHERE key = 'incumbent'") or [(None,)])[0][0],
            "nodes": dict(rows("SELECT id, status FROM nodes")),
            "served": [
                json.loads(r[1]).get("to")
                for r in rows("SELECT kind, payload FROM events WHERE kind IN ('seed', 'promote', 'rollback')")
            ],
            "tools": [
                dict(zip(("id", "name", "version", "code_hash", "status", "origin"), r))
                for r in rows("SELECT id, name, version, code_hash, status, origin FROM tools")
            ],
            "evaluations": [
                dict(zip(("id", "status", "task_id"), r)) for r in rows("SELECT id, status, task_id FROM evaluations")
            ],
            "distilled": [json.loads(r[0]) for r in rows("SELECT evidence FROM events WHERE kind = 'distill'")],
        }
    finally:
        db.close()
    return state


class Invariants:
    """What must hold after any kill, and once the work has drained; each breach is a sentence."""

    def __init__(self, data_dir: Path, max_attempts: int = MAX_ATTEMPTS) -> None:
        self.data_dir = data_dir
        self.max_attempts = max_attempts
        self.ended: dict[str, tuple] = {}  # task -> (status, trajectories, steps) when first seen ended
        self.counts = Counter()

    def check(self, state: dict, submissions: list[Submission], *, final: bool) -> list[str]:
        found: list[str] = []
        tasks, runs = state["tasks"], state["runs"]
        if state["integrity"] != ["ok"]:
            found.append(f"integrity_check: {state['integrity'][:5]}")
        # Every acknowledged task is there, under its key; every reply for one key named the same task.
        for s in submissions:
            if s.unexpected:
                found.append(f"{s.key}: unexpected reply {s.unexpected}")
            if len(set(s.acked)) > 1:
                found.append(f"{s.key}: acknowledged as several tasks {sorted(set(s.acked))}")
            for task_id in set(s.acked):
                if task_id not in tasks:
                    self.counts["lost"] += 1
                    found.append(f"{s.key}: acknowledged task {task_id} is missing")
                elif tasks[task_id]["key"] != s.key:
                    found.append(f"{s.key}: task {task_id} carries the key {tasks[task_id]['key']!r}")
        by_key = Counter(t["key"] for t in tasks.values() if t["key"] is not None)
        for key, n in by_key.items():
            if n > 1:
                found.append(f"{n} tasks carry the Idempotency-Key {key}")
        # A task whose end was recorded never runs again: its trajectories and steps stay as they were.
        for task_id, task in tasks.items():
            if task["attempts"] > self.max_attempts:
                found.append(f"task {task_id} was claimed {task['attempts']} times (limit {self.max_attempts})")
            if task["status"] not in TERMINAL and task["status"] != "cancelled":
                continue
            seen = (task["status"], *runs.get(task_id, (0, 0, None))[:2])
            first = self.ended.setdefault(task_id, seen)
            if first != seen:
                self.counts["completed_twice"] += 1
                found.append(f"task {task_id} changed after it ended: {first} then {seen}")
            last_start = runs.get(task_id, (0, 0, None))[2]
            if last_start is not None and task["finished_at"] is not None and last_start > task["finished_at"]:
                self.counts["completed_twice"] += 1
                found.append(f"task {task_id} started a trajectory after it ended")
        # Only a validated node is ever served.
        for node_id in [state["incumbent"], *state["served"]]:
            if node_id is not None and state["nodes"].get(node_id) in (None, "proposed", "invalid"):
                found.append(f"node {node_id} is served but is {state['nodes'].get(node_id)}")
        # A synthesized tool is served only with files matching the hash its row recorded.
        from tools import ToolFileError, ToolFiles

        files = ToolFiles(self.data_dir / "tools")
        for tool in state["tools"]:
            if tool["origin"] == "synthesized" and tool["status"] == "active":
                self.counts["tools_checked"] += 1
                try:
                    files.read(tool["name"], tool["version"], tool["code_hash"])
                except ToolFileError as exc:
                    found.append(f"active tool row {tool['id']} has no matching files: {exc}")
        if final:
            for task_id, task in tasks.items():
                if task["status"] not in TERMINAL:
                    found.append(f"task {task_id} ({task['source']}) is {task['status']} after the work drained")
                elif task["status"] != "done" and not task["error"]:
                    found.append(f"task {task_id} is {task['status']} without a reason")
            if state["open_trajectories"]:
                found.append(
                    f"{len(state['open_trajectories'])} trajectories are still 'running' after the work "
                    f"drained: {state['open_trajectories'][:3]}"
                )
            for evaluation in state["evaluations"]:
                task = tasks.get(evaluation["task_id"]) if evaluation["task_id"] else None
                if evaluation["task_id"] and task is None:
                    found.append(f"evaluation {evaluation['id']} names a missing task")
                elif evaluation["status"] == "running" and task is not None and task["status"] in TERMINAL:
                    found.append(f"evaluation {evaluation['id']} is still running though its task ended")
            keys = {s.key for s in submissions}
            extra = [t for t in tasks.values() if t["source"] == "api" and t["key"] not in keys]
            if extra:
                found.append(f"{len(extra)} api tasks that no client submitted")
        return found


def distill_repeats(state: dict) -> int:
    """Trajectories that two distill events both learned from (a round repeated after a crash)."""
    seen = Counter(t for evidence in state["distilled"] for t in evidence)
    return sum(1 for n in seen.values() if n > 1)


def index_check(data_dir: Path) -> dict:
    """Reconcile the vector index with SQLite (after the daemon stopped) and compare their ids."""
    from memory import Store

    store = Store(data_dir)  # not Store.open, which would reconcile before we look
    try:
        repaired = store.reconcile()
        truth_sql = {
            "trajectories": "SELECT id FROM trajectories",
            "insights": "SELECT CAST(id AS TEXT) FROM insights WHERE status = 'active'",
            "tools": "SELECT CAST(id AS TEXT) FROM tools WHERE status = 'active'",
        }
        differences = {}
        for collection, sql in truth_sql.items():
            truth = {r[0] for r in store.database.writer.execute(sql).fetchall()}
            differences[collection] = len(truth ^ store.index.all_ids(collection))
        return {"repaired": sum(repaired.values()), "differences": differences, "integrity": store.check()}
    finally:
        store.close()


# --- the kill loop ------------------------------------------------------------------------------


def _post_job(daemon: DaemonProcess, job: str, outcome: dict) -> None:
    try:
        with daemon.client(timeout_s=300) as http:
            outcome["rounds"] = run_rounds(http, job)
    except (httpx.TransportError, ValueError, KeyError, AssertionError) as exc:
        outcome["error"] = type(exc).__name__


def _wait_stepping(daemon: DaemonProcess, task_id: str, timeout_s: float) -> bool:
    """Wait until the task runs and has taken a step; False if that did not happen in time."""
    deadline = time.monotonic() + timeout_s
    with daemon.client() as http:
        while time.monotonic() < deadline:
            task = daemon.task(http, task_id)
            if task["status"] == "running" and task["trajectories"] and task["trajectories"][-1]["steps"]:
                return True
            if task["status"] in TERMINAL:
                return False
            time.sleep(0.05)
    return False


def _kill_worker_of(daemon: DaemonProcess, task_id: str) -> int | None:
    """SIGKILL the worker process running ``task_id`` (not the daemon); its pid, None when none ran it."""
    with daemon.client() as http:
        running = http.get("/v1/status").json()["running"]
    pid = next((r.get("pid") for r in running if r["task_id"] == task_id), None)
    if pid:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return None
    return pid


def _chat_through_a_kill(daemon: DaemonProcess, cycle: int) -> tuple[dict, list[str]]:
    """A chat turn whose worker process is SIGKILLed between its steps: the request must still be answered,
    right, by the turn run again elsewhere. What happened, and what went wrong (sentences)."""
    outcome: dict = {}
    expected = str(cycle * 5)

    def chat() -> None:
        try:
            with daemon.client(timeout_s=120) as http:
                reply = http.post(
                    "/v1/chat/completions",
                    json={"model": "evolver", "messages": [{"role": "user", "content": f"SLOW: What is {cycle} * 5?"}]},
                )
                outcome["code"], outcome["body"] = reply.status_code, reply.json()
        except (httpx.HTTPError, ValueError) as exc:
            outcome["error"] = type(exc).__name__

    asking = threading.Thread(target=chat, name="drill-chat", daemon=True)
    asking.start()
    task_id, deadline = None, time.monotonic() + 60
    with daemon.client() as http:
        while task_id is None and time.monotonic() < deadline and asking.is_alive():
            task_id = next((r["task_id"] for r in http.get("/v1/status").json()["running"] if r.get("chat")), None)
            time.sleep(0.05)
    if task_id is None or not _wait_stepping(daemon, task_id, timeout_s=60):
        asking.join(120)
        return {"task": task_id, "reached": False}, []  # it ended before a kill could land (a busy machine)
    killed = _kill_worker_of(daemon, task_id)
    asking.join(120)
    with daemon.client() as http:
        task = daemon.task(http, task_id)
    seen = {"task": task_id, "reached": True, "worker_killed": killed, "attempts": task["attempts"]}
    answer = (outcome.get("body") or {}).get("choices", [{}])[0].get("message", {}).get("content", "").strip()
    if outcome.get("code") != 200 or answer != expected:
        return seen, [f"chat turn {task_id}, its worker killed, was answered {outcome} (expected {expected!r})"]
    if killed and task["attempts"] < 2:
        return seen, [f"chat turn {task_id} was answered after its worker died without running again: {task}"]
    return seen, []


def _settle_the_search(daemon: DaemonProcess, timeout_s: float) -> None:
    """Before an evolve round that will be killed: the first evaluations queued and recorded, none in
    flight, so the round goes further than queueing (an expansion: a proposal, its validation and
    smoke task; or finishing a node a kill left proposed)."""
    deadline = time.monotonic() + timeout_s
    with daemon.client(timeout_s=300) as http:

        def counts() -> tuple[int, int]:
            nodes = http.get("/v1/tree").json()["nodes"]
            return sum(n["in_flight"] for n in nodes), sum(n["successes"] + n["failures"] for n in nodes)

        def evaluating() -> bool:  # an evaluation ended but unrecorded (a kill) waits for the next step
            return any(
                http.get("/v1/tasks", params={"source": "evaluation", "status": status}).json()["tasks"]
                for status in ("queued", "running")
            )

        if counts() == (0, 0):
            run_rounds(http, "evolve")  # t = 0: queues the root's first evaluations
        while time.monotonic() < deadline and counts()[0] and evaluating():
            time.sleep(0.2)


def _wait_ended(daemon: DaemonProcess, task_ids: list[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    with daemon.client() as http:
        while time.monotonic() < deadline:
            if all(daemon.task(http, t)["status"] in TERMINAL for t in task_ids):
                return
            time.sleep(0.2)


def _wait_drained(daemon: DaemonProcess, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    with daemon.client() as http:
        while True:
            status = http.get("/v1/status").json()
            if not status["queue"].get("queued") and not status["queue"].get("running") and not status["running"]:
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"the work did not drain within {timeout_s:g} s: {status['queue']}\n{daemon.log()}"
                )
            time.sleep(0.3)


def kill_loop(root: Path, *, kills: int, seed: int, clients: int = 3, burst: int = 1, log=lambda message: None) -> dict:
    """Kill -9 a daemon ``kills`` times at seeded random points of its work, restart it each time, let the
    work drain, stop it, and check; returns the report (``violations`` lists every breach)."""
    started = time.monotonic()
    rng = random.Random(seed)
    daemon = DaemonProcess(root, model=write_script(root, "script", script_rules()), settings=durable_settings(root))
    submitters = Submitters(daemon, clients=clients, seed=seed)
    invariants = Invariants(daemon.data_dir)
    violations: list[str] = []
    kill_log: list[dict] = []
    index_left = 0
    percent: list[Submission] = []
    jobs_done: list[dict] = []
    try:
        submitters.start()
        for cycle in range(kills):
            phase = PHASES[cycle % len(PHASES)]
            daemon.start(timeout_s=300)
            submitters.release(clients * burst)
            if not percent:  # two tasks with the same code, for tool synthesis to generalize
                percent = [submitters.submit_now({"prompt": p}, f"percent-{n}") for n, p in enumerate(PERCENT_TASKS)]
            reached, job, worker_killed, chat = True, {}, None, None
            if phase == "worker":
                chat, wrong = _chat_through_a_kill(daemon, cycle)
                violations += [f"in kill {cycle + 1} ({phase}): {v}" for v in wrong]
            if phase in ("steps", "worker"):
                slow = submitters.submit_now(
                    {"prompt": f"SLOW: What is {cycle} * 3?", "check": {"type": "answer", "expected": str(cycle * 3)}},
                    f"slow-{cycle}",
                )
                reached = _wait_stepping(daemon, slow.acked[0], timeout_s=60)
                if phase == "worker" and reached:
                    worker_killed = _kill_worker_of(daemon, slow.acked[0])
            elif phase in ("distill", "evolve", "synthesize"):
                if phase == "synthesize":
                    _wait_ended(daemon, [p.acked[0] for p in percent], timeout_s=60)
                if phase == "evolve":
                    _settle_the_search(daemon, timeout_s=60)
                threading.Thread(target=_post_job, args=(daemon, phase, job), daemon=True).start()
            delay = rng.uniform(*KILL_WINDOW[phase])
            time.sleep(delay)
            daemon.kill()
            entry = {"cycle": cycle, "phase": phase, "after_s": round(delay, 3), "reached": reached}
            if phase == "worker":
                entry["worker_killed"], entry["chat"] = worker_killed, chat
            if phase in ("distill", "evolve", "synthesize"):
                time.sleep(0.2)
                entry["round_finished_before_kill"] = "rounds" in job
            kill_log.append(entry)
            state = read_state(daemon.data_dir)
            index_left += state["outbox"]
            found = invariants.check(state, submitters.acknowledged(), final=False)
            violations += [f"after kill {cycle + 1} ({phase}): {v}" for v in found]
            log(
                f"kill {cycle + 1}/{kills} during {phase} after {delay:.2f} s: {len(state['tasks'])} tasks, "
                f"{state['outbox']} index rows left, {len(found)} violations"
            )

        # The last start: finish the retries, one round of each job, then let everything drain.
        daemon.start(timeout_s=300)
        submitters.finish(timeout_s=300)
        for job in ("distill", "synthesize", "evolve"):
            outcome: dict = {}
            _post_job(daemon, job, outcome)
            jobs_done += outcome.get("rounds", [{"job": job, "ok": False, "summary": outcome.get("error")}])
        violations += [f"the {r['job']} round after the kills failed: {r['summary']}" for r in jobs_done if not r["ok"]]
        _wait_drained(daemon, timeout_s=600)
        code = daemon.terminate(timeout_s=120)
        if code != 0:
            violations.append(f"the last daemon exited with {code} on SIGTERM")
    finally:
        submitters.stop()
        daemon.kill()
        daemon.close()
    state = read_state(daemon.data_dir)
    acknowledged = submitters.acknowledged()
    violations += [f"at the end: {v}" for v in invariants.check(state, acknowledged, final=True)]
    index = index_check(daemon.data_dir)
    if index["repaired"] or any(index["differences"].values()):
        violations.append(f"the index disagreed with SQLite after the last stop: {index}")
    return {
        "kills": kills,
        "seed": seed,
        "phases": dict(Counter(k["phase"] for k in kill_log)),
        "acknowledged": len(acknowledged),
        "lost": invariants.counts["lost"],
        "completed_twice": invariants.counts["completed_twice"],
        "integrity": state["integrity"][0] if state["integrity"] == ["ok"] else state["integrity"],
        "index_repairs": index_left,
        "index_after_stop": index,
        "retried_after_a_transport_error": sum(1 for s in acknowledged if s.tries > 1),
        "replayed": sum(1 for s in acknowledged if 200 in s.codes),
        "tasks": dict(Counter(t["status"] for t in state["tasks"].values())),
        "tasks_by_source": dict(Counter(t["source"] for t in state["tasks"].values())),
        "nodes": dict(Counter(state["nodes"].values())),
        "synthesized_tools": sum(1 for t in state["tools"] if t["origin"] == "synthesized"),
        "jobs_interrupted": sum(1 for k in kill_log if k.get("round_finished_before_kill") is False),
        "distill_repeats": distill_repeats(state),
        "last_rounds": [{"job": r["job"], "ok": r["ok"], "summary": r["summary"][:160]} for r in jobs_done],
        "kill_log": kill_log,
        "violations": violations,
        "seconds": round(time.monotonic() - started, 1),
    }


# --- power loss -----------------------------------------------------------------------------------

SHIM = Path(__file__).with_name("fsync_snapshot.c")


def build_shim(directory: Path) -> Path | None:
    """Compile the fsync-snapshot library into ``directory``; None when there is no gcc."""
    gcc = shutil.which("gcc")
    if gcc is None:
        return None
    out = Path(directory) / "fsync_snapshot.so"
    built = subprocess.run(
        [gcc, "-shared", "-fPIC", "-O2", "-o", str(out), str(SHIM), "-ldl", "-lpthread"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if built.returncode != 0:
        raise AssertionError(f"gcc could not build {SHIM}:\n{built.stderr}")
    return out


def shim_env(shim: Path, data_dir: Path, snapshots: Path, exclude: str = "") -> dict:
    snapshots.mkdir(parents=True, exist_ok=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    return {
        "LD_PRELOAD": str(shim),
        "DURABLE_PREFIX": str(data_dir.resolve()),
        "DURABLE_SNAPSHOTS": str(snapshots.resolve()),
        "DURABLE_EXCLUDE": exclude,
    }


def power_loss_image(snapshots: Path, target: Path) -> list[str]:
    """The data dir as the disk holds it after a power cut: each file as of its last fsync; returns the
    files. The ``-shm`` WAL index is left out (the next open rebuilds it from the WAL)."""
    files = []
    for entry in sorted(Path(snapshots).iterdir()):
        if entry.name.startswith("."):
            continue
        relative = urllib.parse.unquote(entry.name)
        if relative.endswith("-shm"):
            continue
        destination = Path(target) / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(entry, destination)
        files.append(relative)
    return files


def sync_counts(snapshots: Path) -> Counter:
    """How many times each file was synced (and copied), from the shim's log."""
    log = Path(snapshots) / ".log"
    lines = log.read_text().splitlines() if log.exists() else []
    return Counter(line.split(" ", 1)[1] for line in lines if line.startswith("synced "))


def power_loss(
    root: Path,
    shim: Path,
    *,
    seed: int,
    clients: int = 4,
    run_s: tuple[float, float] = (0.5, 3.0),
    log=lambda message: None,
) -> dict:
    """A daemon under the fsync-snapshot shim takes submits (and runs them) until a SIGKILL at a random
    moment; the data dir rebuilt from the snapshots alone must hold every acknowledged task."""
    started = time.monotonic()
    rng = random.Random(seed)
    data_dir, snapshots, image = root / "data", root / "snapshots", root / "image"
    env = shim_env(shim, data_dir, snapshots, exclude="index/")  # the vector index is rebuilt from SQLite
    daemon = DaemonProcess(
        root,
        model=write_script(root, "script", script_rules()),
        settings={**durable_settings(root), **env},
        name="power",
    )
    submitters = Submitters(daemon, clients=clients, seed=seed, slow_share=0.0)
    try:
        daemon.start(timeout_s=300)
        submitters.start()
        submitters.release(100_000)  # as fast as they are answered
        began = time.monotonic()
        # Until a checkpoint has synced the database file itself (or a minute passed), then a little more.
        wait_for(
            lambda: sync_counts(snapshots).get("evolver.db", 0) >= 2 or time.monotonic() - began > 60,
            timeout_s=120,
            what="a checkpoint",
            interval_s=0.2,
        )
        time.sleep(rng.uniform(*run_s))
        run = time.monotonic() - began
        daemon.kill()  # the power goes out: only what was fsynced is on the disk
    finally:
        submitters.stop()
        daemon.close()
    acknowledged = submitters.acknowledged()
    files = power_loss_image(snapshots, image)
    syncs = sync_counts(snapshots)
    log(f"power cut after {run:.2f} s: {len(acknowledged)} acknowledged; image: {files}; syncs: {dict(syncs)}")
    if "evolver.db" not in files:
        raise AssertionError(f"the shim copied no evolver.db (did it load?): {files}, log: {dict(syncs)}")
    db = sqlite3.connect(image / "evolver.db")  # read-write, as a restarted daemon would: WAL recovery runs
    try:
        integrity = [r[0] for r in db.execute("PRAGMA integrity_check")]
        in_image = dict(db.execute("SELECT id, idempotency_key FROM tasks").fetchall())
    finally:
        db.close()
    after_kill = read_state(data_dir)["tasks"]
    lost = [s.key for s in acknowledged if s.acked[0] not in in_image or in_image[s.acked[0]] != s.key]
    # And the store opens on it, and reads every acknowledged task.
    from memory import Store

    with Store(image) as store:
        readable = (
            sum(1 for s in acknowledged if store.inbox.get_task(s.acked[0]).idempotency_key == s.key) if not lost else 0
        )
        store_check = store.check()
    return {
        "acknowledged": len(acknowledged),
        "lost": len(lost),
        "lost_keys": lost[:10],
        "readable_through_the_store": readable,
        "integrity": integrity[0] if integrity == ["ok"] else integrity,
        "store_check": store_check,
        "tasks_in_image": len(in_image),
        "tasks_on_disk_after_kill": len(after_kill),  # with the writes never synced: the image has none of those
        "wal_syncs": syncs.get("evolver.db-wal", 0),
        "db_syncs": syncs.get("evolver.db", 0),
        "run_s": round(run, 2),
        "seconds": round(time.monotonic() - started, 1),
    }
