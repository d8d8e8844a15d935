"""Resource limits of one sandboxed run, and the two ways to impose them.

Limits are set on the sandboxed process itself, never on the daemon: either by
``prlimit`` placed in front of the command inside the sandbox (no Python code
runs between fork and exec, which keeps spawning safe in a threaded daemon), or,
where util-linux's ``prlimit`` is missing, by a ``preexec_fn`` in the child.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

MIB = 1024 * 1024


@dataclass(frozen=True)
class Limits:
    """What one sandboxed run may use before it is stopped."""

    timeout_s: float = 30.0
    """Wall-clock seconds; then the whole process group is killed (partial output is kept)."""
    cpu_s: int = 30
    """CPU seconds (RLIMIT_CPU); past it the process gets SIGXCPU, one second later SIGKILL."""
    memory_mb: int = 1024
    """Address space per process in MiB (RLIMIT_AS); big allocations fail with MemoryError."""
    max_processes: int = 64
    """Processes of the sandbox user at once (RLIMIT_NPROC); a fork bomb stops here."""
    max_open_files: int = 256
    """Open file descriptors per process (RLIMIT_NOFILE)."""
    max_file_mb: int = 64
    """Largest file a process may write, in MiB (RLIMIT_FSIZE)."""
    tmp_mb: int = 64
    """Size of the private tmpfs mounted on /tmp inside the sandbox, in MiB."""
    output_bytes: int = 1_000_000
    """Bytes of stdout and of stderr kept per run; the rest is dropped and flagged as truncated."""

    def __post_init__(self) -> None:
        for name in (
            "timeout_s",
            "cpu_s",
            "memory_mb",
            "max_processes",
            "max_open_files",
            "max_file_mb",
            "tmp_mb",
            "output_bytes",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"Limits.{name} must be positive, got {getattr(self, name)!r}")

    def rlimits(self) -> list[tuple[int, int, int]]:
        """``(resource, soft, hard)`` triples, in the order they are applied."""
        return [
            (resource.RLIMIT_AS, self.memory_mb * MIB, self.memory_mb * MIB),
            (resource.RLIMIT_CPU, self.cpu_s, self.cpu_s + 1),
            (resource.RLIMIT_NPROC, self.max_processes, self.max_processes),
            (resource.RLIMIT_NOFILE, self.max_open_files, self.max_open_files),
            (resource.RLIMIT_FSIZE, self.max_file_mb * MIB, self.max_file_mb * MIB),
            (resource.RLIMIT_CORE, 0, 0),
        ]


_PRLIMIT_FLAGS = {
    resource.RLIMIT_AS: "--as",
    resource.RLIMIT_CPU: "--cpu",
    resource.RLIMIT_NPROC: "--nproc",
    resource.RLIMIT_NOFILE: "--nofile",
    resource.RLIMIT_FSIZE: "--fsize",
    resource.RLIMIT_CORE: "--core",
}


def prlimit_argv(prlimit: str, limits: Limits) -> list[str]:
    """The ``prlimit … --`` prefix that applies ``limits`` to the command after it."""
    argv = [prlimit]
    for res, soft, hard in limits.rlimits():
        argv.append(f"{_PRLIMIT_FLAGS[res]}={soft}:{hard}")
    argv.append("--")
    return argv


def rlimit_setter(limits: Limits):
    """A ``preexec_fn`` applying ``limits`` in the child (the fallback without prlimit)."""
    triples = limits.rlimits()
    setrlimit = resource.setrlimit  # bound now: nothing is imported after fork

    def apply() -> None:
        for res, soft, hard in triples:
            setrlimit(res, (soft, hard))

    return apply
