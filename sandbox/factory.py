"""Choosing the sandbox: bubblewrap when it works, the degraded mode only when allowed."""

from __future__ import annotations

import shutil
import sys

from .base import TASK_UID_BASE, TASK_UIDS, Sandbox
from .bwrap import BubblewrapSandbox
from .degraded import DegradedSandbox
from .errors import SandboxUnavailable
from .limits import Limits


def make_sandbox(
    require_isolation: bool = True,
    unprivileged_uid: int = 65534,
    limits: Limits | None = None,
    *,
    bwrap: str | None = None,
    unprivileged_gid: int | None = None,
    python: str | None = None,
    task_uids: int = TASK_UIDS,
    task_uid_base: int = TASK_UID_BASE,
) -> Sandbox:
    """A working sandbox for this machine.

    Tries bubblewrap (``bwrap``, default: the one on PATH) and proves it by starting
    one sandbox. If that fails, raises ``SandboxUnavailable`` when
    ``require_isolation`` is set, and otherwise returns the loudly logged
    ``DegradedSandbox``. When the daemon is root, sandboxed code runs as a uid of
    its workspace's own, one of ``task_uids`` from ``task_uid_base`` (so no task
    can use up another's process quota), or as ``unprivileged_uid``/``gid`` when
    ``task_uids`` is 0; otherwise as the daemon's user (only root can switch users).
    """
    try:
        if not sys.platform.startswith("linux"):
            raise SandboxUnavailable(f"bubblewrap needs Linux, and this is {sys.platform}")
        sandbox = BubblewrapSandbox(
            bwrap=bwrap or shutil.which("bwrap") or "/usr/bin/bwrap",
            limits=limits,
            unprivileged_uid=unprivileged_uid,
            unprivileged_gid=unprivileged_gid,
            task_uids=task_uids,
            task_uid_base=task_uid_base,
            python=python,
        )
        sandbox.probe()
        return sandbox
    except SandboxUnavailable as exc:
        if require_isolation:
            raise SandboxUnavailable(
                f"{exc}. Isolation is required ([sandbox] require_isolation = true), so no model-written "
                "code will run until bubblewrap works; install bubblewrap, or set require_isolation = "
                "false to accept the degraded mode (a plain subprocess with limits)"
            ) from exc
        return DegradedSandbox(
            limits=limits,
            unprivileged_uid=unprivileged_uid,
            unprivileged_gid=unprivileged_gid,
            task_uids=task_uids,
            task_uid_base=task_uid_base,
            python=python,
            reason=str(exc),
        )
