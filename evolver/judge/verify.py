"""The verifier: decides from a task's check whether an attempt succeeded.

Part of the engine's core, outside the scaffold: nothing evolution proposes can
change how success is judged. Command and Python checks run in the sandbox, in
the task's workspace, like any model-written code (a checker may read files the
agent wrote, and the agent may have planted anything there).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from dataclasses import dataclass, replace

from sandbox import Limits, Sandbox, SandboxError, write_text

from .checks import AnswerCheck, CommandCheck, PythonCheck

__all__ = ["Verdict", "verify"]

_MARK = "__evolver_verdict__"
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


@dataclass(frozen=True)
class Verdict:
    success: bool
    output: str
    verifier: str
    score: float | None = None


def _number(text: str) -> float | None:
    cleaned = text.strip().replace(",", "").rstrip("%").strip()
    try:
        return float(cleaned)
    except ValueError:
        found = _NUMBER.findall(cleaned)
        return float(found[0]) if len(found) == 1 else None


def _check_answer(check: AnswerCheck, answer: str | None) -> Verdict:
    if answer is None:
        return Verdict(False, "no final answer was given", "answer")
    given = answer.strip()
    if check.match == "numeric":
        value, expected = _number(given), float(str(check.expected).replace(",", ""))
        if value is None:
            return Verdict(False, f"expected a number near {expected:g}; the answer {given[:200]!r} is not one",
                           "answer:numeric")
        ok = math.isclose(value, expected, rel_tol=check.rel_tolerance, abs_tol=check.tolerance)
        return Verdict(ok, f"answer {value:g} {'matches' if ok else 'differs from'} expected {expected:g} "
                           f"(tolerance {check.tolerance:g})", "answer:numeric", score=1.0 if ok else 0.0)
    if check.match == "regex":
        ok = re.fullmatch(str(check.expected), given, re.DOTALL) is not None
        return Verdict(ok, f"answer {given[:200]!r} {'matches' if ok else 'does not match'} /{check.expected}/",
                       "answer:regex", score=1.0 if ok else 0.0)
    expected = str(check.expected).strip()
    ok = given.casefold() == expected.casefold() if check.casefold else given == expected
    return Verdict(ok, f"answer {given[:200]!r} {'equals' if ok else 'is not'} expected {expected[:200]!r}",
                   "answer:exact", score=1.0 if ok else 0.0)


def _limits(base: Limits | None, timeout_s: float) -> Limits:
    base = base or Limits()
    return replace(base, timeout_s=min(base.timeout_s, timeout_s) if base.timeout_s else timeout_s)


def _shadowing(workspace: str) -> list[str]:
    """Workspace entries a Python run there would import in place of the standard library's modules.

    A command check such as ``python3 test_solution.py`` puts the workspace first on
    ``sys.path``, so an attempt that plants ``unittest.py`` (or ``json/``) would decide
    its own verdict. The check's files are the judge's; these are the attempt's.
    """
    found = []
    try:
        entries = os.listdir(workspace)
    except OSError:
        return found
    for name in entries:
        stem = name[:-3] if name.endswith(".py") else name
        if stem in sys.stdlib_module_names and (name.endswith(".py") or
                                                os.path.isdir(os.path.join(workspace, name))):
            found.append(name)
    return sorted(found)


def _check_command(check: CommandCheck, sandbox: Sandbox, workspace: str, limits: Limits | None) -> Verdict:
    shadows = _shadowing(workspace)
    if shadows:
        return Verdict(False, f"the workspace holds {', '.join(shadows)}, which would stand in for the standard "
                              "library's module(s) of that name when the check runs Python; rename them",
                       "command", score=0.0)
    result = sandbox.run(["/bin/sh", "-c", check.command], workspace=workspace, limits=_limits(limits, check.timeout_s))
    output = "\n".join(p for p in (result.stdout.strip(), result.stderr.strip(), result.error or "") if p)
    status = "timed out" if result.timed_out else f"exited {result.exit_code}"
    return Verdict(result.ok, f"`{check.command}` {status}\n{output}".strip(), "command",
                   score=1.0 if result.ok else 0.0)


def _check_python(check: PythonCheck, sandbox: Sandbox, workspace: str, answer: str | None,
                  limits: Limits | None) -> Verdict:
    # The agent controls the workspace, which is the checker's working directory:
    # a planted json.py must not be what the checker imports, so the working
    # directory leaves the import path before anything else runs.
    harness = (
        "import sys as _sys\n"
        "_sys.path[:] = [_p for _p in _sys.path if _p not in ('', '.')]\n"
        f"{check.code}\n\n"
        "import json as _json, os as _os\n"
        f"_result = check(_json.loads({json.dumps(json.dumps(answer))}), _os.getcwd())\n"
        "_ok, _message = (_result if isinstance(_result, tuple) else (_result, ''))\n"
        f"print({_MARK!r} + _json.dumps({{'success': bool(_ok), 'message': str(_message)}}))\n"
    )
    result = sandbox.python(harness, workspace=workspace, limits=_limits(limits, check.timeout_s))
    for line in reversed(result.stdout.splitlines()):
        if line.startswith(_MARK):
            data = json.loads(line[len(_MARK):])
            return Verdict(data["success"], data["message"] or ("check passed" if data["success"] else "check failed"),
                           "python", score=1.0 if data["success"] else 0.0)
    problem = "timed out" if result.timed_out else (result.stderr.strip()[-2000:] or result.error or "no verdict")
    return Verdict(False, f"the checker did not give a verdict: {problem}", "python", score=0.0)


def verify(check: AnswerCheck | CommandCheck | PythonCheck, *, answer: str | None, sandbox: Sandbox,
           workspace: str | os.PathLike[str], limits: Limits | None = None) -> Verdict:
    """Judge one attempt; never raises for anything the attempt did."""
    if isinstance(check, AnswerCheck):
        return _check_answer(check, answer)
    for path, text in check.files.items():
        try:
            write_text(workspace, path, text)
        except (SandboxError, OSError) as exc:
            return Verdict(False, f"could not put the check's file {path} in place: {exc}", check.type, score=0.0)
    if isinstance(check, CommandCheck):
        return _check_command(check, sandbox, os.fspath(workspace), limits)
    return _check_python(check, sandbox, os.fspath(workspace), answer, limits)
