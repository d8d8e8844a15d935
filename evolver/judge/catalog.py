"""Task packs by the names a person types: "humaneval", "families", a JSONL file's path, or a bundled pack."""

from __future__ import annotations

from pathlib import Path

from .families import family_pack
from .humaneval import humaneval_tasks
from .taskpack import PackTask, bundled_pack, load_pack

__all__ = ["resolve_pack"]


def resolve_pack(name: str) -> list[PackTask]:
    """A pack by what a person would type: "humaneval", "families" (the generated task families, seed 0), a
    JSONL file's path, or a bundled pack's name."""
    if name == "humaneval":
        return humaneval_tasks()  # its problems load only when asked for (read inside the call)
    if name == "families":
        return family_pack()
    if Path(name).exists():
        return load_pack(name)
    return bundled_pack(name)
