"""Serving the ASGI app on sockets the daemon bound, refusing other users' connections.

uvicorn accepts on the daemon's own listening sockets (``Server.serve(sockets=)``),
so the socket's mode is the daemon's choice, not uvicorn's. Every Unix socket
connection is checked before a byte is read: the peer's uid (SO_PEERCRED)
must be the daemon's own, or the connection is closed. A mode-0600 socket
already keeps others out; this holds even if the file's mode is loosened.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .sockets import peer_uid

__all__ = ["ApiServer", "peer_checked"]

log = logging.getLogger(__name__)


def peer_checked(base: type[asyncio.Protocol], allowed_uid: int) -> type[asyncio.Protocol]:
    """A subclass of uvicorn's HTTP protocol that closes Unix connections from other uids."""

    class PeerChecked(base):  # type: ignore[misc, valid-type]
        refused = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            sock = transport.get_extra_info("socket")
            if sock is not None and sock.family == socket.AF_UNIX:
                try:
                    uid = peer_uid(sock)
                except OSError:
                    uid = -1
                if uid != allowed_uid:
                    log.warning("refused a connection from uid %s (only uid %s may use this socket)", uid, allowed_uid)
                    self.refused = True
                    transport.close()
                    return
            super().connection_made(transport)

        def data_received(self, data: bytes) -> None:
            if not self.refused:
                super().data_received(data)

        def connection_lost(self, exc: Exception | None) -> None:
            if not self.refused:
                super().connection_lost(exc)

    return PeerChecked


class ApiServer:
    """uvicorn in a thread of its own, so the daemon's main thread keeps the signals."""

    def __init__(self, app, sockets: list[socket.socket], *, allowed_uid: int | None = None) -> None:
        config = uvicorn.Config(
            app,
            http=peer_checked(HttpToolsProtocol, os.geteuid() if allowed_uid is None else allowed_uid),
            lifespan="off",
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=3,
            timeout_keep_alive=30,
        )
        self.server = uvicorn.Server(config)
        self.sockets = sockets
        self.thread = threading.Thread(target=self._run, name="api", daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            self.server.run(sockets=self.sockets)
        except BaseException as exc:  # reported to the daemon, which stops
            log.exception("the API server stopped")
            self.error = exc

    def start(self, timeout_s: float = 30.0) -> None:
        self.thread.start()
        deadline = threading.Event()
        for _ in range(int(timeout_s / 0.01)):
            if self.server.started or not self.thread.is_alive():
                break
            deadline.wait(0.01)
        if not self.server.started:
            raise RuntimeError(f"the API server did not start: {self.error or 'timed out'}")

    def stop(self, timeout_s: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)
        if self.thread.is_alive():
            self.server.force_exit = True
            self.thread.join(2.0)
