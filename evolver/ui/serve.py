"""Serving the dashboard in the foreground: a loopback socket, a one-time token, uvicorn; and the page
that `--open` hands the browser, so the token is never on a command line."""

from __future__ import annotations

import html
import os
import secrets
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path

import uvicorn

from .app import create_ui_app

__all__ = ["bind_loopback", "opener_page", "serve_ui"]


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


def opener_page(url: str, folder: Path) -> Path:
    """A page in ``folder`` that only its owner can read (0600) and that sends the browser on to ``url``.
    Handed to the browser by its path, it keeps the token off the browser's command line, which every
    user of the machine can read (/proc/PID/cmdline)."""
    fd, name = tempfile.mkstemp(prefix="evolver-ui-", suffix=".html", dir=folder)  # 0600, a new name
    target = html.escape(url, quote=True)
    with os.fdopen(fd, "w", encoding="utf-8") as page:
        page.write(
            f'<!doctype html><meta charset="utf-8"><meta name="referrer" content="no-referrer">'
            f'<meta http-equiv="refresh" content="0; url={target}"><title>evolver</title>'
            f'<p>Opening <a href="{target}">the dashboard</a>…</p>\n'
        )
    return Path(name)


def serve_ui(
    socket_path: Path,
    *,
    port: int = 0,
    on_ready: Callable[[str], None] | None = None,
    on_traded: Callable[[], None] | None = None,
) -> None:
    """Serve the dashboard over the daemon at ``socket_path`` until interrupted; ``on_ready`` gets the
    URL to open (with its one-time token) once the socket listens (connections wait in its backlog until
    uvicorn takes them); ``on_traded`` is called when that token has been traded for the session."""
    sock = bind_loopback(port)
    port = sock.getsockname()[1]
    token = secrets.token_urlsafe(32)
    app = create_ui_app(str(socket_path), token=token, port=port, on_traded=on_traded)
    server = uvicorn.Server(
        uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False, timeout_graceful_shutdown=2)
    )
    if on_ready is not None:
        on_ready(f"http://127.0.0.1:{port}/?token={token}")
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
