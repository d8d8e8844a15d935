"""Host-side file access inside a workspace, for the built-in file tools.

Sandboxed code owns the workspace and may plant symbolic links, FIFOs or hard
links in it, then ask a file tool to read or write "its" file. Paths are therefore
never handed to the kernel whole: each component is opened relative to the
directory before it with O_NOFOLLOW. A symbolic link is followed by hand, and
only when its target stays inside the workspace (an absolute target is read in
the sandbox's terms, so ``/workspace/x`` means the workspace's ``x``); ``..``
that climbs out, absolute paths elsewhere, links leading outside, and
non-regular or multiply linked files are refused with ``WorkspaceError``. Other
failures (a missing file, a directory where a file was expected) are
``SandboxError``s that name the path, with the ``OSError`` as their cause.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from .errors import SandboxError, WorkspaceError

SANDBOX_ROOT = "/workspace"  # where the workspace appears inside the sandbox
_MAX_LINKS = 40
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
T = TypeVar("T")


@dataclass(frozen=True)
class Entry:
    """One directory entry; links are reported as links, never followed."""

    name: str
    kind: str  # "file", "dir", "symlink" or "other"
    size: int


def read_bytes(workspace: str | os.PathLike[str], relpath: str, max_bytes: int = 1_000_000) -> bytes:
    """The content of a regular file in the workspace, refusing files over ``max_bytes``."""

    def read(dir_fd: int, name: str) -> bytes:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            st = _check_regular(fd, relpath)
            if st.st_size > max_bytes:
                raise SandboxError(
                    f"{relpath!r} is {st.st_size:,} bytes, over the {max_bytes:,}-byte limit for reading it whole"
                )
            chunks, total = [], 0
            while total <= max_bytes:
                chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
            if total > max_bytes:
                raise SandboxError(f"{relpath!r} grew past the {max_bytes:,}-byte limit while being read")
            return b"".join(chunks)
        finally:
            os.close(fd)

    return _at(workspace, relpath, read)


def read_text(workspace: str | os.PathLike[str], relpath: str, max_bytes: int = 1_000_000) -> str:
    """A workspace file as text (UTF-8, undecodable bytes replaced)."""
    return read_bytes(workspace, relpath, max_bytes).decode("utf-8", "replace")


def write_text(workspace: str | os.PathLike[str], relpath: str, text: str, *, make_parents: bool = True) -> int:
    """Write ``text`` (UTF-8) to a workspace file, creating it and its parent directories; bytes written."""
    data = text.encode("utf-8")

    def write(dir_fd: int, name: str) -> int:
        fd = os.open(
            name, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644, dir_fd=dir_fd
        )
        try:
            _check_regular(fd, relpath)  # before truncating: a hard link would write elsewhere
            _give_to_owner(fd, dir_fd)
            os.ftruncate(fd, 0)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            return len(data)
        finally:
            os.close(fd)

    return _at(workspace, relpath, write, make_parents=make_parents)


def list_dir(workspace: str | os.PathLike[str], relpath: str = ".") -> list[Entry]:
    """The entries of a workspace directory, sorted by name."""

    def listing(dir_fd: int, name: str) -> list[Entry]:
        fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd) if name else os.dup(dir_fd)
        try:
            entries = []
            with os.scandir(fd) as it:
                for item in it:
                    st = item.stat(follow_symlinks=False)
                    kind = (
                        "symlink"
                        if stat.S_ISLNK(st.st_mode)
                        else "dir"
                        if stat.S_ISDIR(st.st_mode)
                        else "file"
                        if stat.S_ISREG(st.st_mode)
                        else "other"
                    )
                    entries.append(Entry(item.name, kind, st.st_size))
            return sorted(entries, key=lambda e: e.name)
        finally:
            os.close(fd)

    return _at(workspace, relpath, listing)


# -- walking ---------------------------------------------------------------------------------------


def _parts(relpath: str, shown: str) -> list[str]:
    """Path components inside the workspace, or WorkspaceError for a path that leaves it."""
    if not isinstance(relpath, str) or "\x00" in relpath:
        raise WorkspaceError(f"{shown!r} is not a usable path")
    path = relpath
    if path.startswith("/"):
        if path != SANDBOX_ROOT and not path.startswith(SANDBOX_ROOT + "/"):
            raise WorkspaceError(
                f"{shown!r} is an absolute path outside the workspace "
                f"(inside the sandbox the workspace is {SANDBOX_ROOT})"
            )
        path = path[len(SANDBOX_ROOT) :].lstrip("/") or "."
    normal = posixpath.normpath(path)
    parts = [] if normal == "." else normal.split("/")
    if parts and parts[0] == "..":
        raise WorkspaceError(f"{shown!r} climbs out of the workspace with '..'")
    return parts


def _at(
    workspace: str | os.PathLike[str], relpath: str, final: Callable[[int, str], T], *, make_parents: bool = False
) -> T:
    """Walk to ``relpath``'s parent without following links, then run ``final(dir_fd, name)``."""
    root = os.open(os.fspath(workspace), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        parts = _parts(relpath, relpath)
        for _ in range(_MAX_LINKS):
            try:
                parts, result = _try_walk(root, parts, final, make_parents, relpath)
            except OSError as exc:  # one error type for the tools, naming the path they gave
                raise SandboxError(f"{relpath!r} in the workspace: {exc.strerror or exc}") from exc
            if parts is None:
                return result
        raise WorkspaceError(f"{relpath!r}: too many levels of symbolic links")
    finally:
        os.close(root)


def _try_walk(root: int, parts: list[str], final, make_parents: bool, shown: str):
    """One attempt; returns (None, result), or (new parts, None) when a link must be followed."""
    dir_fd = os.dup(root)
    try:
        for i, part in enumerate(parts[:-1]):
            try:
                next_fd = os.open(part, _DIR_FLAGS, dir_fd=dir_fd)
            except FileNotFoundError:
                if not make_parents:
                    raise
                os.mkdir(part, 0o755, dir_fd=dir_fd)
                next_fd = os.open(part, _DIR_FLAGS, dir_fd=dir_fd)
                _give_to_owner(next_fd, dir_fd)
            except OSError as exc:
                target = _link_target(dir_fd, part, exc)
                return _follow(parts[:i], target, parts[i + 1 :], shown), None
            os.close(dir_fd)
            dir_fd = next_fd
        name = parts[-1] if parts else ""
        try:
            return None, final(dir_fd, name)
        except OSError as exc:
            if not name:
                raise
            target = _link_target(dir_fd, name, exc)
            return _follow(parts[:-1], target, [], shown), None
    finally:
        os.close(dir_fd)


def _link_target(dir_fd: int, name: str, exc: OSError) -> str:
    """The target of the link that made an O_NOFOLLOW open fail, or the original error."""
    if exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        raise exc
    try:
        return os.readlink(name, dir_fd=dir_fd)
    except OSError:
        raise exc from None


def _follow(before: list[str], target: str, after: list[str], shown: str) -> list[str]:
    """The path through a link, in workspace terms, or WorkspaceError when it leads outside."""
    if target.startswith("/"):
        if target != SANDBOX_ROOT and not target.startswith(SANDBOX_ROOT + "/"):
            raise WorkspaceError(f"{shown!r} goes through a symbolic link to {target!r}, outside the workspace")
        combined = "/".join([target.rstrip("/"), *after])
    else:
        combined = "/".join([*before, target, *after])
    try:
        return _parts(combined, shown)
    except WorkspaceError:
        raise WorkspaceError(
            f"{shown!r} goes through a symbolic link to {target!r}, which leads outside the workspace"
        ) from None


def _check_regular(fd: int, shown: str) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise WorkspaceError(f"{shown!r} is not a regular file")
    if st.st_nlink > 1:
        raise WorkspaceError(
            f"{shown!r} has {st.st_nlink} hard links; the file tools refuse them, "
            "since one may lead outside the workspace"
        )
    return st


def _give_to_owner(fd: int, parent_fd: int) -> None:
    """As root, hand a new file or directory to the workspace's owner (the sandbox user)."""
    if os.geteuid() != 0:
        return
    owner = os.fstat(parent_fd)
    st = os.fstat(fd)
    if (st.st_uid, st.st_gid) != (owner.st_uid, owner.st_gid):
        os.fchown(fd, owner.st_uid, owner.st_gid)
