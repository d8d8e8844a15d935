"""What a code task asks to be handed in: a file, and the functions its check loads from it.

A task names it in its metadata (``{"deliver": {"file": "solution.py", "functions": ["fizzbuzz"]}}``;
a pack line in its ``deliver`` key), or the agent reads it from the task's words
(``evolver.agent.asks``), which the field overrides. The agent uses it to deliver what its session defined and to try
the task's own examples before finishing; the judge does not read it: the check loads the file as
before, in its own process.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

__all__ = ["Deliverable", "parse_deliverable"]


@dataclass(frozen=True)
class Deliverable:
    file: str
    functions: tuple[str, ...]

    def data(self) -> dict:
        return {"file": self.file, "functions": list(self.functions)}


def parse_deliverable(data: object) -> Deliverable:
    """A deliverable from its JSON form; ValueError naming the problem."""
    if not isinstance(data, dict) or set(data) - {"file", "functions"}:
        raise ValueError('deliver is an object {"file": "solution.py", "functions": ["name", ...]}')
    path, functions = data.get("file"), data.get("functions")
    if not isinstance(path, str) or not path.endswith(".py"):
        raise ValueError("deliver.file must be the path of a Python file (ending in .py)")
    parts = PurePosixPath(path).parts
    if (
        path.startswith("/")
        or "\\" in path
        or ".." in parts
        or not all(p.removesuffix(".py").isidentifier() for p in parts)
    ):
        raise ValueError(f"deliver.file {path!r} must be a relative path of importable names inside the workspace")
    if (
        not isinstance(functions, list)
        or not functions
        or not all(isinstance(f, str) and f.isidentifier() for f in functions)
    ):
        raise ValueError("deliver.functions must be a non-empty list of function names")
    return Deliverable(file=path, functions=tuple(functions))
