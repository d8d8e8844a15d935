"""Clipping text for prompts: one rule for every prompt the engine writes."""

from __future__ import annotations

__all__ = ["clip"]


def clip(text: str | None, chars: int, *, one_line: bool = False) -> str:
    """``text`` in at most ``chars`` characters, "..." marking a cut; with ``one_line`` its runs of
    white space (newlines included) become single spaces first."""
    text = text or ""
    if one_line:
        text = " ".join(text.split())
    return text if len(text) <= chars else text[: max(0, chars - 3)] + "..."
