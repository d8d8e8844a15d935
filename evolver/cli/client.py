"""The CLI's side of the socket: HTTP over the daemon's Unix socket, errors as one sentence.

``DaemonNotRunning`` and ``SocketDenied`` let the CLI tell "start it first"
from "this socket is not yours"; ``ApiError`` carries the daemon's own message
for a refused request.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

# Its decoder, not its EventSource: EventSource drops comments, and the chat's progress comes in them.
from httpx_sse._decoders import SSEDecoder

__all__ = [
    "Client",
    "ClientError",
    "DaemonNotRunning",
    "SocketDenied",
    "ApiError",
    "decode",
    "server_events",
    "finished_rounds",
]


class ClientError(Exception):
    """The daemon could not be asked, or refused; the message says which and why."""


class DaemonNotRunning(ClientError):
    pass


class SocketDenied(ClientError):
    pass


class ApiError(ClientError):
    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind = status, kind


def finished_rounds(rounds: list[dict], get: Callable[[str], dict], *, poll_s: float = 0.1) -> list[dict]:
    """The rounds ``POST /v1/evolve`` queued, once each has finished (``get`` reads a path's JSON)."""
    finished = []
    for queued in rounds:
        current = queued
        while current["status"] not in ("done", "failed"):
            time.sleep(poll_s)
            current = get(f"/v1/evolve/{queued['id']}")
        finished.append(current)
    return finished


class Client:
    def __init__(self, socket_path: Path, *, timeout_s: float = 30.0) -> None:
        self.socket_path = Path(socket_path)
        self.http = httpx.Client(
            transport=httpx.HTTPTransport(uds=str(self.socket_path)), base_url="http://evolver", timeout=timeout_s
        )

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _unreachable(self, exc: Exception) -> ClientError:
        cause = exc.__cause__ or exc.__context__
        while cause is not None and not isinstance(cause, OSError):
            cause = cause.__cause__ or cause.__context__
        if isinstance(cause, PermissionError):
            return SocketDenied(
                f"permission denied on {self.socket_path}: the daemon there belongs to another "
                "user; use your own data dir or runtime dir"
            )
        return DaemonNotRunning(
            f"the daemon is not running (no answer on {self.socket_path}); start it with `evolver up`"
        )

    def request(
        self,
        method: str,
        path: str,
        *,
        json_body: dict | None = None,
        params: dict | None = None,
        headers: dict | None = None,
        timeout_s: float | None = None,
    ) -> dict:
        try:
            response = self.http.request(
                method,
                path,
                json=json_body,
                params=_clean(params),
                headers=headers,
                timeout=timeout_s if timeout_s is not None else httpx.USE_CLIENT_DEFAULT,
            )
        except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
            # A read or write error: the daemon went away mid-request (one that dies just after binding
            # its socket, say), which its caller reports, never a traceback.
            raise self._unreachable(exc) from None
        except httpx.TimeoutException:
            raise ClientError(f"the daemon on {self.socket_path} did not answer in time") from None
        return decode(response)

    def get(self, path: str, **params) -> dict:
        return self.request("GET", path, params=params)

    def post(self, path: str, body: dict | None = None, **kwargs) -> dict:
        return self.request("POST", path, json_body=body or {}, **kwargs)

    def run_rounds(self, job: str | None = None) -> list[dict]:
        """Queue a round of ``job`` (or of every job) on the daemon's job host and wait for them."""
        return finished_rounds(self.post("/v1/evolve", {"job": job})["rounds"], self.get)

    def events(self, task_id: str, *, after: int = 0) -> Iterator[tuple[str, dict]]:
        """The task's server-sent events as (event, data), reconnecting from the last id if cut."""
        last = after
        for _ in range(5):
            try:
                with self.http.stream(
                    "GET", f"/v1/tasks/{task_id}/events", params={"after": last}, timeout=httpx.Timeout(30.0, read=None)
                ) as response:
                    if response.status_code != 200:
                        response.read()
                        decode(response)
                    for event, event_id, data in server_events(response):
                        if event_id is not None:
                            last = event_id
                        yield event, data
                        if event == "end":
                            return
            except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError) as exc:
                if isinstance(exc, httpx.ConnectError):
                    raise self._unreachable(exc) from None
                continue  # the stream was cut: resume after the last event seen
        raise ClientError(f"lost the event stream of task {task_id} repeatedly")


def server_events(
    response: httpx.Response, *, on_comment: Callable[[str], None] | None = None
) -> Iterator[tuple[str, int | None, Any]]:
    """A response's server-sent events as (event, id, data), the data decoded from JSON, up to and
    including a task stream's ``end`` or up to a chat stream's ``[DONE]``.

    The id is the stream's last event id (kept across events, as the spec says): where a reconnect
    resumes, None before the first. Each comment's text goes to ``on_comment``."""
    decoder = SSEDecoder()
    for line in response.iter_lines():
        if line.startswith(":") and on_comment is not None:
            on_comment(line[1:].strip())
        sse = decoder.decode(line)
        # httpx-sse dispatches every blank line once an id was seen, so a keep-alive comment comes back
        # as an event without data; the spec drops it, and so does this.
        if sse is None or not sse.data:
            continue
        if sse.data == "[DONE]":
            return
        yield sse.event, int(sse.id) if sse.id else None, json.loads(sse.data)
        if sse.event == "end":
            return


def _clean(params: dict | None) -> dict | None:
    return None if params is None else {k: v for k, v in params.items() if v is not None}


def decode(response: httpx.Response) -> dict:
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.is_success:
        return body if isinstance(body, dict) else {}
    error = (body or {}).get("error", {}) if isinstance(body, dict) else {}
    raise ApiError(
        response.status_code,
        error.get("type", "http_error"),
        error.get("message") or f"the daemon answered {response.status_code}",
    )
