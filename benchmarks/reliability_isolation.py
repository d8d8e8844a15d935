"""Run the sandbox attack suite and count what was contained; prints JSON.

    python benchmarks/reliability_isolation.py [--out FILE] [-- extra pytest args]

Runs, with real bubblewrap (and, for tests/test_isolation.py, a real daemon):

* every test of ``tests/test_isolation.py`` — each plays an attack (or proves a
  containment property) from inside the sandbox or against the daemon;
* the tests in the "containment" section of ``tests/test_sandbox.py`` (between
  its ``# -- containment`` header and the next ``# --`` header): the classic
  attacks; its other tests (public surface, ordinary runs, choosing the
  sandbox) run too and are reported apart, as ``other_tests``.

An attack is ``contained`` when its test passes. A strict xfail is a known hole
(its reason says where the fix lies) and counts as not contained, as does a
failure; a skip (no root, no bubblewrap) is reported and counted in neither.
pytest's own output goes to stderr, the JSON to stdout:

    {"attacks": N, "contained": N, "not_contained": [...], "skipped": [...],
     "seconds": S, "per_file": {...}, "other_tests": {...}}

Exit status 0, or 1 when a test failed unexpectedly (a regression, not a known
hole). The script reports; it never asserts timings.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ISOLATION = "tests/test_isolation.py"
SANDBOX = "tests/test_sandbox.py"


def containment_lines(path: Path) -> range:
    """The line numbers (1-based) of the file's ``# -- containment`` section."""
    lines = path.read_text(encoding="utf-8").splitlines()
    headers = [n for n, line in enumerate(lines, 1) if line.startswith("# -- ")]
    start = next((n for n in headers if line_title(lines[n - 1]) == "containment"), None)
    if start is None:
        raise SystemExit(f"{path} has no '# -- containment' section; update this script")
    end = next((n for n in headers if n > start), len(lines) + 1)
    return range(start, end)


def line_title(line: str) -> str:
    return line.removeprefix("# -- ").strip(" -")


class Outcomes:
    """A pytest plugin that records each test's outcome and where it is defined."""

    def __init__(self) -> None:
        self.lines: dict[str, int] = {}
        self.results: dict[str, dict] = {}

    def pytest_collection_modifyitems(self, items) -> None:
        for item in items:
            self.lines[item.nodeid] = item.location[1] + 1  # 0-based in pytest

    def pytest_runtest_logreport(self, report) -> None:
        entry = self.results.setdefault(report.nodeid, {"outcome": "passed", "seconds": 0.0, "reason": None})
        entry["seconds"] += report.duration
        if hasattr(report, "wasxfail"):
            entry["outcome"] = "xpassed" if report.passed else "xfailed"
            entry["reason"] = report.wasxfail or None
        elif report.skipped:
            entry["outcome"] = "skipped"
            entry["reason"] = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else None
        elif report.failed:
            entry["outcome"] = "failed" if report.when == "call" else "error"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args()

    os.chdir(REPO)
    plugin = Outcomes()
    started = time.monotonic()
    with contextlib.redirect_stdout(sys.stderr):
        code = pytest.main(["-q", "-p", "no:cacheprovider", ISOLATION, SANDBOX, *args.pytest_args], plugins=[plugin])
    seconds = round(time.monotonic() - started, 1)

    section = containment_lines(REPO / SANDBOX)
    attacks, others = {}, {}
    for nodeid, result in plugin.results.items():
        path = nodeid.split("::", 1)[0]
        is_attack = path == ISOLATION or (path == SANDBOX and plugin.lines.get(nodeid, 0) in section)
        (attacks if is_attack else others)[nodeid] = result

    def count(results: dict, outcome: str) -> int:
        return sum(1 for r in results.values() if r["outcome"] == outcome)

    ran = {k: v for k, v in attacks.items() if v["outcome"] != "skipped"}
    report = {
        "attacks": len(ran),
        "contained": count(ran, "passed"),
        "not_contained": [
            {"test": k, "outcome": v["outcome"], "reason": v["reason"]}
            for k, v in ran.items()
            if v["outcome"] != "passed"
        ],
        "skipped": [{"test": k, "reason": v["reason"]} for k, v in attacks.items() if v["outcome"] == "skipped"],
        "seconds": seconds,
        "per_file": {
            path: {
                outcome: count({k: v for k, v in attacks.items() if k.startswith(path + "::")}, outcome)
                for outcome in ("passed", "xfailed", "failed", "error", "xpassed", "skipped")
            }
            for path in (ISOLATION, SANDBOX)
        },
        "other_tests": {outcome: count(others, outcome) for outcome in ("passed", "failed", "error", "skipped")},
        "pytest_exit_code": int(code),
        "euid": os.geteuid(),
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    unexpected = [r for r in plugin.results.values() if r["outcome"] in ("failed", "error", "xpassed")]
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
