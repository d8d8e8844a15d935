"""Submits from several processes at once while a long event stream is read; prints JSON.

    python benchmarks/reliability_load.py [--submits 500] [--processes 5] [--connections 20]
                                          [--workers 1] [--sse-steps 100] [--step-sleep-s 0.2] [--out FILE]

The daemon is a real ``evolver up --foreground`` child (``api_bench.Daemon``)
on a fresh data dir, with a scripted model of three rules: a task that starts
with ``LONG`` calls ``run_python`` (sleep, print a tick) again and again and
finishes after ``--sse-steps`` ticks; every other task finishes on its first
model call. The seed scaffold's step limit is raised so the long task fits.

In order, against the one daemon:

1. the long task is submitted and a consumer (a thread in this process, httpx)
   starts reading ``GET /v1/tasks/{id}/events`` once its first step exists;
2. warm-up: one submitter process sends a small burst (and one task listing),
   so one-time allocations happen before the daemon's RSS is read
   (``/proc/<pid>/status`` VmRSS, "before");
3. floor: ``--processes`` submitter processes x ``--connections`` keep-alive
   connections send ``GET /v1/health`` as fast as they are answered, the same
   count and layout as the submits that follow;
4. load: the same processes send ``--submits`` ``POST /v1/tasks`` in all, each
   with a unique prompt marker and ``Idempotency-Key``; acknowledgement
   latency (send to 201) per submit, submits/s over the burst;
5. verification: every task listed through ``GET /v1/tasks`` paging; an acked
   id missing is "lost", a marker or id listed more than once is "duplicated";
   ``--replays`` submits are sent again with the same key and body (200,
   ``Idempotent-Replayed``, the same id, no new task);
6. the event stream is read to its ``end``; its step events are checked
   against the task's stored steps ("sse_gaps": stored steps the stream
   skipped; "sse_repeated", "sse_in_order" beside it; "sse_steps_during_load"
   shows the stream was live during the burst); the RSS is read again
   ("after"). At 500 submits the burst lasts about a second, so its latencies
   are noisy; a larger ``--submits`` (with ``--sse-steps`` to match) steadies
   them and shows whether the RSS growth scales with the submits.

The submitter processes are this script in ``--submitter`` mode: each opens its
connections, says ``ready``, waits for ``go`` on stdin (so all processes start
together) and writes its results to a JSON file. Their requests are written by
hand as in ``api_bench.py`` (httpx costs the client more CPU than the daemon
spends). The benchmark reports; it never asserts timings. Exit 0, or 2 when
the daemon does not start, 3 when a submit is refused, lost or duplicated, or
the stream has gaps.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from api_bench import Daemon, DaemonFailed, RawClient, list_all, pct, run_loop  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
THIS = Path(__file__).resolve()
TICK = "LOAD-TICK"


# --- the daemon's script and scaffold ------------------------------------------------------------


def load_rules(steps: int, sleep_s: float) -> list[dict]:
    """A task whose text starts with LONG ticks ``steps`` times then finishes; any other task finishes at once.

    Each tick appends to a file in the task's workspace and prints the count, so the finishing rule reads
    only the latest tool output (a pattern counting ticks across the whole conversation backtracks
    exponentially while it fails, and the scripted model would hold the daemon's GIL meanwhile)."""
    code = (
        f"import time; time.sleep({sleep_s!r}); f = open('ticks', 'a'); f.write('.'); f.close(); "
        "print('LOAD-TICK', len(open('ticks').read()))"
    )
    return [
        {
            "match": rf"\b{TICK} {steps}\b",
            "on": "last",
            "role": "tool",
            "tool": "finish",
            "arguments": {"answer": "ticked"},
        },
        {"match": r"\ATask:\nLONG", "on": "task", "tool": "run_python", "arguments": {"code": code}},
        {"match": "", "tool": "finish", "arguments": {"answer": "ok"}},
    ]


def write_long_scaffold(path: Path, max_steps: int) -> Path:
    """The bundled seed scaffold with its step limit raised to ``max_steps`` (its limit is 20)."""
    scaffold = json.loads((REPO / "evolver" / "data" / "scaffold.json").read_text(encoding="utf-8"))
    scaffold["parameters"]["max_steps"] = max_steps
    scaffold["parameters"]["repeat_limit"] = 0  # its ticks are one call made again on purpose, not a loop
    path.write_text(json.dumps(scaffold, indent=2), encoding="utf-8")
    return path


def long_prompt(run: str) -> str:
    return f"LONG load-test stream {run}: keep ticking"


# --- submitter processes -------------------------------------------------------------------------


def submit_body(marker: str) -> dict:
    return {"prompt": f"load task {marker}: answer ok", "metadata": {"marker": marker}}


async def _submitter(args) -> dict:
    clients = [await RawClient(args.socket).open() for _ in range(args.connections)]
    # All processes open their connections first, then start together on "go".
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    results: list[list] = []
    indices = iter(range(args.count))

    async def one(client: RawClient) -> None:
        for i in indices:  # a shared iterator: each connection takes the next request when its last is answered
            marker = f"{args.run}-{args.index}-{i}"
            if args.kind == "health":
                method, target, body, headers = "GET", "/v1/health", None, None
            else:
                method, target, body, headers = "POST", "/v1/tasks", submit_body(marker), {"Idempotency-Key": marker}
            sent = time.perf_counter()
            try:
                response = await asyncio.wait_for(client.request(method, target, body, headers), args.timeout_s)
            except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError) as exc:
                results.append([marker, 0, None, (time.perf_counter() - sent) * 1000, f"{type(exc).__name__}: {exc}"])
                return  # this connection is no longer usable
            ms = (time.perf_counter() - sent) * 1000
            task_id = response.json().get("id") if response.status in (200, 201) and args.kind == "submit" else None
            error = None if response.status in (200, 201) else response.body[:300].decode("utf-8", "replace")
            results.append([marker, response.status, task_id, ms, error])

    started = time.perf_counter()
    await asyncio.gather(*(one(c) for c in clients))
    seconds = time.perf_counter() - started
    for c in clients:
        await c.close()
    return {"index": args.index, "kind": args.kind, "seconds": seconds, "started": started, "results": results}


def submitter_main(args) -> int:
    report, _ = run_loop(_submitter(args))
    # A file, not stdout: after uvloop has run, a write to a full stdout pipe can be cut at 64 KiB.
    Path(args.results).write_text(json.dumps(report, separators=(",", ":")), encoding="utf-8")
    return 0


def run_submitters(
    socket_path: str | os.PathLike,
    *,
    run: str,
    processes: int,
    count: int,
    connections: int,
    kind: str = "submit",
    timeout_s: float = 300.0,
) -> dict:
    """``processes`` submitter processes share ``count`` requests (by index), all started together.

    Returns {"results": [[marker, status, id, ms, error], ...], "seconds": wall from "go" to the last answer,
    "go" and "done" (``time.perf_counter()``), "processes": [per-process seconds]}. A process that fails
    raises RuntimeError with its stderr."""
    shares = [count // processes + (1 if p < count % processes else 0) for p in range(processes)]
    procs = []
    tmp = tempfile.TemporaryDirectory(prefix="evrl-results-")
    files = [Path(tmp.name) / f"{p}.json" for p in range(processes)]
    try:
        for p, share in enumerate(shares):
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        str(THIS),
                        "--submitter",
                        "--socket",
                        str(socket_path),
                        "--run",
                        run,
                        "--index",
                        str(p),
                        "--count",
                        str(share),
                        "--connections",
                        str(connections),
                        "--kind",
                        kind,
                        "--timeout-s",
                        str(timeout_s),
                        "--results",
                        str(files[p]),
                    ],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    cwd=str(REPO),
                )
            )
        for proc in procs:
            line = proc.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"a submitter did not get ready ({line!r}): {proc.communicate(timeout=30)[1]}")
        go = time.perf_counter()
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        reports = []
        for proc, path in zip(procs, files):
            _, err = proc.communicate(timeout=timeout_s)
            if proc.returncode != 0:
                raise RuntimeError(f"a submitter exited with {proc.returncode}: {err[-2000:]}")
            reports.append(json.loads(path.read_text(encoding="utf-8")))
        done = time.perf_counter()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        tmp.cleanup()
    return {
        "results": [r for rep in reports for r in rep["results"]],
        "seconds": done - go,
        "go": go,
        "done": done,
        "processes": [round(rep["seconds"], 3) for rep in reports],
    }


# --- the long event stream -----------------------------------------------------------------------


class StreamReader(threading.Thread):
    """Reads a task's server-sent events to ``end`` on its own connection; keeps (event, id, data)."""

    def __init__(self, socket_path: str | os.PathLike, task_id: str, timeout_s: float = 120.0) -> None:
        super().__init__(daemon=True, name="sse-reader")
        self.socket_path, self.task_id, self.timeout_s = str(socket_path), task_id, timeout_s
        self.events: list[tuple[str, int | None, dict]] = []
        self.received: list[float] = []  # time.perf_counter() when each event arrived
        self.error: BaseException | None = None
        self.status: int | None = None

    def run(self) -> None:
        import httpx

        from evolver.cli.client import server_events

        try:
            with httpx.Client(
                transport=httpx.HTTPTransport(uds=self.socket_path), base_url="http://evolver", timeout=self.timeout_s
            ) as http:
                with http.stream("GET", f"/v1/tasks/{self.task_id}/events") as response:
                    self.status = response.status_code
                    for event in server_events(response):
                        self.events.append(event)
                        self.received.append(time.perf_counter())
        except BaseException as exc:  # reported by the caller
            self.error = exc


def stream_gaps(events: list[tuple[str, int | None, dict]], stored: list[tuple[int, int]]) -> dict:
    """Compare the stream's step events with the task's stored steps, each as (attempt, seq).

    Returns {"steps", "gaps" (stored steps the stream never delivered), "repeated", "unknown" (delivered
    steps that are not stored), "in_order" (delivered in the stored order), "ids_increasing", "ended",
    "end_status"}."""
    steps = [(e[1], e[2]) for e in events if e[0] == "step"]
    ids = [i for i, _ in steps]
    got = [(d.get("attempt"), d.get("seq")) for _, d in steps]
    position = {step: n for n, step in enumerate(stored)}
    seen = [position[s] for s in got if s in position]
    end = events[-1] if events and events[-1][0] == "end" else None
    return {
        "steps": len(steps),
        "gaps": len(set(stored) - set(got)),
        "repeated": len(got) - len(set(got)),
        "unknown": len([s for s in got if s not in position]),
        "in_order": all(b > a for a, b in zip(seen, seen[1:])),
        "ids_increasing": None not in ids and all(b > a for a, b in zip(ids, ids[1:])),
        "ended": end is not None,
        "end_status": end[2].get("status") if end else None,
    }


def stored_steps(task: dict) -> list[tuple[int, int]]:
    """(attempt, seq) of every stored step of a task from ``GET /v1/tasks/{id}``, in order."""
    return [(t["attempt"], s["seq"]) for t in task["trajectories"] for s in t["steps"]]


def rss_mb(pid: int) -> float:
    """A process's resident set (VmRSS) in MiB."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


# --- the benchmark ---------------------------------------------------------------------------


def latency_summary(ms: list[float], seconds: float) -> dict:
    return {
        "requests": len(ms),
        "p50_ms": pct(ms, 0.50),
        "p99_ms": pct(ms, 0.99),
        "max_ms": round(max(ms), 3) if ms else None,
        "seconds": round(seconds, 3),
        "per_s": round(len(ms) / seconds, 1) if seconds > 0 else None,
    }


async def _verify(socket_path: str, acked: dict[str, str], others: set[str], replays: int) -> dict:
    """Lost and duplicated among the ``acked`` submits (marker -> id) and ``others`` (ids also submitted
    in this run), every task listed through ``GET /v1/tasks``; then replays by key."""
    client = await RawClient(socket_path).open()
    try:
        listed = await list_all(client)
        ids = [t["id"] for t in listed]
        by_marker: dict[str, list[str]] = {}
        for t in listed:
            by_marker.setdefault((t.get("metadata") or {}).get("marker", ""), []).append(t["id"])
        present = set(ids)
        lost = [tid for tid in [*acked.values(), *others] if tid not in present]
        duplicated = (len(ids) - len(present)) + sum(len(v) - 1 for k, v in by_marker.items() if k)
        unexpected = len(present - set(acked.values()) - others)
        step = max(1, len(acked) // max(1, replays))
        sample = list(acked.items())[::step][:replays]
        same = 0
        for marker, tid in sample:
            r = await client.request("POST", "/v1/tasks", submit_body(marker), {"Idempotency-Key": marker})
            same += r.status == 200 and r.headers.get("idempotent-replayed") == "true" and r.json().get("id") == tid
        after = await list_all(client)
        return {
            "listed": len(listed),
            "lost": lost,
            "duplicated": duplicated,
            "unexpected": unexpected,
            "replayed": len(sample),
            "replay_same_task": same,
            "listed_after_replay": len(after),
        }
    finally:
        await client.close()


async def _submit_one(socket_path: str, body: dict) -> dict:
    client = await RawClient(socket_path).open()
    try:
        r = await client.request("POST", "/v1/tasks", body)
        if r.status != 201:
            raise RuntimeError(f"the long task was refused: HTTP {r.status} {r.body[:300]!r}")
        return r.json()
    finally:
        await client.close()


async def _get(socket_path: str, target: str) -> dict:
    client = await RawClient(socket_path).open()
    try:
        return (await client.request("GET", target)).json()
    finally:
        await client.close()


def _wait(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise RuntimeError(f"timed out after {timeout_s:g} s waiting for {what}")


def run_benchmark(args, root: Path) -> dict:
    run = uuid.uuid4().hex[:8]
    daemon = Daemon(root, workers=args.workers, name="load")
    script = root / "load_script.json"
    script.write_text(json.dumps({"rules": load_rules(args.sse_steps, args.step_sleep_s)}), encoding="utf-8")
    daemon.env.update(
        {
            "EVOLVER_MODEL_NAME": "scripted/" + str(script),
            "EVOLVER_AGENT_SEED_SCAFFOLD": str(write_long_scaffold(root / "scaffold.json", args.sse_steps + 10)),
            # Idle, the tree search would submit evaluation tasks of its own; this run counts every task.
            "EVOLVER_EVOLUTION_EVALUATION_SLOTS": "0",
        }
    )
    report: dict = {}
    daemon.start()
    try:
        sock = daemon.socket
        pid = daemon.proc.pid
        t_start = time.perf_counter()
        long_task = run_loop(_submit_one(sock, {"prompt": long_prompt(run), "priority": 100}))[0]
        _wait(
            lambda: run_loop(_get(sock, f"/v1/tasks/{long_task['id']}"))[0]["status"] != "queued",
            120,
            "the long task to start",
        )
        reader = StreamReader(sock, long_task["id"], timeout_s=120.0)
        reader.start()
        _wait(lambda: reader.events or reader.error, 120, "the first step event")

        warm = run_submitters(
            sock, run=run + "w", processes=1, count=args.connections * 2, connections=args.connections
        )
        run_loop(_get(sock, "/v1/tasks?limit=1000"))
        time.sleep(0.5)
        rss_before = rss_mb(pid)

        floor = run_submitters(
            sock,
            run=run + "h",
            processes=args.processes,
            count=args.submits,
            connections=args.connections,
            kind="health",
        )
        health_ms = [r[3] for r in floor["results"] if r[1] == 200]

        load = run_submitters(sock, run=run, processes=args.processes, count=args.submits, connections=args.connections)
        acked = {r[0]: r[2] for r in load["results"] if r[1] == 201}
        refused = [r for r in load["results"] if r[1] != 201]
        ack_ms = [r[3] for r in load["results"] if r[1] == 201]

        others = {r[2] for r in warm["results"] if r[1] == 201} | {long_task["id"]}
        verify, _ = run_loop(_verify(sock, acked, others, args.replays))

        reader.join(max(60.0, args.sse_steps * args.step_sleep_s * 10))
        task = run_loop(_get(sock, f"/v1/tasks/{long_task['id']}"))[0]
        sse = stream_gaps(reader.events, stored_steps(task))
        time.sleep(0.5)
        rss_after = rss_mb(pid)
        seconds = time.perf_counter() - t_start
    finally:
        daemon.stop()

    report.update(
        {
            "submits": args.submits,
            "acknowledged": len(acked),
            "lost": len(verify["lost"]),
            "duplicated": verify["duplicated"],
            "unexpected_tasks": verify["unexpected"],
            "refused": len(refused),
            "processes": args.processes,
            "connections_per_process": args.connections,
            "workers": args.workers,
            "ack_p50_ms": pct(ack_ms, 0.50),
            "ack_p99_ms": pct(ack_ms, 0.99),
            "ack_max_ms": round(max(ack_ms), 3) if ack_ms else None,
            "submits_per_s": round(len(ack_ms) / load["seconds"], 1) if load["seconds"] > 0 else None,
            "health_floor": latency_summary(health_ms, floor["seconds"]),
            "ack_p50_over_health_p50": (
                round(pct(ack_ms, 0.5) / pct(health_ms, 0.5), 2) if ack_ms and health_ms else None
            ),
            "replays": {
                "sent": verify["replayed"],
                "same_task_200_replayed": verify["replay_same_task"],
                "tasks_listed_before": verify["listed"],
                "tasks_listed_after": verify["listed_after_replay"],
            },
            "rss_before_mb": round(rss_before, 1),
            "rss_after_mb": round(rss_after, 1),
            "rss_growth_mb": round(rss_after - rss_before, 1),
            "sse_events": len(reader.events),
            "sse_steps": sse["steps"],
            "sse_gaps": sse["gaps"],
            "sse_repeated": sse["repeated"],
            "sse_in_order": sse["in_order"],
            "sse_ids_increasing": sse["ids_increasing"],
            "sse_end_status": sse["end_status"],
            "sse_error": repr(reader.error) if reader.error else None,
            "sse_steps_during_load": sum(load["go"] <= t <= load["done"] for t in reader.received),
            "long_task_running_after_load": bool(reader.received) and reader.received[-1] > load["done"],
            "load_seconds": round(load["seconds"], 3),
            "seconds": round(seconds, 3),
            "daemon_start_s": round(daemon.start_s or 0.0, 1),
        }
    )
    if refused:
        report["first_refused"] = refused[:5]
    if verify["lost"]:
        report["first_lost"] = verify["lost"][:5]
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submits", type=int, default=500, help="submits in the load burst, all processes together")
    parser.add_argument("--processes", type=int, default=5, help="submitter processes")
    parser.add_argument("--connections", type=int, default=20, help="keep-alive connections per process")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="the daemon's workers (1: the long task holds it, the submits wait in the queue)",
    )
    parser.add_argument("--sse-steps", type=int, default=100, help="tool steps the long task takes")
    parser.add_argument("--step-sleep-s", type=float, default=0.2, help="how long each of its tool calls sleeps")
    parser.add_argument("--replays", type=int, default=20, help="submits sent again with the same key")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    # --submitter mode (how this script runs its own load processes)
    parser.add_argument("--submitter", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--socket", help=argparse.SUPPRESS)
    parser.add_argument("--run", help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--kind", choices=("submit", "health"), default="submit", help=argparse.SUPPRESS)
    parser.add_argument("--timeout-s", type=float, default=300.0, help=argparse.SUPPRESS)
    parser.add_argument("--results", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.submitter:
        return submitter_main(args)

    # A SIGTERM (say, from ``timeout``) unwinds through the finally blocks, so the daemon child is stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="evrl-", dir="/tmp") as tmp:
        try:
            body = run_benchmark(args, Path(tmp))
        except DaemonFailed as exc:
            print(str(exc), file=sys.stderr)
            return 2
    report = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_avg_1m": round(os.getloadavg()[0], 2),
        },
        **body,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    failed = (
        report["acknowledged"] != report["submits"]
        or report["lost"]
        or report["duplicated"]
        or report["unexpected_tasks"]
        or report["sse_gaps"]
        or report["sse_repeated"]
        or not report["sse_in_order"]
        or not report["sse_ids_increasing"]
        or report["sse_end_status"] is None
        or report["replays"]["same_task_200_replayed"] != report["replays"]["sent"]
        or report["replays"]["tasks_listed_after"] != report["replays"]["tasks_listed_before"]
    )
    return 3 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
