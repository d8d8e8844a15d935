"""Keyword search over SQLite FTS5 and reciprocal rank fusion with vector hits.

Reciprocal rank fusion (Cormack et al., 2009) adds 1 / (k + rank) over the
rankings a document appears in. It needs no score calibration between BM25 and
cosine similarity, which is why it is the usual choice for hybrid retrieval.
"""

from __future__ import annotations

import re
import sqlite3
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import sqlite_utils

__all__ = ["Filters", "match_expression", "keyword_search", "fuse", "learnable_sql"]

# The one rule for what a learner may see. A held-out task (any task whose
# metadata puts it in the "test" split: the evaluations that decide promotions)
# is never learned from and never shown: its attempts are not retrieved as
# examples for any task, not contrasted by distillation, not mined by tool
# synthesis and not sampled for the proposer. Everything else is learnable.


def learnable_sql(alias: str = "t") -> str:
    """A WHERE fragment: the trajectory ``alias`` is not an attempt at a held-out task.

    Correlated, so it costs one primary-key lookup per candidate row: an
    uncorrelated ``task_id NOT IN (SELECT ... FROM tasks ...)`` scans every
    task's metadata on each query (12.6 ms against 0.07 ms for 40 candidates
    among 100k tasks), and retrieval runs it for every task the agent solves.
    """
    return (
        f"NOT EXISTS (SELECT 1 FROM tasks held WHERE held.id = {alias}.task_id "
        "AND json_extract(held.metadata, '$.split') = 'test')"
    )


_WORD = re.compile(r"[^\W_]+", re.UNICODE)
# Words so common in task texts that matching them says nothing; dropping them
# also keeps a query from touching most of the FTS index.
_STOPWORDS = frozenset(
    """a about all an and any are as at be by can do does each for from how i if in
    into is it its me my no not of on or our so that the their them then there these
    this to was we what when which who will with you your""".split()
)
MAX_TERMS = 12
# FTS5 computes BM25 for every row that any query term matches, so a query costs
# in proportion to the summed document frequencies of its terms: over 100k task
# texts, twelve ordinary words touch most rows and take ~70 ms. The rarest terms
# are the ones BM25 weighs most (IDF), so once the summed frequency passes this
# budget the most common remaining terms are left out. The rarest term is always
# kept, and a small store never reaches the budget, so its results are exact.
POSTINGS_BUDGET: int | None = 10_000  # None: match every word, whatever it costs
# When the caller filters the joined rows, the ranked FTS candidates are
# over-fetched by this factor before filtering (and the full query is the
# fallback when too few survive).
FILTER_OVERFETCH = 4


@dataclass(frozen=True)
class Filters:
    """Restrictions on trajectory search; ``None`` means no restriction."""

    success: bool | None = None
    since: float | None = None
    until: float | None = None
    node_id: str | None = None
    learnable: bool = False  # only what a learner may see (``learnable_sql``); Chroma cannot filter on it

    def is_empty(self) -> bool:
        return (
            self.success is None
            and self.since is None
            and self.until is None
            and self.node_id is None
            and not self.learnable
        )

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
        parts: list[str] = []
        params: list = []
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
        if self.learnable:
            parts.append(learnable_sql(alias))
        return (" AND ".join(parts) or "1"), params


def _words(query: str) -> list[str]:
    """The query's informative words, lower-cased, deduplicated, at most MAX_TERMS."""
    seen: list[str] = []
    for word in _WORD.findall(query.lower()):
        if len(word) > 1 and word not in _STOPWORDS and word not in seen:
            seen.append(word)
        if len(seen) == MAX_TERMS:
            break
    return seen


def _expression(words: list[str]) -> str | None:
    return " OR ".join(f'"{w}"' for w in words) if words else None


def match_expression(query: str) -> str | None:
    """An FTS5 MATCH expression: any of the query's informative words.

    Each word is quoted, so FTS5 syntax in a user's text (NEAR, *, :, quotes)
    is searched for as words, never interpreted.
    """
    return _expression(_words(query))


class _Tokenizer:
    """The FTS tables' own tokenizer (porter unicode61), on a private in-memory database.

    The index stores stemmed terms, so a word's document frequency is looked up
    by its stem; SQLite has no SQL function that tokenizes, but a scratch FTS5
    table and its ``fts5vocab`` view do. A connection of its own, so the store's
    connection (and any transaction open on it) is never written.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None

    def stems(self, words: list[str]) -> list[list[str]]:
        with self._lock:
            if self._conn is None:
                conn = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
                conn.execute("CREATE VIRTUAL TABLE scratch USING fts5(x, tokenize='porter unicode61')")
                conn.execute("CREATE VIRTUAL TABLE scratch_terms USING fts5vocab(scratch, instance)")
                self._conn = conn
            conn = self._conn
            conn.executemany("INSERT INTO scratch (rowid, x) VALUES (?, ?)", list(enumerate(words)))
            rows = conn.execute("SELECT doc, term FROM scratch_terms").fetchall()
            conn.execute("DELETE FROM scratch")
        out: list[list[str]] = [[] for _ in words]
        for doc, term in rows:
            out[doc].append(term)
        return out


_TOKENIZER = _Tokenizer()


class _TermStatistics:
    """Document frequencies of stems, per database and FTS table, kept in memory.

    FTS5 stores no document frequencies: ``fts5vocab`` counts a term's rows by
    reading its whole posting list, which for the common words of a large store
    costs as much as the search it is meant to trim. A frequency only decides
    whether a word is worth matching, so a slightly stale one does no harm: an
    entry is re-read once its table has grown by a tenth since it was counted.
    Statistics, not results: every search still runs in full against the index.
    """

    MAX_ENTRIES = 200_000

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_db: weakref.WeakKeyDictionary[Any, dict] = weakref.WeakKeyDictionary()

    def get(self, db: sqlite_utils.Database, table: str, stems: list[str]) -> dict[str, int]:
        size = db.execute(f"SELECT coalesce(max(rowid), 0) FROM {table}").fetchone()[0]
        with self._lock:
            cache = self._by_db.setdefault(db, {})
            known, missing = {}, []
            for stem in stems:
                entry = cache.get((table, stem))
                if entry is not None and size <= entry[1] * 1.1 + 100:
                    known[stem] = entry[0]
                else:
                    missing.append(stem)
        if missing:
            fresh = _count_rows(db, table, missing)
            with self._lock:
                if len(cache) > self.MAX_ENTRIES:
                    cache.clear()
                for stem in missing:
                    cache[(table, stem)] = (fresh.get(stem, 0), size)
            known.update({stem: fresh.get(stem, 0) for stem in missing})
        return known


def _count_rows(db: sqlite_utils.Database, table: str, stems: list[str]) -> dict[str, int]:
    view = f"temp.{table}_fts_terms"
    sql = f"SELECT term, doc FROM {view} WHERE term IN ({','.join('?' * len(stems))})"
    try:
        rows = db.execute(sql, stems).fetchall()
    except sqlite3.OperationalError:
        # A read-only view in this connection's temp schema: it writes nothing to the file.
        db.execute(f"CREATE VIRTUAL TABLE IF NOT EXISTS {view} USING fts5vocab(main, {table}_fts, row)")
        rows = db.execute(sql, stems).fetchall()
    return dict(rows)


_TERM_STATISTICS = _TermStatistics()


def informative_terms(db: sqlite_utils.Database, table: str, words: list[str], budget: int | None = None) -> list[str]:
    """The words worth matching: all of them, unless together they would touch
    more than ``budget`` (default ``POSTINGS_BUDGET``) rows, in which case the
    rarest that fit (at least one)."""
    budget = POSTINGS_BUDGET if budget is None else budget
    if len(words) <= 1 or budget is None:
        return words
    try:
        stems = _TOKENIZER.stems(words)
        frequency = _TERM_STATISTICS.get(db, table, sorted({s for ws in stems for s in ws}))
    except sqlite3.Error:
        return words  # no statistics: search with every word, as before
    # A word unknown to the index matches nothing and costs nothing; keep it.
    cost = {w: sum(frequency.get(s, 0) for s in ws) for w, ws in zip(words, stems)}
    if sum(cost.values()) <= budget:
        return words
    kept: set[str] = set()
    spent = 0
    for word in sorted(words, key=lambda w: cost[w]):
        if kept and spent + cost[word] > budget:
            break
        kept.add(word)
        spent += cost[word]
    return [w for w in words if w in kept]


def keyword_search(
    db: sqlite_utils.Database,
    table: str,
    query: str,
    limit: int,
    *,
    where: str = "1",
    params: list | None = None,
    join: str = "",
) -> list[str]:
    """Ids of ``table`` rows matching the query's words, best BM25 first."""
    words = _words(query)
    if not words:
        return []
    expression = _expression(informative_terms(db, table, words))
    # FTS5 ranks its matches by itself (ORDER BY rank inside the FTS query); the
    # join and the filter then touch only the best candidates, not every match.
    filtered = where.strip() != "1"
    inner = limit * FILTER_OVERFETCH if filtered else limit
    ranked = [
        r[0]
        for r in db.execute(
            f"SELECT rowid FROM {table}_fts WHERE {table}_fts MATCH ? ORDER BY rank LIMIT ?", [expression, inner]
        ).fetchall()
    ]
    if not ranked:
        return []
    position = {rowid: n for n, rowid in enumerate(ranked)}
    found = db.execute(
        f"SELECT t.rowid, t.id FROM {table} AS t {join} WHERE t.rowid IN ({','.join('?' * len(ranked))}) AND {where}",
        [*ranked, *(params or [])],
    ).fetchall()
    rows = [(row_id,) for _, row_id in sorted(found, key=lambda r: position[r[0]])][:limit]
    if filtered and len(rows) < limit and len(ranked) == inner:
        # Too few of the best candidates passed the filter: rank every match that does.
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
