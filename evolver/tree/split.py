"""The front door for tasks: every way a task is created admits it here, which decides its id, its kind and
its split before it is committed.

The kind (``memory.TaskKind``, stored as the task's source) decides the rest: the budget its model calls
spend, whether a failing hook fails its run, whether the tree search reads its result.

The store has one rule for what a learner may see (``memory.search.learnable_sql``): nothing of a
task whose metadata says ``split: "test"``. The split is decided here, so no attempt at a held-out task
is ever learnable, not even for a moment:

- a task that is a held-out task of a configured pack, its words and its files, is held out, whatever its
  kind and whoever sends it (the API, ``evolver run``, a local ``evolver bench``, chat, MCP's submit_task,
  the search), so a held-out task cannot be brought into training by submitting it. Its words alone do not
  make it one: recurring work comes in the same words with new files (this week's log), and such a task
  is another instance of the work, with another answer, which may be learned from;
- anyone may hold out their own task (``split: "test"``); no one can move one out of the held-out split;
- a benchmark's task keeps its pack's split (held out when none is given);
- the search's evaluations and smoke runs keep the split the search gives them;
- a person's task with a check (a possible evaluation task, ``TreeSearch.pool``) is held out by the
  hash of its id, ``[advanced.evolution] held_out_share`` of them; the rest train; a task without a
  check, or a chat turn, has no split (it is learnable and never an evaluation task).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from memory import TaskKind, new_id

from ..config import Config
from ..judge.catalog import resolve_pack
from ..judge.taskpack import SPLITS, TaskPackError, hashed_split

__all__ = ["Admission", "CHAT_PRIORITY", "hashed_split", "held_out_tasks", "task_identity", "SPLITS"]


CHAT_PRIORITY = 1_000  # above any a task is given (the API's are -100..100): a chat turn is claimed first


@dataclass(frozen=True)
class Admission:
    share: float = 0.0  # [advanced.evolution] held_out_share
    held_out: frozenset[str] = frozenset()  # the held-out tasks of [evolution] packs (task_identity)

    @classmethod
    def of(cls, config: Config) -> Admission:
        return cls(config.evolution.held_out_share, held_out_tasks(config.evolution.packs))

    def admit(self, kind: TaskKind | str, prompt: str, **item) -> dict:
        """``add_task``'s arguments for a task of ``kind``: ``item``'s (check, priority, metadata,
        idempotency_key, status, id) with an id of its own, its kind as its source, and its split in its
        metadata. A kind no task has is refused (ValueError)."""
        kind = TaskKind.of(kind)
        task_id = item.get("id") or new_id("task")
        metadata = dict(item.get("metadata") or {})
        asked = metadata.get("split")
        if asked == "test" or task_identity(prompt, metadata.get("files")) in self.held_out:
            split = "test"
        elif kind is TaskKind.BENCH:
            split = asked if asked in SPLITS else "test"
        elif kind.searched:
            split = asked if asked in SPLITS else None
        elif kind is not TaskKind.CHAT and item.get("check") is not None:
            split = hashed_split(task_id, self.share)
        else:
            split = None
        if split is None:
            metadata.pop("split", None)
        else:
            metadata["split"] = split
        if kind is TaskKind.CHAT:  # a person waits for it, in a lane of its own
            item["priority"] = CHAT_PRIORITY
        return {**item, "prompt": prompt, "id": task_id, "source": kind, "metadata": metadata}


def task_identity(prompt: str, files: object = None) -> str:
    """What makes two tasks the same task: their words (trimmed) and the files they come with."""
    given = files if isinstance(files, dict) and files else {}
    digest = hashlib.sha256(json.dumps(given, sort_keys=True).encode("utf-8")).hexdigest()
    return f"{digest}:{prompt.strip()}"


def held_out_tasks(packs: list[str]) -> frozenset[str]:
    """The held-out tasks of ``packs`` (``[evolution] packs``), each by its ``task_identity``; a pack that
    cannot be read adds none (the search says why when it reads its packs)."""
    found = set()
    for name in packs:
        try:
            found.update(task_identity(t.prompt, t.files) for t in resolve_pack(name) if t.split == "test")
        except TaskPackError:
            continue
    return frozenset(found)
