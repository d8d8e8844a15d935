"""The agent framework's own time per step, beside the model's and the tool's.

With the scripted model on a store of N trajectories (default 10k, real
embeddings), one long task runs STEPS steps (a trivial run_python call each,
then finish). For every step the framework's time is the step's wall time minus
the model call (``litellm.completion``, which runs the scripted provider) and
minus the tool's own run in the sandbox worker: what is left is the budget
check (with its token count), the ledger row, prompt building, argument
validation, tool dispatch and writing the step durably (synchronous=FULL). Context assembly
(one query embedding, three collections, keyword search, fusion, rendering) is
measured once per task, over several tasks.

Prints JSON; targets (for this 2-core machine): step p95 <= 10 ms, no growth
from step 1 to step 50, context assembly within the memory benchmark's
retrieval target plus rendering. Never asserts.

    python benchmarks/step_overhead.py [--store-size 10000] [--steps 50] [--tasks 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from task_texts import task_texts  # noqa: E402

from evolver.agent.loop import Agent, render_context  # noqa: E402
from evolver.config import load_config  # noqa: E402
from evolver.engine import Engine  # noqa: E402
from evolver.llm import scripted  # noqa: E402
from memory import NewTrajectory  # noqa: E402
from tools import TaskTools  # noqa: E402


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


class Timers:
    """Wraps the model call (``litellm.completion``) and the tool's run to subtract them
    from each step. Everything else in a step — the budget check with its token count,
    the ledger row, prompt building, validation, dispatch, recording — is the framework's."""

    def __init__(self) -> None:
        self.model_ms = 0.0
        self.tool_ms = 0.0
        self.model_calls = 0

    def install(self) -> None:
        import litellm

        timers = self
        original_completion, original_dispatch = litellm.completion, TaskTools._dispatch

        def completion(*args, **kwargs):
            started = time.perf_counter()
            try:
                return original_completion(*args, **kwargs)
            finally:
                timers.model_ms += (time.perf_counter() - started) * 1000
                timers.model_calls += 1

        def dispatch(self, *args, **kwargs):
            started = time.perf_counter()
            try:
                return original_dispatch(self, *args, **kwargs)
            finally:
                timers.tool_ms += (time.perf_counter() - started) * 1000

        litellm.completion, TaskTools._dispatch = completion, dispatch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store-size", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--tasks", type=int, default=20, help="tasks over which context assembly is timed")
    args = parser.parse_args(argv)

    steps = args.steps
    scripted.register_script(
        "bench-steps",
        {
            "rules": [
                {"match": "", "role": "tool", "tool": "run_python", "arguments": {"code": "1"}, "times": steps - 1},
                {"match": "", "role": "tool", "tool": "finish", "arguments": {"answer": "done"}},
                {"match": "", "role": "user", "tool": "run_python", "arguments": {"code": "1"}},
            ]
        },
    )
    config = load_config(
        env={
            "EVOLVER_MODEL_NAME": "scripted/bench-steps",
            "EVOLVER_BUDGET_TOKENS_PER_DAY": "0",
            "EVOLVER_BUDGET_TOKENS_PER_TASK": "0",
        }
    )
    with tempfile.TemporaryDirectory(prefix="evolver-steps-") as tmp, Engine.open(config, data_dir=Path(tmp)) as engine:
        store = engine.store
        texts = task_texts(args.store_size + args.tasks, seed=11)
        started = time.perf_counter()
        for start in range(0, args.store_size, 2000):
            store.attempts.ingest(
                [
                    NewTrajectory(prompt=t, final_answer="ok", success=i % 3 != 0)
                    for i, t in enumerate(texts[start : min(start + 2000, args.store_size)])
                ]
            )
        build_s = time.perf_counter() - started
        queries = texts[args.store_size :]

        agent: Agent = engine.agent()
        params = agent.scaffold.parameters
        context_ms, render_ms = [], []
        for query in queries:
            t0 = time.perf_counter()
            context = store.retrieval.context(
                query, trajectories=params.similar_trajectories, insights=params.insights, tools=params.tools
            )
            t1 = time.perf_counter()
            render_context(context, params.context_tokens)
            t2 = time.perf_counter()
            context_ms.append((t1 - t0) * 1000)
            render_ms.append((t2 - t1) * 1000)

        timers = Timers()
        timers.install()
        original_step = Agent._step
        framework_ms: list[float] = []

        def timed_step(self, *a, **kw):
            model_before, tool_before = timers.model_ms, timers.tool_ms
            started = time.perf_counter()
            try:
                return original_step(self, *a, **kw)
            finally:
                wall = (time.perf_counter() - started) * 1000
                framework_ms.append(wall - (timers.model_ms - model_before) - (timers.tool_ms - tool_before))

        Agent._step = timed_step
        agent.scaffold = agent.scaffold.model_copy(
            # repeat_limit 0: its steps are one trivial call made again on purpose, not a loop to stop
            update={"parameters": params.model_copy(update={"max_steps": steps + 5, "repeat_limit": 0})}
        )
        task, _ = store.inbox.add_task("Run a trivial computation many times, then finish.")
        result = agent.run_task(task)
        Agent._step = original_step
        model_calls = max(timers.model_calls, 1)
        first, last = framework_ms[0], framework_ms[-1]
        report = {
            "store_size": args.store_size,
            "store_build_s": round(build_s, 1),
            "task_status": result.status,
            "steps": len(framework_ms),
            "step_framework_ms": {
                "p50": pct(framework_ms[1:], 0.5),
                "p95": pct(framework_ms[1:], 0.95),
                "max": round(max(framework_ms), 3),
            },
            "step_1_ms": round(first, 3),
            "step_last_ms": round(last, 3),
            "early_vs_late_p50_ms": [pct(framework_ms[1:11], 0.5), pct(framework_ms[-10:], 0.5)],
            "model_call_ms_mean": round(timers.model_ms / model_calls, 3),
            "tool_run_ms_mean": round(timers.tool_ms / model_calls, 3),
            "context_assembly_ms": {"p50": pct(context_ms, 0.5), "p95": pct(context_ms, 0.95)},
            "context_render_ms": {"p50": pct(render_ms, 0.5), "p95": pct(render_ms, 0.95)},
            "targets": {"step_p95_ms": 10.0},
        }
        report["pass"] = {
            "step_p95": report["step_framework_ms"]["p95"] <= 10.0,
            "no_growth": statistics.median(framework_ms[-10:]) <= 1.5 * statistics.median(framework_ms[1:11]) + 0.5,
        }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
