"""The verifier: decides from a task's check whether an attempt succeeded.

Part of the engine's core, outside the scaffold: nothing evolution proposes can
change how success is judged. Command and Python checks run in the sandbox, in
the task's workspace, like any model-written code (a checker may read files the
agent wrote, and the agent may have planted anything there).
"""

from __future__ import annotations

import math
import os
import re
import sys
from dataclasses import dataclass

import regex

from sandbox import Limits, Sandbox, SandboxError, run_judged, write_text

from .checks import (
    MAX_ANSWER_CHARS,
    REGEX_TIMEOUT_S,
    AnswerCheck,
    CommandCheck,
    PythonCheck,
)

__all__ = ["Verdict", "verify"]

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


@dataclass(frozen=True)
class Verdict:
    success: bool
    output: str
    """What the verifier saw, for the person and the record: it may quote the expected output."""
    verifier: str
    score: float | None = None
    feedback: str | None = None
    """What a learner may be told (the reflection before a retry, a hook): never the expected
    output, the check's tests or its messages, or a retry could copy them into a pass."""

    @property
    def for_learner(self) -> str:
        if self.feedback is not None:
            return self.feedback
        return "the check passed" if self.success else "the check failed"


def _number(text: str) -> float | None:
    cleaned = text.strip().replace(",", "").rstrip("%").strip()
    try:
        return float(cleaned)
    except ValueError:
        found = _NUMBER.findall(cleaned)
        return float(found[0]) if len(found) == 1 else None


def _check_answer(check: AnswerCheck, answer: str | None) -> Verdict:
    if answer is None:
        return Verdict(False, "no final answer was given", "answer", feedback="no final answer was given")
    if len(answer) > MAX_ANSWER_CHARS:
        return Verdict(
            False,
            f"the answer is {len(answer):,} characters long; an answer check reads at most {MAX_ANSWER_CHARS:,}",
            f"answer:{check.match}",
            score=0.0,
            feedback=f"the answer is too long (over {MAX_ANSWER_CHARS:,} characters)",
        )
    given = answer.strip()
    if check.match == "numeric":
        value, expected = _number(given), float(str(check.expected).replace(",", ""))
        if value is None:
            return Verdict(
                False,
                f"expected a number near {expected:g}; the answer {given[:200]!r} is not one",
                "answer:numeric",
                feedback=f"the answer {given[:200]!r} is not a number; a number is expected",
            )
        ok = math.isclose(value, expected, rel_tol=check.rel_tolerance, abs_tol=check.tolerance)
        return Verdict(
            ok,
            f"answer {value:g} {'matches' if ok else 'differs from'} expected {expected:g} "
            f"(tolerance {check.tolerance:g})",
            "answer:numeric",
            score=1.0 if ok else 0.0,
            feedback=f"the answer {value:g} is {'right' if ok else 'wrong'}",
        )
    if check.match == "regex":
        # The regex package, not re: it can give up after a time, and it lets the other
        # threads of the daemon run while it matches (re holds the GIL through a
        # catastrophic backtrack such as (a+)+$ and freezes every request).
        try:
            ok = (
                regex.fullmatch(str(check.expected), given, regex.DOTALL, timeout=REGEX_TIMEOUT_S, concurrent=True)
                is not None
            )
        except TimeoutError:
            return Verdict(
                False,
                f"matching the answer against /{check.expected}/ took over {REGEX_TIMEOUT_S:g} s; counted as no match",
                "answer:regex",
                score=0.0,
                feedback="the answer took too long to match the expected pattern; counted as wrong",
            )
        return Verdict(
            ok,
            f"answer {given[:200]!r} {'matches' if ok else 'does not match'} /{check.expected}/",
            "answer:regex",
            score=1.0 if ok else 0.0,
            feedback=f"the answer {given[:200]!r} is {'right' if ok else 'wrong'}",
        )
    expected = str(check.expected).strip()
    ok = given.casefold() == expected.casefold() if check.casefold else given == expected
    return Verdict(
        ok,
        f"answer {given[:200]!r} {'equals' if ok else 'is not'} expected {expected[:200]!r}",
        "answer:exact",
        score=1.0 if ok else 0.0,
        feedback=f"the answer {given[:200]!r} is {'right' if ok else 'wrong'}",
    )


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
        stem = name.removesuffix(".py")
        if stem in sys.stdlib_module_names and (name.endswith(".py") or os.path.isdir(os.path.join(workspace, name))):
            found.append(name)
    return sorted(found)


def _judged(
    kind: str, job: dict, check: CommandCheck | PythonCheck, sandbox: Sandbox, workspace: str, limits: Limits | None
) -> Verdict:
    judged = run_judged(sandbox, workspace, {"kind": kind, **job}, timeout_s=check.timeout_s, limits=limits)
    if judged.report is None:
        return Verdict(
            False,
            f"the checker gave no verdict: {judged.problem}",
            kind,
            score=0.0,
            feedback="the check could not finish with this attempt's work (it crashed or ran out of time)",
        )
    ok = judged.report.get("success") is True
    message = str(judged.report.get("message") or ("check passed" if ok else "check failed"))
    return Verdict(ok, message, kind, score=1.0 if ok else 0.0)


def _check_command(check: CommandCheck, sandbox: Sandbox, workspace: str, limits: Limits | None) -> Verdict:
    shadows = _shadowing(workspace)
    if shadows:
        message = (
            f"the workspace holds {', '.join(shadows)}, which would stand in for the standard "
            "library's module(s) of that name when the check runs Python; rename them"
        )
        return Verdict(False, message, "command", score=0.0, feedback=message)  # the attempt's own files
    return _judged("command", {"command": check.command}, check, sandbox, workspace, limits)


def _check_python(
    check: PythonCheck, sandbox: Sandbox, workspace: str, answer: str | None, limits: Limits | None
) -> Verdict:
    return _judged("python", {"code": check.code, "answer": answer}, check, sandbox, workspace, limits)


def verify(
    check: AnswerCheck | CommandCheck | PythonCheck,
    *,
    answer: str | None,
    sandbox: Sandbox,
    workspace: str | os.PathLike[str],
    limits: Limits | None = None,
) -> Verdict:
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
