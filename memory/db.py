"""The SQLite side of the store: connection settings and named migrations.

SQLite is the source of truth. Anything acknowledged to a client must survive a
power loss, so the connection runs in WAL mode with ``synchronous=FULL`` (WAL
with NORMAL can lose the last commits). Migrations are named, recorded in
``_sqlite_migrations`` and each runs in its own transaction (sqlite-utils'
``Migrations``), so a failed one leaves nothing half-applied.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import sqlite_utils
from sqlite_utils.migrations import Migrations

from .errors import StoreCorrupt, StoreReadOnly, translate_os_error, translate_sqlite_error

__all__ = ["connect", "MIGRATIONS", "INDEXED_COLLECTIONS"]

# Collections of the vector index and the SQLite table behind each.
INDEXED_COLLECTIONS = ("trajectories", "insights", "tools")

MIGRATIONS = Migrations("evolver")


def connect(path: Path, *, busy_timeout_ms: int, readonly: bool = False) -> sqlite_utils.Database:
    """Open (creating if needed) the store's database with the settings it relies on."""
    conn: sqlite3.Connection | None = None
    try:
        if readonly:
            # as_uri() percent-encodes the path: a '?', '#' or '%' in it must not end the file name.
            conn = sqlite3.connect(
                f"{path.absolute().as_uri()}?mode=ro",
                uri=True,
                check_same_thread=False,
                timeout=busy_timeout_ms / 1000,
            )
        else:
            # The data dir holds the user's tasks, answers and spend: only its owner may read it.
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            _require_writable(path)
            conn = sqlite3.connect(path, check_same_thread=False, timeout=busy_timeout_ms / 1000)
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        # Reading the schema is the cheapest way to learn the file is a database at all.
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        if not readonly:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise StoreCorrupt(f"{path}: could not switch to WAL journal mode (got {mode!r}).")
            conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA foreign_keys = ON")
    except BaseException as exc:
        # Never leave a half-set-up connection (and its file handle) behind.
        if conn is not None:
            conn.close()
        if isinstance(exc, sqlite3.Error):
            raise translate_sqlite_error(exc, path) from exc
        if isinstance(exc, OSError):
            raise translate_os_error(exc, path) from exc
        raise
    return sqlite_utils.Database(conn, execute_plugins=False)


def _require_writable(path: Path) -> None:
    """Refuse a database this process cannot write, at open rather than at the first write.

    SQLite opens a file it may not write read-only without a word (and an
    existing WAL database even reads fine), so a daemon would start, accept a
    task, and only then fail to commit it.
    """
    for target in (path.parent, path):
        if target.exists() and not os.access(target, os.W_OK):
            raise StoreReadOnly(
                f"{path} cannot be written ({target} is read-only for this user). Check that the "
                f"data dir {path.parent} is writable by this user and is not on a read-only mount, "
                "or choose another with [daemon] data_dir."
            )


def _enqueue_trigger(table: str, collection: str, key: str, event: str) -> str:
    return f"""
    CREATE TRIGGER {table}_{event.split()[0].lower()}_{collection}_outbox
    AFTER {event} ON {table}
    BEGIN
        INSERT INTO index_outbox (collection, item_id) VALUES ('{collection}', {key})
        ON CONFLICT (collection, item_id) DO UPDATE SET generation = generation + 1;
    END;
    """


@MIGRATIONS(name="0001_initial")
def _initial(db: sqlite_utils.Database) -> None:
    db.executescript(
        """
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);

        CREATE TABLE tasks (
            id TEXT PRIMARY KEY,
            prompt TEXT NOT NULL,
            "check" TEXT,
            status TEXT NOT NULL,
            priority INTEGER NOT NULL DEFAULT 0,
            source TEXT NOT NULL DEFAULT 'inbox',
            metadata TEXT NOT NULL DEFAULT '{}',
            idempotency_key TEXT UNIQUE,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            finished_at REAL,
            error TEXT
        );
        CREATE INDEX tasks_status ON tasks (status, priority DESC, created_at);

        CREATE TABLE nodes (
            id TEXT PRIMARY KEY,
            parent_id TEXT REFERENCES nodes (id),
            scaffold_hash TEXT NOT NULL,
            status TEXT NOT NULL,
            diff TEXT NOT NULL DEFAULT '',
            rationale TEXT NOT NULL DEFAULT '',
            cost_usd REAL NOT NULL DEFAULT 0,
            tokens INTEGER NOT NULL DEFAULT 0,
            created_at REAL NOT NULL
        );
        CREATE INDEX nodes_parent ON nodes (parent_id);

        CREATE TABLE trajectories (
            id TEXT PRIMARY KEY,
            task_id TEXT NOT NULL REFERENCES tasks (id),
            node_id TEXT REFERENCES nodes (id),
            prompt TEXT NOT NULL,
            status TEXT NOT NULL,
            attempt INTEGER NOT NULL DEFAULT 1,
            final_answer TEXT,
            started_at REAL NOT NULL,
            finished_at REAL,
            tokens_in INTEGER NOT NULL DEFAULT 0,
            tokens_out INTEGER NOT NULL DEFAULT 0,
            cost_usd REAL NOT NULL DEFAULT 0
        );
        CREATE INDEX trajectories_task ON trajectories (task_id);
        CREATE INDEX trajectories_started ON trajectories (started_at);

        CREATE TABLE steps (
            trajectory_id TEXT NOT NULL REFERENCES trajectories (id),
            seq INTEGER NOT NULL,
            role TEXT NOT NULL,
            content TEXT NOT NULL,
            tool_calls TEXT,
            tool_results TEXT,
            tokens_in INTEGER NOT NULL DEFAULT 0,
            tokens_out INTEGER NOT NULL DEFAULT 0,
            cost_usd REAL NOT NULL DEFAULT 0,
            duration_ms REAL NOT NULL DEFAULT 0,
            created_at REAL NOT NULL,
            PRIMARY KEY (trajectory_id, seq)
        );

        CREATE TABLE outcomes (
            trajectory_id TEXT PRIMARY KEY REFERENCES trajectories (id),
            success INTEGER,
            score REAL,
            verifier TEXT,
            verifier_output TEXT,
            feedback TEXT,
            decided_at REAL NOT NULL
        );

        CREATE TABLE insights (
            id INTEGER PRIMARY KEY,
            text TEXT NOT NULL,
            importance INTEGER NOT NULL,
            status TEXT NOT NULL,
            provenance TEXT NOT NULL DEFAULT '[]',
            node_id TEXT REFERENCES nodes (id),
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        );

        CREATE TABLE tools (
            id INTEGER PRIMARY KEY,
            name TEXT NOT NULL,
            version INTEGER NOT NULL,
            description TEXT NOT NULL,
            code_hash TEXT NOT NULL,
            status TEXT NOT NULL,
            origin TEXT NOT NULL,
            node_id TEXT REFERENCES nodes (id),
            event_id INTEGER,
            uses INTEGER NOT NULL DEFAULT 0,
            successes INTEGER NOT NULL DEFAULT 0,
            failures INTEGER NOT NULL DEFAULT 0,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            UNIQUE (name, version)
        );

        CREATE TABLE evaluations (
            id INTEGER PRIMARY KEY,
            node_id TEXT NOT NULL REFERENCES nodes (id),
            task_ref TEXT NOT NULL,
            split TEXT NOT NULL,
            status TEXT NOT NULL,
            success INTEGER,
            trajectory_id TEXT REFERENCES trajectories (id),
            started_at REAL NOT NULL,
            finished_at REAL
        );
        CREATE INDEX evaluations_node ON evaluations (node_id);

        CREATE TABLE ledger (
            id INTEGER PRIMARY KEY,
            at REAL NOT NULL,
            model TEXT NOT NULL,
            purpose TEXT NOT NULL,
            tokens_in INTEGER NOT NULL,
            tokens_out INTEGER NOT NULL,
            cost_usd REAL NOT NULL,
            latency_ms REAL NOT NULL,
            task_id TEXT,
            node_id TEXT
        );
        CREATE INDEX ledger_at ON ledger (at);

        CREATE TABLE events (
            id INTEGER PRIMARY KEY,
            at REAL NOT NULL,
            kind TEXT NOT NULL,
            what TEXT NOT NULL,
            why TEXT NOT NULL DEFAULT '',
            evidence TEXT NOT NULL DEFAULT '[]',
            cost_usd REAL NOT NULL DEFAULT 0,
            node_id TEXT,
            payload TEXT NOT NULL DEFAULT '{}',
            reverts INTEGER REFERENCES events (id)
        );
        -- The evolution log is evidence: it only ever grows.
        CREATE TRIGGER events_no_update BEFORE UPDATE ON events
        BEGIN SELECT RAISE(ABORT, 'the evolution event log is append-only'); END;
        CREATE TRIGGER events_no_delete BEFORE DELETE ON events
        BEGIN SELECT RAISE(ABORT, 'the evolution event log is append-only'); END;

        -- Rows whose vector-index entry may be stale. Filled by triggers in the
        -- same transaction as the change, emptied after the index has it, so a
        -- crash between the SQLite commit and the Chroma write loses nothing.
        CREATE TABLE index_outbox (
            collection TEXT NOT NULL,
            item_id TEXT NOT NULL,
            -- bumped by every change, so a sync that read an older state
            -- does not clear a newer one
            generation INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (collection, item_id)
        ) WITHOUT ROWID;
        """
    )
    triggers = [
        _enqueue_trigger("trajectories", "trajectories", "NEW.id", "INSERT"),
        _enqueue_trigger("trajectories", "trajectories", "NEW.id", "UPDATE OF prompt, final_answer, node_id"),
        _enqueue_trigger("trajectories", "trajectories", "OLD.id", "DELETE"),
        _enqueue_trigger("outcomes", "trajectories", "NEW.trajectory_id", "INSERT"),
        _enqueue_trigger("outcomes", "trajectories", "NEW.trajectory_id", "UPDATE OF success"),
        _enqueue_trigger("insights", "insights", "NEW.id", "INSERT"),
        _enqueue_trigger("insights", "insights", "NEW.id", "UPDATE OF text, status"),
        _enqueue_trigger("insights", "insights", "OLD.id", "DELETE"),
        _enqueue_trigger("tools", "tools", "NEW.id", "INSERT"),
        _enqueue_trigger("tools", "tools", "NEW.id", "UPDATE OF description, status, name"),
        _enqueue_trigger("tools", "tools", "OLD.id", "DELETE"),
    ]
    for sql in triggers:
        db.execute(sql)
    db.table("trajectories").enable_fts(["prompt", "final_answer"], create_triggers=True, tokenize="porter unicode61")
    db.table("insights").enable_fts(["text"], create_triggers=True, tokenize="porter unicode61")
    db.table("tools").enable_fts(["name", "description"], create_triggers=True, tokenize="porter unicode61")


@MIGRATIONS(name="0002_inbox_leases")
def _inbox_leases(db: sqlite_utils.Database) -> None:
    # A worker's claim on a task: who holds it, until when, and a fencing token
    # that grows with every claim, so a worker whose lease expired (and whose
    # task another worker took over) cannot record a completion afterwards.
    db.executescript(
        """
        ALTER TABLE tasks ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE tasks ADD COLUMN lease_owner TEXT;
        ALTER TABLE tasks ADD COLUMN lease_token INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE tasks ADD COLUMN lease_expires_at REAL;
        ALTER TABLE tasks ADD COLUMN cancel_requested INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE tasks ADD COLUMN started_at REAL;
        CREATE INDEX tasks_lease ON tasks (status, lease_expires_at);
        """
    )


@MIGRATIONS(name="0003_ledger_indexes")
def _ledger_indexes(db: sqlite_utils.Database) -> None:
    # The budget guard sums the ledger before every model call: per task, and per
    # purpose since the start of the day. Without these it scans every row ever written.
    db.executescript(
        """
        CREATE INDEX ledger_task ON ledger (task_id);
        CREATE INDEX ledger_purpose_at ON ledger (purpose, at);
        """
    )


@MIGRATIONS(name="0004_scaffolds")
def _scaffolds(db: sqlite_utils.Database) -> None:
    # Scaffold snapshots, content-addressed: a node names its scaffold by hash, and
    # restoring any earlier node needs the exact text it ran with.
    db.executescript(
        """
        CREATE TABLE scaffolds (hash TEXT PRIMARY KEY, body TEXT NOT NULL, created_at REAL NOT NULL);
        """
    )


@MIGRATIONS(name="0005_insight_history")
def _insight_history(db: sqlite_utils.Database) -> None:
    # Every operation on an insight, with the insight before and after it, so the
    # list's evolution can be read back and any operation undone.
    db.executescript(
        """
        CREATE TABLE insight_history (
            id INTEGER PRIMARY KEY,
            insight_id INTEGER NOT NULL REFERENCES insights (id),
            op TEXT NOT NULL,
            before TEXT,
            after TEXT NOT NULL,
            event_id INTEGER,
            at REAL NOT NULL
        );
        CREATE INDEX insight_history_insight ON insight_history (insight_id);
        """
    )


@MIGRATIONS(name="0006_tree_search")
def _tree_search(db: sqlite_utils.Database) -> None:
    # Why a node is invalid (shown in the tree, never served); which inbox task runs
    # an evaluation (so one whose result was not recorded before a crash is found);
    # the background jobs read trajectories in the order they finished.
    db.executescript(
        """
        ALTER TABLE nodes ADD COLUMN reason TEXT NOT NULL DEFAULT '';
        ALTER TABLE evaluations ADD COLUMN task_id TEXT;
        CREATE INDEX trajectories_finished ON trajectories (finished_at, id);
        CREATE INDEX evaluations_status ON evaluations (status, node_id);
        """
    )


@MIGRATIONS(name="0007_task_ending")
def _task_ending(db: sqlite_utils.Database) -> None:
    # How a task's last run ended, typed (memory.records.Ending), so callers never parse ``error``.
    db.execute("ALTER TABLE tasks ADD COLUMN ending TEXT")


@MIGRATIONS(name="0008_exposures")
def _exposures(db: sqlite_utils.Database) -> None:
    # Which insights each attempt was shown and which synthesized tools it was offered: the measured
    # effect of a learned item compares those attempts with the rest (memory.effects). The node index
    # serves a node's hook effects and its attempts.
    db.executescript(
        """
        CREATE TABLE exposures (
            trajectory_id TEXT NOT NULL,
            kind TEXT NOT NULL,
            item TEXT NOT NULL,
            PRIMARY KEY (trajectory_id, kind, item)
        ) WITHOUT ROWID;
        CREATE INDEX exposures_item ON exposures (kind, item);
        CREATE INDEX trajectories_node ON trajectories (node_id);
        """
    )


@MIGRATIONS(name="0009_person_verdict")
def _person_verdict(db: sqlite_utils.Database) -> None:
    # A person's word on an answer, kept beside the verifier's verdict instead of folded into it: where a
    # check decided, the person's "good" was recorded and shown as "bad".
    db.execute("ALTER TABLE outcomes ADD COLUMN person_good INTEGER")
    db.execute("UPDATE outcomes SET person_good = success WHERE feedback IS NOT NULL AND verifier IS NULL")


# The values the tasks table may hold as of 0010 (``memory.records.TaskStatus``, ``TaskKind``), written out
# here because a migration must not change with the code after it: a kind added later needs its own.
TASK_STATUSES = ("queued", "running", "done", "failed", "cancelled", "dead")
TASK_KINDS = ("api", "cli", "chat", "bench", "evaluation", "smoke", "import", "inbox")


def _values(items: tuple[str, ...]) -> str:
    return ", ".join(f"'{item}'" for item in items)


@MIGRATIONS(name="0010_task_checks", transactional=False)
def _task_checks(db: sqlite_utils.Database) -> None:
    # A task's status and kind (its source) are typed (memory.records.TaskStatus, TaskKind), and the table
    # holds the same lists as CHECK constraints. SQLite adds a CHECK only by rebuilding the table, and a
    # rebuild of a table others refer to needs foreign keys off, which cannot be switched inside a
    # transaction: this migration opens its own, and is safe to run again (a kill after its commit and
    # before its record) since a rebuilt table already has its checks.
    conn = db.conn
    (created,) = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'tasks'").fetchone()
    if "CHECK" in created:
        return
    conn.execute("PRAGMA foreign_keys = OFF")
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(
                f"""CREATE TABLE tasks_checked (
                    id TEXT PRIMARY KEY,
                    prompt TEXT NOT NULL,
                    "check" TEXT,
                    status TEXT NOT NULL CHECK (status IN ({_values(TASK_STATUSES)})),
                    priority INTEGER NOT NULL DEFAULT 0,
                    source TEXT NOT NULL DEFAULT 'inbox' CHECK (source IN ({_values(TASK_KINDS)})),
                    metadata TEXT NOT NULL DEFAULT '{{}}',
                    idempotency_key TEXT UNIQUE,
                    created_at REAL NOT NULL,
                    updated_at REAL NOT NULL,
                    finished_at REAL,
                    error TEXT,
                    attempts INTEGER NOT NULL DEFAULT 0,
                    lease_owner TEXT,
                    lease_token INTEGER NOT NULL DEFAULT 0,
                    lease_expires_at REAL,
                    cancel_requested INTEGER NOT NULL DEFAULT 0,
                    started_at REAL,
                    ending TEXT
                )"""
            )
            columns = (
                'id, prompt, "check", status, priority, source, metadata, idempotency_key, created_at, updated_at, '
                "finished_at, error, attempts, lease_owner, lease_token, lease_expires_at, cancel_requested, "
                "started_at, ending"
            )
            # Rows from before the kinds: the demo's imported attempts were "demo"; any other source is a
            # task that came in by no door the kinds name.
            source = (
                f"CASE WHEN source IN ({_values(TASK_KINDS)}) THEN source "
                "WHEN source = 'demo' THEN 'import' ELSE 'inbox' END"
            )
            selected = columns.replace("source,", f"{source},", 1)
            conn.execute(f"INSERT INTO tasks_checked ({columns}) SELECT {selected} FROM tasks")
            conn.execute("DROP TABLE tasks")
            conn.execute("ALTER TABLE tasks_checked RENAME TO tasks")
            conn.execute("CREATE INDEX tasks_status ON tasks (status, priority DESC, created_at)")
            conn.execute("CREATE INDEX tasks_lease ON tasks (status, lease_expires_at)")
            broken = conn.execute("PRAGMA foreign_key_check").fetchall()
            if broken:
                raise sqlite3.IntegrityError(f"rebuilding tasks would break {len(broken)} references: {broken[:3]}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    finally:
        conn.execute("PRAGMA foreign_keys = ON")


@MIGRATIONS(name="0011_claim_order")
def _claim_order(db: sqlite_utils.Database) -> None:
    # A claim reads the next queued task in the inbox's order (priority, then age, then id) straight off an
    # index, whatever the queue's length: the old index lacked the id, and the claim's one query for queued
    # or expired tasks sorted the whole queue, holding the write lock for milliseconds behind a backlog. A
    # lane that serves some kinds only (chat, evaluations) reads the queued ones of its kinds off the other.
    db.executescript(
        """
        DROP INDEX tasks_status;
        CREATE INDEX tasks_queue ON tasks (status, priority DESC, created_at, id);
        CREATE INDEX tasks_queued_kind ON tasks (source, priority DESC, created_at, id) WHERE status = 'queued';
        """
    )


@MIGRATIONS(name="0012_measurements")
def _measurements(db: sqlite_utils.Database) -> None:
    # Each learned item's effect as the last prune round measured it (memory.effects): retrieval prefers
    # items measured to help without measuring anything itself, and a person sees the verdict it acted on.
    db.executescript(
        """
        CREATE TABLE measurements (
            kind TEXT NOT NULL CHECK (kind IN ('insight', 'tool')),
            item TEXT NOT NULL,
            verdict TEXT CHECK (verdict IN ('helps', 'hurts', 'never helps')),
            difference REAL NOT NULL,
            low REAL NOT NULL,
            high REAL NOT NULL,
            compared INTEGER NOT NULL,
            measured_at REAL NOT NULL,
            PRIMARY KEY (kind, item)
        ) WITHOUT ROWID;
        """
    )
