"""Request bodies: strict (unknown fields are refused), with messages that name the field."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..checks import CheckError, parse_check

__all__ = ["TaskIn", "FeedbackIn", "SearchIn", "EvolveIn", "PromoteIn", "RollbackIn", "RevertIn", "ChatIn"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TaskIn(_Strict):
    prompt: str = Field(max_length=200_000, description="What to do, in words.")
    check: dict[str, Any] | None = Field(default=None, description="How success is decided (see the README).")
    priority: int = Field(default=0, ge=-100, le=100, description="Higher runs first.")
    metadata: dict[str, Any] | None = Field(
        default=None, description="Free-form; `files` ({path: text}) are written into the task's workspace.")

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
        if files is not None and not (isinstance(files, dict) and all(
                isinstance(k, str) and isinstance(v, str) for k, v in files.items())):
            raise ValueError("metadata.files must map relative paths to file contents (strings)")
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


class RevertIn(_Strict):
    why: str = Field(default="reverted by hand", max_length=2_000)


class ChatMessage(BaseModel):
    # OpenAI clients send fields this daemon does not use (name, tool_call_id, ...): accepted and ignored.
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.get("text", "") for part in self.content if part.get("type") == "text")
        return self.content or ""


class ChatIn(BaseModel):
    # The OpenAI request has many optional knobs (temperature, top_p, ...); they are accepted and ignored,
    # as the served scaffold decides them.
    model_config = ConfigDict(extra="allow")
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False

    @field_validator("messages")
    @classmethod
    def _has_user_text(cls, value: list[ChatMessage]) -> list[ChatMessage]:
        if not any(m.role == "user" and m.text().strip() for m in value):
            raise ValueError("there is no user message with text to answer")
        return value
