"""Is it learning? What `evolver status` answers beyond "is it running".

Over the last day and the last week: how the person's tasks and the tree's
evaluations ended (success rate among the judged ones), the insights and tools
learned and retired, and what was spent on the person's tasks against the
background work (distilling, synthesizing, proposing, evaluating). Then the
incumbent, the best other candidate and why it is not serving, and the job
rounds that failed in the last day.
"""

from __future__ import annotations

import time

from memory import ExperienceStore

from ..config import Config
from ..tree.search import SEARCH_SOURCES, best_candidate, tree_view

__all__ = ["WINDOWS", "curve", "learning"]

WINDOWS = {"day": 86400.0, "week": 7 * 86400.0}
PERSON_PURPOSES = ("task",)  # the ledger's purpose of the person's tasks and chat turns; the rest is background


def _results(by_source: dict[str, dict[str, int]], evaluations: bool) -> dict:
    counts = {"succeeded": 0, "failed": 0, "unjudged": 0}
    for source, found in by_source.items():
        if (source in SEARCH_SOURCES) == evaluations:
            for key in counts:
                counts[key] += found[key]
    judged = counts["succeeded"] + counts["failed"]
    return {**counts, "rate": round(counts["succeeded"] / judged, 3) if judged else None}


def learning(store: ExperienceStore, config: Config, *, now: float | None = None) -> dict:
    now = time.time() if now is None else now
    windows = {}
    for name, seconds in WINDOWS.items():
        since = now - seconds
        by_source = store.reports.task_results(since=since)
        mine_tokens, mine_usd = store.ledger.spent(since=since, purpose=PERSON_PURPOSES)
        all_tokens, all_usd = store.ledger.spent(since=since)
        windows[name] = {
            "person": _results(by_source, evaluations=False),
            "evaluations": _results(by_source, evaluations=True),
            **store.reports.learned_since(since),
            "spend": {
                "person": {"tokens": mine_tokens, "usd": round(mine_usd, 6)},
                "background": {"tokens": all_tokens - mine_tokens, "usd": round(all_usd - mine_usd, 6)},
            },
        }
    e = config.evolution
    failures = [
        {"at": ev.at, "what": ev.what}
        for ev in store.reports.list_events(kind="job_failed", since=now - 86400, limit=5)
    ]
    return {
        "windows": windows,
        "incumbent": store.get_meta("incumbent"),
        "best_candidate": best_candidate(store, e.min_evaluations, e.promotion_quantile),
        "job_failures": failures,
    }


def curve(
    store: ExperienceStore, *, days: float = 7.0, periods: int = 28, quantile: float = 0.05, now: float | None = None
) -> dict:
    """The learning curve for the dashboard: the success rate of the person's tasks and of the
    evaluations in each of ``periods`` equal periods of the last ``days`` (a period with no judged
    task has rate None), and per node of the tree its own and held-out success."""
    now = time.time() if now is None else now
    since = now - days * 86400
    period_s = days * 86400 / periods
    found = dict(store.reports.results_over_time(since=since, period_s=period_s))
    points = [
        {
            "start": round(since + n * period_s, 3),
            "person": _results(found.get(n, {}), evaluations=False),
            "evaluations": _results(found.get(n, {}), evaluations=True),
        }
        for n in range(periods)
    ]
    nodes = [
        {
            key: node[key]
            for key in (
                "id",
                "short_id",
                "parent_id",
                "status",
                "successes",
                "failures",
                "held_out_successes",
                "held_out_failures",
                "mean",
                "bound",
            )
        }
        for node in tree_view(store, quantile)["nodes"]
    ]
    return {"since": since, "period_s": period_s, "points": points, "nodes": nodes}
