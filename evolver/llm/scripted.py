"""A deterministic model that answers from a script, as a litellm custom provider.

Tests and the offline demo call ``litellm.completion(model="scripted/<name>")``
exactly as they would call a real model; litellm hands the request to
``ScriptedLLM``, which picks the first rule whose pattern matches the
conversation and answers with text or tool calls (``finish_reason="tool_calls"``).

A script is data (JSON-able), so a test can write one inline:

    {"rules": [
        {"match": "What is (\\d+)% of (\\d+)", "on": "task",
         "tool": "run_python", "arguments": {"code": "print(\\1 * \\2 / 100)"}},
        {"match": "^(?P<out>\\S+)\\s*$", "on": "last", "role": "tool",
         "tool": "finish", "arguments": {"answer": "\\g<out>"}},
        {"match": "", "reply": "I cannot do that."}
    ]}

Patterns are Python regexes searched in the chosen text: ``on="last"`` (the
latest message, default), ``"task"`` (the first user message) or ``"all"`` (the
whole conversation). ``role`` restricts which role the latest message must
have. Replies and string arguments are expanded with the match's groups
(``\\1``, ``\\g<name>``). ``error`` simulates a provider failure
("rate_limit", "timeout", "server", "bad_request", "context_full") for at most ``times`` calls
of that rule per script, so retries and fallbacks can be tested.
``native_tools: false`` makes the script answer tool calls as JSON in text, as
a model without native tool calling does. ``record`` names a file to which
every conversation the script is sent is appended, one JSON line each
(``{"messages": [...]}``), so a test can read what a daemon showed its model (and the ``max_tokens``,
``response_format`` and tool names it asked for). A streamed call (``stream=True``) gets the
reply a few characters a chunk, ``stream_delay_s`` apart, as a model writes it.

Another process (a daemon under test) reads a script from a file when the
model is named ``scripted/`` followed by the file's absolute path.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import memory._offline  # noqa: F401  (before litellm)

__all__ = ["Rule", "Script", "register_script", "script_for", "install", "ScriptError", "PROVIDER"]

PROVIDER = "scripted"


class ScriptError(ValueError):
    """A script that cannot be used: the message names the rule and the problem."""


@dataclass
class Rule:
    match: str = ""
    on: str = "last"
    role: str | None = None
    reply: str | None = None
    tool: str | None = None
    arguments: dict[str, Any] | None = None
    calls: list[dict[str, Any]] | None = None  # several tool calls at once
    error: str | None = None
    times: int | None = None

    def __post_init__(self) -> None:
        if self.on not in ("last", "task", "all"):
            raise ScriptError(f"rule {self.match!r}: on must be last, task or all, not {self.on!r}")
        actions = [self.reply is not None, self.tool is not None, self.calls is not None, self.error is not None]
        if sum(actions) != 1:
            raise ScriptError(f"rule {self.match!r}: give exactly one of reply, tool, calls or error")
        if self.error not in (None, "rate_limit", "timeout", "server", "bad_request", "context_full"):
            raise ScriptError(f"rule {self.match!r}: unknown error kind {self.error!r}")
        try:
            self._pattern = re.compile(self.match, re.DOTALL | re.MULTILINE)
        except re.error as exc:
            raise ScriptError(f"rule {self.match!r}: not a valid regex ({exc})") from None


@dataclass
class Script:
    rules: list[Rule]
    native_tools: bool = True
    record: str | None = None  # a file each conversation sent is appended to, one JSON line each
    stream_delay_s: float = 0.0  # streamed replies: the pause before each piece, as a model takes time
    _fired: dict[int, int] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def from_data(cls, data: dict) -> Script:
        if not isinstance(data, dict) or not isinstance(data.get("rules"), list):
            raise ScriptError('a script is an object with a "rules" list')
        unknown = set(data) - {"rules", "native_tools", "record", "stream_delay_s"}
        if unknown:
            raise ScriptError(f"unknown script keys: {sorted(unknown)}")
        rules = []
        for n, raw in enumerate(data["rules"]):
            if not isinstance(raw, dict):
                raise ScriptError(f"rule {n} is not an object")
            try:
                rules.append(Rule(**raw))
            except TypeError as exc:
                raise ScriptError(f"rule {n}: {exc}") from None
        record = data.get("record")
        if record is not None and not isinstance(record, str):
            raise ScriptError('"record" must be a file path')
        delay = data.get("stream_delay_s", 0.0)
        if not isinstance(delay, (int, float)) or isinstance(delay, bool) or not 0 <= delay <= 10:
            raise ScriptError('"stream_delay_s" must be a number of seconds from 0 to 10')
        return cls(
            rules=rules, native_tools=bool(data.get("native_tools", True)), record=record, stream_delay_s=float(delay)
        )

    @classmethod
    def from_file(cls, path: Path) -> Script:
        try:
            return cls.from_data(json.loads(Path(path).read_text(encoding="utf-8")))
        except UnicodeDecodeError as exc:
            raise ScriptError(f"{path} cannot be read as UTF-8 text ({exc.reason} at byte {exc.start})") from None
        except (OSError, json.JSONDecodeError) as exc:
            raise ScriptError(f"{path}: {exc}") from None

    def remember(self, messages: list[dict], options: dict | None = None) -> None:
        """Append the conversation to the ``record`` file (a no-op without one), with the request's
        max_tokens, temperature, seed, response_format and the names of the tools offered when it had them."""
        if self.record is None:
            return
        options = options or {}
        extra = {k: v for k, v in options.items() if k in ("max_tokens", "temperature", "seed", "response_format")}
        if options.get("tools"):
            extra["tools"] = [t.get("function", {}).get("name") for t in options["tools"]]
        line = json.dumps({"messages": [{"role": m.get("role"), "content": _text(m)} for m in messages], **extra})
        with self._lock, open(self.record, "a", encoding="utf-8") as f:
            f.write(line + "\n")

    def answer(self, messages: list[dict]) -> tuple[Rule, re.Match]:
        """The first rule that matches the conversation, and its match."""
        last = messages[-1] if messages else {"role": "user", "content": ""}
        task = next((m for m in messages if m.get("role") == "user"), last)
        texts = {"last": _text(last), "task": _text(task), "all": "\n".join(_text(m) for m in messages)}
        with self._lock:
            for n, rule in enumerate(self.rules):
                if rule.role and last.get("role") != rule.role:
                    continue
                if rule.times is not None and self._fired.get(n, 0) >= rule.times:
                    continue
                found = rule._pattern.search(texts[rule.on])
                if found:
                    self._fired[n] = self._fired.get(n, 0) + 1
                    return rule, found
        raise ScriptError(f"no rule matches the latest message: {texts['last'][:200]!r}")


def _text(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, list):  # OpenAI content parts
        content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def _expand(value: Any, found: re.Match) -> Any:
    if isinstance(value, str):
        return found.expand(value) if "\\" in value else value
    if isinstance(value, dict):
        return {k: _expand(v, found) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, found) for v in value]
    return value


_SCRIPTS: dict[str, Script] = {}
_SCRIPTS_LOCK = threading.Lock()


def register_script(name: str, script: Script | dict) -> Script:
    """Make ``scripted/<name>`` answer from this script (replacing any earlier one)."""
    script = script if isinstance(script, Script) else Script.from_data(script)
    with _SCRIPTS_LOCK:
        _SCRIPTS[name] = script
    return script


def script_for(model: str) -> Script:
    """The script that answers for ``scripted/<name>`` (the bundled demo script for "demo")."""
    name = model[len(PROVIDER) + 1 :] if model.startswith(PROVIDER + "/") else model
    with _SCRIPTS_LOCK:
        script = _SCRIPTS.get(name)
    if script is None and name == "demo":
        script = register_script(
            "demo", Script.from_file(Path(str(resources.files("evolver").joinpath("data", "demo_script.json"))))
        )
    if script is None and name.endswith(".json") and Path(name).is_absolute() and Path(name).is_file():
        # "scripted//abs/path/script.json": how a daemon in another process gets a test's script.
        script = register_script(name, Script.from_file(Path(name)))
    if script is None:
        raise ScriptError(f"no script named {name!r} is registered (model {model!r})")
    return script


def _estimate_tokens(text: str) -> int:
    return max(1, len(text) // 4)


class _Factory:
    """Builds litellm's response objects; imported lazily with litellm."""

    def __init__(self) -> None:
        from litellm import CustomLLM  # noqa: F401
        from litellm.types.utils import (
            ChatCompletionMessageToolCall,
            Choices,
            Function,
            Message,
            ModelResponse,
            Usage,
        )

        self.ToolCall, self.Choices, self.Function = ChatCompletionMessageToolCall, Choices, Function
        self.Message, self.ModelResponse, self.Usage = Message, ModelResponse, Usage


PIECE = 5  # characters a streamed piece carries: a reply comes in several, as a model's tokens do


def _pieces(response, delay_s: float):
    """A scripted reply as litellm's generic stream chunks: its text, or each tool call's name and then
    its arguments, a few characters at a time; last, the finish reason and the usage."""
    import time

    def chunk(
        text: str = "",
        tool_use: dict | None = None,
        finished: bool = False,
        reason: str = "",
        usage: dict | None = None,
    ) -> dict:
        if delay_s and not finished:
            time.sleep(delay_s)
        return {
            "text": text,
            "tool_use": tool_use,
            "is_finished": finished,
            "finish_reason": reason,
            "usage": usage,
            "index": 0,
        }

    choice = response.choices[0]
    content = choice.message.content or ""
    for start in range(0, len(content), PIECE):
        yield chunk(content[start : start + PIECE])
    for n, call in enumerate(choice.message.tool_calls or []):
        yield chunk(
            tool_use={
                "id": call.id,
                "type": "function",
                "index": n,
                "function": {"name": call.function.name, "arguments": ""},
            }
        )
        arguments = call.function.arguments or ""
        for start in range(0, len(arguments), PIECE):
            yield chunk(
                tool_use={
                    "id": None,
                    "type": "function",
                    "index": n,
                    "function": {"name": None, "arguments": arguments[start : start + PIECE]},
                }
            )
    usage = response.usage
    yield chunk(
        finished=True,
        reason=choice.finish_reason,
        usage={
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens,
        },
    )


def _raise_simulated(kind: str, model: str) -> None:
    import litellm

    text = f"scripted {kind} error"
    if kind == "rate_limit":
        raise litellm.RateLimitError(text, llm_provider=PROVIDER, model=model)
    if kind == "timeout":
        raise litellm.Timeout(text, llm_provider=PROVIDER, model=model)
    if kind == "server":
        raise litellm.InternalServerError(text, llm_provider=PROVIDER, model=model)
    if kind == "context_full":
        raise litellm.ContextWindowExceededError(text, llm_provider=PROVIDER, model=model)
    raise litellm.BadRequestError(text, llm_provider=PROVIDER, model=model)


def _build_handler():
    from litellm import CustomLLM

    class ScriptedLLM(CustomLLM):
        """litellm's handler for the ``scripted/`` provider."""

        def __init__(self) -> None:
            super().__init__()
            self._factory = _Factory()

        def completion(self, model: str, messages: list, *args, **kwargs):
            f = self._factory
            script = script_for(model)
            script.remember(messages, kwargs.get("optional_params"))
            rule, found = script.answer(messages)
            if rule.error:
                _raise_simulated(rule.error, model)
            prompt_tokens = sum(_estimate_tokens(_text(m)) for m in messages)
            calls = rule.calls or ([{"tool": rule.tool, "arguments": rule.arguments or {}}] if rule.tool else [])
            calls = [{"tool": c.get("tool"), "arguments": _expand(c.get("arguments") or {}, found)} for c in calls]
            if calls and script.native_tools:
                tool_calls = [
                    f.ToolCall(
                        id=f"call_{n}",
                        type="function",
                        function=f.Function(name=c["tool"], arguments=json.dumps(c["arguments"])),
                    )
                    for n, c in enumerate(calls)
                ]
                message, finish, out_text = (
                    f.Message(role="assistant", content=None, tool_calls=tool_calls),
                    "tool_calls",
                    json.dumps(calls),
                )
            else:
                if calls:  # a model without native tools writes the call as JSON in text
                    out_text = "\n".join("```json\n" + json.dumps(c) + "\n```" for c in calls)
                else:
                    out_text = _expand(rule.reply or "", found)
                message, finish = f.Message(role="assistant", content=out_text), "stop"
            completion_tokens = _estimate_tokens(out_text)
            return f.ModelResponse(
                model=model,
                choices=[f.Choices(index=0, finish_reason=finish, message=message)],
                usage=f.Usage(
                    prompt_tokens=prompt_tokens,
                    completion_tokens=completion_tokens,
                    total_tokens=prompt_tokens + completion_tokens,
                ),
            )

        async def acompletion(self, model: str, messages: list, *args, **kwargs):
            return self.completion(model, messages, *args, **kwargs)

        def streaming(self, model: str, messages: list, *args, **kwargs):
            # Answered (and a simulated error raised) now, as a real provider refuses before it streams.
            response = self.completion(model, messages, *args, **kwargs)
            return _pieces(response, script_for(model).stream_delay_s)

    return ScriptedLLM()


_INSTALLED = False
_INSTALL_LOCK = threading.Lock()


def install() -> None:
    """Register the scripted provider with litellm (idempotent)."""
    global _INSTALLED
    with _INSTALL_LOCK:
        if _INSTALLED:
            return
        import litellm

        handler = _build_handler()
        litellm.custom_provider_map = [
            *[p for p in litellm.custom_provider_map if p.get("provider") != PROVIDER],
            {"provider": PROVIDER, "custom_handler": handler},
        ]
        _INSTALLED = True
