"""Text rules shared by every layer: clipping text for prompts, and keeping control characters out of sight.

Text from outside (a task's prompt, a model's answer, an imported insight, a
tool's docstring) may carry control characters that a terminal acts on instead
of showing: ESC sequences that set its title, clear it or recolour it, a CR
that returns to the line's start and forges a new one over it. ``visible``
writes them out as escapes for every terminal the CLI prints to;
``control_character`` finds one where the engine refuses them outright.
"""

from __future__ import annotations

import re

__all__ = ["Unchanged", "clip", "control_character", "visible"]

# C0 controls but newline and tab, DEL, and the C1 controls (U+0080-U+009F, which some terminals act on too).
# Newline keeps multi-line text multi-line; a tab only moves right, to the next stop, so it forges nothing.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


class Unchanged(str):
    """The summary of a background round that changed nothing (no new trajectory, no evaluation ended, an
    index that agrees): a str like any summary, which the jobs keep as telemetry (status, the dashboard)
    rather than as an evolution event. A record round every 5 minutes wrote 288 events a day that
    `evolver history` showed."""

    __slots__ = ()


def clip(text: str | None, chars: int, *, one_line: bool = False) -> str:
    """``text`` in at most ``chars`` characters, "..." marking a cut; with ``one_line`` its runs of
    white space (newlines included) become single spaces first."""
    text = text or ""
    if one_line:
        text = " ".join(text.split())
    return text if len(text) <= chars else text[: max(0, chars - 3)] + "..."


def visible(text: str) -> str:
    """``text`` with each control character written out as ``\\xNN``, so it shows as what it is."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def control_character(text: str) -> str | None:
    """A sentence naming the first control character in ``text`` and where it is, or None when it has none."""
    found = _CONTROL.search(text)
    if found is None:
        return None
    where = found.start()
    if "\n" not in text:
        return f"control character \\x{ord(found.group()):02x} at character {where + 1}"
    line_start = text.rfind("\n", 0, where) + 1
    return (
        f"control character \\x{ord(found.group()):02x} at line {text.count(chr(10), 0, where) + 1}, "
        f"column {where - line_start + 1}"
    )
