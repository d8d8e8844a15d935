"""Keep learned items only while they help: one round of measuring insights and synthesized tools.

Each active insight and tool has a measured effect (``memory.effects``): the
success rate of the learnable attempts it was put in front of against
comparable attempts made since it existed without it (the same task where it
was attempted both ways), with an approximate 95% interval. After
``retire_after_exposures`` exposures that can be compared, an item whose interval lies below
zero measurably hurts and is retired; after three times as many, an item that
still shows no benefit (a difference at or below zero) is retired too. Each
retirement is an event that ``evolver history revert`` undoes.

Every item's measurement is kept with the verdict it earned
(``record_measurements``): retrieval prefers the items measured to help among
the relevant ones, and the agent keeps them when its token budget cuts
(``evolver.agent.loop.fit_context``).
"""

from __future__ import annotations

from memory import Effect, ExperienceStore, Insight, ToolRecord

from ..config import Config

__all__ = ["insight_effects", "prune_round", "retire_insight", "tool_effects", "verdict", "why_measured"]


def insight_effects(store: ExperienceStore, insights: list[Insight] | None = None) -> dict[int, Effect]:
    """By insight id, for ``insights`` (default: the active ones), each since it was created."""
    insights = store.insights.list_insights() if insights is None else insights
    found = store.exposures.effects("insight", {str(i.id): i.created_at for i in insights})
    return {i.id: found[str(i.id)] for i in insights}


def tool_effects(store: ExperienceStore, tools: list[ToolRecord] | None = None) -> dict[str, Effect]:
    """By tool name (an attempt is offered a name, whichever version), for ``tools`` (default: the active
    ones), each since the first of its versions among them was registered."""
    since: dict[str, float] = {}
    for tool in store.tools.list_tools(status="active") if tools is None else tools:
        since[tool.name] = min(since.get(tool.name, tool.created_at), tool.created_at)
    return store.exposures.effects("tool", since)


def verdict(effect: Effect, min_exposures: int) -> str | None:
    """ "hurts", "never helps", "helps", or None while the evidence is too thin to say: the exposed
    attempts that have attempts without the item to be compared with (an item shown to every attempt
    cannot be measured, and is kept)."""
    low, high = effect.interval
    if effect.compared >= min_exposures and high < 0:
        return "hurts"
    if effect.compared >= 3 * min_exposures and effect.difference <= 0:
        return "never helps"
    if effect.compared >= min_exposures and low > 0:
        return "helps"
    return None


def why_measured(effect: Effect, said: str) -> str:
    low, high = effect.interval
    return (
        f"{said}: {effect.helped} of {effect.exposures} attempts with it succeeded, against "
        f"{effect.control_successes} of {effect.control_successes + effect.control_failures} without it "
        f"since it existed; {effect.matched} of its attempts at tasks also attempted without it "
        f"(difference {effect.difference:+.2f}, 95% interval {low:+.2f} to {high:+.2f})"
    )


def retire_insight(store: ExperienceStore, insight: Insight, effect: Effect, said: str) -> str:
    """Retire an insight measured to hurt or never help, as an event a revert undoes; returns the note."""
    state = " on probation" if insight.status == "probation" else ""
    store.insights.record_insight_changes(
        "insight_retired",
        f"retired insight {insight.id}{state} ({said}): {insight.text[:120]}",
        [{"op": "RETIRE", "id": insight.id, "status": "retired"}],
        why=why_measured(effect, said),
    )
    return f"retired insight {insight.id}{state} ({said})"


def prune_round(store: ExperienceStore, config: Config) -> str:
    """Measure every active insight and tool, keep the measurements, and retire those that hurt or never
    help. Returns a one-line summary."""
    need = config.evolution.retire_after_exposures
    notes = []
    insights = {str(i): (e, verdict(e, need)) for i, e in insight_effects(store).items()}
    tools = {name: (e, verdict(e, need)) for name, e in tool_effects(store).items()}
    store.exposures.record_measurements("insight", insights)
    store.exposures.record_measurements("tool", tools)
    for insight_id, (effect, said) in insights.items():
        if said in ("hurts", "never helps"):
            notes.append(retire_insight(store, store.insights.get_insight(int(insight_id)), effect, said))
        elif said == "helps":
            notes.append(f"insight {insight_id} helps")
    for name, (effect, said) in tools.items():
        if said in ("hurts", "never helps"):
            tool = store.tools.active_tool(name)
            store.tools.apply_tool_changes(
                "tool_retired",
                f"retired tool {name} v{tool.version} ({said})",
                why=why_measured(effect, said),
                status={tool.id: "retired"},
            )
            notes.append(f"retired tool {name} ({said})")
        elif said == "helps":
            notes.append(f"tool {name} helps")
    return "; ".join(notes) or "every learned item is still helping or not yet measured"
