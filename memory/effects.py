"""What learned items were put in front of the agent, and how those attempts ended against the rest.

An *exposure* is one attempt (a trajectory) that was shown an insight or offered
a tool. An item's measured effect compares the success rate of the attempts
exposed to it with that of the attempts made since it existed without it, over
learnable attempts only (an attempt at a held-out task judges promotions; it
never decides what is kept), so a learned item is kept only while it helps.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from .search import learnable_sql

__all__ = ["Effect", "Exposures"]

Z95 = 1.96


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

    @property
    def exposures(self) -> int:
        return self.helped + self.hurt

    @property
    def difference(self) -> float:
        """Success rate with the item minus without it (each smoothed by one success and one failure)."""
        return _rate(self.helped, self.hurt) - _rate(self.control_successes, self.control_failures)

    @property
    def interval(self) -> tuple[float, float]:
        """An approximate 95% interval of ``difference`` (normal, on the smoothed rates)."""
        a, b = _rate(self.helped, self.hurt), _rate(self.control_successes, self.control_failures)
        se = math.sqrt(a * (1 - a) / (self.exposures + 2) + b * (1 - b) / (self.control_successes +
                                                                           self.control_failures + 2))
        return max(-1.0, self.difference - Z95 * se), min(1.0, self.difference + Z95 * se)

    def as_dict(self) -> dict:
        low, high = self.interval
        return {"exposures": self.exposures, "helped": self.helped, "hurt": self.hurt,
                "control": self.control_successes + self.control_failures,
                "difference": round(self.difference, 3), "interval": [round(low, 3), round(high, 3)]}


def _rate(successes: int, failures: int) -> float:
    return (successes + 1) / (successes + failures + 2)


class Exposures:
    """The part of ``Store`` that records exposures and measures effects (a mixin)."""

    def record_exposures(self, trajectory_id: str, items: dict[str, Iterable[str]]) -> None:
        """Note, in one write, what the attempt was shown: ``{"insight": ids, "tool": names}``;
        recording one twice changes nothing."""
        rows = [(trajectory_id, kind, str(item)) for kind, names in items.items() for item in names]
        if not rows:
            return
        with self._write() as db:
            for row in rows:
                db.execute("INSERT OR IGNORE INTO exposures (trajectory_id, kind, item) VALUES (?,?,?)", list(row))

    def exposures_of(self, trajectory_id: str) -> dict[str, list[str]]:
        """What one attempt was shown: ``{"insight": [...], "tool": [...]}``."""
        rows = self._all("SELECT kind, item FROM exposures WHERE trajectory_id = ? ORDER BY kind, item",
                         [trajectory_id])
        out: dict[str, list[str]] = {}
        for row in rows:
            out.setdefault(row["kind"], []).append(row["item"])
        return out

    def effects(self, kind: str, since: dict[str, float]) -> dict[str, Effect]:
        """The measured effect of each item in ``since`` (item -> when it came to exist): its exposed
        attempts against the attempts finished since then without it, over learnable attempts with a
        verdict."""
        out: dict[str, Effect] = {}
        for item, created in since.items():
            row = self._one(
                "SELECT "
                "SUM(x.item IS NOT NULL AND o.success = 1) AS helped, SUM(x.item IS NOT NULL AND o.success = 0) AS hurt, "
                "SUM(x.item IS NULL AND o.success = 1) AS cs, SUM(x.item IS NULL AND o.success = 0) AS cf "
                "FROM trajectories t JOIN outcomes o ON o.trajectory_id = t.id "
                "LEFT JOIN exposures x ON x.trajectory_id = t.id AND x.kind = ? AND x.item = ? "
                f"WHERE o.success IS NOT NULL AND t.started_at >= ? AND {learnable_sql('t')}",
                [kind, str(item), created])
            out[str(item)] = Effect(str(item), int(row["helped"] or 0), int(row["hurt"] or 0),
                                    int(row["cs"] or 0), int(row["cf"] or 0))
        return out
