"""Task checks as data: what decides that a task succeeded.

Three kinds, all validated strictly where they enter (API, task packs):

- ``{"type": "answer", "expected": "165"}`` — the final answer, compared
  ``match="exact"`` (after trimming whitespace; ``casefold`` optional),
  ``"numeric"`` (within ``tolerance``) or ``"regex"`` (``expected`` is a pattern
  the whole answer must match);
- ``{"type": "command", "command": "python3 test_sol.py"}`` — a shell command
  run in the task's workspace, in the sandbox; exit code 0 is success;
- ``{"type": "python", "code": "def check(answer, workspace): ..."}`` — a
  checker function run in the sandbox; it returns a bool, or (bool, message).

Command and Python checks may carry ``files`` (tests, fixtures) that the
verifier writes into the workspace right before checking, so what is checked
against is the pack's, not whatever the agent left there.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    model_validator,
)

__all__ = ["AnswerCheck", "CommandCheck", "PythonCheck", "Check", "parse_check", "CheckError"]


class CheckError(ValueError):
    """A check that cannot be used; the message says what is wrong with it."""


class _Check(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AnswerCheck(_Check):
    type: Literal["answer"]
    expected: str | float | int
    match: Literal["exact", "numeric", "regex"] = "exact"
    tolerance: float = Field(default=1e-6, ge=0)
    """Absolute: |answer - expected| <= tolerance passes (numeric match)."""
    rel_tolerance: float = Field(default=0.0, ge=0, le=1)
    """Relative: also passes within this fraction of expected (numeric match)."""
    casefold: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> "AnswerCheck":
        if self.match == "numeric":
            try:
                float(str(self.expected).replace(",", ""))
            except ValueError:
                raise ValueError(f"a numeric check needs a number as expected, not {self.expected!r}") from None
        if self.match == "regex":
            try:
                re.compile(str(self.expected))
            except re.error as exc:
                raise ValueError(f"expected is not a valid regex ({exc})") from None
        return self


class _FilesCheck(_Check):
    files: dict[str, str] = {}
    """Files (tests, fixtures) the verifier writes into the workspace just before it
    runs the check, over whatever the agent left at those paths: an agent cannot pass
    a test by rewriting it."""

    @model_validator(mode="after")
    def _relative_files(self):
        for path in self.files:
            parts = path.replace("\\", "/").split("/")
            if not path or path.startswith("/") or ".." in parts:
                raise ValueError(f"check file {path!r} must be a relative path inside the workspace")
        return self


class CommandCheck(_FilesCheck):
    type: Literal["command"]
    command: str = Field(min_length=1)
    timeout_s: float = Field(default=60.0, gt=0, le=3600)


class PythonCheck(_FilesCheck):
    type: Literal["python"]
    code: str = Field(min_length=1)
    timeout_s: float = Field(default=60.0, gt=0, le=3600)

    @model_validator(mode="after")
    def _defines_check(self) -> "PythonCheck":
        try:
            compile(self.code, "<check>", "exec")
        except SyntaxError as exc:
            raise ValueError(f"the checker does not parse (line {exc.lineno}: {exc.msg})") from None
        if not re.search(r"^def check\(", self.code, re.MULTILINE):
            raise ValueError("the checker must define a top-level function check(answer, workspace)")
        return self


Check = Annotated[Union[AnswerCheck, CommandCheck, PythonCheck], Field(discriminator="type")]
_ADAPTER: TypeAdapter = TypeAdapter(Check)


def parse_check(data: object) -> AnswerCheck | CommandCheck | PythonCheck:
    """Validate a check; raises ``CheckError`` naming the problem."""
    if not isinstance(data, dict):
        raise CheckError("a check is an object with a type: answer, command or python")
    if data.get("type") not in ("answer", "command", "python"):
        raise CheckError(f"check type must be answer, command or python, not {data.get('type')!r}")
    try:
        return _ADAPTER.validate_python(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'][1:]) or 'check'}: {e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        )
        raise CheckError(f"bad {data['type']} check: {problems}") from None
