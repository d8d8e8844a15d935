"""The dashboard's web app: its page, and the daemon's API passed through from its Unix socket.

Only the person who ran `evolver ui` may read it. It listens on loopback TCP,
and every request must carry the session. The URL printed at start carries a
one-time token as ``?token=``: the first request of that page trades it for a
session value of its own, random, in a cookie (HttpOnly, SameSite Strict), and
drops it from the address bar; from then on the token is refused. Whoever sees
the URL later (scrollback, browser history) holds a dead token, and the
session never appears in a URL. On top of that:

- the Host header must name the loopback address and port the server
  listens on, so a web page that rebinds its own DNS name to 127.0.0.1
  cannot read the dashboard, and no header it reads may come twice
  (``evolver.loopback``);
- a request that changes something (POST) must carry ``X-Evolver-UI``, which
  another origin's page cannot send without a CORS preflight (none is
  answered), and an Origin, if any, that is the dashboard's own exactly; only
  the few actions the page offers are passed through: submit a task, cancel
  one, revert an event, approve an insight on probation;
- the page loads nothing from the network (no CDN) and its content security
  policy allows scripts from itself only.
"""

from __future__ import annotations

import hmac
import re
import secrets
from collections.abc import Callable
from importlib import resources
from urllib.parse import parse_qs

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Route

from ..loopback import Loopback, Refused
from ..tree.export import to_html

__all__ = ["cookie_name", "create_ui_app"]

# The actions the page offers, as paths under the daemon's /v1/ (every GET is read-only and passes).
POSTS = (
    re.compile(r"tasks"),
    re.compile(r"tasks/[A-Za-z0-9_]{1,64}/cancel"),
    re.compile(r"history/[0-9]{1,18}/revert"),
    re.compile(r"insights/[0-9]{1,18}/approve"),
)
STATIC = {"app.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; frame-ancestors 'self'; form-action 'self'; base-uri 'none'",
    "X-Frame-Options": "SAMEORIGIN",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def cookie_name(port: int) -> str:
    """The session cookie's name; it names the port, since cookies are kept per host, not per port."""
    return f"evolver_ui_{port}"


def _error(status: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"type": kind, "message": message, "param": None}}, status_code=status)


def _static(name: str) -> str:
    return resources.files("evolver.ui").joinpath("static", name).read_text(encoding="utf-8")


class Guard:
    """ASGI middleware: the Host check, the session (and the one trade of the URL's token for it), the POST
    header, and the security headers on every reply."""

    def __init__(self, app, *, token: str, port: int, on_traded: Callable[[], None] | None = None) -> None:
        self.app = app
        self.url_token: bytes | None = token.encode()  # None once traded
        self.session: bytes | None = None
        self.on_traded = on_traded
        self.address = Loopback(port)
        self.cookie = cookie_name(port)

    def _trade(self, scope) -> Response | None:
        """The session, in a cookie, for the URL's token on the page's address, once; None for any other
        request. (Requests are handled on one event loop: two cannot both trade it.)"""
        if scope["path"] != "/" or self.url_token is None:
            return None
        given = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("token", [""])[-1].encode()
        if not given or not hmac.compare_digest(given, self.url_token):
            return None
        self.url_token = None
        self.session = secrets.token_urlsafe(32).encode()
        response = RedirectResponse("/", status_code=303)  # drops the token from the address bar
        response.set_cookie(self.cookie, self.session.decode(), httponly=True, samesite="strict", path="/")
        if self.on_traded is not None:
            self.on_traded()
        return response

    def _intercept(self, scope) -> Response | None:
        """The guard's own answer to the request (a refusal, or the token's trade), or None to pass it on."""
        try:
            headers = self.address.headers(scope["headers"])
        except Refused as exc:
            return _error(exc.status, exc.kind, str(exc))
        given = b""
        for part in headers.get(b"cookie", b"").split(b";"):
            name, _, value = part.strip().partition(b"=")
            if name == self.cookie.encode():
                given = value
        if self.session is None or not hmac.compare_digest(given, self.session):
            traded = self._trade(scope)
            if traded is not None:
                return traded
            spent = "" if self.url_token else " Its token opens it once, and was used: run `evolver ui` again."
            return _error(
                401,
                "unauthorized",
                f"open the dashboard with the URL `evolver ui` printed (it carries its one-time token).{spent}",
            )
        if scope["method"] not in ("GET", "HEAD"):
            if headers.get(b"x-evolver-ui") != b"1" or not self.address.same_origin(headers):
                return _error(403, "forbidden", "changes are taken only from the dashboard's own page")
        return None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "websocket":  # the page uses none: nothing to pass unguarded
            return await send({"type": "websocket.close", "code": 1008})
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        answer = self._intercept(scope)

        async def secured(message) -> None:
            if message["type"] == "http.response.start":
                present = {k.lower() for k, _ in message.get("headers", [])}
                message["headers"] = list(message.get("headers", [])) + [
                    (k.lower().encode(), v.encode())
                    for k, v in SECURITY_HEADERS.items()
                    if k.lower().encode() not in present
                ]
            await send(message)

        if answer is not None:
            return await answer(scope, receive, secured)
        await self.app(scope, receive, secured)


def create_ui_app(socket_path: str, *, token: str, port: int, on_traded: Callable[[], None] | None = None) -> Starlette:
    """The dashboard over the daemon that listens on ``socket_path``, served at 127.0.0.1:``port``, opened
    once with ``token``; ``on_traded`` is called when the token has been traded for the session."""
    daemon = httpx.AsyncClient(
        transport=httpx.AsyncHTTPTransport(uds=str(socket_path)),
        base_url="http://evolver",
        timeout=httpx.Timeout(30.0, read=None),
    )
    unreachable = (
        "the daemon is not answering on its socket ({}); start it with `evolver up`, and this page picks it up again"
    )

    async def page(request: Request) -> Response:
        if "token" in request.query_params:  # the session holder opened the URL again: drop the dead token
            return RedirectResponse("/", status_code=303)
        return HTMLResponse(_static("index.html"))

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC:
            return _error(404, "not_found", f"there is no {name!r} here")
        return Response(_static(name), media_type=STATIC[name])

    async def tree_page(request: Request) -> Response:
        try:
            reply = await daemon.get("/v1/tree")
        except httpx.TransportError as exc:
            return HTMLResponse(f"<p>{unreachable.format(type(exc).__name__)}</p>", status_code=503)
        if reply.status_code != 200:
            return HTMLResponse(f"<p>the daemon answered {reply.status_code}</p>", status_code=502)
        return HTMLResponse(to_html(reply.json()))

    async def api(request: Request) -> Response:
        path = request.path_params["path"]
        if request.method == "POST" and not any(p.fullmatch(path) for p in POSTS):
            return _error(403, "forbidden", f"the dashboard does not pass POST /v1/{path} to the daemon")
        outgoing = daemon.build_request(
            request.method,
            f"/v1/{path}",
            params=request.query_params,
            content=await request.body() if request.method == "POST" else None,
            headers={"content-type": "application/json"} if request.method == "POST" else None,
        )
        try:
            reply = await daemon.send(outgoing, stream=True)
        except httpx.TransportError as exc:
            return _error(503, "daemon_unreachable", unreachable.format(type(exc).__name__))
        kind = reply.headers.get("content-type", "application/json")
        if not kind.startswith("text/event-stream"):
            body = await reply.aread()
            await reply.aclose()
            return Response(body, status_code=reply.status_code, media_type=kind)

        async def relay():
            try:  # ends when the daemon ends the stream, or (cancelled by Starlette) when the browser leaves
                async for chunk in reply.aiter_raw():
                    yield chunk
            except httpx.TransportError:
                return
            finally:
                await reply.aclose()

        return StreamingResponse(
            relay(), status_code=reply.status_code, media_type="text/event-stream", headers={"X-Accel-Buffering": "no"}
        )

    app = Starlette(
        routes=[
            Route("/", page),
            Route("/static/{name}", asset),
            Route("/tree.html", tree_page),
            Route("/api/v1/{path:path}", api, methods=["GET", "POST"]),
        ]
    )
    return Guard(app, token=token, port=port, on_traded=on_traded)  # type: ignore[return-value]
