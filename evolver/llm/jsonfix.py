"""A small, conservative repair of the JSON a model writes.

Small models get JSON nearly right: a code fence around it (or only an opening
one), prose before or after the one object, a trailing comma, the final brace
or bracket missing, single quotes where JSON wants double ones, Python's triple
quotes in code they pass as a string (a docstring inside the string, or the
last value written as a triple-quoted string up to the closing braces: three
quotes never occur in JSON, so neither reading is a guess). ``loads``
repairs exactly those, and only when the repair is unambiguous: an unclosed
string, a bracket that closes the wrong thing, single quotes beside double
ones (or apostrophes within them), or several objects in the text are left
as errors, since any repair would be a guess about what the model meant.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..text import clip

__all__ = ["extract", "loads", "not_json"]

_FENCE = re.compile(r"```[a-zA-Z]*[ \t]*\n?(.*?)(?:```|\Z)", re.DOTALL)
_CLOSER = {"{": "}", "[": "]"}


def extract(text: str) -> str:
    """The JSON part of a reply: a fenced block's content (closing fence or not), else the text from the
    first brace or bracket on."""
    text = text.strip()
    fenced = _FENCE.search(text)
    if fenced and fenced.group(1).strip().startswith(("{", "[")):
        return fenced.group(1).strip()
    starts = [i for i in (text.find("{"), text.find("[")) if i >= 0]
    return text[min(starts) :].strip() if starts else text


def _string_state(ch: str, in_string: bool, escaped: bool) -> tuple[bool, bool]:
    """After ``ch``: whether the text is inside a JSON string, and whether the next character is escaped."""
    if not in_string:
        return ch == '"', False
    if escaped:
        return True, False
    return ch != '"', ch == "\\"


def _balance(text: str) -> str | None:
    """``text`` without trailing commas and with its missing closers appended; None when that is a guess."""
    out, stack, in_string, escaped = [], [], False, False
    for n, ch in enumerate(text):
        if in_string:
            out.append(ch)
            in_string, escaped = _string_state(ch, in_string, escaped)
            continue
        if ch == '"':
            in_string = True
        elif ch in _CLOSER:
            stack.append(_CLOSER[ch])
        elif ch in "}]":
            if not stack or stack.pop() != ch:
                return None  # closes what was not opened
            while out and out[-1].isspace():
                out.pop()
            if out and out[-1] == ",":
                out.pop()  # a trailing comma
            if not stack:
                out.append(ch)
                rest = text[n + 1 :].strip()
                # Text after the object: one object and some prose is fine; a second object is not.
                return None if rest.startswith(("{", "[")) else "".join(out)
        out.append(ch)
    if in_string:
        return None  # where the string was meant to end is a guess
    while out and (out[-1].isspace() or out[-1] == ","):
        out.pop()
    return "".join(out) + "".join(reversed(stack))


_TRAILING_CLOSERS = re.compile(r"\s*[}\]][\s}\]]*\Z")


def _python_strings(text: str) -> str | None:
    """``text`` with Python's triple quotes made JSON, or None when there are none or they cannot be
    read: inside a string they are escaped (a docstring in code); outside one they open the last value,
    which runs to the closing braces at the end (an unmatched closing triple quote dropped)."""
    if '"""' not in text:
        return None
    out: list[str] = []
    i, in_string, escaped = 0, False, False
    while i < len(text):
        if not escaped and text.startswith('"""', i):
            if in_string:
                out.append('\\"\\"\\"')
                i += 3
                continue
            closers = _TRAILING_CLOSERS.search(text, i + 3)
            if closers is None:
                return None
            content = text[i + 3 : closers.start()]
            if content.count('"""') % 2:  # the value's own closing quotes
                end = content.rfind('"""')
                content = content[:end] + content[end + 3 :]
            if "\n" not in content and "\\n" in content:  # written with JSON's escapes, on one line
                content = content.replace("\\n", "\n").replace('\\"', '"')
            return "".join(out) + json.dumps(content) + text[closers.start() :]
        ch = text[i]
        in_string, escaped = _string_state(ch, in_string, escaped)
        out.append(ch)
        i += 1
    return "".join(out)


def loads(text: str) -> tuple[Any, bool]:
    """The JSON value in ``text`` and whether it needed repair; ``json.JSONDecodeError`` (of the text as
    written) when no unambiguous repair parses."""
    try:
        return json.loads(text, strict=False), False
    except json.JSONDecodeError as original:
        error = original
    candidate = extract(text)
    candidate = _python_strings(candidate) or candidate
    if "'" in candidate and '"' not in candidate:
        # Single quotes only, and none inside a word (it's): every one delimits a string.
        if re.search(r"\w'\w", candidate):
            raise error
        candidate = candidate.replace("'", '"')
    balanced = _balance(candidate)
    if balanced is None:
        raise error
    try:
        return json.loads(balanced, strict=False), True
    except json.JSONDecodeError:
        raise error from None


def not_json(what: str, text: str, error: json.JSONDecodeError) -> str:
    """Why ``text`` is refused, with its start and the text around the fault: a reason that shows only the
    start says nothing when the fault is further on (a proposal refused at character 469 showed 200)."""
    near = text[max(error.pos - 60, 0) : error.pos + 30]
    return (
        f"{what} is not JSON ({error.msg} at character {error.pos}): {clip(text, 160, one_line=True)!r}, "
        f"around the fault: {near!r}"
    )
