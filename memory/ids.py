"""The store's ids: time-ordered, with a random part."""

from __future__ import annotations

import os
import random
import time

__all__ = ["new_id"]

# An id's random part comes from a generator of this process's own, seeded from the system's randomness (again
# in a forked child): ids are not secrets, and ``os.urandom`` lets go of the GIL for its system call, after
# which the API's thread waited to win it back from the store's writers on every submit.
_ids = random.Random()
os.register_at_fork(after_in_child=_ids.seed)


def new_id(prefix: str) -> str:
    """A time-ordered, collision-resistant id such as ``task_0193a1b2c3d4e5f6a7b8c9``."""
    return f"{prefix}_{int(time.time() * 1000):011x}{_ids.getrandbits(40):010x}"
