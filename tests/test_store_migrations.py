"""Named migrations and the connection settings durability relies on."""

from __future__ import annotations

import sqlite3

import pytest
from sqlite_utils.migrations import Migrations

import memory.database as database_module
from memory import StoreError, StoreOptions
from memory.db import MIGRATIONS


def migration_rows(path):
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT migration_set, name, applied_at FROM _sqlite_migrations ORDER BY id").fetchall()


def test_fresh_store_records_every_migration(store):
    assert store.migrations() == [
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
    assert MIGRATIONS.pending(store.database.writer) == []
    rows = store.database.writer.execute("SELECT migration_set, name FROM _sqlite_migrations").fetchall()
    assert rows == [
        ("evolver", "0001_initial"),
        ("evolver", "0002_inbox_leases"),
        ("evolver", "0003_ledger_indexes"),
        ("evolver", "0004_scaffolds"),
        ("evolver", "0005_insight_history"),
        ("evolver", "0006_tree_search"),
        ("evolver", "0007_task_ending"),
        ("evolver", "0008_exposures"),
        ("evolver", "0009_person_verdict"),
        ("evolver", "0010_task_checks"),
        ("evolver", "0011_claim_order"),
        ("evolver", "0012_measurements"),
    ]
    tables = set(store.database.writer.table_names())
    assert {
        "meta",
        "tasks",
        "trajectories",
        "steps",
        "outcomes",
        "insights",
        "tools",
        "nodes",
        "evaluations",
        "ledger",
        "events",
        "index_outbox",
        "trajectories_fts",
        "insights_fts",
        "tools_fts",
        "scaffolds",
        "insight_history",
        "exposures",
        "measurements",
    } <= tables
    model = store.database.writer.execute("SELECT value FROM meta WHERE key = 'embedding_model'").fetchone()[0]
    assert model == store.embedder.model_id
    assert store.check() == ["ok"]


def test_reopening_applies_nothing_new_and_keeps_the_data(open_store, data_dir):
    first = open_store()
    task, _ = first.inbox.add_task("survive a restart")
    first.close()
    before = migration_rows(data_dir / "evolver.db")
    assert [r[1] for r in before] == [
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

    second = open_store()
    assert migration_rows(data_dir / "evolver.db") == before  # same row, same applied_at
    assert second.inbox.get_task(task.id) == task
    second.close()


def test_a_new_migration_is_applied_once_on_reopen(open_store, data_dir, monkeypatch):
    open_store().close()
    migrations = Migrations("evolver")
    migrations._migrations = list(MIGRATIONS._migrations)

    @migrations(name="0099_task_labels")
    def _labels(db):
        db.execute("ALTER TABLE tasks ADD COLUMN label TEXT")

    monkeypatch.setattr(database_module, "MIGRATIONS", migrations)
    store = open_store()
    assert store.migrations() == [
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
        "0099_task_labels",
    ]
    assert "label" in store.database.writer["tasks"].columns_dict
    store.close()
    store = open_store()  # and not again
    assert [r[1] for r in migration_rows(data_dir / "evolver.db")] == [
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
        "0099_task_labels",
    ]


def test_an_older_store_gets_its_task_checks_and_keeps_every_task_and_reference(open_store, data_dir):
    """Statuses and kinds are CHECK constraints from 0010 on: a store from before keeps its tasks (a source no
    kind has becomes one: the demo's imported attempts "import", the rest "inbox") and the attempts that refer
    to them, and refuses a status or a source no task has from then on, whoever writes it."""
    from memory.db import connect

    db = connect(data_dir / "evolver.db", busy_timeout_ms=5000)
    MIGRATIONS.apply(db, stop_before="0010_task_checks")
    for n, (source, status) in enumerate([("api", "done"), ("demo", "done"), ("pack", "queued"), ("chat", "failed")]):
        db.execute(
            "INSERT INTO tasks (id, prompt, status, source, created_at, updated_at) VALUES (?, ?, ?, ?, 1, 1)",
            [f"t{n}", f"task {n}", status, source],
        )
    db.execute(
        "INSERT INTO trajectories (id, task_id, prompt, status, started_at) VALUES ('j', 't1', 'p', 'finished', 1)"
    )
    db.conn.commit()
    db.conn.close()

    store = open_store()
    assert store.migrations()[-1] == "0012_measurements"
    kinds = {t.id: (str(t.source), str(t.status)) for t in store.inbox.list_tasks(limit=10)}
    assert kinds == {
        "t0": ("api", "done"),
        "t1": ("import", "done"),
        "t2": ("inbox", "queued"),
        "t3": ("chat", "failed"),
    }
    assert store.attempts.get_trajectory("j").task_id == "t1"
    assert store.check() == ["ok"]
    for column, value in (("status", "lost"), ("source", "eval")):
        with pytest.raises(StoreError, match=f"CHECK constraint failed: {column} IN"):
            with store.transaction() as tx:
                tx.execute(f"UPDATE tasks SET {column} = ? WHERE id = 't0'", [value])
    with pytest.raises(ValueError, match="a task's status is one of queued, running, done, failed, cancelled, dead"):
        store.inbox.set_task_status("t0", "lost")


def test_a_failing_migration_leaves_nothing_half_applied(open_store, data_dir, monkeypatch):
    open_store().close()
    migrations = Migrations("evolver")
    migrations._migrations = list(MIGRATIONS._migrations)

    @migrations(name="0099_broken")
    def _broken(db):
        db.execute("CREATE TABLE half_done (x INTEGER)")
        db.execute("INSERT INTO no_such_table VALUES (1)")

    monkeypatch.setattr(database_module, "MIGRATIONS", migrations)
    with pytest.raises(StoreError, match="no such table"):
        open_store()
    with sqlite3.connect(data_dir / "evolver.db") as conn:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert "half_done" not in names
    assert [r[1] for r in migration_rows(data_dir / "evolver.db")] == [
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


def test_connection_pragmas(open_store):
    store = open_store(options=StoreOptions(busy_timeout_ms=1234))
    pragma = lambda name: store.database.writer.execute(f"PRAGMA {name}").fetchone()[0]  # noqa: E731
    assert pragma("journal_mode") == "wal"
    assert pragma("synchronous") == 2  # FULL: WAL with NORMAL can lose the last commits
    assert pragma("busy_timeout") == 1234
    assert pragma("foreign_keys") == 1


def test_foreign_keys_are_enforced(store):
    task, _ = store.inbox.add_task("needs a real node")
    with pytest.raises(StoreError, match="FOREIGN KEY"):
        store.attempts.start_trajectory(task.id, node_id="node_that_does_not_exist")
    assert store.reports.trajectories_of(task.id) == []


def test_wal_mode_persists_in_the_file(open_store, data_dir):
    open_store().close()
    with sqlite3.connect(data_dir / "evolver.db") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_the_databases_lists_of_statuses_and_kinds_are_the_enums():
    """A status or kind added to the code without a migration that widens the CHECK would be refused by every
    store: the lists written out in 0010 must be the enums' values."""
    from memory import TaskKind, TaskStatus
    from memory.db import TASK_KINDS, TASK_STATUSES

    assert TASK_STATUSES == tuple(s.value for s in TaskStatus)
    assert TASK_KINDS == tuple(k.value for k in TaskKind)
