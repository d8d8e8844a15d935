"""One round of insight distillation (after ExpeL): new experience in, insight operations out.

Input: the trajectories finished since this job's watermark, each beside a
similar past task that went the other way (success against failure), and the
active insights numbered 1..n. Attempts that ended without an answer (the step
limit, a repeated call) are the commonest with a weak model and the most
instructive: they come with what the model kept doing and what the verifier
said (``evolver.agent.failures``). Only attempts cut short by something else
(cancelled, a model error, the budget) teach nothing about the agent. The model answers with insight operations
(``evolver.meta.insights``); they are checked whole, recorded as one "distill" event
with the trajectories as evidence, and applied in one transaction. Only then
does the watermark move, so a failed round (model error, bad answer, no
budget) changes nothing and the next round sees the same trajectories again.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel

from memory import ExperienceStore, Filters

from ..agent.failures import behaviour
from ..config import Config
from ..llm import jsonfix
from ..llm.client import Model, json_schema_format
from ..text import Unchanged, clip
from .insights import (
    KINDS,
    InsightOpError,
    apply_ops,
    numbered,
    parse_ops,
    plan_changes,
    render,
)

__all__ = ["distill_round", "WATERMARK_KEY", "watermark", "DistillError"]

WATERMARK_KEY = "watermark.distill"
BATCH = 20
LEARNED_FROM = (
    "finished",
    "asked",
    "step_limit",
    "repeating",
    "context_full",
)  # how an attempt of the agent's own ended

# The operations are described, not shown as an example: with an example whose texts were "...", the 0.5B and
# the 1.5B model both answered with the example itself (its "..." texts, its ids, its votes). With an empty
# list only ADD is offered, and the experience is not numbered: asked with all four and numbered tasks, the
# 1.5B model edited and voted on "insights" 12, 14 and 20 (the tasks' numbers), and wrote an ADD whose text
# described the operation ("Add a new lesson that explains how to use is_multiply_prime").
SYSTEM = (
    "You maintain a short list of insights: general, reusable lessons for an agent that solves tasks by "
    "writing Python. Compare what worked with what failed and propose at most {max_ops} operations on the "
    'list. Answer with JSON only, one object with the key "operations", a list in which each operation is an '
    'object with an "op": {ops} An insight\'s text is the lesson itself, one sentence of advice the agent '
    "reads before a similar task (what to do, or what to avoid), in your own words, general enough to help on "
    "other tasks: it names no task, function or test. An empty list when nothing should change."
)
OPS_FIRST = '"ADD" with a "text", a new lesson that would have turned a failure into a success (the list is empty).'
OPS = (
    '"ADD" with a "text", a new lesson that would have turned a failure into a success; "EDIT" with the "id" of '
    'a listed insight and its better "text"; "UPVOTE" or "DOWNVOTE" with the "id" of a listed insight the '
    "experience confirms or contradicts. An id is the number of an insight in the list ([1] is 1)."
)


class _Operation(BaseModel):
    op: Literal[KINDS]  # type: ignore[valid-type]
    id: int | None = None
    text: str | None = None


class DistillAnswer(BaseModel):
    """The answer's shape, as a JSON schema for servers that constrain output (parse_ops checks the rest)."""

    operations: list[_Operation]


class _Lesson(BaseModel):
    op: Literal["ADD"]
    text: str


class FirstLessons(BaseModel):
    """The answer's shape while the list is empty: only new lessons."""

    operations: list[_Lesson]


class DistillError(RuntimeError):
    """A round that could not be applied; nothing was changed."""


# A round that found nothing to learn from says so in these words (the jobs keep it out of the history).
NOTHING_NEW = Unchanged("no new trajectories since the last round")


def watermark(store: ExperienceStore) -> tuple[float, str] | None:
    raw = store.get_meta(WATERMARK_KEY)
    return None if raw is None else tuple(json.loads(raw))  # type: ignore[return-value]


def _outcome(success: bool | None) -> str:
    return {True: "succeeded", False: "failed", None: "outcome unknown"}[success]


def _named(op, shown) -> str:
    """An operation as the history says it: the insight it touches by id, and its text (an ADD's new one)."""
    if op.kind == "ADD":
        return f"ADD {clip(op.text or '', 80)!r}"
    target = shown[op.ref - 1] if op.ref and 0 < op.ref <= len(shown) else None
    if target is None:
        return f"{op.kind} {op.ref or ''}".strip()
    text = op.text if op.kind == "EDIT" and op.text else target.text
    return f"{op.kind} insight {target.id} {clip(text, 60)!r}"


def _prompt(store: ExperienceStore, batch, shown) -> str:
    lines = ["Insights now:", render(shown), "", "New experience:"]
    for trajectory, success in batch:
        lines.append(f"- Task: {clip(trajectory.prompt, 300, one_line=True)}")
        if trajectory.status in ("finished", "asked"):
            lines.append(f"   Answer: {clip(trajectory.final_answer, 200, one_line=True)} ({_outcome(success)})")
        else:
            lines.append(f"   No answer ({_outcome(success)})")
        if trajectory.status != "finished" or success is False:
            seen = behaviour(trajectory.status, success, store.reports.steps(trajectory.id, limit=200))
            lines.append(f"   What it did: {seen.describe()}")
            outcome = store.reports.outcome(trajectory.id)
            if outcome is not None and outcome.verifier_output:
                lines.append(f"   The verifier said: {clip(outcome.verifier_output, 200, one_line=True)}")
        if success is not None:
            other = store.retrieval.search_trajectories(
                trajectory.prompt, k=1, filters=Filters(success=not success, learnable=True)
            )
            if other:
                lines.append(
                    f"   A similar task that {_outcome(not success)}: "
                    f"{clip(other[0].prompt, 200, one_line=True)} -> "
                    f"{clip(other[0].final_answer, 120, one_line=True)}"
                )
    return "\n".join(lines)


GIVE_UP_AFTER = 3  # unusable answers for the same batch before the round moves past it
REFUSALS_KEY = "distill.refusals"


def distill_round(store: ExperienceStore, model: Model, config: Config, *, max_ops: int = 4) -> str:
    """Run one round; returns a one-line summary. Raises (and changes nothing but a count) when the
    model's answer cannot be applied; after ``GIVE_UP_AFTER`` such answers for the same batch it moves
    past it, as a ``distill_skipped`` event, rather than fail on it every round (a weak model that
    echoes the instructions would otherwise hold distillation at that batch for good)."""
    try:
        return _distill(store, model, config, max_ops=max_ops)
    except _Unusable as unusable:
        refusals = json.loads(store.get_meta(REFUSALS_KEY) or "{}")
        count = refusals.get("count", 0) + 1 if refusals.get("mark") == unusable.new_mark else 1
        if count < GIVE_UP_AFTER:
            store.set_meta(REFUSALS_KEY, json.dumps({"mark": unusable.new_mark, "count": count}))
            raise unusable.error from None
        with store.transaction():
            store.reports.append_event(
                "distill_skipped",
                f"{len(unusable.evidence)} trajectories left undistilled after "
                f"{count} unusable answers: {clip(str(unusable.error), 200)}",
                why="the model's answers for this batch could not be applied",
                evidence=unusable.evidence,
                payload={"error": str(unusable.error)},
            )
            store.set_meta(WATERMARK_KEY, unusable.new_mark)
            store.set_meta(REFUSALS_KEY, "{}")
        return (
            f"gave up on {len(unusable.evidence)} trajectories after {count} unusable answers "
            f"(last: {clip(str(unusable.error), 120)})"
        )


class _Unusable(Exception):
    """The model's answer for a batch could not be applied (``error`` says why)."""

    def __init__(self, error: InsightOpError, new_mark: str, evidence: list[str]) -> None:
        super().__init__(str(error))
        self.error, self.new_mark, self.evidence = error, new_mark, evidence


def _distill(store: ExperienceStore, model: Model, config: Config, *, max_ops: int) -> str:
    mark = watermark(store)
    recent = store.attempts.finished_since(mark, limit=BATCH)
    if not recent:
        return NOTHING_NEW
    batch = [(t, s) for t, s in recent if t.status in LEARNED_FROM]
    cap = config.evolution.max_insights
    shown = numbered(store, limit=cap)
    new_mark = json.dumps([recent[-1][0].finished_at, recent[-1][0].id])
    if not batch:  # only attempts cut short (cancelled, errors, the budget): nothing to learn, move on
        store.set_meta(WATERMARK_KEY, new_mark)
        return f"{len(recent)} trajectories cut short (cancelled or an error); nothing to distill"
    shape = DistillAnswer if shown else FirstLessons
    structured = json_schema_format("insight_operations", shape) if config.model.structured_output else None
    reply = model.complete(
        [
            {"role": "system", "content": SYSTEM.format(max_ops=max_ops, ops=OPS if shown else OPS_FIRST)},
            {"role": "user", "content": _prompt(store, batch, shown)},
        ],
        purpose="distill",
        response_format=structured,
    )
    evidence = [t.id for t, _ in batch]
    try:
        try:
            answer, _ = jsonfix.loads(reply.content)  # a fence, a trailing comma, a last brace left off
        except json.JSONDecodeError as exc:
            raise InsightOpError(
                f"the answer is not JSON ({exc}); what came back: {clip(reply.content, 300, one_line=True)!r}"
            ) from None
        skipped: list[str] = []
        ops = parse_ops(answer, shown=len(shown), max_ops=max_ops, skipped=skipped)
        if skipped and not ops:
            raise InsightOpError(skipped[0])
        plan_changes(
            store, ops, shown, provenance=evidence, cap=cap, merge_threshold=config.evolution.insight_merge_threshold
        )  # refuse before recording anything
    except InsightOpError as exc:
        raise _Unusable(exc, new_mark, evidence) from None
    summary = ", ".join(f"{op.kind} {op.ref or ''}".strip() for op in ops) or "no change"
    named = ", ".join(_named(op, shown) for op in ops) or "no change"  # the history names each insight
    left_out = f"; skipped {len(skipped)}: {'; '.join(skipped)}" if skipped else ""
    summary += left_out
    # The event, its insight changes and the watermark commit together: a kill between
    # them would otherwise leave the round applied but unmarked, and the next run repeat it.
    with store.transaction():
        event = store.reports.append_event(
            "distill",
            f"{len(ops)} insight operations from {len(batch)} trajectories: {named}{left_out}",
            why="contrast of new trajectories with similar past ones",
            evidence=evidence,
            cost_usd=reply.cost_usd,
            payload={"operations": [vars(op) for op in ops], "skipped": skipped},
        )
        apply_ops(
            store,
            ops,
            shown,
            provenance=evidence,
            cap=cap,
            merge_threshold=config.evolution.insight_merge_threshold,
            event_id=event.id,
        )
        store.set_meta(WATERMARK_KEY, new_mark)
    return f"{len(ops)} operations ({summary}) from {len(batch)} trajectories"
