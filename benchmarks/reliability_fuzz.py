"""Fuzz the daemon's API from its OpenAPI schema with a large budget; prints JSON.

    python benchmarks/reliability_fuzz.py [--max-examples 100] [--only in-process|black-box] [--out FILE]

The same fuzzer as tests/test_fuzz_api.py (tests/_fuzz.py: schemathesis 4,
positive and negative cases, derandomized) with more cases per operation, at
both doors: in-process through the ASGI app over a real daemon object, and
black-box over a real daemon's loopback TCP listener with its bearer token.
Every operation is fuzzed but ``POST /v1/shutdown`` (it would stop the daemon
under test); operations whose path names an id are fuzzed once with random
ids and once with ids that exist.

The checks: no 5xx; the status, content type and body of every answer as the
schema declares them for that status; and data the schema forbids refused
with a 4xx. The figures:

    {"operations": N, "cases": N, "server_errors": N, "schema_violations": N,
     "no_response": N, "seconds": S, "doors": {"in_process": {...}, "black_box": {...}},
     "findings": ["one line per distinct finding", ...]}

``no_response`` counts black-box requests that got no answer in 60 s or lost
their connection. The script reports; it never asserts timings. It exits 1
when there is any finding, 2 when a daemon does not start.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the checkout's evolver (and its harness, evolver.testing), not an installed copy

TOKEN = "reliability-fuzz-token"


def in_process(max_examples: int):
    from evolver.testing.fuzz import InProcessDaemon

    daemon = InProcessDaemon()
    try:
        daemon.start()
        return daemon.fuzz(max_examples=max_examples)
    finally:
        daemon.close()


def black_box(max_examples: int):
    import httpx

    from evolver.testing.daemon import DaemonProcess, free_port, make_root, serving
    from evolver.testing.fuzz import black_box as black_box_schema
    from evolver.testing.fuzz import fuzz, known_ids, tcp_settings

    port = free_port()
    with serving(DaemonProcess(make_root(), settings=tcp_settings(port, TOKEN), name="reliability-fuzz")) as proc:
        base_url = f"http://127.0.0.1:{port}"
        schema, send, headers = black_box_schema(base_url, TOKEN)
        with httpx.Client(base_url=base_url, headers=headers, timeout=60) as http:
            known = known_ids(http)
        report = fuzz(schema, send, max_examples=max_examples, known=known, validate_headers=headers)
        if proc.proc.poll() is not None:
            raise RuntimeError(f"the daemon exited during the fuzzing:\n{proc.log()}")
        return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-examples", type=int, default=100, help="cases per operation and mode (default 100)")
    parser.add_argument("--only", choices=["in-process", "black-box"], help="fuzz through one door only")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()

    doors = {}
    started = time.perf_counter()
    try:
        if args.only in (None, "in-process"):
            doors["in_process"] = in_process(args.max_examples)
        if args.only in (None, "black-box"):
            doors["black_box"] = black_box(args.max_examples)
    except AssertionError as exc:  # the harness's way of saying a daemon did not start
        print(json.dumps({"error": str(exc)[:4000]}), flush=True)
        return 2
    findings = [(door, f) for door, report in doors.items() for f in report.unique()]
    result = {
        "operations": max(r.operations for r in doors.values()),
        "cases": sum(r.cases for r in doors.values()),
        "server_errors": sum(r.count("server_error") for r in doors.values()),
        "schema_violations": sum(r.count("schema_violation") for r in doors.values()),
        "no_response": sum(r.count("no_response") for r in doors.values()),
        "seconds": round(time.perf_counter() - started, 1),
        "max_examples": args.max_examples,
        "excluded": next(iter(doors.values())).excluded,
        "doors": {door: report.summary() for door, report in doors.items()},
        "findings": [f"{door}: {str(f).splitlines()[0]}" for door, f in findings][:50],
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
    }
    text = json.dumps(result, indent=2)
    print(text, flush=True)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
