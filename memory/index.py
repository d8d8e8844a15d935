"""The vector index: Chroma collections over rows whose truth lives in SQLite.

One process owns the index. Two processes writing one Chroma directory corrupt
it silently, and a second reader sees a frozen snapshot, so the owner holds an
exclusive ``flock`` on ``writer.lock`` for as long as the index is open and any
other process gets ``IndexBusy`` (the daemon answers its clients' searches).

With a Chroma server (``server``, "http://host:port") the collections live
there instead, named with a namespace of this data dir's own (kept in
``namespace`` beside the lock), so several data dirs can share one server; the
lock still makes one process per data dir the writer.

Embeddings are always passed in explicitly. Each collection is still given an
embedding function, one that refuses to run, because Chroma's default would
download a model the first time something asked it to embed.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from . import _offline  # noqa: F401  (must precede chromadb)
from .errors import EmbeddingMismatch, IndexBusy, StoreError, translate_os_error

if TYPE_CHECKING:
    from chromadb.api.collection_configuration import CreateHNSWConfiguration

__all__ = ["VectorIndex"]

# Chroma's cap on ids per call is larger, but get() of very many ids at once
# runs into SQLite's variable limit; page everything.
PAGE = 5000


def _refusing_embedding_function():
    from chromadb.api.types import EmbeddingFunction

    class ExplicitEmbeddingsOnly(EmbeddingFunction):
        """Stands where Chroma's downloading default would; evolver always passes vectors."""

        def __init__(self) -> None:
            pass

        def __call__(self, input):  # noqa: A002  (Chroma's signature)
            raise StoreError("evolver passes embeddings explicitly; Chroma must never embed text itself")

        @staticmethod
        def name() -> str:
            return "evolver-explicit"

        def get_config(self) -> dict:
            return {}

        @staticmethod
        def build_from_config(config: dict) -> ExplicitEmbeddingsOnly:
            return ExplicitEmbeddingsOnly()

    # Registered by name, so Chroma can rebuild it from a collection's stored
    # configuration instead of warning that it cannot.
    from chromadb.utils.embedding_functions import register_embedding_function

    register_embedding_function(ExplicitEmbeddingsOnly)
    return ExplicitEmbeddingsOnly()


class VectorIndex:
    """Cosine-space Chroma collections, one per indexed kind of row."""

    def __init__(
        self,
        path: Path,
        *,
        collections: Sequence[str],
        model_id: str,
        hnsw: dict[str, Any],
        rebuild: bool = False,
        server: str = "",
    ) -> None:
        self.path = path
        self.server = server
        self._rebuild = rebuild
        self.model_id = model_id
        # ``hnsw`` holds Chroma's HNSW settings by their names (``StoreOptions.hnsw``).
        self._hnsw = cast("CreateHNSWConfiguration", {"space": "cosine", **hnsw})
        self._lock_file = self._take_lock(path)
        try:
            import chromadb
            from chromadb.config import Settings

            settings = Settings(anonymized_telemetry=False, allow_reset=True)
            if server:
                url = urllib.parse.urlsplit(server)
                if url.scheme not in ("http", "https") or not url.hostname:
                    raise StoreError(f"[memory] index_server {server!r} is not an http(s)://host:port address")
                self._prefix = f"ev-{self._namespace(path)}-"
                try:
                    self._client = chromadb.HttpClient(
                        host=url.hostname,
                        port=url.port or (443 if url.scheme == "https" else 8000),
                        ssl=url.scheme == "https",
                        settings=settings,
                    )
                except Exception as exc:
                    raise StoreError(
                        f"The Chroma server at {server} ([memory] index_server) could not be reached "
                        f"({exc}); start it, or empty index_server to keep the index in the data "
                        "dir."
                    ) from exc
            else:
                self._prefix = ""
                self._client = chromadb.PersistentClient(path=str(path / "chroma"), settings=settings)
            self._embedding_function = _refusing_embedding_function()
            self._collections: dict[str, Any] = {}
            for name in collections:
                self._collections[name] = self._open_collection(name)
        except BaseException:
            self.close()
            raise

    @property
    def where(self) -> str:
        """Where the collections are, for messages."""
        return f"{self.server} (collections {self._prefix}*)" if self.server else str(self.path)

    @staticmethod
    def _namespace(path: Path) -> str:
        """This data dir's collections' prefix on a shared server: made once, kept beside the lock."""
        file = path / "namespace"
        try:
            if not file.exists():
                file.write_text(secrets.token_hex(6) + "\n")
            return file.read_text().strip()
        except OSError as exc:
            raise translate_os_error(exc, file) from exc

    # --- ownership -----------------------------------------------------------

    @staticmethod
    def _take_lock(path: Path):
        try:
            path.mkdir(parents=True, exist_ok=True)
            lock_file = open(path / "writer.lock", "a+")
        except OSError as exc:
            raise translate_os_error(exc, path) from exc
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock_file.seek(0)
            owner = lock_file.read().strip() or "unknown"
            lock_file.close()
            raise IndexBusy(
                f"The vector index at {path} is owned by another process (pid {owner}). "
                "Only one process may write it; talk to that process (the daemon) instead, "
                "or stop it first."
            ) from None
        lock_file.seek(0)
        lock_file.truncate()
        lock_file.write(str(os.getpid()))
        lock_file.flush()
        return lock_file

    def close(self) -> None:
        client = getattr(self, "_client", None)
        if client is not None:
            del self._client  # closed once, however often close() is called
            if hasattr(client, "close"):
                client.close()  # releases Chroma's files; it caches a system per path otherwise
        lock_file, self._lock_file = getattr(self, "_lock_file", None), None
        if lock_file is not None:
            fcntl.flock(lock_file, fcntl.LOCK_UN)
            lock_file.close()

    # --- collections ---------------------------------------------------------

    def _open_collection(self, name: str):
        full = self._prefix + name
        try:
            existing = {c.name for c in self._client.list_collections()}
            if full in existing:
                collection = self._client.get_collection(full, embedding_function=self._embedding_function)
                built_with = (collection.metadata or {}).get("embedding_model")
                if built_with != self.model_id and self._rebuild:
                    self.reset(name)
                    return self._collections[name]
                if built_with != self.model_id:
                    raise EmbeddingMismatch(
                        f"The vector index at {self.where} was built with the embedding model "
                        f"{built_with!r}, but the configured model is {self.model_id!r}. "
                        "Run `evolver memory reindex` to rebuild it from the database "
                        "(nothing stored in the database is touched)."
                    )
                return collection
            return self._client.create_collection(
                full,
                embedding_function=self._embedding_function,
                configuration={"hnsw": self._hnsw},
                metadata={"embedding_model": self.model_id},
            )
        except StoreError:
            raise
        except Exception as exc:
            raise StoreError(
                f"The vector index at {self.where} could not be opened ({exc}). "
                "Run `evolver memory reindex` to rebuild it from the database."
            ) from exc

    def reset(self, name: str) -> None:
        """Drop one collection and create it empty, for the current model."""
        try:
            self._client.delete_collection(self._prefix + name)
        except Exception:
            pass  # it may not exist; what matters is that a fresh one does now
        self._collections[name] = self._client.create_collection(
            self._prefix + name,
            embedding_function=self._embedding_function,
            configuration={"hnsw": self._hnsw},
            metadata={"embedding_model": self.model_id},
        )

    # --- reads and writes ----------------------------------------------------

    def upsert(self, name: str, ids: list[str], vectors, metadatas: list[dict]) -> None:
        if ids:
            self._collections[name].upsert(ids=ids, embeddings=vectors, metadatas=metadatas)

    def update_metadata(self, name: str, ids: list[str], metadatas: list[dict]) -> None:
        if ids:
            self._collections[name].update(ids=ids, metadatas=metadatas)

    def delete(self, name: str, ids: list[str]) -> None:
        if ids:
            self._collections[name].delete(ids=ids)

    def metadata_of(self, name: str, ids: list[str]) -> dict[str, dict]:
        """The stored metadata of those ids that the collection has."""
        found: dict[str, dict] = {}
        for start in range(0, len(ids), PAGE):
            got = self._collections[name].get(ids=ids[start : start + PAGE], include=["metadatas"])
            found.update(zip(got["ids"], got["metadatas"]))
        return found

    def query(self, name: str, vector, n: int, where: dict | None = None) -> list[tuple[str, float]]:
        """The ``n`` nearest ids with their cosine similarity, best first."""
        collection = self._collections[name]
        result = collection.query(query_embeddings=[vector], n_results=n, where=where or None, include=["distances"])
        return [(i, 1.0 - d) for i, d in zip(result["ids"][0], result["distances"][0])]

    def count(self, name: str) -> int:
        return self._collections[name].count()

    def all_ids(self, name: str) -> set[str]:
        collection, ids, offset = self._collections[name], set(), 0
        while True:
            page = collection.get(include=[], limit=PAGE, offset=offset)["ids"]
            ids.update(page)
            if len(page) < PAGE:
                return ids
            offset += PAGE
