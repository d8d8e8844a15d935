"""The vector index on a Chroma server (``[advanced.memory] index_server``): a real ``chroma run`` on loopback.

SQLite stays the truth and the data dir's process stays the index's one writer;
only the collections live on the server, under a prefix of the data dir's own.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from memory import NewTrajectory, Store, StoreError, StoreOptions
from tests.test_store_index import PROMPTS, assert_findable, assert_in_sync

CHROMA = Path(sys.executable).with_name("chroma")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not CHROMA.exists():
        pytest.fail(f"{CHROMA} is missing: chromadb installs its server command beside python")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    path = tmp_path_factory.mktemp("chroma-server")
    proc = subprocess.Popen(
        [str(CHROMA), "run", "--path", str(path), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/api/v2/heartbeat", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, "the Chroma server did not start"
        time.sleep(0.2)
    yield url
    proc.terminate()
    proc.wait(30)


def test_the_index_lives_on_the_server_and_each_data_dir_has_its_own(server, open_store, tmp_path):
    options = StoreOptions(index_server=server)
    first = open_store(tmp_path / "a", options=options)
    ids = first.attempts.ingest([NewTrajectory(prompt=p) for p in PROMPTS])
    assert_in_sync(first)
    assert_findable(first, ids)
    assert not (tmp_path / "a" / "index" / "chroma").exists(), "nothing of the index was written locally"
    # Another data dir on the same server sees none of it.
    second = open_store(tmp_path / "b", options=options)
    assert second.index.count("trajectories") == 0
    assert second.attempts.ingest([NewTrajectory(prompt=PROMPTS[0])])
    assert first.index.count("trajectories") == len(PROMPTS)
    # Reopened, the first finds its index on the server as it left it.
    first.close()
    again = open_store(tmp_path / "a", options=options)
    assert again.index.count("trajectories") == len(PROMPTS)
    assert_findable(again, ids)


def test_an_index_lost_on_the_server_is_rebuilt_from_sqlite(server, open_store, tmp_path):
    options = StoreOptions(index_server=server)
    store = open_store(tmp_path / "c", options=options)
    ids = store.attempts.ingest([NewTrajectory(prompt=p) for p in PROMPTS])
    prefix = store.index._prefix
    store.close()
    import chromadb

    host, port = server.removeprefix("http://").split(":")
    client = chromadb.HttpClient(host=host, port=int(port))
    client.delete_collection(prefix + "trajectories")  # the server lost it
    again = open_store(tmp_path / "c", options=options)
    assert_in_sync(again)
    assert_findable(again, ids)


def test_an_unreachable_server_is_a_clear_error(open_store, tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(StoreError, match=f"127.0.0.1:{port}"):
        Store.open(tmp_path / "d", options=StoreOptions(index_server=f"http://127.0.0.1:{port}"))
