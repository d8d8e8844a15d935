"""The ``Sandbox`` protocol and what its two implementations share.

A sandbox runs argv lists, Python snippets and persistent Python workers inside
a task's workspace. Subclasses only say *how* a command is wrapped (``_prepare``);
running it, capping its output and killing it on time is common to both.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from .errors import SandboxError
from .limits import Limits, prlimit_argv, rlimit_setter
from .process import run_process, spawn
from .result import RunResult
from .uids import UidPool

if TYPE_CHECKING:
    from .worker import PythonWorker

SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
TASK_UID_BASE = 2_000_000_000  # far from users, system accounts and the usual subordinate-uid ranges
TASK_UIDS = 4096
_ARG_MAX = 100_000  # longer code goes through stdin: one argv string is capped at 128 KiB


@runtime_checkable
class Sandbox(Protocol):
    """Where model-written code runs. Results come back as data; nothing it does raises here."""

    isolated: bool
    """True behind bubblewrap; False in the degraded mode (a plain subprocess with limits)."""

    python_executable: str | None
    """The interpreter sandboxed Python runs with (None when there is none the sandbox user can run)."""

    def run(
        self,
        argv: Sequence[str],
        *,
        workspace: str | os.PathLike[str],
        stdin: str | bytes | None = None,
        limits: Limits | None = None,
        pass_fds: Sequence[int] = (),
    ) -> RunResult: ...

    def python(self, code: str, *, workspace: str | os.PathLike[str], limits: Limits | None = None) -> RunResult: ...

    def worker(
        self, workspace: str | os.PathLike[str], limits: Limits | None = None, prelude: str = ""
    ) -> PythonWorker: ...

    def workspace_dir(self, workspace: str | os.PathLike[str]) -> str: ...


@dataclass
class Launch:
    """One command, wrapped and ready for ``subprocess``."""

    argv: list[str]
    cwd: str
    env: dict[str, str]
    preexec_fn: Callable[[], None] | None = None
    user: int | None = None
    group: int | None = None
    pass_fds: tuple[int, ...] = ()
    """Descriptors the command is given (and that starting it closes here)."""


def find_tool(name: str) -> str | None:
    """A system tool (prlimit, setpriv) from the system directories the sandbox mounts."""
    return shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin")


def base_interpreter() -> tuple[str, str]:
    """The daemon's own base Python (outside any virtualenv) and its installation prefix."""
    executable = getattr(sys, "_base_executable", None) or sys.executable
    return os.path.abspath(executable), os.path.abspath(sys.base_prefix)


def reachable_by(path: str, uid: int, gid: int) -> bool:
    """Whether ``uid``/``gid`` (without supplementary groups) can reach and run ``path``."""

    def allowed(st: os.stat_result, bits: int) -> bool:  # bits: 1 = x, 4 = r
        if st.st_uid == uid:
            return bool(st.st_mode & (bits << 6))
        if st.st_gid == gid:
            return bool(st.st_mode & (bits << 3))
        return bool(st.st_mode & bits)

    try:
        parts = Path(os.path.abspath(path)).parts
        current = Path("/")
        for part in parts[1:]:
            if not allowed(os.stat(current), 1):
                return False
            current = current / part
        st = os.stat(current)
        return stat.S_ISREG(st.st_mode) and allowed(st, 1) and allowed(st, 4)
    except OSError:
        return False


class ProcessSandbox:
    """Commands, Python snippets and workers, on top of one abstract ``_prepare``."""

    isolated: bool = False

    def __init__(
        self,
        *,
        limits: Limits | None = None,
        unprivileged_uid: int = 65534,
        unprivileged_gid: int | None = None,
        task_uids: int = TASK_UIDS,
        task_uid_base: int = TASK_UID_BASE,
    ) -> None:
        self.limits = limits or Limits()
        self.as_root = os.geteuid() == 0
        # Only root can switch users; process limits do not bind root, so it always switches:
        # to a uid of the workspace's own (``task_uids`` > 0), or to ``unprivileged_uid``.
        self.uid = unprivileged_uid if self.as_root else os.getuid()
        self.gid = (
            (unprivileged_gid if unprivileged_gid is not None else unprivileged_uid) if self.as_root else os.getgid()
        )
        self.uids = UidPool(base=task_uid_base, count=task_uids if self.as_root else 0, uid=self.uid, gid=self.gid)
        self.prlimit = find_tool("prlimit")

    # -- what subclasses provide ------------------------------------------------------------

    python_executable: str | None = None

    def _prepare(self, argv: Sequence[str], workspace: str, owner: tuple[int, int], limits: Limits) -> Launch:
        """Wrap ``argv`` to run in ``workspace``, as ``owner`` (uid, gid) when root."""
        raise NotImplementedError

    # -- shared ------------------------------------------------------------------------------

    def _limit(self, argv: list[str], limits: Limits) -> tuple[list[str], Callable[[], None] | None]:
        """Put ``prlimit`` in front of ``argv``, or fall back to setting limits in the child."""
        if self.prlimit:
            return prlimit_argv(self.prlimit, limits) + argv, None
        return argv, rlimit_setter(limits)

    def workspace_dir(self, workspace: str | os.PathLike[str]) -> str:
        """The workspace as an absolute path, owned by its sandbox user so its code can write there."""
        return self._enter(workspace)[0]

    def _enter(self, workspace: str | os.PathLike[str]) -> tuple[str, tuple[int, int]]:
        """The workspace's absolute path and the (uid, gid) its code runs as."""
        path = os.path.abspath(os.fspath(workspace))
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise SandboxError(f"workspace {path!r} is not an accessible directory: {exc}") from exc
        try:
            owner = self.uids.claim(fd) if self.as_root else (self.uid, self.gid)
        finally:
            os.close(fd)
        return path, owner

    def run(
        self,
        argv: Sequence[str],
        *,
        workspace: str | os.PathLike[str],
        stdin: str | bytes | None = None,
        limits: Limits | None = None,
        pass_fds: Sequence[int] = (),
    ) -> RunResult:
        """Run ``argv`` in the workspace; the result is data, whatever the command does.

        ``pass_fds`` are handed to the command at the same numbers (a private channel,
        such as the judge's verdict pipe) and closed here once it has them."""
        limits = limits or self.limits
        try:
            if not argv:
                raise SandboxError("run() needs a command: argv is empty")
            launch = self._prepare(list(argv), *self._enter(workspace), limits)
        except BaseException:
            for fd in pass_fds:  # handed over even when the command cannot start
                os.close(fd)
            raise
        data = stdin.encode() if isinstance(stdin, str) else stdin
        return run_process(
            launch.argv,
            cwd=launch.cwd,
            env=launch.env,
            stdin=data,
            limits=limits,
            isolated=self.isolated,
            preexec_fn=launch.preexec_fn,
            user=launch.user,
            group=launch.group,
            pass_fds=(*launch.pass_fds, *pass_fds),
        )

    def _python(self) -> str:
        if not self.python_executable:
            raise SandboxError(
                f"no Python interpreter that the sandbox user (uid {self.uid}) can run was found; "
                "pass python= to the sandbox"
            )
        return self.python_executable

    def python(self, code: str, *, workspace: str | os.PathLike[str], limits: Limits | None = None) -> RunResult:
        """Run a Python snippet with a plain interpreter (standard library and its site-packages)."""
        if len(code.encode()) < _ARG_MAX:
            return self.run([self._python(), "-c", code], workspace=workspace, limits=limits)
        return self.run([self._python(), "-"], workspace=workspace, stdin=code, limits=limits)

    def worker(
        self, workspace: str | os.PathLike[str], limits: Limits | None = None, prelude: str = ""
    ) -> PythonWorker:
        """A persistent Python worker for one task (started on its first call); ``prelude`` runs in
        every fresh one before its first call."""
        from .worker import PythonWorker

        return PythonWorker(self, workspace, limits or self.limits, prelude)

    def _spawn_worker(self, workspace: str | os.PathLike[str], limits: Limits, stderr) -> subprocess.Popen:
        """Start the worker loop: JSON lines in on stdin, out on stdout, crashes to ``stderr``."""
        from .worker import worker_argv

        launch = self._prepare(worker_argv(self._python(), limits), *self._enter(workspace), limits)
        return spawn(
            launch.argv,
            cwd=launch.cwd,
            env=launch.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            preexec_fn=launch.preexec_fn,
            user=launch.user,
            group=launch.group,
            pass_fds=launch.pass_fds,
        )
