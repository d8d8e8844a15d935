"""The ASGI app: its routers, the handlers that turn errors into their shape, the body cap and the TCP token."""

from __future__ import annotations

import hmac
import logging
import os

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from memory import AmbiguousId, NotFound, StoreError

from .. import __version__
from ..llm.budget import BudgetExceeded
from ..meta.jobs import JobError
from ..meta.probation import ApprovalError
from ..meta.revert import RevertError
from ..tree.incumbent import IncumbentError
from . import chat, inspect, packs, tasks
from .asgi import replay
from .errors import error_response, http_error, internal_message, validation_error
from .host import ServiceHost, Starting, Stopping
from .lane import SubmitLane

__all__ = ["create_app"]

log = logging.getLogger(__name__)


class BodyCap:
    """Refuse request bodies over the cap with 413 before any route reads them."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._too_large()(scope, receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return await self._too_large()(scope, receive, send)
            if not message.get("more_body"):
                break
        whole = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, replay([whole], receive), send)

    def _too_large(self) -> JSONResponse:
        return error_response(
            413,
            "body_too_large",
            f"the body is larger than the {self.max_bytes}-byte cap ([advanced.daemon] max_body_bytes)",
        )


class TcpToken:
    """Connections over TCP (only when configured, on loopback) must carry the bearer token."""

    def __init__(self, app, token: str | None) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode() if token else None

    async def __call__(self, scope, receive, send) -> None:
        server = scope.get("server")
        over_tcp = scope["type"] == "http" and server is not None and server[1] is not None
        if over_tcp:
            given = dict(scope["headers"]).get(b"authorization", b"")
            if self.expected is None or not hmac.compare_digest(given, self.expected):
                response = error_response(401, "unauthorized", "a valid bearer token is required over TCP")
                return await response(scope, receive, send)
        await self.app(scope, receive, send)


def _starting(request: Request, exc: Starting) -> JSONResponse:
    response = error_response(503, "starting", str(exc))
    response.headers["Retry-After"] = "1"  # the jobs start within a second or two of the socket
    return response


def create_app(daemon: ServiceHost) -> FastAPI:
    """The API over a running daemon: anything that keeps the ``ServiceHost`` protocol."""
    app = FastAPI(
        title="evolver",
        version=__version__,
        docs_url=None,
        redoc_url=None,
        description="A self-evolving agent daemon with experience memory, over a Unix socket.",
    )
    app.state.daemon = daemon
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(NotFound, lambda r, e: error_response(404, "not_found", str(e)))
    app.add_exception_handler(AmbiguousId, lambda r, e: error_response(422, "ambiguous_id", str(e)))
    app.add_exception_handler(IncumbentError, lambda r, e: error_response(409, "conflict", str(e)))
    app.add_exception_handler(JobError, lambda r, e: error_response(409, "conflict", str(e)))
    app.add_exception_handler(RevertError, lambda r, e: error_response(409, "conflict", str(e)))
    app.add_exception_handler(ApprovalError, lambda r, e: error_response(409, "conflict", str(e)))
    app.add_exception_handler(BudgetExceeded, lambda r, e: error_response(429, "budget_exceeded", str(e)))
    app.add_exception_handler(StoreError, lambda r, e: error_response(503, "store_unavailable", str(e)))
    app.add_exception_handler(Stopping, lambda r, e: error_response(503, "stopping", str(e)))
    app.add_exception_handler(Starting, _starting)

    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path, exc_info=exc)
        return error_response(
            500,
            "internal_error",
            internal_message("the daemon failed on this request", exc),
        )

    app.add_exception_handler(Exception, _internal)
    for module in (tasks, chat, inspect, packs):
        app.include_router(module.router, prefix="/v1")
    d = daemon.config.daemon
    # Innermost, so the cap and the token apply to the lane too; the last added runs first.
    app.add_middleware(SubmitLane, host=daemon, handlers=app.exception_handlers)
    app.add_middleware(BodyCap, max_bytes=d.max_body_bytes)
    app.add_middleware(TcpToken, token=os.environ.get(d.tcp_token_env) if d.tcp_token_env else None)
    return app
