"""The vector index follows SQLite: outbox, reconcile after a crash, rebuild, model check, ownership."""

from __future__ import annotations

import sqlite3
import subprocess
import textwrap

import pytest
from _helpers import PYTHON, REPO, OtherModel, index_writes, read_line, run_python
from sqlite_utils.migrations import Migrations

import memory.database as database_module
from memory import EmbeddingMismatch, IndexBusy, NewTrajectory, NotFound, Store, StoreError, StoreOptions
from memory.db import MIGRATIONS
from memory.index import VectorIndex

PROMPTS = [
    "resize every png in a folder to half its size",
    "find the longest common prefix of a list of strings",
    "rotate the nginx access logs every week",
    "convert a csv file of invoices to json",
    "count the words in a markdown document",
]


def sqlite_ids(store: Store, collection: str) -> set[str]:
    return {r[0] for r in store.database.writer.execute(store._indexing._indexable_ids_sql(collection)).fetchall()}


def outbox(store: Store) -> list[tuple]:
    return store.database.writer.execute(
        "SELECT collection, item_id FROM index_outbox ORDER BY collection, item_id"
    ).fetchall()


def assert_in_sync(store: Store) -> None:
    for collection in ("trajectories", "insights", "tools"):
        assert store.index.all_ids(collection) == sqlite_ids(store, collection), collection
        assert store.index.count(collection) == len(sqlite_ids(store, collection))
    assert outbox(store) == []


def assert_findable(store: Store, trajectory_ids: list[str]) -> None:
    """Each trajectory is the best vector match for its own prompt."""
    for trajectory_id in trajectory_ids:
        prompt = store.attempts.get_trajectory(trajectory_id).prompt
        hits = store.retrieval.search_trajectories(prompt, k=3, vector=store.embedder.embed_documents([prompt])[0])
        assert hits[0].trajectory_id == trajectory_id
        assert hits[0].similarity == pytest.approx(1.0, abs=1e-3)


# --- the outbox -------------------------------------------------------------


def test_writes_reach_the_index_through_the_outbox(store):
    ids = store.attempts.ingest([NewTrajectory(prompt=p) for p in PROMPTS[:2]], sync=False)
    assert outbox(store) == sorted(("trajectories", i) for i in ids)
    assert store.index.count("trajectories") == 0
    assert store.sync_index() == 2
    assert outbox(store) == []
    assert store.index.all_ids("trajectories") == set(ids)
    # A new outcome changes only metadata; the trajectory is queued and synced again.
    store.attempts.record_outcome(ids[0], success=True)
    assert outbox(store) == []
    assert store.index.metadata_of("trajectories", [ids[0]])[ids[0]]["success"] == 1
    assert store.index.metadata_of("trajectories", [ids[1]])[ids[1]]["success"] == -1


def test_a_trajectory_enters_the_index_once_when_its_attempt_ends(store, monkeypatch):
    """While its attempt runs, a trajectory waits in the outbox and a sync writes nothing for it; when the
    attempt ends (its outcome recorded first, as the agent does), it is written once: one of Chroma's
    writes, each of which holds the daemon's GIL, instead of an upsert and then an update."""
    writes = index_writes(store.index, monkeypatch)
    task, _ = store.inbox.add_task(PROMPTS[0])
    trajectory = store.attempts.start_trajectory(task.id)
    store.attempts.add_step(trajectory.id, role="assistant", content="resizing")
    assert store.sync_index() == 0
    assert outbox(store) == [("trajectories", trajectory.id)]
    assert writes == [] and store.index.count("trajectories") == 0
    store.attempts.record_outcome(trajectory.id, success=True)
    assert writes == []  # still running
    store.attempts.finish_trajectory(trajectory.id, status="finished", final_answer="done")
    assert writes == [("upsert", "trajectories", [trajectory.id])]
    assert store.index.metadata_of("trajectories", [trajectory.id])[trajectory.id]["success"] == 1
    assert_in_sync(store)
    assert_findable(store, [trajectory.id])


def test_reconcile_after_a_crash_before_the_index_write(open_store, data_dir):
    """Rows committed with the sync skipped (as if the process died right after the commit)."""
    store = open_store()
    synced = store.attempts.ingest([NewTrajectory(prompt=PROMPTS[0], success=True)])
    insight = store.insights.add_insight("always quote shell variables")
    unsynced = store.attempts.ingest([NewTrajectory(prompt=p, success=False) for p in PROMPTS[1:]], sync=False)
    assert store.index.count("trajectories") == 1
    store.close()

    reopened = open_store()
    assert_in_sync(reopened)
    assert reopened.index.count("trajectories") == len(PROMPTS)
    assert str(insight.id) in reopened.index.all_ids("insights")
    assert_findable(reopened, synced + unsynced)


def test_reconcile_after_the_index_write_fails_midway(open_store, monkeypatch):
    store = open_store(options=StoreOptions(index_batch=2))
    calls = {"n": 0}
    real_upsert = VectorIndex.upsert

    def flaky_upsert(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 1:
            raise RuntimeError("chroma went away")
        return real_upsert(self, *args, **kwargs)

    monkeypatch.setattr(VectorIndex, "upsert", flaky_upsert)
    with pytest.raises(StoreError):
        store.attempts.ingest([NewTrajectory(prompt=p) for p in PROMPTS])
    # SQLite has every row; the index has fewer; the rest waits in the outbox.
    assert store.database.writer.execute("SELECT count(*) FROM trajectories").fetchone()[0] == len(PROMPTS)
    assert store.index.count("trajectories") < len(PROMPTS)
    assert len(outbox(store)) == len(PROMPTS) - store.index.count("trajectories")
    store.close()

    monkeypatch.setattr(VectorIndex, "upsert", real_upsert)
    reopened = open_store()
    assert_in_sync(reopened)
    assert reopened.index.count("trajectories") == len(PROMPTS)
    assert_findable(reopened, sorted(sqlite_ids(reopened, "trajectories")))


def test_the_next_write_retries_a_failed_sync(store, monkeypatch):
    def broken(self, *args, **kwargs):
        raise RuntimeError("disk hiccup")

    monkeypatch.setattr(VectorIndex, "upsert", broken)
    with pytest.raises(StoreError):
        store.attempts.ingest([NewTrajectory(prompt=PROMPTS[0])])
    assert store.index.count("trajectories") == 0
    monkeypatch.undo()
    store.insights.add_insight("a later write")
    assert_in_sync(store)
    assert store.index.count("trajectories") == 1


CRASH_SCRIPT = textwrap.dedent("""
    import os, sys, pathlib
    from memory import Store, NewTrajectory
    from memory.embedder import Embedder

    def die(self, texts):
        # Killed after the SQLite commit, before a single vector reaches Chroma.
        os._exit(17)

    Embedder.embed_documents = die
    store = Store.open(pathlib.Path(sys.argv[1]))
    store.attempts.ingest([NewTrajectory(prompt=p, success=True) for p in sys.argv[2:]])
    print("ingest returned: the process should have died", flush=True)
""")


def test_reconcile_after_the_process_is_killed_between_commit_and_index(open_store, data_dir):
    proc = run_python(CRASH_SCRIPT, str(data_dir), *PROMPTS[:3])
    assert proc.returncode == 17, proc.stdout + proc.stderr

    store = open_store()
    assert store.database.writer.execute("SELECT count(*) FROM trajectories").fetchone()[0] == 3
    assert_in_sync(store)
    assert store.index.count("trajectories") == 3
    assert_findable(store, sorted(sqlite_ids(store, "trajectories")))
    hits = store.retrieval.search_trajectories("shrink png images", k=1)
    assert hits[0].prompt == PROMPTS[0] and hits[0].success is True


# --- reconcile against a drifted index -----------------------------------------


def test_reconcile_removes_ids_sqlite_does_not_have(open_store, embedder):
    store = open_store()
    kept = store.attempts.ingest([NewTrajectory(prompt=p) for p in PROMPTS[:2]])
    retired = store.insights.add_insight("retired insight")
    store.insights.update_insight(retired.id, status="retired")
    ghost = embedder.embed_documents(["a ghost trajectory"])
    store.index.upsert(
        "trajectories", ["traj_ghost"], ghost, [{"success": -1, "started_at": 0.0, "node_id": "", "text_hash": "x"}]
    )
    store.index.upsert(
        "insights",
        [str(retired.id), "999"],
        embedder.embed_documents(["a", "b"]),
        [{"text_hash": "x"}, {"text_hash": "y"}],
    )
    assert "traj_ghost" in store.index.all_ids("trajectories")

    fixed = store.reconcile()
    assert fixed["trajectories"] == 1 and fixed["insights"] == 2
    assert store.index.all_ids("trajectories") == set(kept)
    assert store.index.all_ids("insights") == set()
    assert_in_sync(store)

    # And across a restart: a stray added while closed is gone after open.
    store.index.upsert("trajectories", ["traj_ghost2"], ghost, [{"success": -1, "text_hash": "x"}])
    store.close()
    reopened = open_store()
    assert reopened.index.all_ids("trajectories") == set(kept)
    assert all(h.trajectory_id in kept for h in reopened.retrieval.search_trajectories("a ghost trajectory", k=5))


def test_reconcile_restores_ids_missing_from_the_index(store):
    ids = store.attempts.ingest([NewTrajectory(prompt=p) for p in PROMPTS])
    tool = store.tools.add_tool("png_resize", description="resize png images", code_hash="h", origin="builtin")
    store.index.delete("trajectories", ids[:2])
    store.index.delete("tools", [str(tool.id)])
    fixed = store.reconcile()
    assert fixed["trajectories"] == 2 and fixed["tools"] == 1
    assert_in_sync(store)
    assert_findable(store, ids)


def test_reconcile_of_an_index_in_sync_changes_nothing(store):
    store.attempts.ingest([NewTrajectory(prompt=p) for p in PROMPTS[:2]])
    assert store.reconcile() == {"outbox": 0}


def test_reindex_rebuilds_everything(store):
    ids = store.attempts.ingest([NewTrajectory(prompt=p, success=i % 2 == 0) for i, p in enumerate(PROMPTS)])
    insights = [store.insights.add_insight(t) for t in ("check exit codes", "prefer pathlib")]
    store.insights.update_insight(insights[1].id, status="retired")
    tool = store.tools.add_tool("wc", description="count words", code_hash="h", origin="builtin")
    store.index.delete("trajectories", ids[:3])
    store.index.upsert("tools", ["4242"], store.embedder.embed_documents(["stray"]), [{"text_hash": "z"}])

    seen = []
    written = store.reindex(progress=lambda n, total: seen.append((n, total)))
    total = len(PROMPTS) + 1 + 1  # trajectories, the one active insight, the tool
    assert written == total
    assert seen and seen[-1] == (total, total)
    assert_in_sync(store)
    assert store.index.all_ids("tools") == {str(tool.id)}
    assert store.index.all_ids("insights") == {str(insights[0].id)}
    assert_findable(store, ids)
    # Outcomes survive the rebuild as metadata the filters use.
    meta = store.index.metadata_of("trajectories", ids)
    assert [meta[i]["success"] for i in ids] == [1, 0, 1, 0, 1]


# --- the embedding model --------------------------------------------------------


def test_another_embedding_model_is_refused(open_store, data_dir, embedder):
    store = open_store()
    ids = store.attempts.ingest([NewTrajectory(prompt=p) for p in PROMPTS[:3]])
    store.close()

    other = OtherModel(embedder, "some-other-model/384")
    with pytest.raises(EmbeddingMismatch) as caught:
        Store.open(data_dir, embedder=other)
    message = str(caught.value)
    assert "evolver memory reindex" in message
    assert str(data_dir / "index") in message
    assert embedder.model_id in message and "some-other-model/384" in message
    # The failed open let go of the index, and SQLite lost nothing.
    again = open_store()
    assert {t.id for t in map(again.attempts.get_trajectory, ids)} == set(ids)
    assert again.index.count("trajectories") == 3
    again.close()

    # Rebuilding with the new model recovers.
    rebuilt = open_store(embedder=other, rebuild_index=True)
    assert (
        rebuilt.database.writer.execute("SELECT value FROM meta WHERE key = 'embedding_model'").fetchone()[0]
        == other.model_id
    )
    assert rebuilt.reindex() == 3
    assert_in_sync(rebuilt)
    assert (
        rebuilt.database.writer.execute("SELECT value FROM meta WHERE key = 'embedding_model'").fetchone()[0]
        == other.model_id
    )
    assert rebuilt.retrieval.search_trajectories(PROMPTS[1], k=1)[0].trajectory_id == ids[1]
    rebuilt.close()
    # Now the index is the other model's, and the first model is the stranger.
    with pytest.raises(EmbeddingMismatch):
        Store.open(data_dir, embedder=embedder)
    assert open_store(embedder=other).index.count("trajectories") == 3


def test_collection_metadata_naming_another_model_is_refused(open_store, data_dir):
    store = open_store()
    store.insights.add_insight("keep answers short")
    store.index._client.get_collection("insights").modify(metadata={"embedding_model": "tampered/768"})
    store.close()
    with pytest.raises(EmbeddingMismatch, match="evolver memory reindex"):
        open_store()
    recovered = open_store(rebuild_index=True)
    recovered.reindex()
    assert recovered.index.count("insights") == 1
    assert recovered.retrieval.search_insights("short answers", k=1)[0].text == "keep answers short"


# --- one owner of the index ------------------------------------------------------

HOLDER_SCRIPT = textwrap.dedent("""
    import sys, pathlib
    from memory import Store, NewTrajectory
    store = Store.open(pathlib.Path(sys.argv[1]))
    store.attempts.ingest([NewTrajectory(prompt=p, success=True) for p in sys.argv[2:]], sync=False)
    print("ready", flush=True)
    sys.stdin.readline()
    store.close()
    print("closed", flush=True)
""")


def test_a_second_process_gets_index_busy(open_store, data_dir, embedder, monkeypatch):
    holder = subprocess.Popen(
        [PYTHON, "-c", HOLDER_SCRIPT, str(data_dir), *PROMPTS[:2]],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=str(REPO),
    )
    try:
        ready = read_line(holder.stdout, timeout_s=120, what="the index holder to open the store")
        assert ready.strip() == "ready", ready

        with pytest.raises(IndexBusy) as caught:
            Store.open(data_dir, embedder=embedder)
        assert str(data_dir / "index") in str(caught.value)
        assert f"pid {holder.pid}" in str(caught.value)

        # A refused writer changes nothing, not even a pending migration of a newer version.
        migrations = Migrations("evolver")
        migrations._migrations = list(MIGRATIONS._migrations)
        migrations(name="0099_newer")(lambda db: db.execute("CREATE TABLE newer (x)"))
        monkeypatch.setattr(database_module, "MIGRATIONS", migrations)
        with pytest.raises(IndexBusy):
            Store.open(data_dir, embedder=embedder)
        monkeypatch.undo()
        with sqlite3.connect(f"file:{data_dir / 'evolver.db'}?mode=ro", uri=True) as conn:
            assert [r[0] for r in conn.execute("SELECT name FROM _sqlite_migrations")] == [
                "0001_initial",
                "0002_inbox_leases",
                "0003_ledger_indexes",
                "0004_scaffolds",
                "0005_insight_history",
                "0006_tree_search",
                "0007_task_ending",
                "0008_exposures",
                "0009_person_verdict",
                "0010_task_checks",
                "0011_claim_order",
                "0012_measurements",
            ]
            assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'newer'").fetchone()[0] == 0

        # A reader still gets keyword search, without the index.
        reader = open_store(readonly=True)
        assert reader.index is None
        assert reader.retrieval.search_trajectories("nginx logs rotation", k=3) == []  # not among the holder's rows
        hits = reader.retrieval.search_trajectories("resize png", k=3)
        assert [h.prompt for h in hits] == [PROMPTS[0]]
        assert hits[0].similarity is None and hits[0].keyword_rank == 1
        assert reader.retrieval.context("png resize").vector_search is False
        with pytest.raises(StoreError, match="read-only"):
            reader.inbox.add_task("no writes here")
        reader.close()
    finally:
        holder.stdin.write("\n")
        holder.stdin.flush()
        out, err = holder.communicate(timeout=60)
    assert holder.returncode == 0, err
    assert "closed" in out

    # Once the owner is gone, the next writer takes over and finishes its queued work.
    store = open_store()
    assert store.index.count("trajectories") == 2
    assert_in_sync(store)


def test_readonly_open_of_a_missing_store(tmp_path, embedder):
    with pytest.raises(NotFound, match="evolver.db"):
        Store.open(tmp_path / "nothing", embedder=embedder, readonly=True)
    assert not (tmp_path / "nothing").exists()
