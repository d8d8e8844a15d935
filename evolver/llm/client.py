"""The model layer: every model call goes through litellm, is budgeted and ledgered.

``ModelClient.complete`` takes OpenAI-style messages and tool schemas and
returns a ``ModelReply`` (text, parsed tool calls, tokens, cost, latency). It
retries transient errors with exponential backoff, then moves down the
fallback list; it checks the budget before each call and writes one ledger row
after it. Models without native tool calling get the tools described in the
system prompt and their JSON-in-text replies parsed back into tool calls.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import memory._offline  # noqa: F401  (before litellm)
from memory.roles import CallLedger

from ..config import ModelSettings
from . import jsonfix, scripted
from .budget import BudgetGuard

if TYPE_CHECKING:
    from pydantic import BaseModel

__all__ = [
    "Model",
    "ModelClient",
    "ModelReply",
    "ToolCall",
    "ModelError",
    "ContextFull",
    "StreamTap",
    "parse_text_tool_calls",
    "credentials_problem",
    "json_schema_format",
    "chat_turns",
]

log = logging.getLogger(__name__)

PURPOSES = ("task", "distill", "synthesize", "propose", "evaluate", "reflect")  # a chat turn's calls are "task"


class ModelError(Exception):
    """The model could not answer (after retries and fallbacks); the message says why."""


class ContextFull(ModelError):
    """The conversation no longer fits the model's context window: no retry or fallback of the same model can
    answer it, but an agent can end the attempt there and keep what it did."""


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any] | None
    error: str | None = None  # set when the arguments were not a JSON object
    raw_arguments: str = ""


@dataclass(frozen=True)
class ModelReply:
    content: str
    tool_calls: list[ToolCall]
    finish_reason: str
    model: str
    tokens_in: int
    tokens_out: int
    cost_usd: float
    latency_ms: float
    assistant_message: dict = field(default_factory=dict)  # to append to the conversation
    others: tuple[str, ...] = ()  # with n > 1: the other completions' texts (their tokens are in this reply's)


# The one shape a call takes in text (what _tools_as_text teaches, and what a refusal shows again).
TEXT_CALL_SHAPE = '```json\n{"tool": "<name>", "arguments": {...}}\n```'
_FENCED = re.compile(r"```[a-zA-Z]*[ \t]*\n?(.*?)```", re.DOTALL)
_LOOKS_LIKE_CALL = re.compile(r"""\{\s*["']?(tool|name)["']?\s*:""")


def parse_text_tool_calls(text: str) -> list[ToolCall]:
    """Tool calls written as JSON in text: ```json {"tool": ..., "arguments": {...}}```, one per fenced block
    (or one object in the text), slightly malformed JSON repaired when the repair is unambiguous
    (``jsonfix``). A call that cannot be read keeps the text as sent, and its error shows the shape."""
    blocks = [b.strip() for b in _FENCED.findall(text) if b.strip().startswith("{")]
    candidate = jsonfix.extract(text)
    if (
        not blocks
        and candidate.startswith("{")
        and (text.strip().startswith(("{", "```")) or _LOOKS_LIKE_CALL.search(text))
    ):
        blocks = [candidate]  # one object: unfenced, half-fenced, or with prose around it
    calls = []
    for n, block in enumerate(blocks):
        try:
            data, _ = jsonfix.loads(block)
        except json.JSONDecodeError as exc:
            calls.append(
                ToolCall(
                    id=f"text_{n}",
                    name="",
                    arguments=None,
                    raw_arguments=block,
                    error=f"invalid JSON ({exc}); write each call as {TEXT_CALL_SHAPE}, "
                    "with double quotes and every brace closed",
                )
            )
            continue
        name = data.get("tool") or data.get("name") if isinstance(data, dict) else None
        if not isinstance(name, str):
            continue  # JSON that is not a tool call is just text
        arguments = data.get("arguments", data.get("args", data.get("parameters", {})))
        if not isinstance(arguments, dict):
            calls.append(
                ToolCall(
                    id=f"text_{n}",
                    name=name,
                    arguments=None,
                    raw_arguments=block,
                    error=f"arguments must be a JSON object: {TEXT_CALL_SHAPE}",
                )
            )
            continue
        calls.append(ToolCall(id=f"text_{n}", name=name, arguments=arguments, raw_arguments=json.dumps(arguments)))
    return calls


def _tools_as_text(tools: list[dict]) -> str:
    lines = [
        "You can call these tools. To call one, reply with only a JSON block:",
        TEXT_CALL_SHAPE.replace("<name>", "NAME"),
        "",
    ]
    for tool in tools:
        fn = tool.get("function", tool)
        lines.append(
            f"- {fn['name']}: {fn.get('description', '')}\n  parameters: {json.dumps(fn.get('parameters', {}))}"
        )
    return "\n".join(lines)


def _transient_errors() -> tuple[type[Exception], ...]:
    """Errors worth the same request again. Not a timeout: the server may still be generating the
    abandoned reply (a local server has one slot), and a new request would queue behind it."""
    import litellm

    return (
        litellm.RateLimitError,
        litellm.APIConnectionError,
        litellm.InternalServerError,
        litellm.ServiceUnavailableError,
    )


# litellm raises a missing key as an InternalServerError (the OpenAI SDK's refusal to build a
# client): without this, it would be retried as if the server were down.
_MISSING_KEY = re.compile(r"Missing credentials|api_key client option must be set|No API key provided", re.IGNORECASE)

# What a server of your own needs in place of a key: litellm's OpenAI client refuses to start without one.
DUMMY_KEY = "sk-no-key-needed"


def _missing_key(exc: Exception) -> bool:
    import litellm

    return isinstance(exc, litellm.AuthenticationError) or bool(_MISSING_KEY.search(str(exc)))


def credentials_problem(settings: ModelSettings, section: str = "model") -> str | None:
    """Why the configured models cannot be called for want of an API key, or None when nothing is missing.
    A server of your own (api_base set) needs none; neither does the scripted model. ``section`` names
    where the settings came from ([model], or [meta] for the meta model's)."""
    import litellm

    problems = []
    for model in [settings.name, *settings.fallbacks]:
        if model.startswith(f"{scripted.PROVIDER}/") or settings.api_base:
            continue
        if settings.api_key_env:
            if not os.environ.get(settings.api_key_env):
                problems.append(
                    f"{model}: no API key: the environment variable {settings.api_key_env} "
                    f"([{section}] api_key_env) is not set"
                )
            continue
        try:
            missing = litellm.validate_environment(model=model).get("missing_keys") or []
        except Exception as exc:  # a provider litellm cannot check: the first call will say
            log.debug("cannot check the API key of %s: %s", model, exc)
            continue
        if missing:
            problems.append(
                f"{model}: no API key: set {' or '.join(missing)} (or name another variable in "
                f"[{section}] api_key_env; a server of your own needs [{section}] api_base instead)"
            )
    return "; ".join(problems) or None


def json_schema_format(name: str, shape: type[BaseModel] | dict) -> dict:
    """A response_format that asks the server for JSON of this pydantic model's schema, or of this JSON schema
    (a server that supports it, such as llama.cpp, vLLM or OpenAI, constrains the reply to it)."""
    schema = shape if isinstance(shape, dict) else shape.model_json_schema()
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}


def text_call_format(tools: list[dict]) -> dict:
    """Text-mode tool calls as constrained output: the reply is one JSON object calling one of ``tools``
    with arguments of its schema (a server that constrains output cannot then send a malformed call)."""
    options = []
    for tool in tools:
        fn = tool.get("function", tool)
        options.append(
            {
                "type": "object",
                "properties": {
                    "tool": {"type": "string", "enum": [fn["name"]]},
                    "arguments": fn.get("parameters") or {"type": "object"},
                },
                "required": ["tool", "arguments"],
            }
        )
    return {"type": "json_schema", "json_schema": {"name": "tool_call", "schema": {"anyOf": options}}}


def chat_turns(messages: list[dict]) -> list[dict]:
    """The conversation as chat templates want it: one system message first, then user and assistant
    turns that alternate. System messages are joined into the first; consecutive plain messages of one
    role (two tool results written back as text, a note after a result) are joined into one turn.
    Native tool-call turns (an assistant's tool_calls, "tool" results) are kept as they are."""
    system = [str(m.get("content") or "") for m in messages if m.get("role") == "system"]
    turns: list[dict] = [{"role": "system", "content": "\n\n".join(system)}] if system else []
    for message in messages:
        if message.get("role") == "system":
            continue
        last = turns[-1] if turns else None
        plain = message.get("role") in ("user", "assistant") and not message.get("tool_calls")
        if (
            plain
            and last is not None
            and last.get("role") == message["role"]
            and not last.get("tool_calls")
            and isinstance(last.get("content"), str)
            and isinstance(message.get("content"), str)
        ):
            turns[-1] = {**last, "content": f"{last['content']}\n\n{message['content']}"}
        else:
            turns.append(dict(message))
    return turns


class StreamTap(Protocol):
    """What watches a reply while the model streams it (``complete(stream=)``): its text, and each
    native tool call's name (when it comes) and pieces of its arguments' JSON."""

    def text(self, piece: str) -> None: ...

    def call(self, index: int, name: str | None, arguments: str) -> None: ...


class Model(Protocol):
    """What the engine asks of a model: ``ModelClient`` keeps it (litellm, so any provider, and the
    scripted model); another client is a new class that keeps it."""

    budget: BudgetGuard  # the caps its calls are checked against

    def complete(
        self,
        messages: list[dict],
        *,
        tools: list[dict] | None = None,
        temperature: float = 0.2,
        purpose: str = "task",
        task_id: str | None = None,
        node_id: str | None = None,
        max_tokens: int | None = None,
        response_format: dict | None = None,
        stream: StreamTap | None = None,
        seed: int | None = None,
        n: int = 1,
    ) -> ModelReply: ...

    def native_tools(self) -> bool:
        """Whether the model calls tools natively (a scaffold's action_format auto acts in code when not)."""
        ...


class ModelClient:
    def __init__(
        self,
        settings: ModelSettings,
        *,
        ledger: CallLedger,
        budget: BudgetGuard,
        sleep: Callable[[float], None] = time.sleep,
        backoff_s: float = 0.5,
        section: str = "model",
    ) -> None:
        import litellm

        scripted.install()
        litellm.suppress_debug_info = True
        self.settings = settings
        self.section = section  # where its settings came from, for messages: [model], or [meta]
        self.ledger = ledger  # where each call is charged
        self.budget = budget
        self._sleep = sleep
        self._backoff_s = backoff_s
        self._litellm = litellm

    def native_tools(self) -> bool:
        try:
            return self._native_tools(self.settings.name)
        except ModelError:
            return False

    def _native_tools(self, model: str) -> bool:
        if self.settings.tool_mode != "auto":  # the user knows better than litellm's table (a local alias)
            return self.settings.tool_mode == "native"
        if model.startswith(f"{scripted.PROVIDER}/"):
            try:
                return scripted.script_for(model).native_tools
            except scripted.ScriptError as exc:
                raise ModelError(str(exc)) from exc
        try:
            return bool(self._litellm.supports_function_calling(model))
        except Exception:
            return False

    def _takes_seed(self, model: str) -> bool:
        """Whether the provider takes OpenAI's ``seed`` (llama.cpp's and vLLM's servers, OpenAI, Gemini, Ollama
        do): litellm refuses a parameter a provider lacks (Anthropic's), and a draw unseeded is still a draw."""
        return model.startswith(f"{scripted.PROVIDER}/") or self._takes(model, "seed")

    def _takes(self, model: str, parameter: str) -> bool:
        provider, _, name = model.partition("/")
        try:
            supported = self._litellm.get_supported_openai_params(model=name, custom_llm_provider=provider) or []
        except Exception:
            return False
        return parameter in supported

    def _key_in_environment(self, model: str) -> bool:
        """Whether litellm finds the provider's usual key variable set (a gateway at api_base may need it)."""
        try:
            return bool(self._litellm.validate_environment(model=model).get("keys_in_environment"))
        except Exception as exc:  # a provider litellm cannot check
            log.debug("cannot check the API key of %s: %s", model, exc)
            return False

    @staticmethod
    def _estimate_tokens(messages: list[dict]) -> int:
        """About four characters a token. The guard needs an estimate before the call
        (the ledger gets the provider's exact count after it); a real tokenizer here
        would cost a model-specific load and grow with every step of a long task."""
        chars = sum(len(str(m.get("content") or "")) + len(str(m.get("tool_calls") or "")) for m in messages)
        return chars // 4 + 1

    def complete(
        self,
        messages: list[dict],
        *,
        tools: list[dict] | None = None,
        temperature: float = 0.2,
        purpose: str = "task",
        task_id: str | None = None,
        node_id: str | None = None,
        max_tokens: int | None = None,
        response_format: dict | None = None,
        stream: StreamTap | None = None,
        seed: int | None = None,
        n: int = 1,
    ) -> ModelReply:
        """One reply. With ``stream``, the reply is streamed from the model and ``stream`` sees it as it
        comes (the reply returned is the same, put together at the end). ``seed`` asks the server to sample
        with it (OpenAI's parameter, which llama.cpp's server takes), where the provider has one. ``n`` > 1
        asks for that many completions of one prompt pass (llama-server's slots write them at once); the
        reply is the first, and ``others`` holds the texts of the rest that came (a server may send fewer,
        or one: the caller asks again for what is missing)."""
        if purpose not in PURPOSES:
            raise ValueError(f"unknown purpose {purpose!r}; one of {PURPOSES}")
        models = [self.settings.name, *self.settings.fallbacks]
        failures, full = [], []
        for model in models:
            try:
                return self._complete_with(
                    model,
                    messages,
                    tools,
                    temperature,
                    purpose,
                    task_id,
                    node_id,
                    max_tokens,
                    response_format,
                    stream,
                    seed,
                    n,
                )
            except ModelError as exc:
                failures.append(f"{model}: {exc}")
                full.append(isinstance(exc, ContextFull))
                log.warning(
                    "model %s failed, %s",
                    model,
                    "trying the next fallback" if model != models[-1] else "no fallback left",
                )
        raise (ContextFull if all(full) else ModelError)("; ".join(failures))

    def _complete_with(
        self,
        model,
        messages,
        tools,
        temperature,
        purpose,
        task_id,
        node_id,
        max_tokens,
        response_format,
        stream=None,
        seed=None,
        n=1,
    ) -> ModelReply:
        native = self._native_tools(model) if tools else True
        call_messages = list(messages)
        if tools and not native:
            call_messages = [{"role": "system", "content": _tools_as_text(tools)}, *messages]
        call_messages = chat_turns(call_messages)
        self.budget.check(purpose=purpose, tokens=self._estimate_tokens(call_messages), task_id=task_id)
        # Every reply is bounded (a small model may never stop), and the timeout reaches the HTTP
        # request itself; retries are ours alone (the OpenAI SDK would retry a timeout twice more).
        kwargs: dict[str, Any] = {
            "model": model,
            "messages": call_messages,
            "temperature": temperature,
            "timeout": self.settings.timeout_s,
            "num_retries": 0,
            "max_retries": 0,
            "max_tokens": max_tokens or self.settings.max_tokens_for(purpose),
        }
        if seed is not None and self._takes_seed(model):
            kwargs["seed"] = seed
        if n > 1 and stream is None and self._takes(model, "n"):  # else one; the caller asks again
            kwargs["n"] = n
        if tools and native:
            kwargs["tools"] = tools
        if tools and not native and response_format is None and self.settings.structured_output:
            response_format = text_call_format(tools)  # the server's grammar makes every reply a well-formed call
        if response_format is not None:
            schema = (response_format.get("json_schema") or {}).get("schema")
            if self.settings.schema_format == "json_object" and schema is not None:
                response_format = {"type": "json_object", "schema": schema}  # the spelling some servers take instead
            kwargs["response_format"] = response_format
        if self.settings.api_base:
            kwargs["api_base"] = self.settings.api_base
        key = os.environ.get(self.settings.api_key_env, "") if self.settings.api_key_env else ""
        if key:
            kwargs["api_key"] = key
        elif self.settings.api_base and not self._key_in_environment(model):
            kwargs["api_key"] = DUMMY_KEY  # a server of your own: litellm refuses to call it without a key
        transient = _transient_errors()
        attempt = 0
        while True:
            started = time.perf_counter()
            try:
                response = (
                    self._litellm.completion(**kwargs)
                    if stream is None
                    else self._streamed(kwargs, call_messages, stream)
                )
                break
            except self._litellm.Timeout as exc:
                raise ModelError(
                    f"no reply within {self.settings.timeout_s:g} s ([model] timeout_s); not retried, "
                    "since the server may still be generating it"
                ) from exc
            except Exception as exc:
                if _missing_key(exc):  # retrying cannot make a key appear
                    alone = self.settings.model_copy(update={"name": model, "fallbacks": []})
                    raise ModelError(
                        credentials_problem(alone, self.section) or f"the API key was refused: {exc}"
                    ) from exc
                if isinstance(exc, self._litellm.ContextWindowExceededError):
                    raise ContextFull(f"{type(exc).__name__}: {exc}") from exc
                if kwargs.get("n") and isinstance(exc, self._litellm.BadRequestError):
                    # llama-server takes at most as many completions as it has slots: ask for one, and the
                    # caller asks again for the rest
                    log.info("model %s refused n=%s (%s); asking for one completion", model, kwargs.pop("n"), exc)
                    continue
                if not isinstance(exc, transient):  # bad request, unknown model: retrying will not help
                    raise ModelError(f"{type(exc).__name__}: {exc}") from exc
                attempt += 1
                if attempt > self.settings.max_retries:
                    raise ModelError(f"gave up after {attempt} attempts: {type(exc).__name__}: {exc}") from exc
                delay = self._backoff_s * 2 ** (attempt - 1)
                log.info("model %s: %s; retrying in %.1f s", model, type(exc).__name__, delay)
                self._sleep(delay)
        latency_ms = (time.perf_counter() - started) * 1000
        return self._record(model, response, native, latency_ms, purpose, task_id, node_id)

    def _streamed(self, kwargs: dict, call_messages: list[dict], tap: StreamTap):
        """The reply streamed (usage asked for in the last chunk), each piece shown to ``tap``, then put
        together as one response."""
        chunks = []
        for chunk in self._litellm.completion(**kwargs, stream=True, stream_options={"include_usage": True}):
            chunks.append(chunk)
            delta = chunk.choices[0].delta if chunk.choices else None
            if delta is None:
                continue
            if delta.content:
                tap.text(delta.content)
            for call in delta.tool_calls or []:
                function = call.function
                tap.call(
                    call.index or 0,
                    function.name if function else None,
                    (function.arguments if function else None) or "",
                )
        return self._litellm.stream_chunk_builder(chunks, messages=call_messages)

    def _record(self, model, response, native, latency_ms, purpose, task_id, node_id) -> ModelReply:
        choice = response.choices[0]
        message = choice.message
        usage = getattr(response, "usage", None)
        tokens_in = int(getattr(usage, "prompt_tokens", 0) or 0)
        tokens_out = int(getattr(usage, "completion_tokens", 0) or 0)
        cost = 0.0
        if not model.startswith(f"{scripted.PROVIDER}/"):
            try:
                cost = float(self._litellm.completion_cost(completion_response=response) or 0.0)
            except Exception:
                cost = 0.0  # a model litellm has no price for (a local server) costs nothing
        content = message.content or ""
        others = tuple((c.message.content or "") for c in response.choices[1:])
        if others and content:  # llama-server's usage counts the first completion alone (256 of 4 x 256
            # measured): the others' tokens are estimated at the first's tokens per character, for the budget
            tokens_out += round(tokens_out * sum(len(o) for o in others) / len(content))
        if native:
            calls = []
            for raw in message.tool_calls or []:
                text = raw.function.arguments or "{}"
                try:
                    arguments = json.loads(text)
                    error = None if isinstance(arguments, dict) else "arguments must be a JSON object"
                except json.JSONDecodeError as exc:
                    arguments, error = (
                        None,
                        (f"invalid JSON ({exc}); the arguments must be one JSON object of the tool's parameters"),
                    )
                calls.append(
                    ToolCall(
                        id=raw.id,
                        name=raw.function.name or "",
                        arguments=arguments if error is None else None,
                        error=error,
                        raw_arguments=text,
                    )
                )
        else:
            calls = parse_text_tool_calls(content)
        assistant: dict[str, Any] = {"role": "assistant", "content": content or None}
        if native and calls:
            assistant["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.raw_arguments}}
                for c in calls
            ]
        self.ledger.record_call(
            model=model,
            purpose=purpose,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            cost_usd=cost,
            latency_ms=latency_ms,
            task_id=task_id,
            node_id=node_id,
        )
        return ModelReply(
            content=content,
            tool_calls=calls,
            finish_reason=choice.finish_reason or "stop",
            model=model,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            cost_usd=cost,
            latency_ms=latency_ms,
            assistant_message=assistant,
            others=others,
        )
