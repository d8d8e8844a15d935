"""What the views read and the history they show (the ``Reports`` role, ``store.reports``: a part of the
store composed over its database): ids and their short forms, a task's attempts, their steps and
outcomes, a person's verdict, spend and results over time, and the evolution events.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from .database import Database, json_text, required
from .errors import AmbiguousId, NotFound
from .records import Event, Outcome, Step, Trajectory

__all__ = ["ReportRecords"]


class ReportRecords:
    """The views' reads, over the store's database."""

    def __init__(self, database: Database, *, sync_index: Callable[[], object]) -> None:
        """``sync_index``: brings the vector index up to date after a write it must see (a person's
        verdict changes what a trajectory is indexed with)."""
        self.database = database
        self._sync_index = sync_index

    def resolve_id(self, short: str) -> tuple[str, str]:
        """The kind ("task", "trajectory", "node") and full id of a unique prefix of one, as git takes a
        short commit id; an exact id is itself. ``NotFound`` when none starts so, ``AmbiguousId`` when
        several do (the message names them)."""
        tables = {"task_": ("task", "tasks"), "traj_": ("trajectory", "trajectories"), "node_": ("node", "nodes")}
        kind_table = next((v for k, v in tables.items() if short.startswith(k)), None)
        if kind_table is None:
            raise NotFound(f"{short!r} is not an id: ids start with task_, traj_ or node_")
        kind, table = kind_table
        # A range on the primary key ('~' sorts after every digit and letter of an id).
        rows = self.database.all(
            f"SELECT id FROM {table} WHERE id >= ? AND id < ? ORDER BY id LIMIT 4", [short, short + "~"]
        )
        ids = [r["id"] for r in rows]
        if short in ids or len(ids) == 1:
            return kind, short if short in ids else ids[0]
        if not ids:
            raise NotFound(f"No {kind} with id {short!r}" + ("" if len(short) > 5 else "; give more of its id"))
        more = " and more" if len(ids) > 3 else ""
        raise AmbiguousId(f"{short!r} starts several {kind} ids ({', '.join(ids[:3])}{more}); give more of it")

    def short_ids(self, ids: list[str]) -> dict[str, str]:
        """Each id's shortest unique prefix (at least 8 characters after its kind's ``task_``), to
        show in listings; any of them is taken back by ``resolve_id``."""
        tables = {"task_": "tasks", "traj_": "trajectories", "node_": "nodes"}
        out = {}
        for full in ids:
            table = tables.get(full[:5])
            if table is None:
                out[full] = full
                continue
            # Only the neighbours in sorted order can share a longer prefix with it (an aggregate: one row).
            before = self.database.all(f"SELECT max(id) AS id FROM {table} WHERE id < ?", [full])[0]["id"] or ""
            after = self.database.all(f"SELECT min(id) AS id FROM {table} WHERE id > ?", [full])[0]["id"] or ""
            shared = max(len(os.path.commonprefix([full, before])), len(os.path.commonprefix([full, after])))
            out[full] = full[: max(13, shared + 1)]
        return out

    def trajectories_of(self, task_id: str) -> list[Trajectory]:
        """A task's attempts in the order they ran. By time, not by attempt number: a task sent back
        to the queue (a drain, an expired lease) numbers its attempts from 1 again."""
        rows = self.database.all("SELECT * FROM trajectories WHERE task_id = ? ORDER BY started_at, rowid", [task_id])
        return [Trajectory.from_row(r) for r in rows]

    def trajectory_counts(self, task_ids: list[str]) -> dict[str, int]:
        """How many attempts (trajectories) each of ``task_ids`` has had; 0 for one that never ran."""
        counts = dict.fromkeys(task_ids, 0)
        rows = self.database.all_in(
            "SELECT task_id, count(*) AS n FROM trajectories WHERE task_id IN ({marks}) GROUP BY task_id", task_ids
        )
        counts.update((r["task_id"], r["n"]) for r in rows)
        return counts

    def last_trajectory(self, task_id: str) -> Trajectory | None:
        """The task's newest attempt (see ``trajectories_of``), or None before its first."""
        row = self.database.one(
            "SELECT * FROM trajectories WHERE task_id = ? ORDER BY started_at DESC, rowid DESC LIMIT 1", [task_id]
        )
        return None if row is None else Trajectory.from_row(row)

    def last_verdict(self, task_id: str) -> tuple[str, bool | None] | None:
        """The task's last attempt (``last_trajectory``) and whether its check passed (None: no verdict),
        or None without one."""
        last = self.last_trajectory(task_id)
        if last is None:
            return None
        outcome = self.outcome(last.id)
        return last.id, None if outcome is None else outcome.success

    def steps(self, trajectory_id: str, *, after_seq: int = 0, limit: int = 1000) -> list[Step]:
        rows = self.database.all(
            "SELECT * FROM steps WHERE trajectory_id = ? AND seq > ? ORDER BY seq LIMIT ?",
            [trajectory_id, after_seq, limit],
        )
        return [Step.from_row(r) for r in rows]

    def add_feedback(self, trajectory_id: str, *, good: bool, note: str = "") -> Outcome:
        """A person's verdict, kept as they gave it (``person_good``); it decides success where no
        verifier did."""
        required(
            self.database.one("SELECT id FROM trajectories WHERE id = ?", [trajectory_id]), "trajectory", trajectory_id
        )
        with self.database.write() as db:
            db.execute(
                """INSERT INTO outcomes (trajectory_id, success, feedback, person_good, decided_at) VALUES (?,?,?,?,?)
                   ON CONFLICT (trajectory_id) DO UPDATE SET feedback = excluded.feedback,
                   person_good = excluded.person_good,
                   success = CASE WHEN outcomes.verifier IS NULL THEN excluded.success ELSE outcomes.success END,
                   decided_at = CASE WHEN outcomes.verifier IS NULL THEN excluded.decided_at
                                     ELSE outcomes.decided_at END""",
                [trajectory_id, int(good), note or ("good" if good else "bad"), int(good), time.time()],
            )
        self._sync_index()
        outcome = self.outcome(trajectory_id)
        assert outcome is not None  # written above
        return outcome

    def outcome(self, trajectory_id: str) -> Outcome | None:
        row = self.database.one("SELECT * FROM outcomes WHERE trajectory_id = ?", [trajectory_id])
        return None if row is None else Outcome.from_row(row)

    def tool_calls(self, names: list[str]) -> dict[str, dict[str, int]]:
        """How often each named tool was called in any task, and how many calls went well (from the
        ``tool`` steps: the usage of tools the store keeps no record of, such as an MCP server's)."""
        if not names:
            return {}
        rows = self.database.all(
            "SELECT json_extract(tool_results, '$[0].name') AS name, count(*) AS calls, "
            "SUM(json_extract(tool_results, '$[0].ok')) AS ok FROM steps WHERE role = 'tool' "
            f"AND json_extract(tool_results, '$[0].name') IN ({','.join('?' * len(names))}) GROUP BY name",
            list(names),
        )
        found = {r["name"]: {"uses": int(r["calls"]), "successes": int(r["ok"] or 0)} for r in rows}
        return {n: found.get(n, {"uses": 0, "successes": 0}) for n in names}

    def spent_by_model(self, *, since: float = 0.0) -> dict[str, tuple[int, float]]:
        """By model (the ledger's, a fallback its own), tokens (in + out) and USD spent since a time."""
        with self.database.errors():
            rows = (
                self.database.reader()
                .execute(
                    "SELECT model, coalesce(sum(tokens_in + tokens_out), 0), coalesce(sum(cost_usd), 0) FROM ledger "
                    "WHERE at >= ? GROUP BY model ORDER BY model",
                    [since],
                )
                .fetchall()
            )
        return {model: (int(tokens), float(usd)) for model, tokens, usd in rows}

    def task_results(self, *, since: float) -> dict[str, dict[str, int]]:
        """By task source, the tasks whose last attempt finished since a time: how many succeeded,
        failed, or have no verdict (no check and no feedback)."""
        periods = self.results_over_time(since=since, period_s=float("inf"))
        return periods[0][1] if periods else {}

    def results_over_time(self, *, since: float, period_s: float) -> list[tuple[int, dict[str, dict[str, int]]]]:
        """``task_results`` per period: (n, counts by source) for each period of ``period_s`` seconds
        from ``since`` (n = 0 the first) in which some task's last attempt finished, in order."""
        bucket = "0" if period_s == float("inf") else "CAST((t.finished_at - ?) / ? AS INTEGER)"
        rows = self.database.all(
            f"SELECT {bucket} AS period, k.source AS source, o.success AS success, count(*) AS n "
            "FROM trajectories t JOIN tasks k ON k.id = t.task_id LEFT JOIN outcomes o ON o.trajectory_id = t.id "
            "WHERE t.finished_at >= ? AND NOT EXISTS (SELECT 1 FROM trajectories later "
            "WHERE later.task_id = t.task_id AND later.attempt > t.attempt) "
            "GROUP BY period, k.source, o.success ORDER BY period",
            ([] if period_s == float("inf") else [since, period_s]) + [since],
        )
        out: dict[int, dict[str, dict[str, int]]] = {}
        for row in rows:
            counts = out.setdefault(row["period"], {}).setdefault(
                row["source"], {"succeeded": 0, "failed": 0, "unjudged": 0}
            )
            key = "unjudged" if row["success"] is None else "succeeded" if row["success"] else "failed"
            counts[key] += row["n"]
        return sorted(out.items())

    def learned_since(self, since: float) -> dict[str, int]:
        """What was learned and unlearned since a time: insights added and retired, synthesized tools
        that came into use and that were retired."""
        # A SELECT of values, no FROM: always one row.
        row = self.database.all(
            "SELECT (SELECT count(*) FROM insight_history WHERE at >= ? AND op = 'ADD') AS insights_added, "
            "(SELECT count(*) FROM insight_history WHERE at >= ? AND json_extract(after, '$.status') = 'retired' "
            " AND coalesce(json_extract(before, '$.status'), '') != 'retired') AS insights_retired, "
            "(SELECT count(*) FROM tools WHERE created_at >= ? AND status IN ('active', 'retired')) AS tools_added, "
            "(SELECT count(*) FROM tools WHERE updated_at >= ? AND status = 'retired') AS tools_retired",
            [since] * 4,
        )[0]
        return {key: int(row[key]) for key in ("insights_added", "insights_retired", "tools_added", "tools_retired")}

    def append_event(
        self,
        kind: str,
        what: str,
        *,
        why: str = "",
        evidence: list | None = None,
        cost_usd: float = 0.0,
        node_id: str | None = None,
        payload: dict | None = None,
        reverts: int | None = None,
    ) -> Event:
        with self.database.write() as db:
            cursor = db.execute(
                """INSERT INTO events (at, kind, what, why, evidence, cost_usd, node_id, payload, reverts)
                   VALUES (?,?,?,?,?,?,?,?,?)""",
                [
                    time.time(),
                    kind,
                    what,
                    why,
                    json_text(evidence or []),
                    cost_usd,
                    node_id,
                    json_text(payload or {}),
                    reverts,
                ],
            )
            event_id = cursor.lastrowid
            assert event_id is not None  # an INSERT just ran
        return self.get_event(event_id)

    def get_event(self, event_id: int) -> Event:
        return Event.from_row(
            required(self.database.one("SELECT * FROM events WHERE id = ?", [event_id]), "event", event_id)
        )

    def list_events(self, *, kind: str | None = None, since: float = 0.0, limit: int = 100) -> list[Event]:
        sql = "SELECT * FROM events WHERE at >= ?"
        params: list = [since]
        if kind:
            sql, params = sql + " AND kind = ?", [*params, kind]
        rows = self.database.all(sql + " ORDER BY id DESC LIMIT ?", [*params, limit])
        return [Event.from_row(r) for r in rows]
