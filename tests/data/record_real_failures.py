"""Record what the real small model does on a few tasks, for tests/data/real_model_failures.json.

    eval "$(scripts/real-model-setup)"
    python tests/data/record_real_failures.py [--tasks func-01,func-02,...] [--max-steps 6]

Serves the cached Qwen2.5-Coder-0.5B-Instruct GGUF with [model] local (the engine starts
llama-server), runs each task of the ``basic`` pack through the
agent loop with the seed scaffold, and writes every attempt that ended without
an answer, with its steps as recorded, so the distillation test can replay the
real model's behaviour without the server.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

OUT = Path(__file__).with_name("real_model_failures.json")
ALIAS = "qwen2.5-coder-0.5b"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", default="arith-02,text-01,func-01,files-01")  # training tasks
    parser.add_argument("--max-steps", type=int, default=6)
    args = parser.parse_args()
    from evolver.agent.scaffold import load_scaffold
    from evolver.config import load_config
    from evolver.engine import Engine
    from evolver.judge.catalog import resolve_pack

    # [model] local: the engine serves the GGUF itself, with llama-server, as the daemon does.
    config = load_config(
        env={
            "EVOLVER_MODEL_LOCAL": os.environ["REAL_MODEL_GGUF"],
            "EVOLVER_MODEL_LOCAL_SERVER": os.environ.get("REAL_MODEL_SERVER", ""),
            "EVOLVER_MODEL_TIMEOUT_S": "300",
        }
    )
    wanted = args.tasks.split(",")
    tasks = [t for t in resolve_pack("basic") if t.id in wanted]
    recorded = []
    with tempfile.TemporaryDirectory() as tmp, Engine.open(config, data_dir=Path(tmp)) as engine:
        data = json.loads(engine.seed_scaffold().model_dump_json())
        data["parameters"].update({"max_steps": args.max_steps, "max_attempts": 1, "temperature": 0.0})
        scaffold = load_scaffold(data)
        for item in tasks:
            task, _ = engine.store.inbox.add_task(
                item.prompt, check=item.check_data(), metadata={"files": dict(item.files)} if item.files else None
            )
            result = engine.agent(scaffold).run_task(task)
            for trajectory_id in result.trajectory_ids:
                trajectory = engine.store.attempts.get_trajectory(trajectory_id)
                outcome = engine.store.reports.outcome(trajectory_id)
                print(f"{item.id}: {trajectory.status}", file=sys.stderr)
                if trajectory.status == "finished":
                    continue
                recorded.append(
                    {
                        "task": item.id,
                        "prompt": item.prompt,
                        "status": trajectory.status,
                        "verifier_output": outcome.verifier_output if outcome else None,
                        "steps": [
                            {
                                "role": s.role,
                                "content": s.content,
                                "tool_calls": s.tool_calls,
                                "tool_results": s.tool_results,
                            }
                            for s in engine.store.reports.steps(trajectory_id)
                        ],
                    }
                )
    OUT.write_text(json.dumps({"model": ALIAS, "recorded": recorded}, indent=1) + "\n")
    print(f"wrote {len(recorded)} attempts without an answer to {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
