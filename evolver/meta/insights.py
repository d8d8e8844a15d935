"""The meta-agent's operations on the insight list (after ExpeL), checked whole before any is applied.

The model sees the active insights numbered 1..n (small ids it cannot confuse
with, or invent as, database ids) and answers with at most a few operations:

    {"operations": [{"op": "ADD", "text": "..."},
                    {"op": "EDIT", "id": 2, "text": "..."},
                    {"op": "UPVOTE", "id": 1}, {"op": "DOWNVOTE", "id": 3}]}

Importance: a new insight starts at 2; UPVOTE and EDIT add 1; DOWNVOTE takes 1
(2 while the active list is over its cap); at zero an insight is retired. An
ADD whose text is a near-duplicate of an active insight (cosine similarity at
or over the threshold) upvotes that one instead. Any invalid operation refuses
the whole answer, so a round never applies half a change.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import numpy as np

from memory import ExperienceStore, Insight

from ..text import control_character

__all__ = [
    "InsightOp",
    "InsightOpError",
    "apply_changes",
    "apply_ops",
    "numbered",
    "parse_ops",
    "plan_changes",
    "render",
]

KINDS = ("ADD", "EDIT", "UPVOTE", "DOWNVOTE")
MAX_TEXT = 500


class InsightOpError(ValueError):
    """The model's answer cannot be applied; the message says which operation and why."""


@dataclass(frozen=True)
class InsightOp:
    kind: str
    ref: int | None = None  # the number shown in the prompt (1-based)
    text: str | None = None


def numbered(store: ExperienceStore, *, limit: int) -> list[Insight]:
    """The active insights in the order the prompt numbers them (most important first)."""
    return store.insights.list_insights(status="active", limit=limit)


def render(shown: list[Insight]) -> str:
    if not shown:
        return "(no insights yet)"
    return "\n".join(f"[{n}] {i.text} (importance {i.importance})" for n, i in enumerate(shown, start=1))


def parse_ops(
    answer: str | dict | list, *, shown: int, max_ops: int = 4, skipped: list[str] | None = None
) -> list[InsightOp]:
    """The operations in the model's answer, or ``InsightOpError`` naming the first problem. With a
    ``skipped`` list, an operation that is wrong on its own (an unlisted id, no text) is left out and
    its problem appended there instead: a weak model's one bad operation need not cost its good ones, nor do
    the operations past ``max_ops`` (the 1.5B model wrote five for four). The answer's shape (JSON, an
    operations list) is always checked whole."""
    data = answer
    if isinstance(answer, str):
        try:
            data = json.loads(answer)
        except json.JSONDecodeError as exc:
            raise InsightOpError(f"the answer is not JSON: {exc}") from None
    if isinstance(data, dict):
        data = data.get("operations")
    if not isinstance(data, list):
        raise InsightOpError('the answer must be {"operations": [...]}')
    if len(data) > max_ops:
        if skipped is None:
            raise InsightOpError(f"{len(data)} operations; at most {max_ops} are allowed in one answer")
        skipped.append(f"operations {max_ops + 1} to {len(data)}: at most {max_ops} are taken from one answer")
        data = data[:max_ops]
    copied = [
        n
        for n, item in enumerate(data, start=1)
        if isinstance(item, dict)
        and isinstance(item.get("text"), str)
        and item["text"].strip()
        and _placeholder(item["text"])
    ]
    if copied:  # its ids and votes are the example's too: none of it is about the trajectories
        raise InsightOpError(
            f"operation {copied[0]} has the instructions' placeholder for a text "
            f"({data[copied[0] - 1]['text']!r}): the answer copies the example instead of "
            "writing lessons; nothing of it is applied"
        )
    ops = []
    for n, item in enumerate(data, start=1):
        try:
            ops.append(_operation(item, f"operation {n}", shown))
        except InsightOpError as exc:
            if skipped is None:
                raise
            skipped.append(str(exc))
    return ops


_PLACEHOLDER_WORDS = {"text", "insight", "lesson", "the insight", "the lesson", "your insight", "new text"}


def _placeholder(text: str) -> bool:
    """A text that is the prompt's stand-in ("...", "<text>", "TEXT"), not a lesson: what a weak model
    that echoes the example writes."""
    bare = text.strip()
    return (
        not re.sub(r"[\W_]+", "", bare)
        or bare.lower().strip(".…<>[]{}'\" ") in _PLACEHOLDER_WORDS
        or bool(re.fullmatch(r"<[^<>]{0,40}>", bare))
    )


def _operation(item, where: str, shown: int) -> InsightOp:
    """One operation of the answer, or InsightOpError naming its problem."""
    if not isinstance(item, dict):
        raise InsightOpError(f"{where} is not an object")
    kind = str(item.get("op", "")).upper()
    if kind not in KINDS:
        raise InsightOpError(f"{where}: op must be one of {', '.join(KINDS)}, not {item.get('op')!r}")
    ref = item.get("id")
    if kind == "ADD":
        if ref is not None:
            raise InsightOpError(f"{where}: ADD takes no id")
    elif not isinstance(ref, int) or isinstance(ref, bool) or not 1 <= ref <= shown:
        raise InsightOpError(f"{where}: {kind} needs the id of a listed insight (1..{shown}), not {ref!r}")
    text = item.get("text")
    if kind in ("ADD", "EDIT"):
        if not isinstance(text, str) or not text.strip():
            raise InsightOpError(f"{where}: {kind} needs a non-empty text")
        if len(text) > MAX_TEXT:
            raise InsightOpError(f"{where}: the text is {len(text)} characters; at most {MAX_TEXT}")
        text = " ".join(text.split())
        problem = control_character(text)
        if problem:  # white space is made plain above; what is left (ESC, BEL, ...) would act on a terminal
            raise InsightOpError(f"{where}: the text has a {problem}; an insight is plain text")
    elif text is not None:
        raise InsightOpError(f"{where}: {kind} takes no text")
    return InsightOp(kind=kind, ref=ref, text=text)


def _similar(store: ExperienceStore, text: str, candidates: list[Insight]) -> tuple[Insight | None, float]:
    if not candidates:
        return None, 0.0
    vectors = np.asarray(store.embedder.embed_documents([text] + [c.text for c in candidates]), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    scores = vectors[1:] @ vectors[0]
    best = int(np.argmax(scores))
    return candidates[best], float(scores[best])


def plan_changes(
    store: ExperienceStore,
    ops: list[InsightOp],
    shown: list[Insight],
    *,
    provenance: list[str],
    cap: int,
    merge_threshold: float,
) -> list[dict]:
    """The store changes the operations amount to (nothing is written here).

    Raises ``InsightOpError`` for an operation on an insight an earlier operation retired."""
    state = {i.id: {"importance": i.importance, "text": i.text, "provenance": list(i.provenance)} for i in shown}
    active = store.insights.list_insights(status="active", limit=cap * 4 + len(ops))
    over_cap = len(active) > cap
    changes: list[dict] = []
    added: list[dict] = []
    for op in ops:
        target = shown[op.ref - 1] if op.ref is not None else None
        name = op.kind
        if op.kind == "ADD":
            match, score = _similar(store, op.text, active)
            if match is not None and score >= merge_threshold:
                target, name = match, "MERGE"
                state.setdefault(
                    match.id, {"importance": match.importance, "text": match.text, "provenance": list(match.provenance)}
                )
            else:
                change = {"op": "ADD", "text": op.text, "importance": 2, "provenance": list(provenance)}
                changes.append(change)
                added.append(change)
                continue
        current = state[target.id]
        if current["importance"] == 0:
            raise InsightOpError(f"{op.kind} {op.ref}: that insight was retired earlier in this answer")
        delta = {"UPVOTE": 1, "MERGE": 1, "EDIT": 1, "DOWNVOTE": -2 if over_cap else -1}[name]
        current["importance"] = max(0, current["importance"] + delta)
        if op.kind == "EDIT":
            current["text"] = op.text
        current["provenance"] = sorted(set(current["provenance"]) | set(provenance))
        changes.append(
            {
                "op": name,
                "id": target.id,
                "text": current["text"],
                "importance": current["importance"],
                "provenance": current["provenance"],
                "status": "retired" if current["importance"] == 0 else "active",
            }
        )
    return changes


def apply_ops(
    store: ExperienceStore,
    ops: list[InsightOp],
    shown: list[Insight],
    *,
    provenance: list[str],
    cap: int,
    merge_threshold: float = 0.9,
    event_id: int | None = None,
) -> list[Insight]:
    """Apply the operations in one transaction; then retire the lowest-ranked insights over the cap."""
    changes = plan_changes(store, ops, shown, provenance=provenance, cap=cap, merge_threshold=merge_threshold)
    return apply_changes(store, changes, cap=cap, event_id=event_id)


def apply_changes(
    store: ExperienceStore, changes: list[dict], *, cap: int, event_id: int | None = None
) -> list[Insight]:
    """Apply changes ``plan_changes`` made in one transaction; then retire the lowest-ranked insights over
    the cap. (Planning embeds texts: a caller that plans outside its transaction keeps that short.)"""
    result = store.insights.apply_insight_changes(changes, event_id=event_id) if changes else []
    surplus = store.insights.list_insights(status="active", limit=10_000)[cap:]
    if surplus:
        store.insights.apply_insight_changes(
            [{"op": "CAP", "id": i.id, "status": "retired"} for i in surplus], event_id=event_id
        )
    return result
