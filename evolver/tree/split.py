"""Which split a task from outside is in: decided once, when it is created, and recorded in its metadata.

The store has one rule for what a learner may see (``memory.search.learnable_sql``): nothing of a
task whose metadata says ``split: "test"``. This module says which tasks those are, before they are
committed, so no attempt at one is ever learnable, not even for a moment:

- a person's task with a check (a possible evaluation task, ``TreeSearch.pool``) is held out by the
  hash of its id, ``[advanced.evolution] held_out_share`` of them; the rest train;
- a benchmark's task keeps its pack's split (held out when none is given);
- a task whose text is a held-out task of a configured pack is held out, whoever sends it and however
  it is labelled, so a held-out task cannot be brought into training by submitting it;
- anyone may hold out their own task (``split: "test"``); no one can move one out of the held-out split.
"""

from __future__ import annotations

from memory import new_id

from ..judge.catalog import resolve_pack
from ..judge.taskpack import SPLITS, TaskPackError, hashed_split

__all__ = ["hashed_split", "decide_split", "held_out_prompts", "SPLITS"]


def decide_split(item: dict, *, share: float, held_out_prompts: frozenset[str] = frozenset()) -> dict:
    """``item`` (``add_task``'s arguments, for a task from a person or a benchmark) with an id of its
    own and its split in its metadata; without a check or a split asked for, no split is recorded
    (the task is learnable and never an evaluation task)."""
    task_id = item.get("id") or new_id("task")
    metadata = dict(item.get("metadata") or {})
    asked = metadata.get("split")
    if asked == "test" or item["prompt"].strip() in held_out_prompts:
        split = "test"
    elif item.get("source") == "bench":
        split = asked if asked in SPLITS else "test"
    elif item.get("check") is not None:
        split = hashed_split(task_id, share)
    else:
        split = None
    if split is None:
        metadata.pop("split", None)
    else:
        metadata["split"] = split
    return {**item, "id": task_id, "metadata": metadata}


def held_out_prompts(packs: list[str]) -> frozenset[str]:
    """The texts of the held-out tasks of ``packs`` (``[evolution] packs``); a pack that cannot be
    read adds none (the search says why when it reads its packs)."""
    found = set()
    for name in packs:
        try:
            found.update(t.prompt.strip() for t in resolve_pack(name) if t.split == "test")
        except TaskPackError:
            continue
    return frozenset(found)
