"""Proposing a child scaffold, and the checks a proposal must pass before it becomes a servable node.

The proposer (the model, purpose "propose") sees the parent scaffold, a sample
of the parent's failed and successful attempts on *training* tasks (held-out
ones never) with the failure modes counted across it (no finish, repeated
calls, malformed calls, wrong answers), the edits already tried on the parent
with their training results or why they were invalid, and the top insights,
and answers with a structured edit: new
values for some of the scaffold's prompts, parameters, tools or hooks. The
edit may name nothing else: the verifiers, the evaluation harness, the budget,
the sandbox policy, the event log and the store are not part of the scaffold,
and an edit that reaches for them is invalid. A valid edit must apply, the
child must load, its prompts must only use their placeholders, its tools must
exist, its hooks must load in the sandbox and answer a sample call at each of
their points, and a smoke task must run on it.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import string
import tempfile
from dataclasses import dataclass
from pathlib import Path

from memory import Ending, ExperienceStore, Node, Task

from ..agent.failures import behaviour, count_modes
from ..agent.hooks import HOOKS_GUIDE, SAMPLE_DATA, HookError, Hooks, hook_points
from ..agent.scaffold import Parameters, Scaffold, ScaffoldError, load_scaffold, parts_guide, unused_parts
from ..engine import Engine, hook_limits
from ..llm import jsonfix
from ..llm.client import json_schema_format
from ..text import clip

__all__ = [
    "Proposal",
    "ProposalError",
    "InvalidProposal",
    "propose",
    "apply_edit",
    "check_child",
    "check_hooks",
    "smoke_ran",
    "scaffold_diff",
    "edit_schema",
]

EDITABLE = ("prompts", "parameters", "tools", "hooks")
PLACEHOLDERS = {
    "system": (),
    "task": ("task", "examples", "insights"),
    "reflection": ("task", "verdict"),
    "retry": ("task", "reflection"),
    "plan": ("task",),
    "code": ("functions",),
    "draft": ("stub", "examples", "insights"),
}
SAMPLE = 6  # attempts shown to the proposer
SAMPLE_CHARS = 6000
TRIED = 8  # the parent's latest children shown
# Proposals are sampled, not greedy: at 0.2 the 1.5B meta model answered 7 of its 8 proposals of a learning run
# with the same opening and 2 ideas in all, though each was shown the edits already tried.
TEMPERATURE = 0.8

SYSTEM = (
    "You improve an agent by editing its scaffold: its prompt templates, its parameters, its enabled tools and "
    "its policy hooks. Study the scaffold and how it did on training tasks, then propose ONE edit likely to "
    "raise its success rate. Answer with JSON only: "
    '{"rationale": "<what you change and why>", "edit": {"prompts": {"<name>": "<new template>"}, '
    '"parameters": {"<name>": <value>}, "tools": ["<tool>", ...], "hooks": "<python>"}} '
    "(include only the parts you change). Templates must keep to their placeholders. A part set to the value "
    "it has changes nothing, and a prompt acts only where its parameter uses it. Nothing outside the "
    "scaffold can be edited. " + HOOKS_GUIDE
)


def edit_schema(scaffold: Scaffold, tools: list[str]) -> dict:
    """The answer's JSON schema for a server that constrains output, naming only what the scaffold has: its
    prompts, its parameters with their types and bounds, the tools that exist. Under it a proposer cannot
    name a part the scaffold lacks; asked with free keys, the 1.5B meta model spent 4 of its 8 proposals of a
    learning run on a ``feedback`` prompt that does not exist, though each was shown the last one refused
    for it. apply_edit still checks everything, for the servers that constrain nothing."""
    parameters = Parameters.model_json_schema()["properties"]
    for field in parameters.values():  # the proposer reads the descriptions in parts_guide, not here
        for key in ("description", "title", "default"):
            field.pop(key, None)
    edit = {
        "prompts": {
            "type": "object",
            "properties": {name: {"type": "string"} for name in type(scaffold.prompts).model_fields},
            "additionalProperties": False,
        },
        "parameters": {"type": "object", "properties": parameters, "additionalProperties": False},
        "tools": {"type": "array", "items": {"type": "string", "enum": sorted(set(tools))}},
        "hooks": {"type": "string"},
    }
    return {
        "type": "object",
        "properties": {
            "rationale": {"type": "string"},
            "edit": {"type": "object", "properties": edit, "additionalProperties": False},
        },
        "required": ["rationale", "edit"],
        "additionalProperties": False,
    }


class ProposalError(ValueError):
    """The proposer's answer is not an edit at all. ``proposal`` holds what it cost (an empty edit), so the
    search records it as an invalid node, the answer in its reason, like any other proposal spent."""

    def __init__(self, message: str, proposal: Proposal) -> None:
        super().__init__(message)
        self.proposal = proposal


class InvalidProposal(ValueError):
    """A well-formed edit that cannot become a servable node; the reason is kept on the invalid node."""


@dataclass(frozen=True)
class Proposal:
    rationale: str
    edit: dict
    cost_usd: float
    tokens: int


def _attempts(store: ExperienceStore, node: Node) -> str:
    """The parent's finished training evaluations that a learner may see, failures first, within SAMPLE_CHARS."""
    done = [
        e for e in store.tree.evaluations_of(node.id) if e.split == "train" and e.status == "done" and e.trajectory_id
    ]
    shown = store.attempts.learnable([e.trajectory_id for e in done])
    done = [e for e in done if e.trajectory_id in shown]
    done.sort(key=lambda e: (bool(e.success), -e.id))
    lines, left, seen = [], SAMPLE_CHARS, []
    for evaluation in done[:SAMPLE]:
        trajectory = store.attempts.get_trajectory(evaluation.trajectory_id)
        steps = store.reports.steps(trajectory.id, limit=200)
        did = behaviour(trajectory.status, evaluation.success, steps)
        trace = " | ".join(f"{s.role}: {clip(s.content, 160, one_line=True)}" for s in steps[:12] if s.content)
        outcome = "SUCCEEDED" if evaluation.success else "FAILED"
        line = (
            f"- {outcome}: {clip(trajectory.prompt, 300, one_line=True)}\n"
            f"  answer: {clip(trajectory.final_answer, 150, one_line=True)}\n"
            + ("" if evaluation.success else f"  what it did: {did.describe()}\n")
            + f"  steps: {clip(trace, 900, one_line=True)}"
        )
        if len(line) > left:
            break
        lines.append(line)
        seen.append(did)
        left -= len(line)
    if not lines:
        return "(no training evaluations yet)"
    modes = count_modes(seen)
    counted = ", ".join(f"{mode} {n}" for mode, n in modes.items()) or "none"
    return f"Failure modes in these {len(seen)} attempts: {counted}\n" + "\n".join(lines)


def _tried(store: ExperienceStore, parent: Node) -> str:
    """The parent's children so far: each edit with how it did on training tasks, or why it was invalid,
    so the proposer does not propose one again."""
    children = [n for n in store.tree.list_nodes() if n.parent_id == parent.id][-TRIED:]
    lines = []
    for child in children:
        train = [e for e in store.tree.evaluations_of(child.id) if e.split == "train" and e.status == "done"]
        result = (
            f"invalid: {clip(child.reason, 240, one_line=True)}"
            if child.status == "invalid"
            else f"{child.status}, {sum(bool(e.success) for e in train)} of {len(train)} training evaluations passed"
        )
        lines.append(
            f"- {clip(child.rationale or '(no rationale)', 160, one_line=True)}\n"
            f"  edit: {clip(child.diff, 500, one_line=True)}\n  result: {result}"
        )
    return "\n".join(lines) or "(none yet)"


def propose(engine: Engine, parent: Node, parent_scaffold: Scaffold) -> Proposal:
    """Ask the model for one edit of ``parent``; raises ProposalError when the answer is not one."""
    store = engine.store
    insights = store.insights.list_insights(limit=10)
    names = engine.registry.names()
    user = (
        f"The scaffold (JSON):\n{json.dumps(parent_scaffold.model_dump(mode='json'), indent=1)}\n\n"
        f"What each part does:\n{parts_guide(parent_scaffold)}\n\n"
        f"How it did on training tasks:\n{_attempts(store, parent)}\n\n"
        f"Edits already tried on this scaffold (propose something else):\n{_tried(store, parent)}\n\n"
        "Lessons from experience:\n"
        + ("\n".join(f"- {i.text}" for i in insights) or "(none yet)")
        + f"\n\nTools that exist: {', '.join(names)}"
    )
    structured = (
        json_schema_format("scaffold_edit", edit_schema(parent_scaffold, names))
        if engine.config.model.structured_output
        else None
    )
    reply = engine.meta.complete(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
        purpose="propose",
        node_id=parent.id,
        response_format=structured,
        temperature=TEMPERATURE,
    )
    spent = Proposal(rationale="", edit={}, cost_usd=reply.cost_usd, tokens=reply.tokens_in + reply.tokens_out)
    try:
        data, _ = jsonfix.loads(reply.content)  # a fence, prose around it, a last brace left off
    except json.JSONDecodeError as exc:
        raise ProposalError(jsonfix.not_json("the proposer's answer", reply.content, exc), spent) from None
    if not isinstance(data, dict) or not isinstance(data.get("edit"), dict):
        raise ProposalError(
            'the proposer\'s answer must be {"rationale": "...", "edit": {...}}, not '
            f"{clip(reply.content, 200, one_line=True)!r}",
            spent,
        )
    rationale = data.get("rationale")
    return Proposal(
        rationale=rationale if isinstance(rationale, str) else "",
        edit=data["edit"],
        cost_usd=spent.cost_usd,
        tokens=spent.tokens,
    )


def apply_edit(parent: Scaffold, edit: dict) -> Scaffold:
    """The child scaffold, or InvalidProposal saying why the edit cannot make one."""
    outside = [key for key in edit if key not in EDITABLE]
    if outside:
        raise InvalidProposal(
            f"the edit touches {', '.join(map(repr, outside))}, which is not part of the scaffold: only "
            f"{', '.join(EDITABLE)} can change; the verifiers, evaluation harness, budget, sandbox policy, "
            "event log and store are outside what evolution may edit"
        )
    data = parent.model_dump(mode="json")
    for section in ("prompts", "parameters"):
        if section in edit:
            if not isinstance(edit[section], dict):
                raise InvalidProposal(f"the edit's {section} must be an object of names to new values")
            unknown = [k for k in edit[section] if k not in data[section]]
            if unknown:
                raise InvalidProposal(
                    f"the edit does not apply: the scaffold has no {section} "
                    f"{', '.join(map(repr, unknown))} (it has {', '.join(data[section])})"
                )
            data[section] = {**data[section], **edit[section]}
    for key in ("tools", "hooks"):
        if key in edit:
            data[key] = edit[key]
    try:
        child = load_scaffold(data)
    except ScaffoldError as exc:
        raise InvalidProposal(f"the edited scaffold does not load: {exc}") from None
    for name, allowed in PLACEHOLDERS.items():
        template = getattr(child.prompts, name)
        may_use = ", ".join("{" + p + "}" for p in allowed) or "none"
        try:
            _bounded(template)
            template.format(**{p: "" for p in allowed})
        except (KeyError, IndexError) as exc:
            raise InvalidProposal(
                f"prompt {name!r} uses a placeholder it does not have ({exc}); it may use {may_use}"
            ) from None
        except Exception as exc:  # whatever would fail the loop ({task.prompt}, {task:d}) fails the proposal
            raise InvalidProposal(
                f"prompt {name!r} cannot be rendered ({type(exc).__name__}: {exc}); it may "
                f"use {may_use}, each filled with a string"
            ) from None
    if child.hash == parent.hash:
        raise InvalidProposal("the edit changes nothing")
    changed = _changed_parts(parent, child)
    unused = unused_parts(child)
    if changed and all(part in unused for part in changed):
        # Evaluating it would spend evaluations measuring its parent again.
        raise InvalidProposal(
            "the edit changes only what the scaffold never uses: "
            + "; ".join(f"{part} ({unused[part]})" for part in changed)
        )
    return child


def _changed_parts(parent: Scaffold, child: Scaffold) -> list[str]:
    """The prompts and parameters ``child`` sets otherwise than ``parent`` (and "tools", "hooks")."""
    before, after = parent.model_dump(mode="json"), child.model_dump(mode="json")
    changed = [
        f"{section}.{name}"
        for section in ("prompts", "parameters")
        for name in after[section]
        if after[section][name] != before[section].get(name)
    ]
    return changed + [key for key in ("tools", "hooks") if after[key] != before[key]]


def scaffold_diff(parent: Scaffold, child: Scaffold) -> str:
    def lines(s: Scaffold) -> list[str]:
        return json.dumps(s.model_dump(mode="json"), indent=1, sort_keys=True).splitlines(keepends=True)

    return "".join(difflib.unified_diff(lines(parent), lines(child), "parent", "child"))


_MAX_WIDTH = 1000


def _bounded(template: str) -> None:
    """Refuse a format spec that would pad a field to a huge width ({task:>1000000000} builds a gigabyte,
    here and in every task), before rendering it."""
    for _, _, spec, _ in string.Formatter().parse(template):
        if spec and any(int(n) > _MAX_WIDTH for n in re.findall(r"\d+", spec)):
            raise ValueError(f"the format spec {spec!r} asks for a width or precision over {_MAX_WIDTH}")


def check_child(engine: Engine, child: Scaffold) -> None:
    """Raise InvalidProposal unless ``child``'s tools exist and its hooks load in the sandbox (what can be
    checked before its smoke task runs)."""
    engine.toolbox.refresh()
    missing = [name for name in child.tools if engine.registry.get(name) is None]
    if missing:
        raise InvalidProposal(f"its tools do not import: no tool named {', '.join(map(repr, missing))}")
    if child.hooks.strip():
        check_hooks(engine, child.hooks)


def check_hooks(engine: Engine, source: str) -> None:
    """Raise InvalidProposal unless the hooks parse, define a hook point, load in their sandbox and
    answer a sample call at each point they define with a well-formed reply."""
    try:
        points = hook_points(source)
    except HookError as exc:
        raise InvalidProposal(str(exc)) from None
    root = engine.data_dir / "workspaces"
    root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="hooks-", dir=root))
    os.chmod(scratch, 0o700)
    with Hooks(
        source,
        sandbox=engine.sandbox,
        scratch=scratch,
        limits=hook_limits(engine.config),
        timeout_s=engine.config.agent.hook_timeout_s,
    ) as hooks:
        for point in points:
            outcome = hooks.call(point, SAMPLE_DATA[point])
            if outcome.error is not None:
                raise InvalidProposal(f"its hooks failed a sample call: {outcome.error}")


def smoke_ran(task: Task) -> bool:
    """What an ended smoke task says of its child: True when it ran (whatever its answer), False when it
    must run again because what stopped it was not the child's fault (the model, the budget, a person
    cancelling it, a daemon stopping); InvalidProposal when the child broke it."""
    if task.ending is Ending.INTERNAL_ERROR:
        raise InvalidProposal(f"the smoke task did not run: {task.error}")
    if task.status == "dead":
        raise InvalidProposal(f"the smoke task's worker kept dying: {task.error}")
    return task.ending in (Ending.ANSWERED, Ending.CHECK_FAILED, Ending.NO_ANSWER)
