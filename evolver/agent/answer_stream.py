"""The answer of a chat turn, passed on while the model writes it.

The agent's answer is the ``finish`` call's ``answer`` argument, so the model's
tokens cannot be passed on as they come: most of them are other tool calls,
and the answer sits inside a JSON string. ``AnswerStream`` watches each model
reply as it streams (``ReplyTap``: the text of a model that writes its calls as
JSON, or the arguments of a native ``finish`` call) and passes on the answer's
characters, decoded, as soon as they are complete. Only one reply's answer is
passed on: if that call then turns out unusable (its JSON broken after the
answer), the caller sees a final answer that does not continue what was
streamed, and says so (``evolver.api.chat``).
"""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = ["AnswerStream", "ReplyTap", "partial_json_string"]

_FINISH_NAMED = re.compile(r'"(?:tool|name)"\s*:\s*"finish"')
_ANSWER = re.compile(r'"answer"\s*:\s*"')
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def partial_json_string(raw: str) -> tuple[str, bool]:
    """The body of a JSON string (``raw`` starts after its opening quote) decoded as far as it is
    complete, and whether its closing quote came. An escape cut off at the end waits for the rest; an
    invalid one ends the string there."""
    out: list[str] = []
    i = 0
    while i < len(raw):
        c = raw[i]
        if c == '"':
            return "".join(out), True
        if c != "\\":
            out.append(c)
            i += 1
            continue
        if i + 1 >= len(raw):
            break
        kind = raw[i + 1]
        if kind != "u":
            if kind not in _ESCAPES:
                return "".join(out), True
            out.append(_ESCAPES[kind])
            i += 2
            continue
        if i + 6 > len(raw):
            break
        try:
            code = int(raw[i + 2 : i + 6], 16)
        except ValueError:
            return "".join(out), True
        if 0xD800 <= code < 0xDC00:  # the high half of a pair: wait for the low half
            if i + 12 > len(raw):
                break
            try:
                low = int(raw[i + 8 : i + 12], 16) if raw[i + 6 : i + 8] == "\\u" else -1
            except ValueError:
                low = -1
            if 0xDC00 <= low < 0xE000:
                out.append(chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)))
                i += 12
                continue
        out.append(chr(code))
        i += 6
    return "".join(out), False


class AnswerStream:
    """One chat turn's answer as it is written: ``emit`` gets each new piece of it."""

    def __init__(self, emit: Callable[[str], None]) -> None:
        self.emit = emit
        self.streamed = ""

    def tap(self) -> ReplyTap | None:
        """A tap for the next model reply; None once a reply's answer has been passed on (one only)."""
        return None if self.streamed else ReplyTap(self)

    def _pass_on(self, piece: str) -> None:
        self.streamed += piece
        self.emit(piece)


class ReplyTap:
    """Watches one model reply as it streams (``ModelClient.complete(stream=)`` feeds it)."""

    def __init__(self, stream: AnswerStream) -> None:
        self.stream = stream
        self.content = ""
        self.calls: dict[int, list[str]] = {}  # native calls: index -> [name, arguments so far]
        self.source: tuple[str, int] | None = None  # where the answer is: ("text", 0) or ("call", index)
        self.start = 0
        self.sent = ""
        self.closed = False

    def text(self, piece: str) -> None:
        """More of the reply's text (a model that writes its calls as JSON in text)."""
        self.content += piece
        if self.source is None:
            named = _FINISH_NAMED.search(self.content)
            found = _ANSWER.search(self.content, named.end()) if named else None
            if found is None:
                return
            self.source, self.start = ("text", 0), found.end()
        if self.source == ("text", 0):
            self._advance(self.content)

    def call(self, index: int, name: str | None, arguments: str) -> None:
        """More of a native tool call: its name when it comes, and a piece of its arguments' JSON."""
        call = self.calls.setdefault(index, ["", ""])
        call[0] += name or ""
        call[1] += arguments
        if self.source is None and call[0] == "finish":
            found = _ANSWER.match(call[1].lstrip("{ \n\t"))
            if found is None:
                return
            self.source, self.start = ("call", index), len(call[1]) - len(call[1].lstrip("{ \n\t")) + found.end()
        if self.source == ("call", index):
            self._advance(call[1])

    def _advance(self, raw: str) -> None:
        if self.closed:
            return
        text, self.closed = partial_json_string(raw[self.start :])
        if len(text) > len(self.sent):
            piece, self.sent = text[len(self.sent) :], text
            self.stream._pass_on(piece)
