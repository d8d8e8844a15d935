"""ASGI plumbing the API's middleware share."""

from __future__ import annotations

__all__ = ["replay"]


def replay(messages: list[dict], receive):
    """``receive`` that gives ``messages`` (a request body already read) again, then goes on reading: what a
    middleware that read the body hands on, so the app behind it reads the body as if nobody had."""
    pending = list(messages)

    async def replayed():
        return pending.pop(0) if pending else await receive()

    return replayed
