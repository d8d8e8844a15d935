"""What a task comes with, shown with its words: the files a person hands over, pasted after the request.

A person asking a model in a chat pastes the log or the CSV after the question; the model alone is
measured that way (``benchmarks/learning_curve.py``'s ``alone_prompt`` is this text). The agent got the
files only in its workspace, with "files you are given are there" in its system message, and the 0.5B model
did not look: asked for the errors in app.log, it called a ``mailer.log()`` it made up, three times, and
never opened the file. So the task's text the agent is shown (its first message, its plan, its reflection
and its retry) is its words and then its files, as pasted: what the model alone is given, and the workspace
besides. A long file is cut (the whole of it is in the workspace, which the cut says); a file that is not
text is named, not pasted.
"""

from __future__ import annotations

__all__ = ["PASTE_CHARS", "PASTE_TOTAL_CHARS", "task_text"]

PASTE_CHARS = 4_000
"""Of one file, pasted: a log or a CSV of about a hundred lines; the rest is in the workspace."""
PASTE_TOTAL_CHARS = 8_000
"""Of all the files, pasted: about 2,500 tokens of a local model's 8,192-token context."""


def task_text(prompt: str, files: object = None) -> str:
    """The task's words, then each of its files (by path) in a fenced block, as a person pastes them."""
    if not isinstance(files, dict) or not files:
        return prompt
    parts, left = [prompt], PASTE_TOTAL_CHARS
    for path, text in sorted(files.items()):
        if not isinstance(text, str) or "\x00" in text:
            parts.append(f"\n\n{path}: (not text; it is in your workspace)")
            continue
        shown = text[: min(PASTE_CHARS, max(left, 0))]
        left -= len(shown)
        if not shown and text:
            parts.append(f"\n\n{path}: ({len(text):,} characters, in your workspace)")
            continue
        cut = (
            f"\n(the first {len(shown):,} of its {len(text):,} characters; the whole file is in your workspace)"
            if len(shown) < len(text)
            else ""
        )
        body = shown if shown.endswith("\n") or not shown else shown + "\n"
        parts.append(f"\n\n{path}:\n```\n{body}```{cut}")
    return "".join(parts)
