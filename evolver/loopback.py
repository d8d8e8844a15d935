"""What a server on 127.0.0.1 that only its user may use checks before anything else: the dashboard
(`evolver ui`) and MCP over HTTP (`evolver mcp serve --http`) share it.

A web page in the user's browser reaches 127.0.0.1 too. It may rebind its own
DNS name to 127.0.0.1, and its requests then carry that name as their Host; it
may send requests from its own origin. So the Host must be the address served,
and an Origin, where one is checked, must be that address's origin exactly:
scheme, host and port. A header that a check reads must come once: with two,
one part of the server could read the first and another the last.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["Loopback", "Refused"]

# The headers a check here or a server's own reads (its token); each must come once.
SINGLE = (b"host", b"origin", b"authorization", b"cookie")


class Refused(Exception):
    """A request refused before it reaches the app: ``status`` and ``kind`` say how to answer, the message why."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind = status, kind


class Loopback:
    """The address 127.0.0.1:``port`` (or localhost:``port``) as its server checks a request against it."""

    def __init__(self, port: int) -> None:
        self.hosts = {f"127.0.0.1:{port}".encode(), f"localhost:{port}".encode()}
        self.origins = {b"http://" + host for host in self.hosts}

    def headers(self, raw: Iterable[tuple[bytes, bytes]]) -> dict[bytes, bytes]:
        """The request's headers (ASGI's lowercase names), those of ``SINGLE`` once each, its Host one of
        this address's; else ``Refused``."""
        headers: dict[bytes, bytes] = {}
        for name, value in raw:
            if name in headers and name in SINGLE:
                raise Refused(
                    400, "duplicate_header", f"the request has two {name.decode().title()} headers; one is allowed"
                )
            headers[name] = value
        if headers.get(b"host") not in self.hosts:
            raise Refused(
                403,
                "wrong_host",
                "this server answers only at the address it printed (Host "
                f"{' or '.join(sorted(h.decode() for h in self.hosts))})",
            )
        return headers

    def same_origin(self, headers: dict[bytes, bytes]) -> bool:
        """Whether the request's Origin, if it sent one, is this address's, exactly (http, host and port)."""
        origin = headers.get(b"origin")
        return origin is None or origin in self.origins
