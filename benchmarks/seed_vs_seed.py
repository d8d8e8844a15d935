"""The seed scaffold against the previous seed on a pack's split, paired by task; prints JSON.

    python benchmarks/seed_vs_seed.py [--local 0.5b|1.5b] [--pack basic] [--split test] [--max-steps N]
        [--max-attempts N] [--held-out N] [--set NAME=VALUE ...] [--alone] [--out FILE]

``--alone`` compares the seed ("now") with the model alone ("before"): one completion at temperature 0 of
the task's own words (its files pasted after them, as a person would paste them into a chat), whose reply
is the answer, and whose first code block that defines the functions the task asks for (read from its
words, as the agent reads them) is written to that file; judged by the task's own check, as the agent is.
It also counts the recorded answers that are the agent loop's own messages (there must be none).

``--held-out N`` runs the learning curve's N held-out HumanEval problems (its split, seed 0) in place of a
pack's. ``--set NAME=VALUE`` (repeatable) compares another scaffold with the seed instead: "now" is the
seed with those parameters set, "before" the seed as it is.

Both scaffolds run every task of the split, one after the other, through the agent loop (as `evolver bench`
runs a pack without a daemon: the real store, the real sandbox, the verifier), on the local llama.cpp server
(``eval "$(scripts/real-model-setup 1.5b)"``; this script starts the server and stops it, in text tool mode
with the server's grammar, as the README configures it). "now" is the bundled seed (``action_format`` auto:
code for this server); "before" is the same seed as it was before code actions: tool calls, no examples
tried before finishing, no last answer turn. ``--max-steps`` and ``--max-attempts`` shorten both alike.
Per scaffold: successes with a Wilson interval, turns, tokens and wall time per task; then the paired
difference (now minus before) with its interval, and the tasks that changed. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from learning_curve import LocalServer, alone_prompt, direct_work, log, paired, rate  # noqa: E402


def seeds(max_steps: int | None, max_attempts: int | None, changed: dict | None = None) -> dict:
    """The two scaffolds compared: the seed ("now") and the seed before code actions, or, with ``changed``,
    the seed with those parameters ("now") and the seed ("before"); both with the same limits."""
    from evolver.agent.scaffold import default_scaffold

    limits = {k: v for k, v in (("max_steps", max_steps), ("max_attempts", max_attempts)) if v is not None}
    seed = default_scaffold()
    if changed:
        pairs = (("now", changed), ("before", {}))
    else:
        pairs = (("now", {}), ("before", {"action_format": "tools", "example_rounds": 0, "last_answer_turn": False}))
    scaffolds = {}
    for name, extra in pairs:
        parameters = seed.parameters.model_validate({**seed.parameters.model_dump(), **limits, **extra})
        scaffolds[name] = seed.model_copy(update={"parameters": parameters})
    return scaffolds


def setting(text: str) -> tuple[str, object]:
    """``NAME=VALUE`` of ``--set``: the value read as JSON (a number, true, false), else as text."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    try:
        return name, json.loads(value)
    except json.JSONDecodeError:
        return name, value


def local_settings(server: LocalServer) -> dict[str, str]:
    """The engine's settings for the started local server: text tool calls under its grammar, as [model] local
    configures it, and no budget cap (a long run must not stop halfway)."""
    return server.settings("model") | {
        "EVOLVER_MODEL_TIMEOUT_S": "300",
        "EVOLVER_MODEL_MAX_RETRIES": "1",
        "EVOLVER_MODEL_TOOL_MODE": "text",
        "EVOLVER_MODEL_STRUCTURED_OUTPUT": "true",
        "EVOLVER_MODEL_SCHEMA_FORMAT": "json_schema",
        "EVOLVER_BUDGET_TOKENS_PER_DAY": "0",
        "EVOLVER_BUDGET_USD_PER_DAY": "0",
    }


LOOP_WORDS = (  # the loop's own messages: an answer holding one of these is the loop talking to itself
    "this attempt ends",
    "you have called",
    "no code, no tool call",
    "finish was refused",
    "taken word for word",
    "a reply without code is taken",
    "you did not call a tool",
)


def alone(engine, tasks) -> dict:
    """The model alone: one completion per task, its reply the answer and its code the deliverable."""
    import os

    from evolver.engine import sandbox_limits
    from evolver.judge.verify import verify
    from evolver.llm.client import ModelError

    per_task, work = {}, {}
    for pack_task in tasks:
        task, _ = engine.store.inbox.add_task(
            pack_task.prompt, check=pack_task.check_data(), source="bench", metadata=pack_task.metadata()
        )
        started = time.perf_counter()
        workspace = engine.data_dir / "workspaces" / f"alone-{task.id}"
        workspace.mkdir(parents=True)
        os.chmod(workspace, 0o700)
        engine.sandbox.workspace_dir(workspace)
        try:
            reply = engine.model.complete(
                [{"role": "user", "content": alone_prompt(pack_task)}], temperature=0.0, purpose="evaluate"
            )
        except ModelError as exc:
            per_task[pack_task.id] = False
            work[pack_task.id] = {"turns": 1, "tokens": 0, "wall_s": 0.0, "ended": f"model error: {exc}"[:200]}
            continue
        # its files, then its code where its words ask for a file: as the learning curve judges the model alone
        answer = direct_work(workspace, pack_task, reply.content, {})
        verdict = verify(
            pack_task.check,
            answer=answer,
            sandbox=engine.sandbox,
            workspace=workspace,
            limits=sandbox_limits(engine.config),
        )
        per_task[pack_task.id] = verdict.success
        work[pack_task.id] = {
            "turns": 1,
            "tokens": reply.tokens_in + reply.tokens_out,
            "wall_s": round(time.perf_counter() - started, 1),
            "ended": "answered",
        }
        log(f"alone {pack_task.id}: {'solved' if verdict.success else 'failed'} ({work[pack_task.id]})")
    return summary(per_task, work, len(tasks))


def summary(per_task: dict, work: dict, n: int) -> dict:
    mean = {k: round(sum(w[k] for w in work.values()) / (n or 1), 1) for k in ("turns", "tokens", "wall_s")}
    return {**rate(per_task), "per_task_mean": mean, "per_task": per_task, "work": work}


def run(engine, scaffold, tasks) -> dict:
    per_task, work = {}, {}
    for pack_task in tasks:
        task, _ = engine.store.inbox.add_task(
            pack_task.prompt,
            check=pack_task.check_data(),
            source="bench",
            metadata={"pack_task": pack_task.id, **pack_task.metadata()},
        )
        started = time.perf_counter()
        result = engine.agent(scaffold).run_task(task)
        steps = [s for tid in result.trajectory_ids for s in engine.store.reports.steps(tid)]
        per_task[pack_task.id] = bool(result.success)
        work[pack_task.id] = {
            "turns": sum(s.role in ("assistant", "answer", "reflection", "plan") for s in steps),
            "tokens": sum(s.tokens_in + s.tokens_out for s in steps),
            "wall_s": round(time.perf_counter() - started, 1),
            "ended": engine.store.attempts.get_trajectory(result.trajectory_ids[-1]).status
            if result.trajectory_ids
            else None,
            "loop_words_answers": sum(
                any(w in (engine.store.attempts.get_trajectory(t).final_answer or "").casefold() for w in LOOP_WORDS)
                for t in result.trajectory_ids
            ),
        }
        log(f"{pack_task.id}: {'solved' if result.success else 'failed'} ({work[pack_task.id]})")
    report = summary(per_task, work, len(tasks))
    report["loop_words_answers"] = sum(w["loop_words_answers"] for w in work.values())
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local", choices=("0.5b", "1.5b"), default="0.5b")
    parser.add_argument("--pack", default="basic")
    parser.add_argument("--split", choices=("train", "test", "all"), default="test")
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--max-attempts", type=int, default=None)
    parser.add_argument("--held-out", type=int, default=None, help="the learning curve's N held-out problems")
    parser.add_argument("--set", type=setting, action="append", default=[], help="NAME=VALUE, against the seed")
    parser.add_argument("--alone", action="store_true", help="the seed against the model alone")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    from evolver.config import load_config
    from evolver.engine import Engine
    from evolver.judge.catalog import resolve_pack

    if args.held_out is not None:
        from learning_curve import split_tasks

        tasks = split_tasks(0, args.held_out, 0, 0)[0]
    else:
        tasks = [t for t in resolve_pack(args.pack) if args.split == "all" or t.split == args.split]
    compared = seeds(args.max_steps, args.max_attempts, dict(args.set))  # a bad --set fails before the server
    if args.alone and args.set:
        parser.error("--alone compares the seed with the model alone; --set compares the seed with an edit")
    with tempfile.TemporaryDirectory(prefix="seed-vs-seed-") as tmp:
        server = LocalServer(Path(tmp), args.local)
        try:
            server.start()
            env = local_settings(server)
            report: dict = {
                "model": server.alias,
                "tasks_from": f"the learning curve's {args.held_out} held-out problems"
                if args.held_out is not None
                else f"{args.pack} ({args.split})",
                "tasks": [t.id for t in tasks],
                "settings": {k: str(v) for k, v in vars(args).items()},
            }
            with Engine.open(load_config(env=env), data_dir=Path(tmp) / "data") as engine:
                if args.alone:
                    log(f"the model alone: {len(tasks)} tasks")
                    report["before"] = alone(engine, tasks)
                    compared = {"now": compared["now"]}
                for name, scaffold in compared.items():
                    log(f"{name}: {len(tasks)} tasks")
                    report[name] = run(engine, scaffold, tasks)
        finally:
            server.stop()
    report["paired_now_minus_before"] = paired(report["now"]["per_task"], report["before"]["per_task"])
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
