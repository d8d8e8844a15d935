"""Choosing the sandbox: bubblewrap when it works, the degraded mode only when allowed."""

from __future__ import annotations

import shutil
import sys

from .base import Sandbox
from .bwrap import BubblewrapSandbox
from .degraded import DegradedSandbox
from .errors import SandboxUnavailable
from .limits import Limits


def make_sandbox(require_isolation: bool = True, unprivileged_uid: int = 65534,
                 limits: Limits | None = None, *, bwrap: str | None = None,
                 unprivileged_gid: int | None = None, python: str | None = None) -> Sandbox:
    """A working sandbox for this machine.

    Tries bubblewrap (``bwrap``, default: the one on PATH) and proves it by starting
    one sandbox. If that fails, raises ``SandboxUnavailable`` when
    ``require_isolation`` is set, and otherwise returns the loudly logged
    ``DegradedSandbox``. ``unprivileged_uid``/``gid`` are what sandboxed code runs
    as when the daemon is root (ignored otherwise: only root can switch users).
    """
    try:
        if not sys.platform.startswith("linux"):
            raise SandboxUnavailable(f"bubblewrap needs Linux, and this is {sys.platform}")
        sandbox = BubblewrapSandbox(bwrap=bwrap or shutil.which("bwrap") or "/usr/bin/bwrap", limits=limits,
                                    unprivileged_uid=unprivileged_uid, unprivileged_gid=unprivileged_gid,
                                    python=python)
        sandbox.probe()
        return sandbox
    except SandboxUnavailable as exc:
        if require_isolation:
            raise SandboxUnavailable(
                f"{exc}. Isolation is required ([sandbox] require_isolation = true), so no model-written "
                "code will run until bubblewrap works; install bubblewrap, or set require_isolation = "
                "false to accept the degraded mode (a plain subprocess with limits)") from exc
        return DegradedSandbox(limits=limits, unprivileged_uid=unprivileged_uid,
                               unprivileged_gid=unprivileged_gid, python=python, reason=str(exc))
