"""The degraded mode: a plain subprocess with limits, for machines without bubblewrap.

It keeps what a subprocess can keep: its own session (the whole group is killed
on timeout), resource limits, the workspace as working directory, a cleared
environment (no API keys), and — when the daemon is root — an unprivileged
uid/gid. It does NOT hide the user's files, the network, local sockets or other
processes of the same uid, so it is chosen only when the configuration allows
it, and it says so loudly in the log every time one is made.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from .base import SYSTEM_PATH, TASK_UID_BASE, TASK_UIDS, Launch, ProcessSandbox, base_interpreter, reachable_by
from .limits import Limits

log = logging.getLogger(__name__)

_FALLBACK_PYTHONS = ("/usr/local/bin/python3", "/usr/bin/python3")


class DegradedSandbox(ProcessSandbox):
    """Runs commands as plain subprocesses with limits; ``isolated`` is False."""

    isolated = False

    def __init__(
        self,
        *,
        limits: Limits | None = None,
        unprivileged_uid: int = 65534,
        unprivileged_gid: int | None = None,
        task_uids: int = TASK_UIDS,
        task_uid_base: int = TASK_UID_BASE,
        python: str | None = None,
        reason: str = "bubblewrap is not available",
    ) -> None:
        super().__init__(
            limits=limits,
            unprivileged_uid=unprivileged_uid,
            unprivileged_gid=unprivileged_gid,
            task_uids=task_uids,
            task_uid_base=task_uid_base,
        )
        self.reason = reason
        self.python_executable = python or self._find_python()
        log.warning(
            "sandbox DEGRADED: %s; model-written code runs as a plain subprocess (%s) with "
            "resource limits only: it can read files that uid can read, use the network and reach "
            "local sockets. Install bubblewrap to isolate it.",
            reason,
            self._who(),
        )

    def _who(self) -> str:
        if self.as_root and self.uids.count:
            return f"a uid per workspace, {self.uids.base}..{self.uids.base + self.uids.count - 1}"
        return f"uid {self.uid}"

    def _find_python(self) -> str | None:
        """The daemon's base Python, or a system one when the sandbox uid cannot reach it."""
        own, _ = base_interpreter()
        if not self.as_root:
            return own
        # A pool uid owns nothing outside workspaces, so its first one stands for them all.
        uid, gid = (self.uids.base, self.uids.base) if self.uids.count else (self.uid, self.gid)
        for candidate in (own, *_FALLBACK_PYTHONS):
            if reachable_by(candidate, uid, gid):
                if candidate != own:
                    log.warning("sandbox uid %d cannot reach %s; degraded runs use %s instead", uid, own, candidate)
                return candidate
        return None

    def _prepare(self, argv: Sequence[str], workspace: str, owner: tuple[int, int], limits: Limits) -> Launch:
        command, preexec = self._limit(list(argv), limits)
        path = SYSTEM_PATH
        if self.python_executable:
            path = f"{os.path.dirname(self.python_executable)}:{path}"
        env = {"PATH": path, "HOME": workspace, "LANG": "C.UTF-8"}
        user = group = None
        if self.as_root:
            user, group = owner
        return Launch(argv=command, cwd=workspace, env=env, preexec_fn=preexec, user=user, group=group)
