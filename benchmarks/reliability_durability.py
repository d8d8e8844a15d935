"""Durability drills against a real daemon, with many kills; prints JSON.

    python benchmarks/reliability_durability.py [--kills 20] [--seed N] [--clients 3] [--burst 2]
                                                [--no-power-loss] [--out FILE] [--keep]

1. The kill loop (``evolver/testing/durability.py``, ``kill_loop``): one daemon on a
   fresh data dir with a scripted model, SIGKILLed ``--kills`` times, each at a
   seeded random moment of one kind of work in turn — clients submitting with
   Idempotency-Keys (``--clients`` threads, ``--burst`` submits each per
   start), a task between its sandboxed steps, a worker process alone in the
   middle of a chat turn (whose request must still be answered, right) and of
   a task (then the daemon), a distillation round, a tree-search
   step, a tool-synthesis round — and restarted each time. Clients
   retry a submit whose reply never came with the same key. After every kill
   the dead daemon's database is read and checked; after the last restart the
   work drains, the daemon stops on SIGTERM and everything is checked again.
2. The power cut (``power_loss``): a daemon under an LD_PRELOAD library that
   copies each file of the data dir at every fsync takes submits from four
   clients until a SIGKILL at a random moment after the WAL's first
   checkpoint; the data dir rebuilt from the copies alone (what was fsynced)
   must hold every acknowledged task. Skipped without gcc.

Figures: ``acknowledged`` submits (a 200/201 came back), ``lost`` (an
acknowledged task missing after a kill or at the end), ``completed_twice`` (a
task whose end was recorded that later gained a trajectory or step, or changed
status), ``integrity`` (PRAGMA integrity_check at the end), ``index_repairs``
(vector-index updates the kills left in the outbox, summed: work the next start
finished), ``index_after_stop`` (what a reconcile after the last, clean stop
still had to repair: 0), ``replayed`` (submits whose reply was lost in a kill
and whose retry got the committed task back), ``jobs_interrupted`` (job rounds
whose reply never came: the kill landed before they finished),
``distill_repeats`` (trajectories two distill events both learned from).
``violations`` lists every broken invariant. Exit status 0 when there are
none, 2 when a daemon does not start, 3 otherwise. Timings are reported, never
judged.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evolver.testing.daemon import make_root, remove_root  # noqa: E402
from evolver.testing.durability import build_shim, kill_loop, power_loss  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=20, help="SIGKILLs in the kill loop (default 20)")
    parser.add_argument("--seed", type=int, default=7, help="seed of the kill points and the clients")
    parser.add_argument("--clients", type=int, default=3, help="submitting client threads (default 3)")
    parser.add_argument("--burst", type=int, default=2, help="submits per client per daemon start (default 2)")
    parser.add_argument("--no-power-loss", action="store_true", help="skip the power-cut drill")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    parser.add_argument("--keep", action="store_true", help="keep the temp dirs (their paths go to stderr)")
    args = parser.parse_args(argv)

    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    started = time.monotonic()
    roots = []
    try:
        roots.append(make_root())
        try:
            loop = kill_loop(
                roots[-1], kills=args.kills, seed=args.seed, clients=args.clients, burst=args.burst, log=progress
            )
        except AssertionError as exc:  # a daemon that did not start, or work that never drained
            print(str(exc), file=sys.stderr)
            return 2
        power: dict | None = None
        if not args.no_power_loss:
            roots.append(make_root())
            shim = build_shim(roots[-1])
            if shim is None:
                power = {"skipped": "gcc is not installed"}
            else:
                try:
                    power = power_loss(roots[-1], shim, seed=args.seed, log=progress)
                except AssertionError as exc:
                    print(str(exc), file=sys.stderr)
                    return 2
    finally:
        for root in roots:
            if args.keep:
                progress(f"kept {root}")
            else:
                remove_root(root)

    report = {
        "kills": loop["kills"],
        "acknowledged": loop["acknowledged"],
        "lost": loop["lost"],
        "completed_twice": loop["completed_twice"],
        "integrity": loop["integrity"],
        "index_repairs": loop["index_repairs"],
        "power_loss": power,
        "seconds": round(time.monotonic() - started, 1),
        "kill_loop": {
            k: v
            for k, v in loop.items()
            if k not in ("kills", "acknowledged", "lost", "completed_twice", "integrity", "index_repairs")
        },
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    broken = loop["violations"] or (
        power and not power.get("skipped") and (power["lost"] or power["integrity"] != "ok")
    )
    return 3 if broken else 0


if __name__ == "__main__":
    raise SystemExit(main())
