"""The ledger of model calls: every call's tokens, cost and latency, by model and purpose, and what was spent.

The budget's caps read it (``spent``) before each call, and ``evolver status`` and the dashboard sum it by
model (``store.reports.spent_by_model``). As ``store.ledger``, a part composed over the store's database.
"""

from __future__ import annotations

import time

from .database import Database, required
from .records import LedgerEntry

__all__ = ["Ledger"]


class Ledger:
    """The model calls' ledger (see the module)."""

    def __init__(self, database: Database) -> None:
        self.database = database

    def record_call(
        self,
        *,
        model: str,
        purpose: str,
        tokens_in: int,
        tokens_out: int,
        cost_usd: float,
        latency_ms: float,
        task_id: str | None = None,
        node_id: str | None = None,
    ) -> LedgerEntry:
        with self.database.write() as db:
            cursor = db.execute(
                """INSERT INTO ledger (at, model, purpose, tokens_in, tokens_out, cost_usd, latency_ms, task_id,
                                       node_id)
                   VALUES (?,?,?,?,?,?,?,?,?)""",
                [time.time(), model, purpose, tokens_in, tokens_out, cost_usd, latency_ms, task_id, node_id],
            )
            entry_id = cursor.lastrowid
        return LedgerEntry.from_row(
            required(self.database.one("SELECT * FROM ledger WHERE id = ?", [entry_id]), "ledger entry", entry_id)
        )

    def spent(
        self, *, since: float = 0.0, purpose: str | tuple[str, ...] | None = None, task_id: str | None = None
    ) -> tuple[int, float]:
        """Tokens (in + out) and USD spent since a time, optionally for some purposes or one task."""
        sql = "SELECT coalesce(sum(tokens_in + tokens_out), 0), coalesce(sum(cost_usd), 0) FROM ledger WHERE at >= ?"
        params: list = [since]
        if purpose is not None:
            purposes = (purpose,) if isinstance(purpose, str) else tuple(purpose)
            sql += f" AND purpose IN ({','.join('?' * len(purposes))})"
            params += list(purposes)
        if task_id is not None:
            sql, params = sql + " AND task_id = ?", [*params, task_id]
        with self.database.errors():
            tokens, usd = self.database.reader().execute(sql, params).fetchone()
        return int(tokens), float(usd)
