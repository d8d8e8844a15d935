"""Opening the experience store with the user's settings."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from memory import Context, Embedder, Store, StoreOptions

from .config import Config

__all__ = ["open_store", "store_options", "embedder_for"]


def store_options(config: Config) -> StoreOptions:
    m = config.memory
    return StoreOptions(
        busy_timeout_ms=m.busy_timeout_ms,
        rrf_k=m.rrf_k,
        hnsw_ef_search=m.hnsw_ef_search,
        hnsw_ef_construction=m.hnsw_ef_construction,
        hnsw_max_neighbors=m.hnsw_max_neighbors,
        index_server=m.index_server,
    )


def embedder_for(config: Config) -> Embedder:
    m = config.memory
    return Embedder(fast_queries=m.fast_queries, batch_size=m.embed_batch_size, threads=m.embed_threads)


def open_store(
    config: Config,
    *,
    data_dir: Path | None = None,
    readonly: bool = False,
    rebuild_index: bool = False,
    embedder: Embedder | None = None,
    index_owner: bool = True,
    context_from: Callable[..., Context] | None = None,
) -> Store:
    """The store under the configured data dir (reconciled with its index when writable). With
    ``index_owner=False``: SQLite only, for a worker process beside the daemon that owns the index,
    which it asks for a task's retrieval context (``context_from``)."""
    return Store.open(
        data_dir or config.data_dir,
        embedder=embedder or embedder_for(config),
        options=store_options(config),
        readonly=readonly,
        rebuild_index=rebuild_index,
        index_owner=index_owner,
        context_from=context_from,
    )
