"""Hybrid retrieval: vector similarity from Chroma fused with FTS5 keyword search (``store.retrieval``).

Reciprocal rank fusion of the two rankings, with filters on trajectories
(success, time window, scaffold node); ``context`` gathers one task's examples,
insights and tools for a single query embedding.

A part composed over the store's database, handed the store's options, its embedder, the index as it
is now (none while a reader shares the daemon's, or once the store is closed) and the verdicts items
earned (``store.exposures``), by which it prefers those measured to help.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from .database import Database
from .embedder import Embedder
from .index import VectorIndex
from .options import StoreOptions
from .records import Context, InsightHit, ToolHit, TrajectoryHit
from .search import Filters, fuse, keyword_search

__all__ = ["Retrieval"]

# How far down the ranking of relevance an insight or tool measured to help is preferred: among the
# most relevant MEASURED_REACH × k, before those never measured (or measured without a verdict).
MEASURED_REACH = 2
# Where a collection's measured effects are kept (``memory.effects``): the kind, and the column naming
# the item (an attempt is offered a tool by name, whichever version).
MEASURED_BY = {"insights": ("insight", "id"), "tools": ("tool", "name")}


class _Pending:
    """A call running on its own thread; ``result()`` waits for it and re-raises its error."""

    def __init__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self._value: Any = None
        self._error: BaseException | None = None

        def run() -> None:
            try:
                self._value = fn(*args, **kwargs)
            except BaseException as exc:  # handed to result()
                self._error = exc

        self._thread = threading.Thread(target=run, name="evolver-keyword-search", daemon=True)
        self._thread.start()

    def result(self) -> Any:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


class Retrieval:
    """Similarity queries over what the store holds (see the module)."""

    def __init__(
        self,
        database: Database,
        *,
        options: StoreOptions,
        embedder: Embedder,
        index: Callable[[], VectorIndex | None],
        verdicts: Callable[[str, Iterable[str]], dict[str, str]],
        context_from: Callable[..., Context] | None = None,
    ) -> None:
        """``context_from``: a store beside the index's owner asks it for a task's context instead."""
        self.database = database
        self.options = options
        self.embedder = embedder
        self._index = index
        self._verdicts = verdicts
        self.context_from = context_from

    @property
    def index(self) -> VectorIndex | None:
        return self._index()

    def _vector_hits(self, collection: str, vector, k: int, filters: Filters | None) -> list[tuple[str, float]]:
        """Nearest ids, filtered. Unfiltered HNSW search is fast and metadata-filtered
        search in Chroma is not, so over-fetch, filter in SQLite, and fall back to
        Chroma's filtered search only when too few candidates survive."""
        if self.index is None:
            return []
        # No count() first: Chroma counts a collection in time linear in its size
        # (~5 ms at 100k), and a query for more than it holds returns all it holds.
        fetch = max(k * self.options.candidates_per_result, 20)
        hits = self.index.query(collection, vector, fetch)
        if not hits or filters is None or filters.is_empty():
            return hits
        allowed = self._filter_trajectories([i for i, _ in hits], filters)
        kept = [(i, s) for i, s in hits if i in allowed]
        if len(kept) >= k or len(hits) < fetch:  # enough, or every row was a candidate
            return kept
        wider = self.index.query(collection, vector, fetch, where=filters.chroma_where())
        if not filters.learnable:
            return wider
        allowed = self._filter_trajectories([i for i, _ in wider], filters)  # what Chroma cannot filter on
        return [(i, s) for i, s in wider if i in allowed]

    def _filter_trajectories(self, ids: list[str], filters: Filters) -> set[str]:
        if not ids:
            return set()
        where, params = filters.sql("t")
        marks = ",".join("?" * len(ids))
        rows = (
            self.database.reader()
            .execute(
                f"SELECT t.id FROM trajectories t LEFT JOIN outcomes o ON o.trajectory_id = t.id "
                f"WHERE t.id IN ({marks}) AND {where}",
                [*ids, *params],
            )
            .fetchall()
        )
        return {r[0] for r in rows}

    def search_trajectories(
        self, query: str, *, k: int = 5, filters: Filters | None = None, vector=None
    ) -> list[TrajectoryHit]:
        vector = self._query_vector(query, vector)
        fetch = max(k * self.options.candidates_per_result, 20)
        with self.database.errors():
            where, params = (filters or Filters()).sql("t")
            keyword_args = (self.database.reader(), "trajectories", query, fetch)
            keyword_kwargs: dict[str, Any] = dict(
                where=where, params=params, join="LEFT JOIN outcomes o ON o.trajectory_id = t.id"
            )
            if callable(vector):
                # A query embedding still to compute (``context``): the keyword
                # search needs no vector, so it runs on another thread meanwhile
                # (SQLite and torch both release the GIL). The embedding stays on
                # this thread, where torch's thread pool lives.
                keywords = _Pending(keyword_search, *keyword_args, **keyword_kwargs)
                try:
                    vector = vector()
                finally:
                    keyword_ids = keywords.result()
            else:
                keyword_ids = keyword_search(*keyword_args, **keyword_kwargs)
            vector_hits = self._vector_hits("trajectories", vector, k, filters) if vector is not None else []
            fused = self._fuse(vector_hits, keyword_ids, k)
            if not fused:
                return []
            marks = ",".join("?" * len(fused))
            rows = {
                r["id"]: r
                for r in self.database.all(
                    f"""SELECT t.id, t.task_id, t.prompt, t.final_answer, o.success,
                           (SELECT s.content FROM steps s WHERE s.trajectory_id = t.id AND s.role = 'work'
                            ORDER BY s.seq DESC LIMIT 1) AS work
                    FROM trajectories t
                    LEFT JOIN outcomes o ON o.trajectory_id = t.id WHERE t.id IN ({marks})""",
                    [f[0] for f in fused],
                )
            }
        return [
            TrajectoryHit(
                trajectory_id=i,
                task_id=rows[i]["task_id"],
                prompt=rows[i]["prompt"],
                final_answer=rows[i]["final_answer"],
                success=None if rows[i]["success"] is None else bool(rows[i]["success"]),
                score=score,
                similarity=similarity,
                keyword_rank=rank,
                work=rows[i]["work"],
            )
            for i, score, similarity, rank in fused
            if i in rows
        ]

    def _fuse(
        self, vector_hits: list[tuple[str, float]], keyword_ids: list[str], k: int
    ) -> list[tuple[str, float, float | None, int | None]]:
        """The best ``k`` of both rankings by reciprocal rank fusion: (id, fused score, similarity,
        keyword rank), best first."""
        similarity = dict(vector_hits)
        keyword_rank = {i: n for n, i in enumerate(keyword_ids, start=1)}
        fused = fuse([[i for i, _ in vector_hits], keyword_ids], self.options.rrf_k)[:k]
        return [(i, score, similarity.get(i), keyword_rank.get(i)) for i, score in fused]

    def _query_vector(self, query: str, vector):
        """The given vector, or the query embedded now when the index can use one."""
        if vector is None and self.index is not None:
            return self.embedder.embed_query(query)
        return vector

    def _search_small(
        self, collection: str, query: str, k: int, vector, columns: str, statuses: tuple[str, ...] = ("active",)
    ) -> list[tuple[dict, float, float | None, int | None, str | None]]:
        """Insights or tools in ``statuses`` for a query: (row, fused score, similarity, keyword rank, the
        verdict it last earned), best first: among the ``MEASURED_REACH`` × ``k`` most relevant, those
        measured to help come first, so one a little less relevant than an item never measured is still
        shown, and the rest keep their order of relevance."""
        fetch = max(k * self.options.candidates_per_result, 20)
        vector_hits = self._vector_hits(collection, vector, k * MEASURED_REACH, None) if vector is not None else []
        allowed = ",".join("?" * len(statuses))
        keyword_ids = keyword_search(
            self.database.reader(), collection, query, fetch, where=f"t.status IN ({allowed})", params=list(statuses)
        )
        fused = self._fuse(vector_hits, keyword_ids, k * MEASURED_REACH)
        if not fused:
            return []
        marks = ",".join("?" * len(fused))
        rows = {
            str(r["id"]): r
            for r in self.database.all(
                f"SELECT {columns} FROM {collection} WHERE status IN ({allowed}) AND id IN ({marks})",
                [*statuses, *(int(f[0]) for f in fused)],
            )
        }
        found = [(rows[i], score, similarity, rank) for i, score, similarity, rank in fused if i in rows]
        kind, key = MEASURED_BY[collection]
        verdicts = self._verdicts(kind, [str(row[key]) for row, *_ in found])
        said = [(*f, verdicts.get(str(f[0][key]))) for f in found]
        return sorted(said, key=lambda f: f[4] != "helps")[:k]  # stable: relevance within each side

    def search_insights(self, query: str, *, k: int = 5, vector=None, probation: bool = False) -> list[InsightHit]:
        """The active insights most like ``query``; with ``probation``, those on probation too (an
        imported insight not yet approved or measured: ``evolver.meta.probation``)."""
        vector = self._query_vector(query, vector)
        statuses = ("active", "probation") if probation else ("active",)
        with self.database.errors():
            found = self._search_small("insights", query, k, vector, "id, text, importance", statuses)
        return [
            InsightHit(
                insight_id=row["id"],
                text=row["text"],
                importance=row["importance"],
                score=score,
                similarity=similarity,
                keyword_rank=rank,
                measured=said,
            )
            for row, score, similarity, rank, said in found
        ]

    def search_tools(self, query: str, *, k: int = 5, vector=None) -> list[ToolHit]:
        vector = self._query_vector(query, vector)
        with self.database.errors():
            found = self._search_small("tools", query, k, vector, "id, name, version, description")
        return [
            ToolHit(
                tool_id=row["id"],
                name=row["name"],
                version=row["version"],
                description=row["description"],
                score=score,
                similarity=similarity,
                keyword_rank=rank,
                measured=said,
            )
            for row, score, similarity, rank, said in found
        ]

    def context(
        self,
        query: str,
        *,
        trajectories: int = 3,
        insights: int = 5,
        tools: int = 5,
        successful_only: bool = True,
        probation: bool = False,
    ) -> Context:
        """One task's full context from memory, for one query embedding.

        The trajectories' keyword search runs on another thread while the query
        is embedded, so the two overlap on a multi-core machine; the vector is
        then shared by all three collections. A store beside the index's owner
        asks it (``context_from``).
        """
        if self.context_from is not None:
            return self.context_from(
                query,
                trajectories=trajectories,
                insights=insights,
                tools=tools,
                successful_only=successful_only,
                probation=probation,
            )
        embedded: list = []

        def embed():
            embedded.append(self.embedder.embed_query(query))
            return embedded[0]

        # Held-out attempts are never shown, to any task (``learnable_sql``).
        filters = Filters(success=True if successful_only else None, learnable=True)
        hits = self.search_trajectories(
            query, k=trajectories, filters=filters, vector=embed if self.index is not None else None
        )
        vector = embedded[0] if embedded else None
        return Context(
            trajectories=hits,
            insights=self.search_insights(query, k=insights, vector=vector, probation=probation),
            tools=self.search_tools(query, k=tools, vector=vector),
            vector_search=self.index is not None,
        )
