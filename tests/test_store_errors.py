"""Bad input: each a clear error that names the file, and nothing stored lost or rewritten."""

from __future__ import annotations

import os
import random
import sqlite3
import textwrap
import threading

import pytest
from _helpers import last_json, run_python, works

from memory import (
    EmbeddingMismatch,
    IndexBusy,
    NotFound,
    Store,
    StoreCorrupt,
    StoreError,
    StoreFull,
    StoreLocked,
    StoreOptions,
    StoreReadOnly,
)

IS_ROOT = os.geteuid() == 0
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def task_prompts(store: Store) -> list[str]:
    return sorted(t.prompt for t in store.inbox.list_tasks(limit=1000))


@pytest.fixture(scope="module")
def real_db_bytes(tmp_path_factory, embedder) -> bytes:
    """The bytes of a real, closed store's database file."""
    data_dir = tmp_path_factory.mktemp("real") / "data"
    with Store.open(data_dir, embedder=embedder) as store:
        store.inbox.add_task("a task in a real store")
    return (data_dir / "evolver.db").read_bytes()


# --- corrupt files ---------------------------------------------------------------------

CORRUPTIONS = {
    "random bytes": lambda real: random.Random(1234).randbytes(16384),
    "a few bytes": lambda real: b"hello",
    "truncated header": lambda real: real[:50],
    "header, no pages": lambda real: b"SQLite format 3\x00" + bytes(4080),
    "first page only": lambda real: real[:4096],
    "truncated in half": lambda real: real[: len(real) // 2],
    "garbage after page 2": lambda real: real[:8192] + random.Random(99).randbytes(len(real) - 8192),
}


@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_corrupt_database_is_refused_and_left_alone(tmp_path, embedder, real_db_bytes, kind):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    db_path = data_dir / "evolver.db"
    blob = CORRUPTIONS[kind](real_db_bytes)
    db_path.write_bytes(blob)

    with pytest.raises(StoreCorrupt) as caught:
        Store.open(data_dir, embedder=embedder)
    assert str(db_path) in str(caught.value)
    assert "backup" in str(caught.value)
    assert isinstance(caught.value.__cause__, sqlite3.DatabaseError)
    assert db_path.read_bytes() == blob  # not a byte rewritten
    assert sorted(p.name for p in data_dir.iterdir()) == ["evolver.db"]  # and nothing created beside it
    with pytest.raises(StoreCorrupt):  # a reader gets the same answer
        Store.open(data_dir, embedder=embedder, readonly=True)
    assert db_path.read_bytes() == blob


# --- locks -----------------------------------------------------------------------------


def test_locked_database_gives_store_locked(open_store, data_dir):
    store = open_store()
    store.inbox.add_task("before the lock")
    store.close()

    holder = sqlite3.connect(data_dir / "evolver.db", isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        holder.execute("INSERT INTO meta (key, value) VALUES ('holder', 'uncommitted')")
        store = open_store(options=StoreOptions(busy_timeout_ms=100))  # WAL: reading still works
        assert task_prompts(store) == ["before the lock"]
        with pytest.raises(StoreLocked) as caught:
            store.inbox.add_task("during the lock")
        assert str(data_dir / "evolver.db") in str(caught.value)
        with pytest.raises(StoreLocked):
            store.insights.add_insight("also refused")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    # The lock is gone: writing works again, and the refused writes left nothing behind.
    store.inbox.add_task("after the lock")
    assert task_prompts(store) == ["after the lock", "before the lock"]
    assert store.insights.list_insights() == []
    assert store.database.writer.execute("SELECT count(*) FROM meta WHERE key = 'holder'").fetchone()[0] == 0
    assert store.check() == ["ok"]


def test_a_write_that_meets_another_writers_lock_waits_for_it_and_keeps_its_busy_timeout(open_store, data_dir):
    """The store asks for the write lock itself, again and again (SQLite's own handler sleeps up to
    100 ms between tries): a write that meets another process's lock goes through once it is released,
    and the connection's busy timeout is what it was after, for the statements that rely on it."""
    store = open_store(options=StoreOptions(busy_timeout_ms=30_000))
    holder = sqlite3.connect(data_dir / "evolver.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    written: dict = {}
    writing = threading.Thread(target=lambda: written.setdefault("task", store.inbox.add_task("behind the lock")[0]))
    writing.start()
    try:
        writing.join(0.2)
        assert writing.is_alive() and not written, "the write did not wait for the lock"
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    writing.join(30)
    assert not writing.is_alive() and written["task"].prompt == "behind the lock"
    assert store.database.writer.execute("PRAGMA busy_timeout").fetchone()[0] == 30_000


def test_database_locked_before_the_store_ever_opened(tmp_path, embedder):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    holder = sqlite3.connect(data_dir / "evolver.db", isolation_level=None)
    try:
        holder.execute("CREATE TABLE someone_elses (x)")
        holder.execute("BEGIN EXCLUSIVE")  # rollback-journal mode: even readers wait
        holder.execute("INSERT INTO someone_elses VALUES (1)")
        with pytest.raises(StoreLocked, match="evolver.db"):
            Store.open(data_dir, embedder=embedder, options=StoreOptions(busy_timeout_ms=100))
    finally:
        holder.execute("COMMIT")
        holder.close()
    with Store.open(data_dir, embedder=embedder) as store:
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
        assert store.database.writer.execute("SELECT x FROM someone_elses").fetchall() == [(1,)]


# --- read-only data dirs ---------------------------------------------------------------

OPEN_AND_WRITE = textwrap.dedent("""
    import json, sys, pathlib
    from memory import Store
    stage = "open"
    try:
        store = Store.open(pathlib.Path(sys.argv[1]))
        stage = "write"
        store.inbox.add_task("written where nothing may be written")
        result = {"error": None}
    except Exception as exc:
        result = {"error": type(exc).__name__, "message": str(exc), "stage": stage}
    print(json.dumps(result))
""")


def make_store(data_dir, embedder, *prompts):
    with Store.open(data_dir, embedder=embedder) as store:
        for prompt in prompts:
            store.inbox.add_task(prompt)
    return (data_dir / "evolver.db").read_bytes()


def as_nobody(data_dir):
    if not IS_ROOT:
        pytest.skip("runs the check as another user, which needs root")
    if not works(*NOBODY, "true"):
        pytest.skip("setpriv cannot switch to uid 65534 here")
    return run_python(OPEN_AND_WRITE, str(data_dir), prefix=NOBODY, env={"HOME": "/tmp"})


def assert_unharmed(data_dir, embedder, before: bytes, prompts: list[str]):
    assert (data_dir / "evolver.db").read_bytes() == before
    with Store.open(data_dir, embedder=embedder) as store:
        assert task_prompts(store) == sorted(prompts)
        assert store.check() == ["ok"]


def test_data_dir_not_writable_by_this_user(shared_dir, embedder):
    data_dir = shared_dir / "data"
    before = make_store(data_dir, embedder, "kept safe")  # owned by root, mode 0755
    result = last_json(as_nobody(data_dir))
    assert (result["error"], result["stage"]) == ("StoreReadOnly", "open"), result
    assert str(data_dir) in result["message"]
    assert "writable" in result["message"]
    assert_unharmed(data_dir, embedder, before, ["kept safe"])


def test_database_file_not_writable_by_this_user(shared_dir, embedder):
    """The dir is writable but the file is not: refused at open, not at the first write."""
    data_dir = shared_dir / "data"
    before = make_store(data_dir, embedder, "kept safe")
    for path in (data_dir, data_dir / "index", *(data_dir / "index").rglob("*")):
        path.chmod(0o777 if path.is_dir() else 0o666)
    (data_dir / "evolver.db").chmod(0o644)
    result = last_json(as_nobody(data_dir))
    assert (result["error"], result["stage"]) == ("StoreReadOnly", "open"), result
    assert str(data_dir / "evolver.db") in result["message"]
    assert_unharmed(data_dir, embedder, before, ["kept safe"])


def test_new_store_in_a_dir_not_writable_by_this_user(shared_dir):
    data_dir = shared_dir / "data"
    data_dir.mkdir(mode=0o755)
    result = last_json(as_nobody(data_dir))
    assert (result["error"], result["stage"]) == ("StoreReadOnly", "open"), result
    assert str(data_dir) in result["message"]
    assert list(data_dir.iterdir()) == []


def test_data_dir_on_a_read_only_mount(shared_dir, embedder):
    if not IS_ROOT or not works("unshare", "-m", "true"):
        pytest.skip("a private read-only bind mount needs root and unshare -m")
    data_dir = shared_dir / "data"
    before = make_store(data_dir, embedder, "kept safe")
    remount_ro = [
        "unshare",
        "-m",
        "sh",
        "-ec",
        'mount --bind "$1" "$1"; mount -o remount,bind,ro "$1"; shift; exec "$@"',
        "sh",
        str(data_dir),
    ]
    proc = run_python(OPEN_AND_WRITE, str(data_dir), prefix=remount_ro)
    result = last_json(proc)
    assert (result["error"], result["stage"]) == ("StoreReadOnly", "open"), result
    assert str(data_dir) in result["message"]
    assert_unharmed(data_dir, embedder, before, ["kept safe"])


@pytest.mark.skipif(IS_ROOT, reason="root writes read-only files; the as-root variants run instead")
def test_read_only_dir_without_root(tmp_path, embedder):
    data_dir = tmp_path / "data"
    before = make_store(data_dir, embedder, "kept safe")
    data_dir.chmod(0o555)
    try:
        with pytest.raises(StoreReadOnly, match=str(data_dir)):
            Store.open(data_dir, embedder=embedder)
    finally:
        data_dir.chmod(0o755)
    assert_unharmed(data_dir, embedder, before, ["kept safe"])


# --- a full disk -----------------------------------------------------------------------


def test_full_database_gives_store_full_and_keeps_earlier_rows(store):
    """SQLite's page cap stands in for the disk's end."""
    for i in range(5):
        store.inbox.add_task(f"earlier task {i}")
    insight = store.insights.add_insight("an earlier insight")
    pages = store.database.writer.execute("PRAGMA page_count").fetchone()[0]
    store.database.writer.execute(f"PRAGMA max_page_count = {pages}")

    with pytest.raises(StoreFull) as caught:
        store.inbox.add_task("a huge task " + "x" * 200_000)
    assert str(store.db_path) in str(caught.value)
    with pytest.raises(StoreFull):
        store.insights.add_insight("a huge insight " + "y" * 200_000)

    assert task_prompts(store) == [f"earlier task {i}" for i in range(5)]
    assert [i.id for i in store.insights.list_insights()] == [insight.id]
    assert store.check() == ["ok"]
    store.database.writer.execute("PRAGMA max_page_count = 1073741823")  # space again
    task, _ = store.inbox.add_task("a huge task " + "x" * 200_000)
    assert store.inbox.get_task(task.id).prompt.endswith("x" * 100)


FILL_THE_DISK = textwrap.dedent("""
    import errno, json, os, sys, pathlib
    from memory import Store, StoreError, NewTrajectory

    root = pathlib.Path(sys.argv[1])
    store = Store.open(root / "data")
    for i in range(20):
        store.inbox.add_task(f"earlier task {i}")
    filler = os.open(root / "filler", os.O_WRONLY | os.O_CREAT)
    for size in (1 << 20, 1 << 12, 1 << 9):
        try:
            while True:
                os.write(filler, bytes(size))
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    os.close(filler)

    errors = []
    for write in (lambda: store.inbox.add_task("a task on a full disk " + "x" * 300_000),
                  lambda: store.attempts.ingest([NewTrajectory(prompt="a trajectory on a full disk " + "y" * 300_000)],
                                       sync=False)):
        try:
            write()
            errors.append(None)
        except StoreError as exc:
            errors.append([type(exc).__name__, str(exc)])
    os.remove(root / "filler")
    store.inbox.add_task("after space was freed")
    store.close()

    with Store.open(root / "data") as again:
        prompts = sorted(t.prompt for t in again.inbox.list_tasks(limit=100))
        print(json.dumps({"errors": errors, "prompts": prompts, "check": again.check()}))
""")


def test_full_disk_on_a_tiny_tmpfs(tmp_path):
    if not IS_ROOT or not works("unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {tmp_path}"):
        pytest.skip("mounting a tiny tmpfs needs root and unshare -m")
    on_tmpfs = [
        "unshare",
        "-m",
        "sh",
        "-ec",
        'mount -t tmpfs -o size=24m tmpfs "$1"; shift; exec "$@"',
        "sh",
        str(tmp_path),
    ]
    proc = run_python(FILL_THE_DISK, str(tmp_path), prefix=on_tmpfs)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = last_json(proc)
    for error in result["errors"]:
        assert error is not None, "a write succeeded on a full disk"
        name, message = error
        assert name == "StoreFull", message
        assert "evolver.db" in message and "disk is full" in message
    assert result["prompts"] == sorted([f"earlier task {i}" for i in range(20)] + ["after space was freed"])
    assert result["check"] == ["ok"]
    assert list(tmp_path.iterdir()) == []  # the tmpfs lived only in the script's namespace


def test_errors_are_one_family():
    for error in (StoreCorrupt, StoreLocked, StoreReadOnly, StoreFull, IndexBusy, EmbeddingMismatch, NotFound):
        assert issubclass(error, StoreError)
    assert issubclass(NotFound, KeyError)
    assert str(NotFound("No task with id 'x'.")) == "No task with id 'x'."  # not KeyError's quoting


# --- translating low-level errors ---------------------------------------------------------


def sqlite_error(cls, message, code=None):
    exc = cls(message)
    if code is not None:
        exc.sqlite_errorcode = code
    return exc


@pytest.mark.parametrize(
    "exc,expected",
    [
        (sqlite_error(sqlite3.DatabaseError, "file is not a database", 26), StoreCorrupt),
        (sqlite_error(sqlite3.DatabaseError, "database disk image is malformed", 11), StoreCorrupt),
        (sqlite_error(sqlite3.OperationalError, "database is locked", 5), StoreLocked),
        (sqlite_error(sqlite3.OperationalError, "database is locked", 5 | (3 << 8)), StoreLocked),  # BUSY_SNAPSHOT
        (sqlite_error(sqlite3.OperationalError, "attempt to write a readonly database", 8), StoreReadOnly),
        (sqlite_error(sqlite3.OperationalError, "unable to open database file", 14), StoreReadOnly),
        (sqlite_error(sqlite3.OperationalError, "database or disk is full", 13), StoreFull),
        # Words in a message are not the error: the code decides.
        (sqlite_error(sqlite3.OperationalError, "no such column: fullname", 1), StoreError),
        (sqlite_error(sqlite3.OperationalError, "no such table: locked_items", 1), StoreError),
        (sqlite_error(sqlite3.IntegrityError, "the evolution event log is append-only", 19), StoreError),
        # Without a code (raised by the sqlite3 module itself), the text is all there is.
        (sqlite_error(sqlite3.OperationalError, "database is locked"), StoreLocked),
        (sqlite_error(sqlite3.ProgrammingError, "Cannot operate on a closed database."), StoreError),
    ],
)
def test_sqlite_errors_are_translated_by_their_code(tmp_path, exc, expected):
    from memory.errors import translate_sqlite_error

    path = tmp_path / "evolver.db"
    translated = translate_sqlite_error(exc, path)
    assert type(translated) is expected
    assert str(path) in str(translated) and str(exc) in str(translated)


@pytest.mark.parametrize(
    "errno_name,expected",
    [
        ("EACCES", StoreReadOnly),
        ("EPERM", StoreReadOnly),
        ("EROFS", StoreReadOnly),
        ("ENOSPC", StoreFull),
        ("EDQUOT", StoreFull),
        ("EIO", StoreError),
    ],
)
def test_os_errors_are_translated(tmp_path, errno_name, expected):
    import errno

    from memory.errors import translate_os_error

    code = getattr(errno, errno_name)
    translated = translate_os_error(OSError(code, os.strerror(code)), tmp_path)
    assert type(translated) is expected
    assert str(tmp_path) in str(translated)


def test_a_failed_open_lets_go_of_the_index(open_store, data_dir, embedder):
    """Open fails while finishing queued index work (the database is locked); a retry must not find
    the index still owned by the store that failed."""
    from memory import NewTrajectory

    store = open_store()
    store.attempts.ingest([NewTrajectory(prompt="queued for the index")], sync=False)
    store.close()
    holder = sqlite3.connect(data_dir / "evolver.db", isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        with pytest.raises(StoreLocked) as caught:
            Store.open(data_dir, embedder=embedder, options=StoreOptions(busy_timeout_ms=100))
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert caught.value is not None  # the failed store stays referenced by the traceback
    store = open_store()
    assert store.index.count("trajectories") == 1


def test_a_new_data_dir_is_its_owners_alone(open_store, tmp_path):
    data = tmp_path / "new" / "data"
    open_store(data)
    assert data.stat().st_mode & 0o777 == 0o700  # tasks, answers and spend: nobody else's to read
