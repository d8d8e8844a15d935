"""Benchmark what one tool call costs in the sandbox; prints JSON.

    python benchmarks/sandbox_bench.py [--runs 40] [--calls 500] [--out FILE]

Three figures, each beside a floor measured in the same run and interleaved
with it round by round, because the machine is shared and noisy:

* a fresh sandbox per call: ``python3 -c pass`` inside bubblewrap (namespaces,
  mounts, prlimit, and setpriv when the daemon is root) against the same
  ``python3 -c pass`` started as a plain subprocess by the same runner, with the
  same interpreter, flags, cleared environment and working directory. Target:
  <= 1.6x plain. Reported twice: with default startup (site-packages and their
  .pth files load) and with ``-I -S`` on BOTH sides (a bare interpreter, where the
  sandbox's fixed cost weighs more).
* the sandbox's fixed cost alone: ``true`` inside bubblewrap.
* a warm per-task worker: one ``PythonWorker.call`` of a trivial function
  (request and reply as JSON lines over pipes). Target: <= 3 ms median.

The benchmark reports; it never asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sandbox import Limits, make_sandbox  # noqa: E402
from sandbox.process import run_process  # noqa: E402

TARGET_FRESH_RATIO = 1.6
TARGET_WORKER_MS = 3.0


def median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 3)


def timed(fn) -> float:
    start = time.perf_counter()
    result = fn()
    elapsed = time.perf_counter() - start
    ok = result.ok if hasattr(result, "ok") else True
    if not ok:
        raise SystemExit(f"benchmark step failed: {result}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40, help="rounds of fresh-process timings")
    parser.add_argument("--calls", type=int, default=500, help="warm worker calls timed")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()

    sandbox = make_sandbox(require_isolation=True)
    python = sandbox.python_executable
    limits = Limits()
    with tempfile.TemporaryDirectory(prefix="sandbox-bench-") as tmp:
        plain_ws = os.path.join(tmp, "plain")
        box_ws = os.path.join(tmp, "box")
        os.mkdir(plain_ws)
        os.mkdir(box_ws)
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": plain_ws, "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
        variants = {"default": [], "isolated_nosite": ["-I", "-S"]}

        def plain(flags):
            return lambda: run_process(
                [python, *flags, "-c", "pass"], cwd=plain_ws, env=env, stdin=None, limits=limits, isolated=False
            )

        def boxed(flags):
            return lambda: sandbox.run([python, *flags, "-c", "pass"], workspace=box_ws, limits=limits)

        samples: dict[str, list[float]] = {}
        steps = {"bwrap_true": lambda: sandbox.run(["true"], workspace=box_ws, limits=limits)}
        for name, flags in variants.items():
            steps[f"plain_{name}"] = plain(flags)
            steps[f"sandbox_{name}"] = boxed(flags)
        for fn in steps.values():  # warm caches once
            timed(fn)
        for _ in range(args.runs):
            for name, fn in steps.items():
                samples.setdefault(name, []).append(timed(fn))

        with sandbox.worker(box_ws) as worker:
            worker.execute("def noop():\n    return None")
            for _ in range(20):
                worker.call("noop")
            calls = [timed(lambda: worker.call("noop")) for _ in range(args.calls)]
            inside = [worker.call("noop").duration_ms for _ in range(50)]

    medians = {name: median_ms(values) for name, values in samples.items()}
    medians["worker_call"] = median_ms(calls)
    ratios = {name: round(medians[f"sandbox_{name}"] / medians[f"plain_{name}"], 3) for name in variants}
    report = {
        "benchmark": "sandbox",
        "sandbox": type(sandbox).__name__,
        "isolated": sandbox.isolated,
        "runs_as": (f"root, dropped to uid {sandbox.uid} inside the sandbox")
        if sandbox.as_root
        else f"uid {sandbox.uid} (unprivileged bubblewrap)",
        "python": python,
        "flags": {name: " ".join([*flags, "-c", "pass"]) for name, flags in variants.items()},
        "rounds": args.runs,
        "worker_calls": args.calls,
        "median_ms": medians,
        "worker_call_p95_ms": round(sorted(calls)[int(len(calls) * 0.95)] * 1000, 3),
        "worker_call_reported_median_ms": statistics.median(inside),
        "sandbox_fixed_cost_ms": medians["bwrap_true"],
        "ratio_sandbox_to_plain": ratios,
        "targets": {"fresh_ratio_max": TARGET_FRESH_RATIO, "worker_call_ms_max": TARGET_WORKER_MS},
        "pass": {
            **{f"fresh_{name}": ratio <= TARGET_FRESH_RATIO for name, ratio in ratios.items()},
            "worker_call": medians["worker_call"] <= TARGET_WORKER_MS,
        },
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_avg_1m": round(os.getloadavg()[0], 2),
        },
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
