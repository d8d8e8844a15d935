"""What more drafts could add: the seed with N drafts and no repair turns, on the held-out problems where a
learning curve's seed failed after every draft; prints JSON.

    python benchmarks/drafts_ceiling.py --from REPORT.json [--drafts 10] [--local 0.5b|1.5b] [--out FILE]

The problems are those of REPORT's generation 0 (the seed, measured through the daemon) that failed at the
step limit: each of its drafts failed the task's own examples and so did its repair turns. ``drafts`` acts
there directly (the tree may raise it to 10; every other parameter only through the repair turns), so this
is the most that raising it could add to the seed's held-out successes, measured on the tasks where it can
act: each problem is asked again with the seed's scaffold, ``drafts`` N and ``max_steps`` 1 (the drafts
alone), through the agent loop in process on the local llama.cpp server, as ``seed_vs_seed.py`` runs a
scaffold. Drafts are seeded by what they ask, so the
first four draw as the seed's did, alike though not bit for bit; a problem solved within them is the
sampler's noise, not the extra drafts' gain, and ``turns`` (one per draft) tells which. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from learning_curve import LocalServer, log, split_tasks  # noqa: E402
from seed_vs_seed import local_settings, run, seeds  # noqa: E402


def failed_after_every_draft(report: dict) -> list[str]:
    """The held-out problems the report's seed failed at its step limit, in the report's order."""
    seed = report["generations"][0]
    work = seed["measurement"]["work"]
    return [task for task, solved in seed["per_task"].items() if not solved and work[task]["ended"] == "step_limit"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="report", type=Path, required=True, help="a learning curve's JSON")
    parser.add_argument("--drafts", type=int, default=10)
    parser.add_argument("--local", choices=("0.5b", "1.5b"), default="0.5b")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    from evolver.config import load_config
    from evolver.engine import Engine

    report = json.loads(args.report.read_text(encoding="utf-8"))
    ids = failed_after_every_draft(report)
    held = {t.id: t for t in split_tasks(report["settings"].get("seed", 0), len(report["tasks"]["held_out"]), 0, 0)[0]}
    tasks = [held[i] for i in ids]
    scaffold = seeds(1, 1, {"drafts": args.drafts})["now"]  # the drafts alone, one attempt
    out: dict = {"from": str(args.report), "drafts": args.drafts, "tasks": ids}
    with tempfile.TemporaryDirectory(prefix="drafts-ceiling-") as tmp:
        server = LocalServer(Path(tmp), args.local)
        try:
            server.start()
            env = local_settings(server)
            log(f"{len(tasks)} problems, up to {args.drafts} drafts each")
            with Engine.open(load_config(env=env), data_dir=Path(tmp) / "data") as engine:
                out["measured"] = run(engine, scaffold, tasks)
        finally:
            server.stop()
    text = json.dumps(out, indent=2)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
