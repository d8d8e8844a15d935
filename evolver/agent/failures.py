"""How an attempt went, in a learner's words: counted from its recorded steps.

A weak model's commonest trajectories end without an answer: it hits the step
limit, repeats one call, or sends calls that cannot be read. Those are the
most instructive ones, so distillation and the proposer read them through
this summary instead of skipping them: what the model kept doing, how the
attempt ended, and what the verifier said.

A code task with a stub opens with drafts (the loop's own samples of the
model's completion, ``draft_first``), which the summary tells apart from the
calls the model chose: whether every draft failed the task's own examples is
what the ``drafts`` parameter acts on, and counted among the model's calls it
read as "the model called run_python nine times". Shown only that, the 1.5B
meta model touched ``drafts`` in none of its 28 proposals over five learning
runs, though it is the parameter whose change (1 to 4) moved the 0.5B model's
results most (docs/measurements/learning-curves.md).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from memory.records import Step

from ..text import clip

__all__ = ["Behaviour", "behaviour", "MODES", "DRAFT_CALL", "count_modes", "call_key"]

MODES = ("no finish", "every draft failed the examples", "repeated calls", "malformed calls", "wrong answer")
REPEATED = 3  # identical calls in a row that count as repeating
DRAFT_CALL = "draft"  # the id of a draft's run_python call, as the loop records it (``Agent._draft_step``)
ENDINGS = {
    "step_limit": "hit the step limit",
    "repeating": "was stopped for repeating one call",
    "finished": "handed in an answer",
    "asked": "was asked for its answer on a last turn",
    "context_full": "outgrew the model's context window",
}


@dataclass(frozen=True)
class Behaviour:
    status: str
    """How the trajectory ended: finished (an answer), step_limit, repeating."""
    success: bool | None
    steps: int
    calls: Counter = field(default_factory=Counter)
    """Tool name -> calls that could be read (the model's own: drafts are counted apart)."""
    longest_repeat: int = 0
    """The longest run of identical calls (same name and arguments) in a row."""
    malformed: int = 0
    last_result: str = ""
    drafts: int = 0
    """Drafts the loop sampled (draft_first), each tried on the task's own examples."""
    draft_handed_in: bool = False
    """Whether the attempt ended with its last draft, which passed the task's examples, handed in."""

    @property
    def drafts_failed(self) -> bool:
        """Every draft failed the task's own examples, so the attempt went on without one (or ended)."""
        return self.drafts > 0 and not self.draft_handed_in

    @property
    def answered(self) -> bool:
        return self.status in ("finished", "asked")

    @property
    def modes(self) -> list[str]:
        """Which of MODES this attempt shows (empty for a success)."""
        found = []
        if not self.answered:
            found.append("no finish")
        if self.drafts_failed and self.success is not True:
            found.append("every draft failed the examples")
        if self.status == "repeating" or self.longest_repeat >= REPEATED:
            found.append("repeated calls")
        if self.malformed:
            found.append("malformed calls")
        if self.answered and self.success is False:
            found.append("wrong answer")
        return found

    def describe(self) -> str:
        """One line: how it ended and what the model kept doing."""
        used = ", ".join(f"{name} x{n}" for name, n in self.calls.most_common(4)) or "no tool calls"
        parts = [f"{ENDINGS.get(self.status, self.status)} after {self.steps} model turns"]
        if self.drafts:
            plural = "" if self.drafts == 1 else "s"
            parts.append(
                f"{self.drafts} draft{plural}, the last handed in (it passed the task's own examples)"
                if self.draft_handed_in
                else f"{self.drafts} draft{plural}, {'none' if plural else 'it'} passing the task's own examples"
            )
        parts.append(f"calls: {used}")
        if self.longest_repeat >= 2:
            parts.append(f"{self.longest_repeat} identical calls in a row")
        if self.malformed:
            parts.append(f"{self.malformed} call{'' if self.malformed == 1 else 's'} that could not be read")
        if self.last_result:
            parts.append(f"last result: {clip(self.last_result, 160, one_line=True)}")
        return "; ".join(parts)


def call_key(name: str | None, arguments) -> str:
    """What makes two tool calls the same call: the name and the arguments (the loop's repeat guard and
    the count of identical calls in a row both compare these)."""
    return json.dumps([name, arguments], sort_keys=True, default=str)


def behaviour(status: str, success: bool | None, steps: Iterable[Step]) -> Behaviour:
    """Count what an attempt did from its steps."""
    calls: Counter = Counter()
    turns = malformed = run = longest = drafts = 0
    last_key, last_result, last_was_draft = None, "", False
    for step in steps:
        if step.role == "assistant":
            turns += 1
            last_was_draft = any(call.get("id") == DRAFT_CALL for call in step.tool_calls or [])
            if last_was_draft:  # the loop's sample, not a call the model chose
                drafts += 1
                continue
            for call in step.tool_calls or []:
                if call.get("error"):
                    malformed += 1
                    last_key, run = None, 0
                    continue
                calls[call.get("name")] += 1
                key = call_key(call.get("name"), call.get("arguments"))
                run = run + 1 if key == last_key else 1
                last_key = key
                longest = max(longest, run)
        elif step.role == "tool":
            last_result = step.content
    return Behaviour(
        status=status,
        success=success,
        steps=turns,
        calls=calls,
        longest_repeat=longest,
        malformed=malformed,
        last_result=last_result,
        drafts=drafts,
        draft_handed_in=last_was_draft and status == "finished",
    )


def count_modes(behaviours: Iterable[Behaviour]) -> dict[str, int]:
    """How many attempts show each failure mode, in MODES order (modes no attempt shows are left out)."""
    counted = Counter(mode for b in behaviours for mode in b.modes)
    return {mode: counted[mode] for mode in MODES if counted[mode]}
