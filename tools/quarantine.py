"""Quarantine: a synthesized tool earns its place by proving itself in the sandbox.

A candidate must (1) parse, with its schema derived from its signature
(``spec_from_source``); (2) bring at least one test of its own; (3) pass
those tests, and the tests of the version it would replace, when run in the
sandbox; and (4) reproduce the recorded output of every real call it claims
to generalize, called with the arguments the model mapped onto that call.

Nothing of the candidate runs in the host process, and the report does not
come from the tool's interpreter: the judge's runner (``sandbox.run_judged``)
loads the tool in a child process of its own and calls it with plain data,
runs the tests in its own interpreter, and reports over a channel the tool
cannot reach, with the run's nonce. A tool that patches ``json.dumps`` or the
test framework patches only its own process. The candidate's own tests run
apart from the earlier version's tests and the replays, which they could
otherwise tamper with; replays are compared here, on plain data. This is a
quality gate, not the security boundary: a synthesized tool only ever runs
inside the sandbox, here and when the agent calls it.
"""

from __future__ import annotations

import ast
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from sandbox import Limits, Sandbox, run_judged, write_text

from .spec import ToolSpec, schema_for_call

__all__ = ["Replay", "QuarantineReport", "quarantine", "defined_tests"]

_MODULE = "tool"  # the candidate's code, as tool.py in a fresh workspace
_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Replay:
    """A real recorded call the tool claims to generalize: its arguments for the tool, the output seen then."""

    label: str
    arguments: dict
    expected: str


@dataclass
class QuarantineReport:
    ok: bool
    reason: str
    tests: list[dict] = field(default_factory=list)
    replays: list[dict] = field(default_factory=list)

    def summary(self) -> str:
        passed = sum(t["ok"] for t in self.tests)
        matched = sum(r["ok"] for r in self.replays)
        return f"{passed}/{len(self.tests)} tests passed, {matched}/{len(self.replays)} recorded calls reproduced"


def defined_tests(tests: str) -> list[str]:
    """The test functions a test file defines; raises SyntaxError when it does not parse."""
    module = ast.parse(tests)
    return [n.name for n in module.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]


def _same(expected: str, got: list[str]) -> bool:
    """The recorded observation, whitespace aside, equals the tool's output or its value's repr."""
    want = " ".join(expected.split())
    return any(" ".join(g.split()) == want for g in got)


def _judged(
    sandbox: Sandbox,
    workspace: Path,
    spec: ToolSpec,
    tests: list[tuple[str, str]],
    replays: list[dict],
    limits: Limits | None,
) -> dict | QuarantineReport:
    """One run of the judge's runner: the tool in a process of its own, the tests beside the verdict."""
    timeout = (limits or Limits()).timeout_s or _TIMEOUT_S
    judged = run_judged(
        sandbox,
        workspace,
        {"kind": "tool", "module": _MODULE, "name": spec.name, "tests": tests, "replays": replays},
        timeout_s=timeout,
        limits=limits,
    )
    if judged.report is None or not isinstance(judged.report.get("report"), dict):
        return QuarantineReport(False, f"its run in the sandbox gave no report: {judged.problem or 'malformed'}")
    return judged.report["report"]


def quarantine(
    spec: ToolSpec,
    *,
    sandbox: Sandbox,
    work_root: str | os.PathLike[str],
    replays: list[Replay] = (),
    earlier_tests: str = "",
    limits: Limits | None = None,
) -> QuarantineReport:
    """Run the candidate's tests (and ``earlier_tests``) and ``replays`` in the sandbox; never raises for the tool."""
    try:
        names = defined_tests(spec.tests)
    except SyntaxError as exc:
        return QuarantineReport(False, f"its tests do not parse: line {exc.lineno}: {exc.msg}")
    if not names:
        return QuarantineReport(False, "it brings no tests (define at least one test_... function)")
    for replay in replays:
        problems = schema_for_call(spec, replay.arguments)
        if problems:
            return QuarantineReport(
                False,
                f"the arguments given for recorded call {replay.label} do not fit its signature: {'; '.join(problems)}",
            )
    os.makedirs(work_root, exist_ok=True)
    workspace = Path(tempfile.mkdtemp(prefix="tool-", dir=work_root))
    try:
        os.chmod(workspace, 0o700)
        sandbox.workspace_dir(workspace)
        write_text(workspace, f"{_MODULE}.py", spec.code)
        # Two runs: the candidate's own tests may do anything to the interpreter they run in,
        # so the earlier version's tests and the recorded calls are judged in another.
        own = _judged(sandbox, workspace, spec, [("test_tool.py", spec.tests)], [], limits)
        if isinstance(own, QuarantineReport):
            return own
        report = own
        if earlier_tests or replays:
            other = _judged(
                sandbox,
                workspace,
                spec,
                [("test_earlier.py", earlier_tests)] if earlier_tests else [],
                [r.arguments for r in replays],
                limits,
            )
            if isinstance(other, QuarantineReport):
                return other
            report = {**other, "tests": own["tests"] + other["tests"]}
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    if report["load_error"]:
        return QuarantineReport(False, f"it fails to load in the sandbox: {report['load_error']}")
    replayed = [
        {
            "label": r.label,
            "expected": r.expected[:500],
            "got": (got["got"] or [None])[0],
            "error": got["error"],
            "ok": got["error"] is None and _same(r.expected, got["got"]),
        }
        for r, got in zip(replays, report["replays"])
    ]
    failed = [t for t in report["tests"] if not t["ok"]]
    if failed:
        first = failed[0]
        return QuarantineReport(
            False,
            f"{len(failed)} of {len(report['tests'])} tests failed; {first['name']}: {first['error']}",
            report["tests"],
            replayed,
        )
    wrong = [r for r in replayed if not r["ok"]]
    if wrong:
        first = wrong[0]
        seen = first["error"] or repr((first["got"] or "")[:200])
        return QuarantineReport(
            False,
            f"{len(wrong)} of {len(replayed)} recorded calls not reproduced; call "
            f"{first['label']} gave {seen}, recorded {first['expected'][:200]!r}",
            report["tests"],
            replayed,
        )
    report_ok = QuarantineReport(True, "", report["tests"], replayed)
    report_ok.reason = report_ok.summary()
    return report_ok
