"""The store's knobs, in a module of their own: what the store's parts use of the store (``_host``) names
their type without importing the store, which imports its parts."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["StoreOptions"]


@dataclass(frozen=True)
class StoreOptions:
    """The knobs of the store; ``evolver.config`` fills them from ``[memory]``."""

    busy_timeout_ms: int = 5000
    rrf_k: int = 60
    # How many candidates each ranking contributes before fusion, per result wanted.
    candidates_per_result: int = 4
    hnsw_ef_construction: int = 100
    hnsw_ef_search: int = 100
    hnsw_max_neighbors: int = 16
    index_batch: int = 256
    index_server: str = ""  # a Chroma server ("http://host:port") holding the index; empty: the data dir

    def hnsw(self) -> dict:
        return {
            "ef_construction": self.hnsw_ef_construction,
            "ef_search": self.hnsw_ef_search,
            "max_neighbors": self.hnsw_max_neighbors,
        }
