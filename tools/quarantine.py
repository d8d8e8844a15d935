"""Quarantine: a synthesized tool earns its place by proving itself in the sandbox.

A candidate must (1) parse, with its schema derived from its signature
(``spec_from_source``); (2) bring at least one test of its own; (3) pass
those tests, and the tests of the version it would replace, when run in the
sandbox; and (4) reproduce the recorded output of every real call it claims
to generalize, called with the arguments the model mapped onto that call.
Nothing of the candidate runs in the host process: the code and the tests are
files in a fresh workspace that only the sandboxed interpreter executes. This
is a quality gate, not the security boundary: a synthesized tool only ever runs
inside the sandbox, here and when the agent calls it.
"""

from __future__ import annotations

import ast
import json
import os
import secrets
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from sandbox import Limits, Sandbox, write_text

from .spec import ToolSpec, schema_for_call

__all__ = ["Replay", "QuarantineReport", "quarantine", "defined_tests"]

_MARK = "__evolver_quarantine__"

# Runs inside the sandbox. The tool and its tests share one namespace (tests call
# the function by name); every test and every replay runs even if one fails.
_RUNNER = r'''
import contextlib, io, json, sys, traceback
ns = {"__name__": "evolver_tool"}
report = {"tests": [], "replays": [], "load_error": None}
def _tail(exc):
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()[-1500:]
def _render(value, stdout):
    parts = [stdout.rstrip("\n")] if stdout else []
    if value is not None:
        parts.append(value if isinstance(value, str) else json.dumps(value, default=repr))
    return ["\n".join(parts), repr(value)]
try:
    exec(compile(open("tool.py").read(), "tool.py", "exec"), ns)
    tool = ns[NAME]
except BaseException as exc:
    report["load_error"] = _tail(exc)
else:
    for path in TEST_FILES:
        try:
            exec(compile(open(path).read(), path, "exec"), ns)
        except BaseException as exc:
            report["tests"].append({"name": path, "ok": False, "error": "the tests do not load: " + _tail(exc)})
            continue
        for name in [n for n in list(ns) if n.startswith("test_") and callable(ns[n])]:
            test = ns.pop(name)
            try:
                test()
                report["tests"].append({"name": name, "ok": True, "error": None})
            except BaseException as exc:
                report["tests"].append({"name": name, "ok": False, "error": _tail(exc)})
    for arguments in json.load(open("replays.json")):
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                value = tool(**arguments)
            report["replays"].append({"got": _render(value, out.getvalue()), "error": None})
        except BaseException as exc:
            report["replays"].append({"got": None, "error": _tail(exc)})
sys.stdout = sys.__stdout__
print(MARK + json.dumps(report))
'''


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
        return (f"{passed}/{len(self.tests)} tests passed, {matched}/{len(self.replays)} recorded calls "
                f"reproduced")


def defined_tests(tests: str) -> list[str]:
    """The test functions a test file defines; raises SyntaxError when it does not parse."""
    module = ast.parse(tests)
    return [n.name for n in module.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]


def _same(expected: str, got: list[str]) -> bool:
    """The recorded observation, whitespace aside, equals the tool's output or its value's repr."""
    want = " ".join(expected.split())
    return any(" ".join(g.split()) == want for g in got)


def quarantine(spec: ToolSpec, *, sandbox: Sandbox, work_root: str | os.PathLike[str],
               replays: list[Replay] = (), earlier_tests: str = "", limits: Limits | None = None) -> QuarantineReport:
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
            return QuarantineReport(False, f"the arguments given for recorded call {replay.label} do not fit "
                                           f"its signature: {'; '.join(problems)}")
    os.makedirs(work_root, exist_ok=True)
    workspace = Path(tempfile.mkdtemp(prefix=f"quarantine-{spec.name}-", dir=work_root))
    try:
        os.chmod(workspace, 0o700)
        sandbox.workspace_dir(workspace)
        files = ["test_tool.py"] + (["test_earlier.py"] if earlier_tests else [])
        write_text(workspace, "tool.py", spec.code)
        write_text(workspace, "test_tool.py", spec.tests)
        if earlier_tests:
            write_text(workspace, "test_earlier.py", earlier_tests)
        write_text(workspace, "replays.json", json.dumps([r.arguments for r in replays]))
        # A fresh mark per run, so output the tool prints cannot pass for the report by accident.
        mark = f"{_MARK}{secrets.token_hex(8)}:"
        runner = f"NAME = {spec.name!r}\nTEST_FILES = {files!r}\nMARK = {mark!r}\n{_RUNNER}"
        result = sandbox.python(runner, workspace=workspace, limits=limits)
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    report = None
    for line in reversed(result.stdout.splitlines()):
        if line.startswith(mark):
            report = json.loads(line[len(mark):])
            break
    if report is None:
        problem = "timed out" if result.timed_out else (result.stderr.strip()[-1500:] or result.error or
                                                         f"exit code {result.exit_code}")
        return QuarantineReport(False, f"its run in the sandbox gave no report: {problem}")
    if report["load_error"]:
        return QuarantineReport(False, f"it fails to load in the sandbox: {report['load_error']}")
    replayed = [{"label": r.label, "expected": r.expected[:500], "got": (got["got"] or [None])[0],
                 "error": got["error"], "ok": got["error"] is None and _same(r.expected, got["got"])}
                for r, got in zip(replays, report["replays"])]
    failed = [t for t in report["tests"] if not t["ok"]]
    if failed:
        first = failed[0]
        return QuarantineReport(False, f"{len(failed)} of {len(report['tests'])} tests failed; "
                                       f"{first['name']}: {first['error']}", report["tests"], replayed)
    wrong = [r for r in replayed if not r["ok"]]
    if wrong:
        first = wrong[0]
        seen = first["error"] or repr((first["got"] or "")[:200])
        return QuarantineReport(False, f"{len(wrong)} of {len(replayed)} recorded calls not reproduced; call "
                                       f"{first['label']} gave {seen}, recorded {first['expected'][:200]!r}",
                                report["tests"], replayed)
    report_ok = QuarantineReport(True, "", report["tests"], replayed)
    report_ok.reason = report_ok.summary()
    return report_ok
