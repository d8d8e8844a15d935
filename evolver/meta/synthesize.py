"""One round of tool synthesis (after Voyager and Alita): repeated work in, verified tools out.

Opportunities come from the trajectories finished since this job's watermark:
code the agent ran (run_python) that repeats, literals aside, across several
tasks (matched against a look back over older trajectories too), and failures
whose reflection says a capability was missing. For each, the model writes one
tool: a typed function with a docstring, its own tests, and the arguments that
make it reproduce each recorded call. The candidate goes through quarantine
(``tools.quarantine``) and is registered only if it passes; otherwise it is
rejected with the reason. Either way the outcome is one event, committed with
the tool's row and the watermark's progress in one transaction.

The watermark keeps a fixed window (``after``..``until``) and the opportunities
of it already handled, so a round stopped halfway (the budget ran out, the
model failed) resumes exactly where it stopped: nothing is proposed twice and
nothing is skipped.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel, RootModel

from memory import ExperienceStore, NewTool, RecordedCall, ToolRecord
from tools import (
    BUILTIN_SOURCES,
    QuarantineReport,
    Replay,
    ToolFileError,
    ToolFiles,
    ToolSpec,
    ToolSpecError,
    quarantine,
    spec_from_source,
)

from ..config import Config
from ..engine import Engine, sandbox_limits
from ..llm import jsonfix
from ..llm.client import json_schema_format
from ..text import clip, control_character
from ..tree.incumbent import incumbent
from .distill import NOTHING_NEW

__all__ = [
    "WATERMARK_KEY",
    "Opportunity",
    "SynthesisError",
    "ToolRejected",
    "candidate_spec",
    "find_opportunities",
    "pending_trajectories",
    "synthesize_round",
    "vet_tool",
]

WATERMARK_KEY = "watermark.synthesize"
WINDOW = 100  # trajectories one window holds at most
LOOKBACK = 200  # older trajectories whose code a new one's may repeat
SHOWN_CALLS = 5  # recorded calls of one opportunity shown to the model (and replayed)

SYSTEM = (
    "You write one reusable tool for an agent that solves tasks in a Python sandbox. A tool is one Python function "
    "with type-annotated parameters (str, int, float, bool, list[...], dict, Literal[...] or X | None), an "
    "annotated return type and a docstring (a summary line, then an Args: section); helpers may start with _; "
    "only the standard library is available. Write tests for it: test_... functions that call it by name and "
    "assert. It must reproduce the output of each numbered recorded call: give the arguments for each.\n"
    'Answer with JSON only: {"name": "snake_case_name", "code": "<the function\'s source>", "tests": "<the '
    'tests\' source>", "replays": [{"call": 1, "arguments": {...}}], "rationale": "<why this tool helps>"}. '
    "To improve an existing tool, use its name: the new version replaces it if it also passes the old tests. "
    'Answer {"tool": null, "why": "..."} when no tool is worth writing.'
)

# A reflection that names something the agent could not do.
_GAP = re.compile(
    r"\b(no tool|missing|lack(?:s|ed|ing)?|unable|cannot|can't|could not|couldn't|no way|"
    r"not available|need(?:s|ed)? (?:a|an|to)|would need)\b",
    re.IGNORECASE,
)


class _Replay(BaseModel):
    call: int
    arguments: dict[str, Any]


class _Tool(BaseModel):
    name: str
    code: str
    tests: str
    replays: list[_Replay] = []
    rationale: str = ""


class _NoTool(BaseModel):
    tool: None
    why: str


class ToolAnswer(RootModel[_Tool | _NoTool]):
    """The answer's shape, as a JSON schema for servers that constrain output (_parse checks the rest)."""


class SynthesisError(ValueError):
    """The model's answer is not a tool proposal; the round fails and changes nothing."""


@dataclass(frozen=True)
class Opportunity:
    key: str
    kind: str  # "repeated_code" or "missing_capability"
    calls: tuple[RecordedCall, ...]  # the recorded calls a tool must reproduce
    evidence: tuple[str, ...]  # trajectory ids
    text: str  # what the model is shown


@dataclass(frozen=True)
class _Candidate:
    name: str
    code: str
    tests: str
    replays: dict[int, dict]
    rationale: str


def _state(store: ExperienceStore) -> dict:
    raw = store.get_meta(WATERMARK_KEY)
    state = {"after": None, "until": None, "done": []}
    if raw is not None:
        state.update(json.loads(raw))
    return state


def _key(trajectory) -> list:
    return [trajectory.finished_at, trajectory.id]


def pending_trajectories(store: ExperienceStore, limit: int) -> int:
    """Trajectories finished since the last complete window (what the job's trigger counts)."""
    after = _state(store)["after"]
    return len(store.attempts.finished_since(None if after is None else tuple(after), limit=limit))


# --- finding opportunities ------------------------------------------------------------


class _Literals(ast.NodeTransformer):
    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        return ast.copy_location(ast.Constant(value=f"<{type(node.value).__name__}>"), node)


def normalized_code(code: str) -> str | None:
    """The code with every literal replaced by its type, so one computation on other data looks the same."""
    try:
        return ast.unparse(_Literals().visit(ast.parse(code)))
    except (SyntaxError, ValueError, RecursionError):
        return None


def _code_opportunities(
    store: ExperienceStore, window: list[str], lookback: list[str], config: Config
) -> list[Opportunity]:
    e = config.evolution
    in_window = set(window)
    groups: dict[str, list[RecordedCall]] = {}
    for call in store.tools.recorded_calls(window + lookback, tool="run_python"):
        code = call.arguments.get("code")
        if not call.ok or call.success is False or not isinstance(code, str):
            continue
        shape = normalized_code(code)
        if shape is not None:
            groups.setdefault(shape, []).append(call)
    if not groups:
        return []
    shapes = sorted(groups)
    vectors = np.asarray(store.embedder.embed_documents(shapes), dtype=np.float32)
    vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    clusters: list[tuple[int, list[RecordedCall]]] = []  # (representative shape, calls)
    for i, shape in enumerate(shapes):
        for representative, members in clusters:
            if float(vectors[i] @ vectors[representative]) >= e.tool_code_similarity:
                members.extend(groups[shape])
                break
        else:
            clusters.append((i, list(groups[shape])))
    found = []
    for _, members in clusters:
        tasks = {c.task_id or c.trajectory_id for c in members}
        if len(tasks) < e.tool_min_repeats or not any(c.trajectory_id in in_window for c in members):
            continue
        members.sort(key=lambda c: (c.trajectory_id not in in_window, c.finished_at or 0.0, c.trajectory_id, c.seq))
        shown: list[RecordedCall] = []
        for call in members:  # one call per task, new ones first
            if len(shown) < SHOWN_CALLS and (call.task_id or call.trajectory_id) not in {
                s.task_id or s.trajectory_id for s in shown
            }:
                shown.append(call)
        key = (
            "code:"
            + hashlib.sha256(json.dumps(sorted([c.trajectory_id, c.seq] for c in members)).encode()).hexdigest()[:16]
        )
        lines = [f"This code ran in {len(tasks)} different tasks, each time on other data:"]
        for n, call in enumerate(shown, start=1):
            lines.append(
                f"Recorded call {n}:\n```python\n{clip(call.arguments['code'], 1500)}\n```\n"
                f"Its output:\n```\n{clip(call.output, 600)}\n```"
            )
        found.append(
            (
                len(tasks),
                Opportunity(
                    key=key,
                    kind="repeated_code",
                    calls=tuple(shown),
                    evidence=tuple(sorted({c.trajectory_id for c in members})),
                    text="\n".join(lines),
                ),
            )
        )
    found.sort(key=lambda item: (-item[0], item[1].key))
    return [opportunity for _, opportunity in found]


def _gap_opportunities(store: ExperienceStore, failed: dict[str, object]) -> list[Opportunity]:
    found = []
    for trajectory_id, reflection in sorted(store.attempts.reflections(list(failed)).items()):
        if not _GAP.search(reflection):
            continue
        trajectory = failed[trajectory_id]
        text = (
            f"A task failed for want of a capability.\nTask: {clip(trajectory.prompt, 800)}\n"
            f"Its answer: {clip(trajectory.final_answer or '(none)', 300)}\n"
            f"The agent's reflection: {clip(reflection, 800)}\nThere are no recorded calls to reproduce "
            "(give an empty replays list)."
        )
        found.append(
            Opportunity(
                key=f"gap:{trajectory_id}", kind="missing_capability", calls=(), evidence=(trajectory_id,), text=text
            )
        )
    return found


def find_opportunities(store: ExperienceStore, config: Config, window: list, lookback: list[str]) -> list[Opportunity]:
    """Opportunities in a window of (trajectory, success) pairs, the strongest first."""
    ids = [t.id for t, _ in window]
    failed = {t.id: t for t, success in window if success is False}
    return _code_opportunities(store, ids, lookback, config) + _gap_opportunities(store, failed)


# --- one proposal ---------------------------------------------------------------------


def _parse(content: str, opportunity: Opportunity) -> _Candidate | str:
    """The model's proposal, or the reason it gives for proposing none; SynthesisError when malformed."""
    try:  # raw newlines inside strings, a fence, a trailing comma, a last brace left off
        data, _ = jsonfix.loads(content)
    except json.JSONDecodeError as exc:
        raise SynthesisError(jsonfix.not_json("the model's answer", content, exc)) from None
    if not isinstance(data, dict):
        raise SynthesisError("the model's answer must be a JSON object")
    if "tool" in data and data["tool"] is None:
        return str(data.get("why") or "no reason given")
    unknown = set(data) - {"name", "code", "tests", "replays", "rationale"}
    if unknown:
        raise SynthesisError(f"the model's answer has unknown fields: {', '.join(sorted(unknown))}")
    for field in ("name", "code", "tests"):
        if not isinstance(data.get(field), str) or not data[field].strip():
            raise SynthesisError(f"the model's answer needs {field!r} as a non-empty string")
    replays = data.get("replays", [])
    if not isinstance(replays, list):
        raise SynthesisError('\'replays\' must be a list of {"call": n, "arguments": {...}}')
    mapped: dict[int, dict] = {}
    for item in replays:
        if not (
            isinstance(item, dict)
            and isinstance(item.get("call"), int)
            and not isinstance(item["call"], bool)
            and isinstance(item.get("arguments"), dict)
            and set(item) <= {"call", "arguments"}
        ):
            raise SynthesisError(f'each replay must be {{"call": n, "arguments": {{...}}}}, not {item!r:.200}')
        if not 1 <= item["call"] <= len(opportunity.calls):
            raise SynthesisError(
                f"replay of call {item['call']}: the recorded calls are numbered 1 to {len(opportunity.calls)}"
            )
        if item["call"] in mapped:
            raise SynthesisError(f"call {item['call']} is replayed twice")
        mapped[item["call"]] = item["arguments"]
    rationale = data.get("rationale", "")
    return _Candidate(
        name=data["name"].strip(),
        code=data["code"],
        tests=data["tests"],
        replays=mapped,
        rationale=rationale if isinstance(rationale, str) else str(rationale),
    )


def _existing(store: ExperienceStore) -> str:
    rows = [t for t in store.tools.list_tools(status="active") if t.origin == "synthesized"]
    if not rows:
        return "There are no synthesized tools yet."
    return "Synthesized tools now:\n" + "\n".join(
        f"- {t.name} (v{t.version}): {clip(t.description, 200)}" for t in rows
    )


class ToolRejected(Exception):
    """A candidate tool refused before registration; the message says why (quarantine's reason, a
    built-in's name, a duplicate, ...)."""


def _plain_text(field: str, text: str) -> None:
    """ToolRejected naming ``field`` when it has a control character: a tool's texts are shown to the model
    and printed to people's terminals, where one would act instead of showing."""
    problem = control_character(text)
    if problem:
        raise ToolRejected(f"a {problem} in its {field}; a tool's code, tests and docstring are plain text")


def candidate_spec(name: str, code: str, tests: str, *, node_id: str | None) -> ToolSpec:
    """The candidate's spec, its schema derived from its signature; ToolRejected when it has none a model
    call could carry (a built-in's name, no parse, no annotations, a default that is not JSON)."""
    if name in BUILTIN_SOURCES:
        raise ToolRejected(f"{name!r} is a built-in tool's name")
    _plain_text("code", code)
    _plain_text("tests", tests)
    try:
        spec = spec_from_source(code, name=name, tests=tests, node_id=node_id)
    except ToolSpecError as exc:
        raise ToolRejected(str(exc)) from None
    # Escapes in the source ("\x1b") become control characters in the docstring that is shown to people.
    _plain_text("description", spec.description)
    for parameter, schema in spec.parameters.get("properties", {}).items():
        _plain_text(f"description of parameter {parameter!r}", str(schema.get("description", "")))
    try:  # a default or Literal of bytes, ..., inf: no model call could carry the schema
        json.dumps(spec.openai_schema(), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ToolRejected(f"its schema is not JSON ({exc}); defaults and Literal values must be JSON values") from None
    return spec


def vet_tool(
    engine: Engine, files: ToolFiles, spec: ToolSpec, replays: list[Replay] = ()
) -> tuple[ToolRecord | None, QuarantineReport]:
    """Quarantine ``spec`` as the store stands now: under an active tool's name it is that tool's next
    version and must pass its tests too; under a new name it must not duplicate another tool. Returns
    (the row it would replace or None, the report) or raises ToolRejected. Tool synthesis and the import
    of learned packs both register only what passed here; the code runs only in the sandbox."""
    store, e = engine.store, engine.config.evolution
    held = engine.registry.get(spec.name)
    if held is not None and held.origin != "synthesized":  # a built-in, or a tool of the user's MCP server
        raise ToolRejected(f"{spec.name!r} is the name of a {held.origin} tool")
    replaced = store.tools.active_tool(spec.name)
    earlier_tests = ""
    if replaced is not None:
        try:
            earlier_tests = files.read(replaced.name, replaced.version, replaced.code_hash)[1]
        except ToolFileError:
            earlier_tests = ""  # the old version is unusable anyway; the new one stands on its own tests
    else:
        for hit in store.retrieval.search_tools(f"{spec.name}: {spec.description}", k=3):
            if hit.name != spec.name and (hit.similarity or 0.0) >= e.tool_dedup_threshold:
                raise ToolRejected(
                    f"it duplicates tool {hit.name!r} (description similarity "
                    f"{hit.similarity:.2f}); to improve that tool, propose a new version under "
                    "its name"
                )
    report = quarantine(
        spec,
        sandbox=engine.sandbox,
        work_root=engine.data_dir / "workspaces",
        replays=list(replays),
        earlier_tests=earlier_tests,
        limits=sandbox_limits(engine.config),
    )
    if not report.ok:
        raise ToolRejected(report.reason)
    return replaced, report


def _check(engine: Engine, files: ToolFiles, candidate: _Candidate, opportunity: Opportunity, node_id: str | None):
    """Quarantine the candidate; returns (spec, the row it replaces or None, report) or raises ToolRejected."""
    spec = candidate_spec(candidate.name, candidate.code, candidate.tests, node_id=node_id)
    missing = [n for n in range(1, len(opportunity.calls) + 1) if n not in candidate.replays]
    if missing:
        raise ToolRejected(
            f"it gives no arguments for recorded call(s) {', '.join(map(str, missing))}; a tool "
            "must reproduce every call it generalizes"
        )
    replays = [
        Replay(label=str(n), arguments=candidate.replays[n], expected=call.output)
        for n, call in enumerate(opportunity.calls, start=1)
    ]
    replaced, report = vet_tool(engine, files, spec, replays)
    return spec, replaced, report


def _take(engine: Engine, files: ToolFiles, opportunity: Opportunity, state: dict) -> str:
    """Propose, check and record one tool for one opportunity; returns what happened."""
    store = engine.store
    reply = engine.meta.complete(
        [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"{_existing(store)}\n\n{opportunity.text}"},
        ],
        purpose="synthesize",
        response_format=json_schema_format("tool", ToolAnswer) if engine.config.model.structured_output else None,
    )
    candidate = _parse(reply.content, opportunity)  # malformed: the round fails here, nothing recorded
    node = incumbent(store)
    node_id = node.id if node else None
    meta = {WATERMARK_KEY: json.dumps({**state, "done": [*state["done"], opportunity.key]})}
    common = {"evidence": list(opportunity.evidence), "cost_usd": reply.cost_usd, "node_id": node_id, "meta": meta}
    if isinstance(candidate, str):
        store.tools.apply_tool_changes(
            "tool_skipped",
            f"no tool for {opportunity.kind} opportunity: {clip(candidate, 200)}",
            why=candidate,
            payload={"opportunity": opportunity.key},
            **common,
        )
        return "skipped"
    try:
        spec, replaced, report = _check(engine, files, candidate, opportunity, node_id)
    except ToolRejected as exc:
        reason = str(exc)
        store.tools.apply_tool_changes(
            "tool_rejected",
            f"rejected tool {candidate.name}: {clip(reason, 300)}",
            why=reason,
            payload={
                "opportunity": opportunity.key,
                "name": candidate.name,
                "code": candidate.code,
                "tests": candidate.tests,
                "reason": reason,
            },
            **common,
        )
        return f"rejected {candidate.name}"
    version = store.tools.next_tool_version(spec.name)
    digest = files.write(spec.name, version, spec.code, spec.tests)  # durable before the row names it
    what = f"registered tool {spec.name} v{version}" + (f" (replaces v{replaced.version})" if replaced else "")
    store.tools.apply_tool_changes(
        "tool_registered",
        f"{what}: {clip(spec.description, 200)}",
        why=candidate.rationale or opportunity.kind,
        payload={
            "opportunity": opportunity.key,
            "name": spec.name,
            "version": version,
            "quarantine": report.summary(),
            "tests": report.tests,
            "replays": report.replays,
        },
        new=NewTool(name=spec.name, description=spec.description, code_hash=digest, version=version, node_id=node_id),
        status={replaced.id: "replaced"} if replaced else None,
        **common,
    )
    engine.toolbox.refresh()
    return f"registered {spec.name} v{version}"


def synthesize_round(engine: Engine) -> str:
    """One round; returns a one-line summary. Raises when the model fails or answers nonsense
    (what was completed before stays; the next round resumes from there)."""
    store, config = engine.store, engine.config
    files = ToolFiles(engine.data_dir / "tools")
    state = _state(store)
    after = None if state["after"] is None else tuple(state["after"])
    window = store.attempts.finished_since(after, limit=WINDOW)
    if state["until"] is None:
        if not window:
            return NOTHING_NEW
        state = {"after": state["after"], "until": _key(window[-1][0]), "done": []}
    until = tuple(state["until"])
    window = [(t, s) for t, s in window if (t.finished_at, t.id) <= until]
    lookback = store.attempts.finished_until(after, limit=LOOKBACK) if after else []
    todo = [o for o in find_opportunities(store, config, window, lookback) if o.key not in state["done"]]
    outcomes = []
    for opportunity in todo[: config.evolution.tools_per_round]:
        outcomes.append(_take(engine, files, opportunity, state))
        state = _state(store)
    if len(todo) <= config.evolution.tools_per_round:  # the window is done: the next one starts after it
        store.set_meta(WATERMARK_KEY, json.dumps({"after": state["until"], "until": None, "done": []}))
    else:
        store.set_meta(WATERMARK_KEY, json.dumps(state))
    left = max(0, len(todo) - config.evolution.tools_per_round)
    summary = "; ".join(outcomes) if outcomes else "no opportunity"
    return f"{summary} ({len(window)} trajectories{f', {left} opportunities left for the next round' if left else ''})"
