"""Keyword search over SQLite FTS5 and reciprocal rank fusion with vector hits.

Reciprocal rank fusion (Cormack et al., 2009) adds 1 / (k + rank) over the
rankings a document appears in. It needs no score calibration between BM25 and
cosine similarity, which is why it is the usual choice for hybrid retrieval.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import sqlite_utils

__all__ = ["Filters", "match_expression", "keyword_search", "fuse"]

_WORD = re.compile(r"[^\W_]+", re.UNICODE)
# Words so common in task texts that matching them says nothing; dropping them
# also keeps a query from touching most of the FTS index.
_STOPWORDS = frozenset(
    """a about all an and any are as at be by can do does each for from how i if in
    into is it its me my no not of on or our so that the their them then there these
    this to was we what when which who will with you your""".split()
)
MAX_TERMS = 12


@dataclass(frozen=True)
class Filters:
    """Restrictions on trajectory search; ``None`` means no restriction."""

    success: bool | None = None
    since: float | None = None
    until: float | None = None
    node_id: str | None = None

    def is_empty(self) -> bool:
        return self.success is None and self.since is None and self.until is None and self.node_id is None

    def chroma_where(self) -> dict | None:
        clauses: list[dict] = []
        if self.success is not None:
            clauses.append({"success": 1 if self.success else 0})
        if self.since is not None:
            clauses.append({"started_at": {"$gte": self.since}})
        if self.until is not None:
            clauses.append({"started_at": {"$lte": self.until}})
        if self.node_id is not None:
            clauses.append({"node_id": self.node_id})
        if not clauses:
            return None
        return clauses[0] if len(clauses) == 1 else {"$and": clauses}

    def sql(self, alias: str = "t") -> tuple[str, list]:
        """A WHERE fragment over trajectories (alias) left-joined to outcomes (o)."""
        parts, params = [], []
        if self.success is not None:
            parts.append("o.success = ?")
            params.append(1 if self.success else 0)
        if self.since is not None:
            parts.append(f"{alias}.started_at >= ?")
            params.append(self.since)
        if self.until is not None:
            parts.append(f"{alias}.started_at <= ?")
            params.append(self.until)
        if self.node_id is not None:
            parts.append(f"{alias}.node_id = ?")
            params.append(self.node_id)
        return (" AND ".join(parts) or "1"), params


def match_expression(query: str) -> str | None:
    """An FTS5 MATCH expression: any of the query's informative words.

    Each word is quoted, so FTS5 syntax in a user's text (NEAR, *, :, quotes)
    is searched for as words, never interpreted.
    """
    seen: list[str] = []
    for word in _WORD.findall(query.lower()):
        if len(word) > 1 and word not in _STOPWORDS and word not in seen:
            seen.append(word)
        if len(seen) == MAX_TERMS:
            break
    if not seen:
        return None
    return " OR ".join(f'"{w}"' for w in seen)


def keyword_search(
    db: sqlite_utils.Database, table: str, query: str, limit: int,
    *, where: str = "1", params: list | None = None, join: str = "",
) -> list[str]:
    """Ids of ``table`` rows matching the query's words, best BM25 first."""
    expression = match_expression(query)
    if expression is None:
        return []
    sql = f"""
        SELECT t.id FROM {table}_fts
        JOIN {table} AS t ON t.rowid = {table}_fts.rowid
        {join}
        WHERE {table}_fts MATCH ? AND {where}
        ORDER BY {table}_fts.rank
        LIMIT ?
    """
    rows = db.execute(sql, [expression, *(params or []), limit]).fetchall()
    return [str(r[0]) for r in rows]


def fuse(rankings: list[list[str]], k: int) -> list[tuple[str, float]]:
    """Reciprocal rank fusion of several best-first id lists."""
    scores: dict[str, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, start=1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
    return sorted(scores.items(), key=lambda pair: pair[1], reverse=True)
