"""Evaluations on the local backend against Ray on the same machine, in one run; prints JSON.

    python benchmarks/eval_bench.py [--evaluations 20] [--warmup 4] [--quick] [--out FILE]

Each backend runs in a real daemon (``evolver up --foreground`` in a child
process) on a fresh data dir, twice: one evaluation at a time (the local
backend with one worker, Ray with ``[advanced.evaluator] in_flight = 1``), which gives
each evaluation's latency, and two at a time (two workers; ``in_flight = 2``),
which gives evaluations/s on this machine. Ray is the daemon's private
instance (``[evaluator]`` with no address: ``ray.init()`` on loopback), so its
figures include shipping each evaluation to a Ray worker process and
recording what comes back, but no network.

An evaluation here is what the tree search queues: a task of source
"evaluation" naming the node whose scaffold it tests (the root), with an
answer check, seeded into the store before the daemon starts. The scripted
model finishes on its first call, so an evaluation is one model call, one
step and the verdict: what is measured is the machinery around the agent, not
the agent. The first ``--warmup`` evaluations (claimed first, by priority) are
left out of the figures but reported: on Ray they include starting the worker
processes and importing evolver there.

Figures, from the daemon's own clock in the store (a task's first claim,
``started_at``, and its end, ``finished_at``):

- latency_ms: per evaluation, claim to recorded end, one at a time;
- evaluations_per_s: the measured evaluations over the span from the first
  one's claim to the last one's end, two at a time;
- overhead_per_evaluation_ms: Ray's latency less the local backend's (p50 and
  mean), what running an evaluation on Ray rather than on a worker costs (a
  negative figure: saves); and Ray's latency less the time the evaluation ran
  on its node (``on_node_ms``, from the evaluator's log line), what the daemon
  and Ray add around it: claim, ship, scheduling, transport, replay.

The two backends do not write alike: a worker commits each step durably as it
happens (live steps), a Ray evaluation's records are replayed in one
transaction when it comes back, so on one machine Ray can be the faster.

The benchmark reports; it never asserts timings. Exit 2 when a daemon does not
start or an evaluation does not finish in time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

ONE_STEP = {"rules": [{"match": "", "tool": "finish", "arguments": {"answer": "ok"}}]}
TERMINAL = ("done", "failed", "cancelled", "dead")


class BenchFailed(RuntimeError):
    pass


def seed(data_dir: Path, env: dict, warmup: int, evaluations: int) -> tuple[list[str], list[str]]:
    """The root node and the evaluation tasks of it, written before the daemon starts; returns the ids of
    the warm-up tasks and of the measured ones."""
    from evolver.agent.scaffold import default_scaffold
    from evolver.config import load_config
    from evolver.storage import open_store
    from evolver.tree.incumbent import ensure_root

    config = load_config(env=env)
    store = open_store(config, data_dir=data_dir)
    try:
        root = ensure_root(store, default_scaffold())
        items = [
            {
                "prompt": f"Evaluation {n}: answer ok",
                "check": {"type": "answer", "expected": "ok"},
                "source": "evaluation",
                "priority": 1 if n < warmup else 0,
                "metadata": {"node": root.id},
            }
            for n in range(warmup + evaluations)
        ]
        ids = [task.id for task, _ in store.inbox.add_tasks(items)]
    finally:
        store.close()
    return ids[:warmup], ids[warmup:]


def run_backend(root: Path, *, backend: str, at_once: int, warmup: int, evaluations: int, timeout_s: float) -> dict:
    name = f"{backend}-{at_once}"
    script = root / "one_step.json"
    script.write_text(json.dumps(ONE_STEP), encoding="utf-8")
    data_dir = root / f"{name}-data"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EVOLVER_", "RAY_"))}
    env.update(
        {
            "EVOLVER_MODEL_NAME": "scripted/" + str(script.absolute()),
            "EVOLVER_DAEMON_DATA_DIR": str(data_dir),
            "EVOLVER_DAEMON_RUNTIME_DIR": str(root / f"{name}-run"),
            "EVOLVER_DAEMON_WORKERS": str(at_once),
            "EVOLVER_EVOLUTION_ENABLED": "false",
            "EVOLVER_EVOLUTION_EVALUATION_SLOTS": "0",  # the search hands out nothing of its own
            "EVOLVER_EVALUATOR_BACKEND": f'"{backend}"',
            "EVOLVER_EVALUATOR_IN_FLIGHT": str(at_once),
            "PYTHONUNBUFFERED": "1",
        }
    )
    warm, measured = seed(data_dir, env, warmup, evaluations)
    log_path = root / f"{name}.log"
    started = time.monotonic()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "evolver", "up", "--foreground"],
            cwd=str(REPO),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    try:
        rows = wait_for_tasks(data_dir / "evolver.db", warm + measured, proc, log_path, started + timeout_s)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
    ended: dict[str, int] = {}
    for t in measured:
        ended[rows[t]["status"]] = ended.get(rows[t]["status"], 0) + 1
    if ended.get("done", 0) < len(measured):  # reported, and left out of the figures; the log says why
        errors = sorted({str(rows[t]["error"])[:300] for t in warm + measured if rows[t]["status"] != "done"})
        print(f"{name}: not every evaluation was done: {ended}; {errors}; see {log_path}", file=sys.stderr)
    measured = [t for t in measured if rows[t]["status"] == "done"]
    if not measured:
        raise BenchFailed(f"{name}: no evaluation was done; see {log_path}")
    latency = [(rows[t]["finished_at"] - rows[t]["started_at"]) * 1000 for t in measured]
    span = max(rows[t]["finished_at"] for t in measured) - min(rows[t]["started_at"] for t in measured)
    figures = {
        "evaluations": len(measured),
        "ended": ended,
        "at_once": at_once,
        "latency_ms": spread(latency),
        "evaluations_per_s": round(len(measured) / span, 2) if span > 0 else None,
        "warmup_latency_ms": [round((rows[t]["finished_at"] - rows[t]["started_at"]) * 1000, 1) for t in warm],
    }
    if backend == "ray":
        # The Ray evaluator logs the time each evaluation took on its node ("evaluation task X: done in S s on
        # N"); the rest of its latency is the daemon's side: claim, ship, Ray's scheduling and transport, replay.
        on_node = {}
        for line in log_path.read_text(errors="replace").splitlines():
            if "evaluation task " in line and ": done in " in line:
                task_id = line.split("evaluation task ", 1)[1].split(":", 1)[0]
                on_node[task_id] = float(line.split(": done in ", 1)[1].split(" s", 1)[0]) * 1000
        if all(t in on_node for t in measured):
            figures["on_node_ms"] = spread([on_node[t] for t in measured])
            figures["around_node_ms"] = spread([lat - on_node[t] for lat, t in zip(latency, measured)])
    return figures


def spread(values_ms: list[float]) -> dict:
    ordered = sorted(values_ms)
    return {
        "p50": round(statistics.median(ordered), 1),
        "mean": round(statistics.fmean(ordered), 1),
        "p90": round(ordered[int(0.9 * (len(ordered) - 1))], 1),
        "max": round(ordered[-1], 1),
    }


def wait_for_tasks(db: Path, ids: list[str], proc: subprocess.Popen, log_path: Path, deadline: float) -> dict:
    """Poll the store (read-only) until every task in ``ids`` ended; returns their rows by id."""
    marks = ",".join("?" * len(ids))
    while True:
        if proc.poll() is not None:
            raise BenchFailed(f"the daemon exited with {proc.returncode}; see {log_path}")
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
                conn.row_factory = sqlite3.Row
                rows = {
                    r["id"]: dict(r)
                    for r in conn.execute(
                        f"SELECT id, status, error, started_at, finished_at FROM tasks WHERE id IN ({marks})", ids
                    )
                }
        except sqlite3.OperationalError:  # a moment of a write lock, or the file not there yet
            rows = {}
        if len(rows) == len(ids) and all(r["status"] in TERMINAL for r in rows.values()):
            return rows
        if time.monotonic() > deadline:
            left = sum(1 for r in rows.values() if r["status"] not in TERMINAL)
            raise BenchFailed(f"{left} evaluations had not ended by the deadline; see {log_path}")
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evaluations", type=int, default=None, help="measured evaluations per run (default 20)")
    parser.add_argument("--warmup", type=int, default=4, help="evaluations run first and left out of the figures")
    parser.add_argument("--quick", action="store_true", help="5 evaluations a run, for a smoke run")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="for each run")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    args.evaluations = args.evaluations or (5 if args.quick else 20)
    try:
        import ray
    except ImportError:
        print("Ray is not installed: pip install 'evolver[ray]'", file=sys.stderr)
        return 2

    report: dict = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "ray": ray.__version__},
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }
    with tempfile.TemporaryDirectory(prefix="eveb-", dir="/tmp") as tmp:
        try:
            for backend in ("local", "ray"):
                report[backend] = {
                    "one_at_a_time": run_backend(
                        Path(tmp),
                        backend=backend,
                        at_once=1,
                        warmup=args.warmup,
                        evaluations=args.evaluations,
                        timeout_s=args.timeout_s,
                    ),
                    "two_at_a_time": run_backend(
                        Path(tmp),
                        backend=backend,
                        at_once=2,
                        warmup=args.warmup,
                        evaluations=args.evaluations,
                        timeout_s=args.timeout_s,
                    ),
                }
        except BenchFailed as exc:
            print(str(exc), file=sys.stderr)
            for log in sorted(Path(tmp).glob("*.log")):
                print(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}", file=sys.stderr)
            return 2
    local, on_ray = report["local"]["one_at_a_time"], report["ray"]["one_at_a_time"]
    report["overhead_per_evaluation_ms"] = {
        # Ray's latency less the local backend's: what choosing Ray costs (or saves) an evaluation here.
        "ray_less_local_p50": round(on_ray["latency_ms"]["p50"] - local["latency_ms"]["p50"], 1),
        "ray_less_local_mean": round(on_ray["latency_ms"]["mean"] - local["latency_ms"]["mean"], 1),
        # What the daemon and Ray add around the evaluation's run on its node.
        "ray_around_node_p50": on_ray.get("around_node_ms", {}).get("p50"),
    }
    report["evaluations_per_s"] = {
        backend: {k: report[backend][k]["evaluations_per_s"] for k in ("one_at_a_time", "two_at_a_time")}
        for backend in ("local", "ray")
    }
    local_2, ray_2 = report["local"]["two_at_a_time"], report["ray"]["two_at_a_time"]
    report["ray_over_local_evaluations_per_s"] = (
        round(ray_2["evaluations_per_s"] / local_2["evaluations_per_s"], 2) if local_2["evaluations_per_s"] else None
    )
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
