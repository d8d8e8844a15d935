"""The scaffold: the editable part of the agent, as a content-addressed snapshot.

Everything the agent loop does that evolution may vary lives here: the prompt
templates, the agent's parameters, the enabled tools and optional policy hooks.
The engine's core (verifiers, evaluation harness, budget, sandbox policy, the
store) is not part of it and cannot be reached from it. A scaffold is plain
data, validated strictly; its id is the hash of its canonical JSON, so two
equal scaffolds are one version.
"""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

__all__ = [
    "Scaffold",
    "Prompts",
    "Parameters",
    "ScaffoldError",
    "load_scaffold",
    "default_scaffold",
    "parts_guide",
    "unused_parts",
]

FORMAT_VERSION = 1
BUILTIN_TOOLS = ("run_python", "run_shell", "read_file", "write_file", "list_files", "finish")


class ScaffoldError(ValueError):
    """A scaffold that cannot be used; the message names the field and the problem."""


class _Strict(BaseModel):
    # the attribute docstrings are the fields' descriptions: the proposer is shown them (parts_guide)
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, use_attribute_docstrings=True)


class Prompts(_Strict):
    system: str = Field(min_length=1)
    """The system message. Placeholders: none."""
    task: str = Field(min_length=1)
    """The first user message. Placeholders: {task}, {examples}, {insights}."""
    reflection: str = Field(min_length=1)
    """Asked after a failed attempt. Placeholders: {task}, {verdict}."""
    retry: str = Field(min_length=1)
    """Opens the next attempt. Placeholders: {task}, {reflection}."""
    plan: str = ""
    """Asked before the first step when plan_first is on. Placeholders: {task}."""
    code: str = Field(default="", min_length=0)
    """The system message when the agent acts in code (action_format code). Placeholders: {functions}
    (the functions the session defines, one per line). Empty: the system message above."""
    draft: str = ""
    """The draft (draft_first): the first turn of a code task that gives the stub of the function it asks
    for, sent alone, with no system message, as the model would be asked on its own. Placeholders: {stub}
    (the task's code of the function), {examples}, {insights}. Empty: no draft."""


class Parameters(_Strict):
    max_steps: int = Field(default=20, ge=1, le=500)
    """Model turns an attempt may take before it ends unfinished."""
    temperature: float = Field(default=0.2, ge=0, le=2)
    """The sampling temperature of every turn but the draft's (which is 0)."""
    similar_trajectories: int = Field(default=3, ge=0, le=20)
    """Past successes on similar tasks retrieved as worked examples ({examples}), within context_tokens."""
    insights: int = Field(default=5, ge=0, le=50)
    """Lessons from experience retrieved for the task ({insights}), within context_tokens."""
    tools: int = Field(default=5, ge=0, le=50)
    """Synthesized tools retrieved for the task and enabled beside the scaffold's own."""
    context_tokens: int = Field(default=2000, ge=0, le=100_000)
    """The budget of the examples and insights shown with a task (about 4 characters a token)."""
    reflect_retry: bool = True
    """After a failed attempt, ask prompts.reflection and start the next attempt with prompts.retry."""
    max_attempts: int = Field(default=2, ge=1, le=10)
    """Attempts per task; a retry happens only with reflect_retry on, and never on a held-out task (its
    check is the measurement: one attempt there)."""
    plan_first: bool = False
    """Ask prompts.plan before the first step and keep the plan in the conversation. Off: the plan
    prompt is never used."""
    repeat_limit: int = Field(default=3, ge=0, le=100)
    """After this many identical tool calls in a row (same name and arguments) the model is given the
    earlier result instead and told to do something else; after twice as many the attempt ends as a
    failure. 0: never; otherwise at least 2 (a first call is no repeat)."""
    action_format: Literal["auto", "code", "tools"] = "auto"
    """How the model acts. code: each reply's Python block runs in the attempt's persistent session,
    where the tools are functions and finish(answer) ends the attempt; a reply with no block is the
    answer. tools: tool calls (native, or JSON in text). auto: tools for a model that calls tools
    natively, code for one that does not."""
    example_rounds: int = Field(default=2, ge=0, le=10)
    """For a task that names its deliverable: how many times a finish is refused because the task's own
    examples fail on what would be delivered (the failures are the observation). 0: never tried."""
    draft_first: bool = True
    """Acting in code, on a task that names its deliverable: the first attempt opens with the model's own
    completion of the task's stub (prompts.draft, temperature 0). When its definition passes the task's
    examples it is handed in at once; otherwise the attempt goes on from it. However it goes on, the version
    handed in is the one that passed the most examples, the earliest of equals: the agent never hands in
    worse than its first draft by the task's own examples."""
    drafts: int = Field(default=1, ge=1, le=10)
    """How many drafts a code task with a stub may get (draft_first): after the first, while none passes the
    task's own examples, the model completes the stub again at draft_temperature. The first to pass is
    handed in; if none does, the attempt goes on from the one that passed the most."""
    draft_temperature: float = Field(default=0.8, ge=0, le=2)
    """The sampling temperature of the drafts after the first (which is 0). Each is sampled with a seed fixed
    by the draft prompt and its number, where the provider takes one, so the same prompt draws alike."""
    last_answer_turn: bool = True
    """An attempt about to end on its step limit or on repetition gets one last turn that can only be an
    answer (its trajectory ends 'asked')."""

    @field_validator("repeat_limit")
    @classmethod
    def _never_or_a_repeat(cls, value: int) -> int:
        if value == 1:
            raise ValueError("repeat_limit is 0 (never) or at least 2: a first call repeats nothing")
        return value


class Scaffold(_Strict):
    format: int = FORMAT_VERSION
    prompts: Prompts
    parameters: Parameters = Parameters()
    tools: tuple[str, ...] = BUILTIN_TOOLS
    """Enabled tools: built-in names, and synthesized ones by name."""
    hooks: str = ""
    """Optional policy hooks (Python source), run only inside the sandboxed worker."""

    def canonical_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))

    @property
    def hash(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()[:16]


def unused_parts(scaffold: Scaffold) -> dict[str, str]:
    """The prompts no run of ``scaffold`` ever sends and the parameters none ever reads, each with the
    parameter that leaves it unused."""
    p = scaffold.parameters
    unused = {}
    if not p.plan_first:
        unused["prompts.plan"] = "plan_first is off"
    if not p.reflect_retry or p.max_attempts == 1:
        why = "reflect_retry is off" if not p.reflect_retry else "max_attempts is 1"
        unused |= {"prompts.reflection": why, "prompts.retry": why}
    if not p.draft_first:
        unused |= {"prompts.draft": "draft_first is off", "parameters.drafts": "draft_first is off"}
    if not p.draft_first or p.drafts == 1:
        unused["parameters.draft_temperature"] = "draft_first is off" if not p.draft_first else "drafts is 1"
    if p.action_format == "tools":
        unused["prompts.code"] = "action_format is tools"
    return unused


def parts_guide(scaffold: Scaffold | None = None) -> str:
    """What each prompt and parameter does, a line each, from their docstrings, and which prompts
    ``scaffold`` never uses: a proposer that sees only the values cannot tell that the plan prompt is
    unused while plan_first is off (the 1.5B meta model proposed "adding" the plan prompt three times
    over), nor that the reflection prompt is unused with one attempt (it edited it in all three of its
    next valid proposals)."""
    unused = unused_parts(scaffold) if scaffold is not None else {}
    lines = []
    for section, model in (("prompts", Prompts), ("parameters", Parameters)):
        for name, field in model.model_fields.items():
            key = f"{section}.{name}"
            note = f" UNUSED by this scaffold ({unused[key]})." if key in unused else ""
            lines.append(f"- {key}: {' '.join((field.description or '').split())}{note}")
    return "\n".join(lines)


def _from_data(data: object, where: str) -> Scaffold:
    if not isinstance(data, dict):
        raise ScaffoldError(f"{where}: a scaffold is a JSON object")
    if data.get("format", FORMAT_VERSION) != FORMAT_VERSION:
        raise ScaffoldError(
            f"{where}: scaffold format {data.get('format')!r} is not supported (this is {FORMAT_VERSION})"
        )
    if "tools" in data and isinstance(data["tools"], list):
        data = {**data, "tools": tuple(data["tools"])}
    try:
        scaffold = Scaffold.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise ScaffoldError(f"{where}: {problems}") from None
    if "finish" not in scaffold.tools:
        raise ScaffoldError(f"{where}: tools must include finish, or no task could ever end")
    return scaffold


def load_scaffold(source: Path | str | dict) -> Scaffold:
    """A scaffold from a file path, a JSON string or a dict."""
    if isinstance(source, dict):
        return _from_data(source, "scaffold")
    if isinstance(source, Path):
        try:
            text = source.read_text(encoding="utf-8")
        except OSError as exc:
            raise ScaffoldError(f"{source}: cannot be read ({exc})") from None
        where = str(source)
    else:
        text, where = source, "scaffold"
    try:
        return _from_data(json.loads(text), where)
    except json.JSONDecodeError as exc:
        raise ScaffoldError(f"{where}: not valid JSON ({exc})") from None


def default_scaffold() -> Scaffold:
    """The seed scaffold the tree grows from (evolver/data/scaffold.json)."""
    text = resources.files("evolver").joinpath("data", "scaffold.json").read_text(encoding="utf-8")
    return load_scaffold(text)
