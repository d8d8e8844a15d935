"""Request bodies: strict (unknown fields and loosely typed values are refused), with messages that name
the field; the error shape every error answers with."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..judge.checks import CheckError, parse_check
from ..judge.deliverable import parse_deliverable

__all__ = [
    "TaskIn",
    "FeedbackIn",
    "SearchIn",
    "EvolveIn",
    "PromoteIn",
    "RollbackIn",
    "RevertIn",
    "ChatIn",
    "ErrorOut",
    "errors",
    "MAX_ID",
    "MAX_DEPTH",
]

MAX_ID = 2**63 - 1  # SQLite's largest INTEGER: a bigger number cannot even be compared with a stored one
MAX_DEPTH = 32  # how deep a body may nest (free-form metadata included)


def _refuse_unstorable(value: Any, path: str = "", depth: int = 0) -> None:
    """Refuse what the JSON parser lets through but the store and the replies cannot hold: NaN and
    Infinity (not JSON numbers), text with lone surrogates (not encodable as UTF-8), and nesting so
    deep that turning it back into JSON would exhaust the stack."""
    at = f" (at {path[:200]})" if path else ""
    if depth > MAX_DEPTH:
        raise ValueError(f"it nests deeper than {MAX_DEPTH} levels")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"NaN and Infinity are not JSON numbers{at}")
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"the text is not valid Unicode (a lone surrogate){at}") from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _refuse_unstorable(key, path, depth + 1)
            _refuse_unstorable(item, f"{path}.{str(key)[:40]}".lstrip("."), depth + 1)
    elif isinstance(value, list):
        for n, item in enumerate(value):
            _refuse_unstorable(item, f"{path}.{n}".lstrip("."), depth + 1)


class _Storable(BaseModel):
    # Strict: JSON types as the schema declares them (0.0 is not false, 1.0 is not a priority).
    model_config = ConfigDict(strict=True)

    @field_validator("*", mode="before")
    @classmethod
    def _storable(cls, value: Any) -> Any:
        _refuse_unstorable(value)
        return value


class _Strict(_Storable):
    model_config = ConfigDict(extra="forbid")


class TaskIn(_Strict):
    prompt: str = Field(max_length=200_000, description="What to do, in words.")
    check: dict[str, Any] | None = Field(
        default=None, description="How success is decided (the manual: docs/user-guide/tasks.md, Checks)."
    )
    priority: int = Field(default=0, ge=-100, le=100, description="Higher runs first.")
    metadata: dict[str, Any] | None = Field(
        default=None,
        description="Free-form; `files` ({path: text}) are written into the task's workspace; "
        '`split` "test" holds the task out of everything learned (a task with a check '
        "is held out or not by the daemon; none is ever moved out of the held-out split); "
        '`deliver` ({"file": "solution.py", "functions": ["f"]}) names what a code task '
        "hands in, which the agent delivers from its session and tries on the task's "
        "examples.",
    )
    source: Literal["api", "bench"] = Field(
        default="api",
        description="\"bench\": a task of a benchmark's pack (`evolver bench`), in its pack's "
        "`split`; never an evaluation task.",
    )

    @field_validator("prompt")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the task text is empty; say what the task is")
        return value

    @field_validator("check")
    @classmethod
    def _valid_check(cls, value: dict | None) -> dict | None:
        if value is not None:
            try:
                parse_check(value)
            except CheckError as exc:
                raise ValueError(str(exc)) from None
        return value

    @field_validator("metadata")
    @classmethod
    def _valid_files(cls, value: dict | None) -> dict | None:
        files = (value or {}).get("files")
        if files is not None and not (
            isinstance(files, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in files.items())
        ):
            raise ValueError("metadata.files must map relative paths to file contents (strings)")
        if (value or {}).get("split", "train") not in ("train", "test"):
            raise ValueError('metadata.split must be "train" or "test"')
        if (value or {}).get("deliver") is not None:
            try:
                parse_deliverable(value["deliver"])
            except ValueError as exc:
                raise ValueError(f"metadata.{exc}") from None
        return value


class FeedbackIn(_Strict):
    good: bool
    note: str = Field(default="", max_length=10_000)


class SearchIn(_Strict):
    text: str = Field(min_length=1, max_length=10_000)
    kind: Literal["trajectories", "insights", "tools"] = "trajectories"
    k: int = Field(default=5, ge=1, le=100)
    success: bool | None = None
    node: str | None = None
    since_hours: float | None = Field(default=None, ge=0)

    @field_validator("text")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the search text is empty")
        return value


class EvolveIn(_Strict):
    job: str | None = None


class PromoteIn(_Strict):
    node_id: str = Field(min_length=1)
    why: str = Field(default="promoted by hand", max_length=2_000)


class RollbackIn(_Strict):
    node_id: str | None = None
    why: str = Field(default="rolled back by hand", max_length=2_000)


class ToolCallIn(_Strict):
    arguments: dict[str, Any] = Field(
        default_factory=dict, description="The tool's keyword arguments, as its parameters schema says."
    )


class RevertIn(_Strict):
    why: str = Field(default="reverted by hand", max_length=2_000)


class ApproveIn(_Strict):
    why: str = Field(default="approved by hand", max_length=2_000)


class ChatMessage(BaseModel):
    # OpenAI clients send fields this daemon does not use (name, tool_call_id, ...): accepted and ignored.
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None

    @field_validator("content")
    @classmethod
    def _text_parts(cls, value: str | list[dict[str, Any]] | None) -> str | list[dict[str, Any]] | None:
        for part in value if isinstance(value, list) else []:
            if part.get("type") == "text" and not isinstance(part.get("text"), str):
                raise ValueError("a text part needs its text as a string")
        return value

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.get("text", "") for part in self.content if part.get("type") == "text")
        return self.content or ""


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False


class ChatIn(_Storable):
    # The OpenAI request has many optional knobs (temperature, top_p, ...); they are accepted and ignored,
    # as the served scaffold decides them.
    model_config = ConfigDict(extra="allow")
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None

    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    @field_validator("messages")
    @classmethod
    def _has_user_text(cls, value: list[ChatMessage]) -> list[ChatMessage]:
        if not any(m.role == "user" and m.text().strip() for m in value):
            raise ValueError("there is no user message with text to answer")
        return value


class ErrorDetail(BaseModel):
    type: str = Field(description="What went wrong, as a word: invalid_request, invalid_json, not_found, ...")
    message: str = Field(description="What is wrong, in a sentence that names the field or the thing.")
    param: str | None = Field(description="The field, parameter or header at fault, when there is one.")


class ErrorOut(BaseModel):
    """Every error the API answers (the shape OpenAI clients read)."""

    error: ErrorDetail


_ERRORS = {
    400: "The body is not JSON in UTF-8, or a header is malformed.",
    401: "Over TCP, without the right bearer token.",
    404: "There is no such task, node, event, job or model.",
    409: "The request conflicts with the state: nothing to revert, no answer yet, not a node to promote...",
    413: "The body is over [advanced.daemon] max_body_bytes.",
    422: "A field, parameter or header is missing, of the wrong type or out of range.",
    429: "The budget is spent.",
    500: "The daemon failed on this request; it keeps serving, and its log has the details.",
    502: "The model failed.",
    503: "The store cannot be used now.",
}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The error responses of a route, for its OpenAPI schema: ``statuses``, and those every route may give."""
    return {status: {"model": ErrorOut, "description": _ERRORS[status]} for status in sorted({*statuses, 401, 500})}
