"""Wake-ups for live streams: worker threads say "task X changed", event-loop readers wait for it.

The store holds the steps; this only tells waiting server-sent-event streams
to look again, so a stream costs nothing while its task is quiet. A missed
wake-up is harmless: readers also look again after a short timeout.
"""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict

__all__ = ["Feed"]


class Feed:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: dict[str, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = defaultdict(set)
        self.closed = threading.Event()

    def publish(self, task_id: str) -> None:
        """Wake every reader of ``task_id`` (callable from any thread)."""
        with self._lock:
            waiters = list(self._waiters.get(task_id, ()))
        for loop, event in waiters:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # that reader's loop is already closed
                pass

    async def wait(self, task_id: str, timeout: float) -> None:
        """Return when ``task_id`` changes, the feed closes, or ``timeout`` passes."""
        if self.closed.is_set():
            return
        entry = (asyncio.get_running_loop(), asyncio.Event())
        with self._lock:
            self._waiters[task_id].add(entry)
        try:
            await asyncio.wait_for(entry[1].wait(), timeout)
        except TimeoutError:
            pass
        finally:
            with self._lock:
                waiters = self._waiters.get(task_id)
                if waiters is not None:
                    waiters.discard(entry)
                    if not waiters:
                        del self._waiters[task_id]

    def close(self) -> None:
        """Wake everyone so streams end (the daemon is stopping)."""
        self.closed.set()
        with self._lock:
            task_ids = list(self._waiters)
        for task_id in task_ids:
            self.publish(task_id)
