"""Insights from outside on probation: no person's task is shown one until it has earned it.

An insight is an instruction the agent reads. One that comes in a pack was
written elsewhere, for another model and other tasks, and quarantine cannot test
an instruction as it tests a tool: one that only makes answers wrong needs no
sandbox escape to do harm. So an imported insight comes in with the status
``probation``. A person's tasks and chats are never shown it; the tree's
evaluations on the promotion split are, half of them
(``evolver.agent.loop.shows_probation``), so the same promotion tasks are
attempted with and without it. It leaves probation in one of two ways:

- a person approves it (`evolver insights approve ID`, or the dashboard's
  approve button): an ``insight_approved`` event, which `evolver history revert`
  undoes (the insight is on probation again);
- it earns it, with the evidence a scaffold edit needs: measured on the
  promotion split (``memory.effects``, ``promotion=True``) by the prune job's
  rule (``evolver.meta.prune.verdict``), an insight that helps becomes active
  (``insight_earned``), one that hurts or never helps is retired.

Either way the active list keeps its cap (``[advanced.evolution] max_insights``): the
lowest-ranked active insight over it is retired by the same event.
"""

from __future__ import annotations

from memory import Event, ExperienceStore

from ..config import Config
from .insights import apply_changes
from .prune import retire_insight, verdict, why_measured

__all__ = ["PROBATION", "ApprovalError", "approve_insight", "probation_round"]

PROBATION = "probation"


class ApprovalError(ValueError):
    """The insight cannot be approved; the message says why."""


def approve_insight(store: ExperienceStore, insight_id: int, *, cap: int, why: str = "approved by hand") -> Event:
    """Make an insight on probation active, as one event that a revert undoes."""
    insight = store.insights.get_insight(insight_id)  # NotFound names the id
    if insight.status != PROBATION:
        raise ApprovalError(
            f"insight {insight_id} is {insight.status}, not on probation; only an insight on probation can be approved"
        )
    return _activate(
        store,
        insight_id,
        "insight_approved",
        "APPROVE",
        f"approved insight {insight_id}: {insight.text[:120]}",
        why=why,
        cap=cap,
    )


def probation_round(store: ExperienceStore, config: Config) -> list[str]:
    """Measure every insight on probation on the promotion split: activate those that help, retire
    those that hurt or never help. Returns what it did, a note each."""
    waiting = store.insights.list_insights(status=PROBATION, limit=10_000)
    if not waiting:
        return []
    found = store.exposures.effects("insight", {str(i.id): i.created_at for i in waiting}, promotion=True)
    notes = []
    for insight in waiting:
        effect = found[str(insight.id)]
        said = verdict(effect, config.evolution.retire_after_exposures)
        if said == "helps":
            _activate(
                store,
                insight.id,
                "insight_earned",
                "EARNED",
                f"insight {insight.id} earned its place on the promotion split: {insight.text[:120]}",
                why=why_measured(effect, said),
                cap=config.evolution.max_insights,
            )
            notes.append(f"insight {insight.id} left probation (helps)")
        elif said in ("hurts", "never helps"):
            notes.append(retire_insight(store, insight, effect, said))
    return notes


def _activate(store: ExperienceStore, insight_id: int, kind: str, op: str, what: str, *, why: str, cap: int) -> Event:
    with store.transaction():  # the event, the change and any retirement over the cap: all or nothing
        event = store.reports.append_event(kind, what, why=why)
        apply_changes(store, [{"op": op, "id": insight_id, "status": "active"}], cap=cap, event_id=event.id)
    return event
