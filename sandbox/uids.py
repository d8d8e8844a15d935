"""Which uid a workspace's sandboxed code runs as, when the daemon is root.

RLIMIT_NPROC counts every process of a uid on the machine, not of one sandbox:
were all sandboxes one uid, a task that held its quota of processes (a
persistent worker keeps them for the whole task) would leave every other task's
sandbox, and its verifier, unable to fork. So each workspace gets a uid of its
own from a pool, handed out in turn; the workspace directory's owner is the
record of which one (a workspace seen again, by the verifier or after a
restart, keeps its uid, and the files its code wrote stay writable).

Two workspaces share a uid only when one outlives ``count`` newer ones; they
then share a process quota, which is where a single uid starts. The first
uid of a run is drawn at random, so two processes handing out uids (a daemon
and a ``bench`` run beside it) rarely start on the same one.
"""

from __future__ import annotations

import os
import secrets
import threading

UID_MAX = 2**32 - 2  # (uid_t)-1 means "no change" to the system calls


class UidPool:
    """``count`` uids from ``base`` (gid = uid), or the one fixed ``uid``/``gid`` when ``count`` is 0."""

    def __init__(self, *, base: int, count: int, uid: int, gid: int) -> None:
        if count < 0 or (count and not 0 < base <= UID_MAX - count + 1):
            raise ValueError(f"uids {base}..{base + count - 1} are not a usable range of uids")
        self.base, self.count = base, count
        self.uid, self.gid = uid, gid
        self._lock = threading.Lock()
        self._next = secrets.randbelow(count) if count else 0

    def __contains__(self, uid: int) -> bool:
        return self.base <= uid < self.base + self.count

    def claim(self, fd: int) -> tuple[int, int]:
        """The uid and gid for the workspace directory open at ``fd``, made its owner.

        Under a lock, so two threads entering one new workspace agree on its uid.
        """
        with self._lock:
            st = os.fstat(fd)
            if not self.count:
                uid, gid = self.uid, self.gid
            elif st.st_uid in self and st.st_gid == st.st_uid:
                return st.st_uid, st.st_gid
            else:
                uid = gid = self.base + self._next
                self._next = (self._next + 1) % self.count
            if (st.st_uid, st.st_gid) != (uid, gid):
                os.fchown(fd, uid, gid)
            return uid, gid


__all__ = ["UID_MAX", "UidPool"]
