"""Many threads, one store: readers see only committed rows, a writer sees its own."""

from __future__ import annotations

import gc
import threading

import pytest

from memory.errors import StoreError


def test_a_reader_never_sees_another_threads_uncommitted_rows(store):
    inside, release = threading.Event(), threading.Event()
    seen_inside: list = []

    def writer() -> None:
        with store.database.write() as db:
            db.execute("INSERT INTO meta (key, value) VALUES ('pending', 'yes')")
            seen_inside.append(store.get_meta("pending"))  # its own row, not yet committed
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=writer)
    thread.start()
    assert inside.wait(10)
    assert store.get_meta("pending") is None  # this thread reads committed data only
    release.set()
    thread.join()
    assert seen_inside == ["yes"]
    assert store.get_meta("pending") == "yes"


def test_many_threads_submitting_and_reading_at_once(store):
    errors: list[BaseException] = []
    made: list[str] = []
    lock = threading.Lock()

    def work(n: int) -> None:
        try:
            for i in range(25):
                ((task, new),) = store.inbox.add_tasks([{"prompt": f"task {n}-{i}", "idempotency_key": f"{n}-{i}"}])
                assert new and store.inbox.get_task(task.id).prompt == f"task {n}-{i}"
                store.inbox.list_tasks(limit=5)
                store.inbox.queue_depth()
                with lock:
                    made.append(task.id)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(set(made)) == 200
    assert sum(store.inbox.queue_depth().values()) == 200


def test_close_closes_the_connections_other_threads_read_through(open_store):
    import sqlite3

    store = open_store()
    readers: list = []

    def read() -> None:
        store.inbox.list_tasks()
        readers.append(store.database.reader())

    thread = threading.Thread(target=read)
    thread.start()
    thread.join()
    store.close()
    with pytest.raises(sqlite3.ProgrammingError):
        readers[0].execute("SELECT 1")


def test_a_writer_reads_its_own_rows_through_nested_blocks_and_others_through_its_reader(store):
    with store.database.write() as db:
        assert store.database.reader() is store.database.writer
        db.execute("INSERT INTO meta (key, value) VALUES ('outer', '1')")
        with store.database.write() as inner:
            inner.execute("INSERT INTO meta (key, value) VALUES ('inner', '2')")
            assert store.database.one("SELECT value FROM meta WHERE key = 'outer'") == {"value": "1"}
        # still inside the outer block: its rows, uncommitted, stay visible to it
        assert store.database.reader() is store.database.writer
        assert [
            r["key"] for r in store.database.all("SELECT key FROM meta WHERE key IN ('outer', 'inner') ORDER BY key")
        ] == [
            "inner",
            "outer",
        ]
        ((task, _),) = store.inbox.add_tasks([{"prompt": "inside"}])
        assert store.inbox.get_task(task.id).prompt == "inside"  # add_tasks nested in this block
    assert store.database.reader() is not store.database.writer
    assert store.get_meta("outer") == "1" and store.get_meta("inner") == "2"
    assert store.inbox.get_task(task.id).prompt == "inside"


def test_a_rolled_back_write_is_seen_by_nobody(store):
    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with store.database.write() as db:
            db.execute("INSERT INTO meta (key, value) VALUES ('doomed', 'x')")
            raise Boom
    assert store.get_meta("doomed") is None
    seen: list = []
    thread = threading.Thread(target=lambda: seen.append(store.get_meta("doomed")))
    thread.start()
    thread.join()
    assert seen == [None]
    with store.database.write():
        assert store.get_meta("doomed") is None
    assert store.database.reader() is not store.database.writer  # the depth went back to zero after the error


def test_claiming_reads_the_claimed_task_inside_the_write(store):
    task, _ = store.inbox.add_task("claim me")
    lease = store.inbox.claim_task("w1", lease_s=60, max_attempts=3)
    assert lease is not None and lease.task.id == task.id
    assert lease.task.status == "running" and lease.token == 1
    assert store.inbox.get_task(task.id).lease_owner == "w1"


def test_a_reader_thread_follows_commits_made_after_its_first_read(store):
    before, after = threading.Event(), threading.Event()
    seen: list = []

    def reader() -> None:
        seen.append(len(store.inbox.list_tasks()))
        before.set()
        assert after.wait(10)
        seen.append(len(store.inbox.list_tasks()))

    thread = threading.Thread(target=reader)
    thread.start()
    assert before.wait(10)
    store.inbox.add_task("later")
    after.set()
    thread.join()
    assert seen == [0, 1]


def test_a_closed_store_opens_no_new_reader(open_store):
    store = open_store()
    store.close()
    errors: list = []

    def read() -> None:
        try:
            store.inbox.list_tasks()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=read)
    thread.start()
    thread.join()
    assert len(errors) == 1 and isinstance(errors[0], StoreError) and "closed" in str(errors[0])
    assert len(store.database._readers) == 0


def test_the_reader_of_a_thread_that_ended_is_closed(store):
    import sqlite3

    readers: list = []

    def read() -> None:
        store.inbox.list_tasks()
        readers.append(store.database.reader())

    ended = threading.Thread(target=read)
    ended.start()
    ended.join()
    readers[0].execute("SELECT 1")  # still open: nobody has noticed the thread end yet
    other = threading.Thread(target=read)  # a new reader notices, and closes the old one
    other.start()
    other.join()
    with pytest.raises(sqlite3.ProgrammingError):
        readers[0].execute("SELECT 1")
    readers[1].execute("SELECT 1")
    assert ended not in store.database._readers and other in store.database._readers

    del other
    gc.collect()  # a thread collected takes its reader with it
    with pytest.raises(sqlite3.ProgrammingError):
        readers[1].execute("SELECT 1")
    assert set(store.database._readers) <= {threading.current_thread()}  # this one's own, opened by Store.open
