"""The durable inbox: workers claim tasks under a lease, fenced on completion.

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

from ._host import StoreHost
from .errors import NotFound
from .records import Ending, Task, TaskStatus

__all__ = ["Inbox", "Lease", "TERMINAL"]

TERMINAL = (TaskStatus.DONE, TaskStatus.FAILED, TaskStatus.CANCELLED, TaskStatus.DEAD)


@dataclass(frozen=True)
class Lease:
    """A worker's claim on a task; ``token`` fences whatever it records about the task."""

    task: Task
    owner: str
    token: int
    expires_at: float


class Inbox(StoreHost):
    """The part of ``Store`` that hands out work (a mixin over the store's connection)."""

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
