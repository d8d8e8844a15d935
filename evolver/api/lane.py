"""The submit lane: ``POST /v1/tasks`` with a plainly well-formed body, served without FastAPI's
per-request machinery.

Submitting is what the daemon's API does most, and under load its cost is the API's: measured in
process, FastAPI's dependency solving, body handling and response wrapping took 154 µs of a submit
against 85 µs for the whole bare health route, while the submit's own work (parse, validate, admit,
answer) took 42. The lane does that own work and nothing else, for the one common case: a JSON body
(``Content-Type: application/json``) that validates as ``TaskIn``, with at most one Idempotency-Key
within its bound. It parses and validates exactly as FastAPI's route would (``json.loads``, then the
same strict model), so it takes a subset of what the route takes and never answers a body differently.
Everything else goes on, body intact, to FastAPI's route (``tasks.submit``), which answers errors in
the documented shapes; both end in ``tasks.accept``. The lane sits inside the body cap and the TCP token
check, and an exception it meets is answered by the app's own handlers, as the route's would be.
"""

from __future__ import annotations

import inspect
import json

from starlette.requests import Request

from .asgi import replay
from .host import ServiceHost
from .models import TaskIn
from .tasks import MAX_IDEMPOTENCY_KEY, accept

__all__ = ["SubmitLane"]

PATH = "/v1/tasks"


class SubmitLane:
    def __init__(self, app, host: ServiceHost, handlers: dict) -> None:
        self.app = app  # the rest of the API: FastAPI's routes
        self.host = host
        self.handlers = handlers  # the app's exception handlers, by exception class

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != PATH:
            return await self.app(scope, receive, send)
        content_types, keys = [], []
        for name, value in scope["headers"]:
            if name == b"content-type":
                content_types.append(value)
            elif name == b"idempotency-key":
                keys.append(value)
        if content_types != [b"application/json"] or len(keys) > 1:
            return await self.app(scope, receive, send)
        body, more, messages = b"", True, []
        while more:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                return await self.app(scope, replay(messages, receive), send)
            body += message.get("body", b"")
            more = message.get("more_body", False)
        key = keys[0].decode("latin-1") if keys else None
        task = _task(body)
        if task is None or (key is not None and len(key) > MAX_IDEMPOTENCY_KEY):
            return await self.app(scope, replay(messages, receive), send)
        try:
            response = await accept(self.host, task, key)
        except Exception as exc:  # answered as the route's would be; one with no handler is the server's
            response = await self._handled(scope, exc)
        await response(scope, receive, send)

    async def _handled(self, scope, exc: Exception):
        for kind in type(exc).__mro__:
            handler = self.handlers.get(kind)
            if handler is not None:
                response = handler(Request(scope), exc)
                return await response if inspect.isawaitable(response) else response
        raise exc


def _task(body: bytes) -> TaskIn | None:
    """The body as a task, read as FastAPI's route reads it; None for anything the route should answer."""
    try:
        return TaskIn.model_validate(json.loads(body))
    except Exception:  # noqa: BLE001  not JSON, not text, nested past the parser's stack, or not a task
        return None
