"""Many threads, one store: readers see only committed rows, a writer sees its own."""

from __future__ import annotations

import threading

import pytest


def test_a_reader_never_sees_another_threads_uncommitted_rows(store):
    inside, release = threading.Event(), threading.Event()
    seen_inside: list = []

    def writer() -> None:
        with store._write() as db:
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
                (task, new), = store.add_tasks([{"prompt": f"task {n}-{i}", "idempotency_key": f"{n}-{i}"}])
                assert new and store.get_task(task.id).prompt == f"task {n}-{i}"
                store.list_tasks(limit=5)
                store.queue_depth()
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
    assert sum(store.queue_depth().values()) == 200


def test_close_closes_the_connections_other_threads_read_through(open_store):
    import sqlite3

    store = open_store()
    readers: list = []

    def read() -> None:
        store.list_tasks()
        readers.append(store._reader())

    thread = threading.Thread(target=read)
    thread.start()
    thread.join()
    store.close()
    with pytest.raises(sqlite3.ProgrammingError):
        readers[0].execute("SELECT 1")
