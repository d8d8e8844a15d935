"""What learned items were put in front of the agent, and how those attempts ended against the rest.

An *exposure* is one attempt (a trajectory) that was shown an insight or offered
a tool. An item's measured effect compares the attempts exposed to it with the
attempts made since it existed without it, over learnable attempts only (an
attempt at a held-out task judges promotions; it never decides what is kept),
so a learned item is kept only while it helps. The one exception is an insight
on probation (imported, not yet trusted): it is shown only to the tree's
evaluations on the promotion split, and measured there, as a scaffold edit is.

Comparable attempts are compared: a task attempted both with and without the
item (the same text, as the tree's evaluations and a person's repeated tasks
are) is a group of its own, and all other attempts form one more group; the
difference is the Mantel-Haenszel weighted mean of the groups' differences. An
easy task that happened to be attempted without the item thus never counts
against it, and with no task seen both ways this is the plain comparison.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .database import Database
from .search import learnable_sql

__all__ = ["Effect", "Exposures"]

Z95 = 1.96
Group = tuple[int, int, int, int]
# An attempt at an evaluation task of the promotion split (the held-out split the tree promotes on).
PROMOTION_SQL = "k.source = 'evaluation' AND json_extract(k.metadata, '$.split') = 'test'"
"""(exposed successes, exposed failures, control successes, control failures) of comparable attempts."""


@dataclass(frozen=True)
class Effect:
    """One item's record: attempts with it (succeeded, failed) and without it since it existed."""

    item: str
    helped: int
    """Exposed attempts that succeeded."""
    hurt: int
    """Exposed attempts that failed."""
    control_successes: int
    control_failures: int
    groups: tuple[Group, ...] = ()
    """The attempts above by group of comparable ones (see the module); none: one group of them all."""

    @property
    def exposures(self) -> int:
        return self.helped + self.hurt

    @property
    def matched(self) -> int:
        """Exposed attempts at tasks that were also attempted without the item."""
        return sum(g[0] + g[1] for g in self.groups[:-1])

    @property
    def compared(self) -> int:
        """Exposed attempts in groups that also hold attempts without the item: the evidence the
        difference rests on (none: it cannot be measured yet)."""
        return sum(g[0] + g[1] for g in self._groups() if _two_sided(g))

    def _groups(self) -> tuple[Group, ...]:
        return self.groups or ((self.helped, self.hurt, self.control_successes, self.control_failures),)

    @property
    def difference(self) -> float:
        """Success rate with the item minus without it (each rate smoothed by one success and one
        failure), weighted over groups of comparable attempts."""
        return self._estimate()[0]

    @property
    def interval(self) -> tuple[float, float]:
        """An approximate 95% interval of ``difference`` (normal, on the smoothed rates)."""
        difference, se = self._estimate()
        return max(-1.0, difference - Z95 * se), min(1.0, difference + Z95 * se)

    def _estimate(self) -> tuple[float, float]:
        total = weighted = variance = 0.0
        for s1, f1, s0, f0 in filter(_two_sided, self._groups()):
            n1, n0 = s1 + f1, s0 + f0
            weight = n1 * n0 / (n1 + n0)
            a, b = _rate(s1, f1), _rate(s0, f0)
            total += weight
            weighted += weight * (a - b)
            variance += weight * weight * (a * (1 - a) / (n1 + 2) + b * (1 - b) / (n0 + 2))
        if not total:
            return 0.0, 0.5
        return weighted / total, math.sqrt(variance) / total

    def as_dict(self) -> dict:
        low, high = self.interval
        return {
            "exposures": self.exposures,
            "helped": self.helped,
            "hurt": self.hurt,
            "control": self.control_successes + self.control_failures,
            "compared": self.compared,
            "matched": self.matched,
            "difference": round(self.difference, 3),
            "interval": [round(low, 3), round(high, 3)],
        }


def _two_sided(group: Sequence[int]) -> bool:
    """Whether a group holds attempts both with and without the item: only such a group says anything
    about the difference."""
    return bool((group[0] + group[1]) and (group[2] + group[3]))


def _as_group(counts: Sequence[int]) -> Group:
    successes, failures, control_successes, control_failures = counts
    return successes, failures, control_successes, control_failures


def _rate(successes: int, failures: int) -> float:
    return (successes + 1) / (successes + failures + 2)


class Exposures:
    """Exposures and measured effects (``store.exposures``, a part composed over the store's database)."""

    def __init__(self, database: Database) -> None:
        self.database = database

    def record_exposures(self, trajectory_id: str, items: Mapping[str, Iterable[str]]) -> None:
        """Note, in one write, what the attempt was shown: ``{"insight": ids, "tool": names}``;
        recording one twice changes nothing."""
        rows = [(trajectory_id, kind, str(item)) for kind, names in items.items() for item in names]
        if not rows:
            return
        with self.database.write() as db:
            for row in rows:
                db.execute("INSERT OR IGNORE INTO exposures (trajectory_id, kind, item) VALUES (?,?,?)", list(row))

    def record_measurements(self, kind: str, measured: Mapping[str, tuple[Effect, str | None]]) -> None:
        """Keep each item's effect as just measured, with the verdict it earned (``evolver.meta.prune``), in
        place of its last measurement: what retrieval prefers items by, without measuring anything itself."""
        now = time.time()
        rows = [
            [kind, str(item), said, effect.difference, *effect.interval, effect.compared, now]
            for item, (effect, said) in measured.items()
        ]
        if not rows:  # no durable commit for nothing: a prune round with nothing learned yet
            return
        with self.database.write() as db:
            db.conn.executemany(
                "INSERT OR REPLACE INTO measurements (kind, item, verdict, difference, low, high, compared, "
                "measured_at) VALUES (?,?,?,?,?,?,?,?)",
                rows,
            )

    def verdicts(self, kind: str, items: Iterable[str]) -> dict[str, str]:
        """The verdict each of ``items`` earned when last measured ("helps", "hurts", "never helps"), for
        those that earned one."""
        names = [str(i) for i in items]
        if not names:
            return {}
        marks = ",".join("?" * len(names))
        rows = self.database.all(
            f"SELECT item, verdict FROM measurements WHERE kind = ? AND item IN ({marks}) AND verdict IS NOT NULL",
            [kind, *names],
        )
        return {r["item"]: r["verdict"] for r in rows}

    def exposures_of(self, trajectory_id: str) -> dict[str, list[str]]:
        """What one attempt was shown: ``{"insight": [...], "tool": [...]}``."""
        rows = self.database.all(
            "SELECT kind, item FROM exposures WHERE trajectory_id = ? ORDER BY kind, item", [trajectory_id]
        )
        out: dict[str, list[str]] = {}
        for row in rows:
            out.setdefault(row["kind"], []).append(row["item"])
        return out

    def effects(self, kind: str, since: dict[str, float], *, promotion: bool = False) -> dict[str, Effect]:
        """The measured effect of each item in ``since`` (item -> when it came to exist): its exposed
        attempts against the attempts finished since then without it, over learnable attempts with a
        verdict, grouped by task (see the module). With ``promotion``, over the tree's evaluations on
        the promotion split instead (held-out tasks run as evaluations): the evidence an insight on
        probation earns there. Two queries, whatever the number of items."""
        if not since:
            return {}
        first = min(since.values())
        over = PROMOTION_SQL if promotion else learnable_sql("t")
        # A task's text, by a key short enough to group on (its start, its length): the tree's
        # evaluations and a person's repeated tasks share it.
        attempts = self.database.all(
            "SELECT t.id, t.started_at, o.success, substr(k.prompt, 1, 200) || '#' || length(k.prompt) AS task "
            "FROM trajectories t JOIN outcomes o ON o.trajectory_id = t.id JOIN tasks k ON k.id = t.task_id "
            f"WHERE o.success IS NOT NULL AND t.started_at >= ? AND {over}",
            [first],
        )
        shown: dict[str, set[str]] = {}
        for row in self.database.all(
            "SELECT x.item, x.trajectory_id FROM exposures x JOIN trajectories t ON t.id = x.trajectory_id "
            "WHERE x.kind = ? AND t.started_at >= ?",
            [kind, first],
        ):
            shown.setdefault(row["item"], set()).add(row["trajectory_id"])
        out: dict[str, Effect] = {}
        for item, created in since.items():
            exposed = shown.get(str(item), set())
            by_task: dict[str, list[int]] = {}
            for row in attempts:
                if row["started_at"] < created:
                    continue
                side = 0 if row["id"] in exposed else 2
                counts = by_task.setdefault(row["task"], [0, 0, 0, 0])
                counts[side + (0 if row["success"] else 1)] += 1
            rest = [0, 0, 0, 0]
            groups: list[Group] = []
            for counts in by_task.values():
                if _two_sided(counts):
                    groups.append(_as_group(counts))
                else:
                    rest = [a + b for a, b in zip(rest, counts)]
            totals = [sum(g[i] for g in groups) + rest[i] for i in range(4)]
            out[str(item)] = Effect(str(item), *_as_group(totals), groups=(*groups, _as_group(rest)))
        return out
