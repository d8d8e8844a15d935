"""Task packs: evaluation and demo tasks in a documented JSONL format.

One JSON object per line:

    {"id": "arith-001",                      unique within the pack
     "prompt": "A train leaves at ...",      the task text
     "check": {"type": "answer", ...},       required; see evolver/judge/checks.py
     "tags": ["arithmetic"],                 optional
     "family": "loan-payment",               optional: the kind of recurring work it is one instance of
     "split": "train",                       "train" (default) or "test" (held out)
     "files": {"data.csv": "a,b\\n1,2\\n"},  optional: files put in the workspace first
     "deliver": {"file": "solution.py",      optional, for a code task: the file and the
                 "functions": ["f"]}}          functions its check loads (see deliverable.py)

A family is one kind of work given again and again with new data (a count from a log, a total
from a CSV): its instances share a family name and differ in their numbers, dates or files. The
learning curve splits a pack by family (``benchmarks/learning_curve.py --pack``) and reports how the
agent does on new instances of families it learned from and on families it never saw. Nothing the
agent or a learner reads carries the name: it is the benchmark's label, not a hint.

Blank lines and lines starting with ``#`` are skipped. A bad line is refused
with its file and line number; a pack with any bad line is refused whole, so a
half-read pack never feeds an evaluation.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path, PurePosixPath

from .checks import AnswerCheck, CheckError, CommandCheck, PythonCheck, parse_check
from .deliverable import Deliverable, parse_deliverable

__all__ = ["PackTask", "TaskPackError", "load_pack", "parse_pack", "bundled_pack", "SPLITS", "hashed_split"]

SPLITS = ("train", "test")


def hashed_split(task_id: str, test_share: float) -> str:
    """A stable split by the hash of an id: "test" (held out) for about ``test_share`` of ids."""
    bucket = int(hashlib.sha256(task_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "test" if bucket < test_share else "train"


_KEYS = {"id", "prompt", "check", "tags", "family", "split", "files", "deliver"}


class TaskPackError(ValueError):
    """A pack that cannot be used; the message lists every bad line."""


@dataclass(frozen=True)
class PackTask:
    id: str
    prompt: str
    check: AnswerCheck | CommandCheck | PythonCheck
    tags: tuple[str, ...] = ()
    split: str = "train"
    files: dict[str, str] = field(default_factory=dict)
    deliver: Deliverable | None = None
    family: str | None = None

    def check_data(self) -> dict:
        return self.check.model_dump()

    def metadata(self) -> dict:
        """What a task made from this one carries: its files, its deliverable and its split."""
        return {
            **({"files": self.files} if self.files else {}),
            **({"deliver": self.deliver.data()} if self.deliver else {}),
            "split": self.split,
        }

    def data(self) -> dict:
        """The pack line of this task."""
        return {
            "id": self.id,
            "prompt": self.prompt,
            "check": self.check_data(),
            "tags": list(self.tags),
            **({"family": self.family} if self.family else {}),
            "split": self.split,
            "files": self.files,
            **({"deliver": self.deliver.data()} if self.deliver else {}),
        }


def _safe_relative(path: str) -> bool:
    """A file path inside the workspace: relative, no `..`, naming a file (not `.` or `dir/`)."""
    p = PurePosixPath(path)
    return (
        bool(path)
        and not p.is_absolute()
        and ".." not in p.parts
        and "\\" not in path
        and not path.endswith("/")
        and p.parts not in ((), (".",))
        and p.name not in ("", ".")
    )


def _task(data: object, where: str) -> PackTask:
    if not isinstance(data, dict):
        raise TaskPackError(f"{where}: a task is a JSON object")
    unknown = set(data) - _KEYS
    if unknown:
        raise TaskPackError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(_KEYS)}")
    task_id = data.get("id")
    if not isinstance(task_id, str) or not task_id.strip():
        raise TaskPackError(f"{where}: id must be a non-empty string")
    prompt = data.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise TaskPackError(f"{where}: task {task_id}: prompt must be a non-empty string")
    if "check" not in data:
        raise TaskPackError(f"{where}: task {task_id} has no check; every pack task needs one")
    try:
        check = parse_check(data["check"])
    except CheckError as exc:
        raise TaskPackError(f"{where}: task {task_id}: {exc}") from None
    tags = data.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise TaskPackError(f"{where}: task {task_id}: tags must be a list of strings")
    family = data.get("family")
    if family is not None and (not isinstance(family, str) or not family.strip()):
        raise TaskPackError(f"{where}: task {task_id}: family must be a non-empty string (the kind of work)")
    split = data.get("split", "train")
    if split not in SPLITS:
        raise TaskPackError(f"{where}: task {task_id}: split must be one of {SPLITS}, not {split!r}")
    files = data.get("files", {})
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        raise TaskPackError(f"{where}: task {task_id}: files must map relative paths to text")
    for path in files:
        if not _safe_relative(path):
            raise TaskPackError(f"{where}: task {task_id}: file path {path!r} must be relative, inside the workspace")
    deliver = None
    if "deliver" in data:
        try:
            deliver = parse_deliverable(data["deliver"])
        except ValueError as exc:
            raise TaskPackError(f"{where}: task {task_id}: {exc}") from None
    return PackTask(
        id=task_id,
        prompt=prompt,
        check=check,
        tags=tuple(tags),
        split=split,
        files=dict(files),
        deliver=deliver,
        family=family,
    )


def parse_pack(text: str, source: str = "pack") -> list[PackTask]:
    tasks: list[PackTask] = []
    problems: list[str] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{source}:{number}"
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})")
            continue
        try:
            task = _task(data, where)
        except TaskPackError as exc:
            problems.append(str(exc))
            continue
        if task.id in seen:
            problems.append(f"{where}: duplicate id {task.id!r} (first on line {seen[task.id]})")
            continue
        seen[task.id] = number
        tasks.append(task)
    if problems:
        raise TaskPackError("\n".join(problems))
    if not tasks:
        raise TaskPackError(f"{source}: the pack has no tasks")
    return tasks


def load_pack(path: Path | str) -> list[PackTask]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskPackError(f"{path}: cannot be read ({exc})") from None
    return parse_pack(text, str(path))


def bundled_pack(name: str = "basic") -> list[PackTask]:
    """A pack shipped with evolver (evolver/data/packs/NAME.jsonl)."""
    resource = resources.files("evolver").joinpath("data", "packs", f"{name}.jsonl")
    if not resource.is_file():
        raise TaskPackError(f"there is no bundled pack named {name!r}")
    return parse_pack(resource.read_text(encoding="utf-8"), f"{name}.jsonl")
