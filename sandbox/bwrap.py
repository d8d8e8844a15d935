"""Isolation with bubblewrap: fresh namespaces, a read-only system, one writable workspace.

What the sandboxed command sees:

    /usr, /bin, /lib*    the host's, read-only (the /bin and /lib* links as the distro has them)
    <python prefix>      the daemon's Python installation, read-only, at its own path
    /etc/ld.so.cache     so the dynamic loader finds libraries (nothing else from /etc)
    /proc, /dev          fresh: its own processes only; null, zero, random, tty…
    /tmp                 a private tmpfs capped at ``Limits.tmp_mb``
    /workspace           the task's workspace, the only host path it can write (its cwd)

It gets new user (when unprivileged), pid, network (loopback only), IPC, UTS and
cgroup namespaces, a new session (no terminal to inject into), a cleared
environment, and dies with the daemon. Not ``--ro-bind / /``: that would show
the user's home, other tasks' workspaces and every socket on the machine.

As root the daemon cannot simply run an unprivileged bubblewrap: the Python
prefix and the workspace may sit under a 0700 directory such as /root, which an
unprivileged bwrap could not mount. So bwrap runs as root (mounting needs no user
namespace then) and ``setpriv`` inside the sandbox drops to the unprivileged
uid/gid, clears supplementary groups, sets no_new_privs and empties the capability
bounding set before the command runs; ``prlimit`` before it sets the limits, which
bind from then on because the process is no longer root. Without a user namespace
of its own, ``--disable-userns`` is not available, so a seccomp filter
(``seccomp.py``) refuses to let the sandboxed code create one.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence

from .base import SYSTEM_PATH, TASK_UID_BASE, TASK_UIDS, Launch, ProcessSandbox, base_interpreter, find_tool
from .errors import SandboxUnavailable
from .limits import MIB, Limits
from .seccomp import no_userns_program, program_fd

WORKSPACE = "/workspace"
_SYSTEM_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
_ETC = ("/etc/ld.so.cache", "/etc/alternatives")
_PROBE_TIMEOUT_S = 10


class BubblewrapSandbox(ProcessSandbox):
    """Runs every command inside a fresh bubblewrap sandbox of its own."""

    isolated = True

    def __init__(
        self,
        *,
        bwrap: str = "/usr/bin/bwrap",
        limits: Limits | None = None,
        unprivileged_uid: int = 65534,
        unprivileged_gid: int | None = None,
        task_uids: int = TASK_UIDS,
        task_uid_base: int = TASK_UID_BASE,
        python: str | None = None,
        python_prefix: str | None = None,
    ) -> None:
        super().__init__(
            limits=limits,
            unprivileged_uid=unprivileged_uid,
            unprivileged_gid=unprivileged_gid,
            task_uids=task_uids,
            task_uid_base=task_uid_base,
        )
        if not (os.path.isfile(bwrap) and os.access(bwrap, os.X_OK)):
            raise SandboxUnavailable(
                f"bubblewrap was not found at {bwrap!r}, so model-written code cannot be isolated; "
                "install it (Debian/Ubuntu: apt install bubblewrap; Fedora: dnf install bubblewrap)"
            )
        self.bwrap = bwrap
        self.setpriv = find_tool("setpriv") if self.as_root else None
        if self.as_root and not self.setpriv:
            raise SandboxUnavailable(
                "the daemon runs as root, and dropping to an unprivileged user inside the sandbox "
                "needs setpriv from util-linux, which is not installed"
            )
        default_python, default_prefix = base_interpreter()
        self.python_executable = python or default_python
        if python_prefix is None:
            python_prefix = default_prefix if python is None else os.path.dirname(os.path.dirname(python))
        self.python_prefix = os.path.abspath(python_prefix)
        self._fixed = self._fixed_args()
        self._prefix = self._prefix_args()
        # As root no user namespace is made, so nested ones are refused by seccomp instead.
        self._seccomp = no_userns_program() if self.as_root else None

    def _fixed_args(self) -> list[str]:
        """The part of the command line that is the same for every run."""
        if self.as_root:
            # Not --unshare-all: as root it adds a user namespace in which bwrap, having
            # shed its capabilities, can no longer enter a workspace owned by the sandbox uid.
            args = [
                self.bwrap,
                "--unshare-pid",
                "--unshare-net",
                "--unshare-ipc",
                "--unshare-uts",
                "--unshare-cgroup-try",
            ]
        else:
            args = [self.bwrap, "--unshare-all", "--unshare-user", "--disable-userns"]
        path = SYSTEM_PATH
        if self.python_prefix and not _under_usr(self.python_prefix):
            path = f"{self.python_prefix}/bin:{path}"
        args += [
            "--die-with-parent",
            "--new-session",
            "--clearenv",
            "--setenv",
            "PATH",
            path,
            "--setenv",
            "HOME",
            WORKSPACE,
            "--setenv",
            "TMPDIR",
            "/tmp",
            "--setenv",
            "LANG",
            "C.UTF-8",
            "--hostname",
            "sandbox",
            "--ro-bind",
            "/usr",
            "/usr",
        ]
        for name in _SYSTEM_LINKS:
            host = f"/{name}"
            if os.path.islink(host):
                args += ["--symlink", os.readlink(host), host]
            elif os.path.isdir(host):
                args += ["--ro-bind", host, host]
        args += ["--perms", "0755", "--dir", "/etc"]  # made parents would copy modes (or be 0700)
        for path in _ETC:
            args += ["--ro-bind-try", path, path]
        args += ["--proc", "/proc", "--dev", "/dev"]
        return args

    def _prefix_args(self) -> list[str]:
        """Bind the Python prefix at its own path (its binary finds libpython by absolute RUNPATH).

        bubblewrap would create the missing parents with the host's modes, and /root is
        0700, so they are made world-traversable first: they hold nothing but the bind.
        """
        prefix = self.python_prefix
        if not prefix or _under_usr(prefix):
            return []
        args: list[str] = []
        parts = prefix.strip("/").split("/")
        for i in range(1, len(parts)):
            args += ["--perms", "0755", "--dir", "/" + "/".join(parts[:i])]
        return args + ["--ro-bind", prefix, prefix]

    def _prepare(self, argv: Sequence[str], workspace: str, owner: tuple[int, int], limits: Limits) -> Launch:
        command, preexec = self._limit(list(argv), limits)
        if self.setpriv:
            uid, gid = owner
            command = [
                self.setpriv,
                f"--reuid={uid}",
                f"--regid={gid}",
                "--clear-groups",
                "--no-new-privs",
                "--inh-caps=-all",
                "--bounding-set=-all",
                "--",
            ] + command
        # /dev/shm too: without it multiprocessing's semaphores (Pool, Queue) are refused.
        args = (
            self._fixed
            + ["--perms", "1777", "--size", str(limits.tmp_mb * MIB), "--tmpfs", "/tmp"]
            + ["--perms", "1777", "--size", str(limits.tmp_mb * MIB), "--tmpfs", "/dev/shm"]
            + self._prefix
            + ["--bind", workspace, WORKSPACE, "--chdir", WORKSPACE]
        )
        pass_fds: tuple[int, ...] = ()
        if self._seccomp:  # a fresh pipe per run: bubblewrap reads the program and closes it
            pass_fds = (program_fd(self._seccomp),)
            args += ["--seccomp", str(pass_fds[0])]
        args += ["--", *command]
        # bwrap itself needs no limits; with the prlimit fallback they are inherited through it.
        return Launch(argv=args, cwd="/", env={"PATH": SYSTEM_PATH}, preexec_fn=preexec, pass_fds=pass_fds)

    def probe(self) -> None:
        """Start one trivial sandbox; raise ``SandboxUnavailable`` with bwrap's words if it fails."""
        with tempfile.TemporaryDirectory(prefix="evolver-sandbox-probe-") as tmp:
            result = self.run(["true"], workspace=tmp, limits=Limits(timeout_s=_PROBE_TIMEOUT_S))
            if result.ok and self.python_executable:
                result = self.run(
                    [self.python_executable, "-c", "pass"], workspace=tmp, limits=Limits(timeout_s=_PROBE_TIMEOUT_S)
                )
        if not result.ok:
            detail = (result.error or result.stderr or f"exit status {result.exit_code}").strip()
            raise SandboxUnavailable(
                f"bubblewrap at {self.bwrap!r} is installed but cannot start a sandbox here: {detail}. "
                "Unprivileged user namespaces may be disabled (sysctl kernel.unprivileged_userns_clone "
                "or user.max_user_namespaces), or the container forbids mounts"
            )


def _under_usr(path: str) -> bool:
    return path == "/usr" or path.startswith("/usr/")


__all__ = ["BubblewrapSandbox", "WORKSPACE"]
