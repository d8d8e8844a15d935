"""The durable inbox: tasks committed, and workers claiming them under a lease, fenced on completion
(the ``InboxStore`` role, ``store.inbox``: a part of the store composed over its database).

A claim sets the task running for one owner until ``lease_expires_at`` and
bumps its ``lease_token``. A worker renews the lease while it works, and its
completion counts only if the token still matches: a worker that stalled past
its lease (and whose task another worker has taken over) is told its result is
stale instead of overwriting the newer run. A task whose lease expired is
claimable again; after ``max_attempts`` claims it is dead-lettered with the
reason. Cancelling a queued task ends it at once; a running one is asked to
stop (``cancel_requested``) and ends at its worker's next step boundary.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from .database import Database, json_text, required
from .errors import NotFound
from .ids import new_id
from .records import Ending, Step, Task, TaskKind, TaskStatus

__all__ = ["Inbox", "Lease", "TERMINAL"]

TERMINAL = (TaskStatus.DONE, TaskStatus.FAILED, TaskStatus.CANCELLED, TaskStatus.DEAD)

# How many tasks one INSERT of ``add_tasks`` carries (each row binds several parameters).
_TASKS_PER_INSERT = 200


@dataclass(frozen=True)
class Lease:
    """A worker's claim on a task; ``token`` fences whatever it records about the task."""

    task: Task
    owner: str
    token: int
    expires_at: float


class Inbox:
    """Tasks and their leases, over the store's database."""

    def __init__(self, database: Database) -> None:
        self.database = database

    def add_task(
        self,
        prompt: str,
        *,
        check: dict | None = None,
        priority: int = 0,
        source: TaskKind | str = TaskKind.INBOX,
        metadata: dict | None = None,
        idempotency_key: str | None = None,
        status: str = "queued",
    ) -> tuple[Task, bool]:
        """Commit a task durably. Returns the task and whether it is new.

        With an idempotency key already used, the earlier task comes back
        unchanged: a client retrying after a lost reply never makes a duplicate.
        """
        return self.add_tasks(
            [
                dict(
                    prompt=prompt,
                    check=check,
                    priority=priority,
                    source=source,
                    metadata=metadata,
                    idempotency_key=idempotency_key,
                    status=status,
                )
            ]
        )[0]

    def add_tasks(self, items: list[dict]) -> list[tuple[Task, bool]]:
        """Commit several tasks in one transaction (one fsync): ``add_task`` for each item's arguments.

        An item may bring its own ``id`` (``new_id("task")``): a caller that decides something from
        the id (the held-out split of a person's task) records it in the same commit."""
        # Each task and its row are made before the transaction (a task refused, named, before it too), so
        # the write lock is held for three statements and little else: each statement lets go of the GIL,
        # and winning it back from the API's busy thread is what a commit beside it waits on, with the
        # workers waiting for the lock behind it.
        now = time.time()
        made = []
        for item in items:
            if not item.get("prompt") or not item["prompt"].strip():
                raise ValueError("A task needs a non-empty prompt.")
            task = Task(
                id=item.get("id") or new_id("task"),
                prompt=item["prompt"],
                status=TaskStatus.of(item.get("status", TaskStatus.QUEUED)),
                created_at=now,
                updated_at=now,
                check=item.get("check"),
                priority=item.get("priority", 0),
                source=TaskKind.of(item.get("source", TaskKind.INBOX)),
                metadata=item.get("metadata") or {},
                idempotency_key=item.get("idempotency_key"),
            )
            row = [
                task.id,
                task.prompt,
                json_text(task.check),
                task.status.value,
                task.priority,
                task.source.value,
                json_text(task.metadata),
                task.idempotency_key,
                now,
                now,
            ]
            made.append((task, row))
        keys = [task.idempotency_key for task, _ in made if task.idempotency_key is not None]
        results: list[tuple[Task, bool]] = []
        with self.database.write() as db:
            known = {
                found["idempotency_key"]: Task.from_row(found)
                for found in self.database.all_in("SELECT * FROM tasks WHERE idempotency_key IN ({marks})", keys)
            }
            rows = []
            for task, row in made:
                key = task.idempotency_key
                if key is not None and key in known:  # an earlier task, or one earlier in this batch
                    results.append((known[key], False))
                    continue
                if key is not None:
                    known[key] = task
                rows.append(row)
                results.append((task, True))
            for start in range(0, len(rows), _TASKS_PER_INSERT):
                inserted = rows[start : start + _TASKS_PER_INSERT]
                db.execute(
                    """INSERT INTO tasks (id, prompt, "check", status, priority, source, metadata,
                       idempotency_key, created_at, updated_at) VALUES """
                    + ",".join(["(?,?,?,?,?,?,?,?,?,?)"] * len(inserted)),
                    [value for row in inserted for value in row],
                )
        return results

    def get_task(self, task_id: str) -> Task:
        return Task.from_row(
            required(self.database.one("SELECT * FROM tasks WHERE id = ?", [task_id]), "task", task_id)
        )

    def set_task_status(
        self, task_id: str, status: str, *, error: str | None = None, ending: Ending | None = None
    ) -> Task:
        checked = TaskStatus.of(status)  # a status no task has is refused, naming them
        now = time.time()
        finished = now if checked in TERMINAL else None
        with self.database.write() as db:
            cursor = db.execute(
                "UPDATE tasks SET status = ?, error = ?, ending = ?, updated_at = ?, "
                "finished_at = coalesce(?, finished_at) WHERE id = ?",
                [checked.value, error, None if ending is None else Ending(ending).value, now, finished, task_id],
            )
            if cursor.rowcount == 0:
                raise NotFound(f"No task with id {task_id!r}.")
        return self.get_task(task_id)

    def list_tasks(
        self, *, status: str | None = None, source: str | None = None, limit: int = 50, offset: int = 0
    ) -> list[Task]:
        clauses: list[str] = []
        params: list = []
        if status:
            clauses, params = clauses + ["status = ?"], params + [status]
        if source:
            clauses, params = clauses + ["source = ?"], params + [source]
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = self.database.all(
            f"SELECT * FROM tasks {where} ORDER BY created_at DESC, id DESC LIMIT ? OFFSET ?", [*params, limit, offset]
        )
        return [Task.from_row(r) for r in rows]

    def task_steps(self, task_id: str, *, after_id: int = 0, limit: int = 500) -> list[tuple[int, int, Step]]:
        """A task's steps across its attempts, in order, as (event id, attempt, step).

        The event id (the step's rowid) only grows, so a live reader resumes
        after the last id it saw.
        """
        rows = self.database.all(
            "SELECT s.rowid AS event_id, t.attempt AS attempt, s.* FROM steps s JOIN trajectories t "
            "ON t.id = s.trajectory_id WHERE t.task_id = ? AND s.rowid > ? ORDER BY s.rowid LIMIT ?",
            [task_id, after_id, limit],
        )
        return [(r.pop("event_id"), r.pop("attempt"), Step.from_row(r)) for r in rows]

    def close_interrupted_trajectories(self) -> int:
        """End the attempts a process that died left open: status ``interrupted``, finished when their last
        step was written (or when they started). Only for the store's owner before it runs anything (the
        daemon at start), when every trajectory still ``running`` belongs to a dead process."""
        with self.database.write() as db:
            return interrupt_trajectories(db)

    def claim_task(
        self,
        owner: str,
        *,
        lease_s: float,
        max_attempts: int,
        sources: tuple[str, ...] | None = None,
        exclude_sources: tuple[str, ...] = (),
    ) -> Lease | None:
        """The most urgent claimable task, now leased to ``owner``; None when there is none.

        Queued tasks and running tasks whose lease expired are claimable, highest
        priority first, then oldest. One that has used up its attempts is
        dead-lettered on the way, with the reason.
        """
        now = time.time()
        # Read first, without the write lock: an idle worker asking finds nothing far more often than
        # something, and taking the lock for that would make every idle worker a writer.
        with self.database.errors():
            if self._next_claimable(self.database.reader(), now, sources, exclude_sources) is None:
                return None
        with self.database.write() as db:
            while True:
                row = self._next_claimable(db, now, sources, exclude_sources)
                if row is None:
                    return None
                task_id, attempts, status = row
                if attempts >= max_attempts:
                    reason = (
                        f"dead-lettered after {attempts} attempts: the last worker's lease expired without a result"
                        if status == "running"
                        else f"dead-lettered: {attempts} attempts used, the limit is {max_attempts}"
                    )
                    db.execute(
                        "UPDATE tasks SET status = 'dead', error = ?, lease_owner = NULL, lease_expires_at = NULL, "
                        "updated_at = ?, finished_at = ? WHERE id = ?",
                        [reason, now, now, task_id],
                    )
                    continue
                expires = now + lease_s
                db.execute(
                    "UPDATE tasks SET status = 'running', attempts = attempts + 1, lease_owner = ?, "
                    "lease_token = lease_token + 1, lease_expires_at = ?, started_at = coalesce(started_at, ?), "
                    "updated_at = ? WHERE id = ?",
                    [owner, expires, now, now, task_id],
                )
                task = self.get_task(task_id)
                return Lease(task=task, owner=owner, token=task.lease_token, expires_at=expires)

    @staticmethod
    def _next_claimable(
        db, now: float, sources: tuple[str, ...] | None, exclude_sources: tuple[str, ...]
    ) -> tuple[str, int, str] | None:
        """``(id, attempts, status)`` of the first claimable task in the inbox's order, or None.

        Two queries, each read in order off an index (``tasks_queue``, ``tasks_queued_kind``; the running
        ones are few), rather than one whose OR made SQLite sort the whole queue: a claim behind a backlog of
        thousands held the write lock for milliseconds."""
        kinds, params = "", []
        if sources:
            kinds += f" AND source IN ({','.join('?' * len(sources))})"
            params += list(sources)
        if exclude_sources:  # another lane serves those (chat, evaluations on Ray)
            kinds += f" AND source NOT IN ({','.join('?' * len(exclude_sources))})"
            params += list(exclude_sources)
        columns, order = "priority, created_at, id, attempts, status", "ORDER BY priority DESC, created_at, id LIMIT 1"
        found = [
            row
            for row in (
                db.execute(
                    f"SELECT {columns} FROM tasks WHERE status = 'queued'{kinds} {order}",
                    params,
                ).fetchone(),
                db.execute(
                    f"SELECT {columns} FROM tasks WHERE status = 'running' AND lease_expires_at < ?{kinds} {order}",
                    [now, *params],
                ).fetchone(),
            )
            if row is not None
        ]
        if not found:
            return None
        _, _, task_id, attempts, status = min(found, key=lambda r: (-r[0], r[1], r[2]))
        return task_id, attempts, status

    def renew_lease(self, lease: Lease, *, lease_s: float) -> Lease | None:
        """Extend a lease still held; None when it was lost (expired and taken over, or cancelled)."""
        expires = time.time() + lease_s
        with self.database.write() as db:
            cursor = db.execute(
                "UPDATE tasks SET lease_expires_at = ? WHERE id = ? AND lease_token = ? AND status = 'running'",
                [expires, lease.task.id, lease.token],
            )
        if cursor.rowcount == 0:
            return None
        return Lease(task=lease.task, owner=lease.owner, token=lease.token, expires_at=expires)

    def complete_task(
        self, lease: Lease, status: str, *, error: str | None = None, ending: Ending | None = None
    ) -> bool:
        """Record how the leased run ended. False (and nothing written) if the lease was lost."""
        if status not in TERMINAL:
            raise ValueError(f"a task ends as one of {', '.join(TERMINAL)}, not {status!r}")
        now = time.time()
        with self.database.write() as db:
            cursor = db.execute(
                "UPDATE tasks SET status = ?, error = ?, ending = ?, lease_owner = NULL, lease_expires_at = NULL, "
                "updated_at = ?, finished_at = ? WHERE id = ? AND lease_token = ? AND status = 'running'",
                [status, error, None if ending is None else Ending(ending).value, now, now, lease.task.id, lease.token],
            )
        return cursor.rowcount == 1

    def release_task(self, lease: Lease) -> bool:
        """Give a leased task back to the queue (a graceful shutdown), refunding the attempt."""
        with self.database.write() as db:
            cursor = db.execute(
                "UPDATE tasks SET status = 'queued', attempts = max(attempts - 1, 0), lease_owner = NULL, "
                "lease_expires_at = NULL, updated_at = ? WHERE id = ? AND lease_token = ? AND status = 'running'",
                [time.time(), lease.task.id, lease.token],
            )
        return cursor.rowcount == 1

    def expire_leases(self, *, except_owner_prefix: str) -> int:
        """End now the leases held by other owners (a dead process's): their tasks become claimable.

        Only for a process that knows it is the inbox's sole worker pool (the
        daemon holds the single-instance socket). The attempt still counts, so a
        task that kills its worker every time is dead-lettered, not retried forever.
        """
        with self.database.write() as db:
            cursor = db.execute(
                "UPDATE tasks SET lease_expires_at = 0 WHERE status = 'running' AND lease_owner IS NOT NULL "
                "AND substr(lease_owner, 1, ?) != ?",
                [len(except_owner_prefix), except_owner_prefix],
            )
        return cursor.rowcount

    def abandon_lease(self, lease: Lease) -> bool:
        """A worker holding ``lease`` died (crashed or was killed): its task is claimable at once and the
        attempt it was making ends as interrupted. The attempt counts, so a task that kills its worker
        every time is dead-lettered rather than retried forever. False when the lease had already ended."""
        return bool(self._abandon("id = ? AND lease_token = ?", [lease.task.id, lease.token]))

    def abandon_leases(self, owner: str) -> list[str]:
        """``abandon_lease`` for every lease ``owner`` holds (a worker process that died, perhaps between
        claiming a task and saying so); the ids of their tasks."""
        return self._abandon("lease_owner = ?", [owner])

    def _abandon(self, where: str, params: list) -> list[str]:
        now = time.time()
        with self.database.write() as db:
            ids = [r[0] for r in db.execute(f"SELECT id FROM tasks WHERE status = 'running' AND {where}", params)]
            for task_id in ids:
                db.execute("UPDATE tasks SET lease_expires_at = 0, updated_at = ? WHERE id = ?", [now, task_id])
                interrupt_trajectories(db, task_id)
        return ids

    def interrupt_task(self, task_id: str, error: str) -> bool:
        """A task nobody will run or wait for again (a chat turn whose daemon died with its request): it
        fails as interrupted, and so does the attempt it left open. The caller holds no lease on it: a
        daemon starting, before its workers claim anything. False when it had already ended."""
        now = time.time()
        with self.database.write() as db:
            cursor = db.execute(
                "UPDATE tasks SET status = 'failed', error = ?, ending = ?, updated_at = ?, finished_at = ?, "
                "lease_owner = NULL, lease_expires_at = NULL WHERE id = ? AND status IN ('queued', 'running')",
                [error, Ending.INTERRUPTED.value, now, now, task_id],
            )
            if cursor.rowcount:
                interrupt_trajectories(db, task_id)
        return cursor.rowcount == 1

    def request_cancel(self, task_id: str) -> Task:
        """Cancel a queued task now; ask a running one to stop at its next step."""
        now = time.time()
        with self.database.write() as db:
            row = db.execute("SELECT status FROM tasks WHERE id = ?", [task_id]).fetchone()
            if row is None:
                raise NotFound(f"No task with id {task_id!r}.")
            if row[0] == "queued":
                db.execute(
                    "UPDATE tasks SET status = 'cancelled', error = 'cancelled', cancel_requested = 1, "
                    "updated_at = ?, finished_at = ? WHERE id = ?",
                    [now, now, task_id],
                )
            elif row[0] == "running":
                db.execute("UPDATE tasks SET cancel_requested = 1, updated_at = ? WHERE id = ?", [now, task_id])
        return self.get_task(task_id)

    def cancel_requested(self, task_id: str) -> bool:
        row = self.database.one("SELECT cancel_requested FROM tasks WHERE id = ?", [task_id])
        if row is None:
            raise NotFound(f"No task with id {task_id!r}.")
        return bool(row["cancel_requested"])

    def queue_depth(self, *, excluding: tuple[str, ...] = ()) -> dict[str, int]:
        """How many tasks are in each state (leaving out tasks from the ``excluding`` sources)."""
        where = f"WHERE source NOT IN ({','.join('?' * len(excluding))})" if excluding else ""
        rows = self.database.all(f"SELECT status, count(*) AS n FROM tasks {where} GROUP BY status", list(excluding))
        return {r["status"]: r["n"] for r in rows}


def interrupt_trajectories(db, task_id: str | None = None) -> int:
    """End the open attempts of ``task_id`` (None: of every task) as interrupted, finished when their last
    step was written (or when they started); how many."""
    where, params = ("AND task_id = ?", [task_id]) if task_id is not None else ("", [])
    return db.execute(
        "UPDATE trajectories SET status = 'interrupted', finished_at = coalesce((SELECT max(s.created_at) "
        f"FROM steps s WHERE s.trajectory_id = trajectories.id), started_at) WHERE status = 'running' {where}",
        params,
    ).rowcount
