"""The sandbox's exceptions.

    SandboxError              anything the sandbox refuses or cannot do
    ├── SandboxUnavailable    isolation was demanded but cannot be had (no bubblewrap)
    └── WorkspaceError        a path given to the workspace helpers leaves the workspace

What sandboxed code does (crashes, timeouts, limits) is never an exception:
it comes back as data in a ``RunResult`` or ``ExecResult``.
"""

from __future__ import annotations


class SandboxError(Exception):
    """The sandbox cannot do what was asked."""


class SandboxUnavailable(SandboxError):
    """Strict isolation was demanded, and this machine cannot provide it."""


class WorkspaceError(SandboxError):
    """A workspace path is absolute, climbs out with ``..``, or crosses a link leading outside."""
