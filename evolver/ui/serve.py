"""Serving the dashboard in the foreground: a loopback socket, a one-time token, uvicorn."""

from __future__ import annotations

import secrets
import socket
from collections.abc import Callable
from pathlib import Path

import uvicorn

from .app import create_ui_app

__all__ = ["bind_loopback", "serve_ui"]


def bind_loopback(port: int) -> socket.socket:
    """A listening TCP socket on 127.0.0.1 only (port 0: any free one)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        sock.close()
        raise
    sock.listen(64)
    return sock


def serve_ui(socket_path: Path, *, port: int = 0, on_ready: Callable[[str], None] | None = None) -> None:
    """Serve the dashboard over the daemon at ``socket_path`` until interrupted; ``on_ready`` gets the
    URL to open (with its token) once the socket listens (connections wait in its backlog until
    uvicorn takes them)."""
    sock = bind_loopback(port)
    port = sock.getsockname()[1]
    token = secrets.token_urlsafe(32)
    app = create_ui_app(str(socket_path), token=token, port=port)
    server = uvicorn.Server(uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False,
                                           timeout_graceful_shutdown=2))
    if on_ready is not None:
        on_ready(f"http://127.0.0.1:{port}/?token={token}")
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
