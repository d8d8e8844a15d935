"""Task checks as data: what decides that a task succeeded.

Three kinds, all validated strictly where they enter (API, task packs):

- ``{"type": "answer", "expected": "165"}`` — the final answer, compared
  ``match="exact"`` (after trimming whitespace; ``casefold`` optional),
  ``"numeric"`` (within ``tolerance``) or ``"regex"`` (``expected`` is a pattern
  the whole answer must match);
- ``{"type": "command", "command": "test -s out.txt"}`` — a shell command run
  in the task's workspace, in the sandbox; exit code 0 is success. The attempt's
  code it runs (``python3 wc.py data.txt | grep …``) runs as a child of it. A
  command whose Python test files import the attempt's modules is refused: that
  code would run inside the test's own interpreter, where ``os._exit(0)`` at
  import decides the verdict. Use a Python check with ``solution()`` for that;
- ``{"type": "python", "code": "def check(answer, workspace): ..."}`` — a
  checker function; it returns a bool, or (bool, message). It runs in the
  sandbox in the judge's own runner (``sandbox/judged.py``), which gives it
  ``solution(module="solution")`` (the attempt's module, loaded in a process of
  its own, its functions called with plain data), ``run(argv_or_line, stdin=…)``
  and ``run_unittest(*TestCases)``. The attempt's code never runs in the
  checker's interpreter.

Command and Python checks may carry ``files`` (fixtures) that the verifier
writes into the workspace right before checking, so what is checked against is
the pack's, not whatever the agent left there. The attempt's code can read the
workspace: keep expected results in the check's code, which it cannot read.
"""

from __future__ import annotations

import ast
import re
import sys
from typing import Annotated, Literal

import regex
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    model_validator,
)

__all__ = [
    "MAX_ANSWER_CHARS",
    "REGEX_TIMEOUT_S",
    "AnswerCheck",
    "Check",
    "CheckError",
    "CommandCheck",
    "PythonCheck",
    "parse_check",
]

MAX_ANSWER_CHARS = 100_000
"""Longer answers fail an answer check unread: comparing them must stay cheap."""
REGEX_TIMEOUT_S = 2.0
"""How long a regex answer check may take to match before it counts as no match."""


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
    def _consistent(self) -> AnswerCheck:
        if self.match == "numeric":
            try:
                float(str(self.expected).replace(",", ""))
            except ValueError:
                raise ValueError(f"a numeric check needs a number as expected, not {self.expected!r}") from None
        if self.match == "regex":
            try:
                regex.compile(str(self.expected))
            except regex.error as exc:
                raise ValueError(f"expected is not a valid regex ({exc})") from None
        return self


class _FilesCheck(_Check):
    timeout_s: float = Field(default=60.0, gt=0, le=3600)
    """How long the check may run, in the sandbox, before it counts as failed."""
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

    @model_validator(mode="after")
    def _judged_code_outside(self) -> CommandCheck:
        imported = attempt_imports(self.files)
        if imported:
            path, module = imported[0]
            raise ValueError(
                f"its test file {path} imports {module}, which is not the standard library's nor one of the "
                "check's files: the attempt's code would run inside the test's own process, where it can "
                "decide its own verdict (os._exit(0) at import passes). Use a python check that calls it "
                f"through solution({module!r})"
            )
        return self


def attempt_imports(files: dict[str, str]) -> list[tuple[str, str]]:
    """(file, module) for each import in the check's Python files of a module that only the workspace can hold."""
    own = {path.rsplit("/", 1)[-1].removesuffix(".py") for path in files if path.endswith(".py")}
    found = []
    for path, text in files.items():
        if not path.endswith(".py"):
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue  # a broken test fails when it runs
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom) and node.module and not node.level
                else []
            )
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in own:
                    found.append((path, top))
    return found


class PythonCheck(_FilesCheck):
    type: Literal["python"]
    code: str = Field(min_length=1)

    @model_validator(mode="after")
    def _defines_check(self) -> PythonCheck:
        try:
            compile(self.code, "<check>", "exec")
        except SyntaxError as exc:
            raise ValueError(f"the checker does not parse (line {exc.lineno}: {exc.msg})") from None
        if not re.search(r"^def check\(", self.code, re.MULTILINE):
            raise ValueError("the checker must define a top-level function check(answer, workspace)")
        return self


Check = Annotated[AnswerCheck | CommandCheck | PythonCheck, Field(discriminator="type")]
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
