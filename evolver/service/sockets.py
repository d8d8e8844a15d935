"""The daemon's Unix socket: private, single-instance, and owned by one process.

The socket is the single-instance lock (as supervisord's is). Binding refuses
when a live daemon answers on the path, replaces a stale file left by a dead
one, and creates the socket with mode 0600 inside a 0700 directory: uvicorn's
own ``--uds`` leaves it world-writable, so the daemon binds it here and hands
the socket to the server. ``peer_uid`` reads the connecting process's uid
(SO_PEERCRED) so every connection can be checked against the daemon's own.
Cleanup removes the socket only if it is still the one this process created.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DaemonRunning", "SocketError", "BoundSocket", "prepare_runtime_dir", "probe", "bind", "peer_uid"]


MAX_PATH_BYTES = 107  # sun_path holds 108 bytes, the last one a NUL


class SocketError(Exception):
    """The socket cannot be set up safely; the message says why and what to do."""


class DaemonRunning(SocketError):
    """Another daemon already answers on the socket."""


def prepare_runtime_dir(path: Path) -> Path:
    """Create the socket's directory (0700) and refuse one that others could enter."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise SocketError(f"{path} is not a directory; choose another [advanced.daemon] runtime_dir.")
    if info.st_uid != os.geteuid():
        raise SocketError(
            f"{path} belongs to uid {info.st_uid}, not to you (uid {os.geteuid()}); "
            "choose another [advanced.daemon] runtime_dir."
        )
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(path, 0o700)
    return path


def probe(path: Path, timeout_s: float = 1.0) -> bool:
    """Whether a live process accepts connections on the socket at ``path``."""
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.settimeout(timeout_s)
    try:
        client.connect(str(path))
        return True
    except (FileNotFoundError, ConnectionRefusedError):
        return False
    except OSError as exc:
        if exc.errno in (errno.ENOTSOCK, errno.ECONNREFUSED, errno.ENOENT):
            return False
        raise
    finally:
        client.close()


@dataclass
class BoundSocket:
    """A listening socket this process created, and how to recognise its file."""

    sock: socket.socket
    path: Path
    identity: tuple[int, int, int]  # device, inode, change time: inode numbers get reused

    def close(self) -> None:
        """Stop listening and remove the file, unless someone else's socket is there now."""
        self.sock.close()
        try:
            info = self.path.lstat()
        except FileNotFoundError:
            return
        ours = (info.st_dev, info.st_ino, info.st_ctime_ns) == self.identity
        if ours and not probe(self.path):  # nobody answers there now that this socket is closed
            self.path.unlink()


def bind(path: Path, *, backlog: int = 128) -> BoundSocket:
    """Bind and listen on ``path`` (mode 0600), or raise ``DaemonRunning``."""
    if len(os.fsencode(str(path))) > MAX_PATH_BYTES:
        raise SocketError(
            f"the socket path {path} is {len(os.fsencode(str(path)))} bytes; Unix sockets allow "
            f"{MAX_PATH_BYTES}: choose a shorter [advanced.daemon] runtime_dir."
        )
    prepare_runtime_dir(path.parent)
    if path.exists() or path.is_symlink():
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise SocketError(f"{path} exists and is not a socket; move it away or choose another runtime_dir.")
        if probe(path):
            raise DaemonRunning(f"a daemon is already running on {path}; stop it with `evolver down` first.")
        path.unlink()  # stale: its daemon died without cleaning up
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)  # the file is born 0600: no window in which others may connect
    try:
        sock.bind(str(path))
    except OSError as exc:
        sock.close()
        raise SocketError(f"cannot bind {path}: {exc.strerror or exc}") from exc
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    sock.listen(backlog)
    info = path.lstat()
    return BoundSocket(sock=sock, path=path, identity=(info.st_dev, info.st_ino, info.st_ctime_ns))


def peer_uid(conn: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket connection."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid
