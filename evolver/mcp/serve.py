"""`evolver mcp serve`: what evolver learned, offered to other agents over MCP.

The server is a client of the running daemon (its socket API, as the CLI and
the dashboard are): it never opens the store. It offers:

- ``memory_search``: past trajectories, insights or tools like a text;
- ``insights``: the active insights, most important first;
- ``submit_task`` and ``task_status``: hand the daemon a task, ask how it went;
- ``learned_<name>`` for every active synthesized tool: a call runs in
  evolver's sandbox, in the daemon (``POST /v1/tools/{name}/call``), never in
  the MCP host's process. The list follows the daemon: a tool learned or
  retired later is offered or withdrawn at the next ``tools/list``.

Over stdio (what desktop and editor hosts start), or streamable HTTP on
loopback, where every request must carry the bearer token, the Host header
must be the address served (DNS rebinding is refused), an Origin must be its
own exactly, and none of those headers may come twice (``evolver.loopback``).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from mcp import types
from mcp.server import Server
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings

from tools import ToolSpec, schema_for_call

from .. import __version__
from ..loopback import Loopback, Refused

__all__ = ["LEARNED_PREFIX", "build_server", "serve_http", "serve_stdio"]

LEARNED_PREFIX = "learned_"
TERMINAL = ("done", "failed", "cancelled", "dead")
MAX_WAIT_S = 600.0

_FIXED = [
    types.Tool(
        name="memory_search",
        description=(
            "Search evolver's experience memory: past task trajectories (prompt, answer, whether it succeeded), "
            "distilled insights, or synthesized tools, most similar to a text first."
        ),
        input_schema={
            "type": "object",
            "required": ["text"],
            "properties": {
                "text": {"type": "string", "description": "What to look for."},
                "kind": {"type": "string", "enum": ["trajectories", "insights", "tools"], "default": "trajectories"},
                "k": {"type": "integer", "minimum": 1, "maximum": 50, "default": 5},
            },
        },
    ),
    types.Tool(
        name="insights",
        description=(
            "The lessons evolver distilled from its experience and uses now, most important first, each with its "
            "measured effect on success."
        ),
        input_schema={
            "type": "object",
            "properties": {"limit": {"type": "integer", "minimum": 1, "maximum": 200, "default": 20}},
        },
    ),
    types.Tool(
        name="submit_task",
        description=(
            "Hand evolver's agent a task. It is stored durably and solved by the daemon's workers; with wait_s the "
            "call waits up to that many seconds for the answer, else it returns the task id at once."
        ),
        input_schema={
            "type": "object",
            "required": ["prompt"],
            "properties": {
                "prompt": {"type": "string", "description": "What to do, in words."},
                "expected_answer": {"type": "string", "description": "If given, success is the answer equal to it."},
                "wait_s": {"type": "number", "minimum": 0, "maximum": MAX_WAIT_S, "default": 0},
            },
        },
    ),
    types.Tool(
        name="task_status",
        description="How a task submitted to evolver stands: its status and answer.",
        input_schema={"type": "object", "required": ["task_id"], "properties": {"task_id": {"type": "string"}}},
    ),
]


# The fixed tools' arguments are checked against their schemas by the rule every tool call meets (a learned
# tool's, in the daemon): a missing one is named as missing, before the daemon is asked anything.
_SPECS = {t.name: ToolSpec(name=t.name, description=t.description or "", parameters=t.input_schema) for t in _FIXED}


class _Refused(Exception):
    """The daemon could not be reached, or refused; the message is what the MCP client is told."""


def _summary(task: dict) -> dict:
    trajectories = task.get("trajectories") or []
    answer = trajectories[-1].get("final_answer") if trajectories else None
    return {
        "task_id": task["id"],
        "status": task["status"],
        "ending": task.get("ending"),
        "error": task.get("error"),
        "answer": answer,
    }


def build_server(socket_path: str | Path) -> Server:
    """The MCP server over the daemon listening on ``socket_path``."""
    daemon = httpx.AsyncClient(
        transport=httpx.AsyncHTTPTransport(uds=str(socket_path)),
        base_url="http://evolver",
        timeout=httpx.Timeout(60.0, read=None),
    )

    async def ask(method: str, path: str, body: dict | None = None, **params: Any) -> dict:
        try:
            reply = await daemon.request(method, path, json=body, params=params or None)
        except httpx.TransportError:
            raise _Refused(
                f"the evolver daemon is not answering on {socket_path}; start it with `evolver up`"
            ) from None
        data = reply.json() if reply.content else {}
        if reply.status_code >= 400:
            raise _Refused((data.get("error") or {}).get("message") or f"the daemon answered {reply.status_code}")
        return data

    async def learned() -> list[dict]:
        tools = (await ask("GET", "/v1/tools", status="active"))["synthesized"]
        return [t for t in tools if t.get("parameters") is not None and t["status"] == "active"]

    async def list_tools(ctx, params) -> types.ListToolsResult:
        try:
            found = await learned()
        except _Refused:
            found = []  # the fixed tools still say what is wrong when called
        offered = [
            types.Tool(
                name=LEARNED_PREFIX + t["name"],
                input_schema=t["parameters"],
                description=f"{t['description']} (a tool evolver synthesized and tested, v{t['version']}; "
                "it runs in evolver's sandbox)",
            )
            for t in found
        ]
        return types.ListToolsResult(tools=[*_FIXED, *offered])

    async def run(name: str, args: dict) -> tuple[Any, bool]:
        if name == "memory_search":
            found = await ask(
                "POST",
                "/v1/memory/search",
                {
                    "text": str(args.get("text", "")),
                    "kind": args.get("kind", "trajectories"),
                    "k": int(args.get("k", 5)),
                },
            )
            return found["hits"], False
        if name == "insights":
            return (await ask("GET", "/v1/insights", limit=int(args.get("limit", 20))))["insights"], False
        if name == "submit_task":
            body: dict[str, Any] = {"prompt": str(args.get("prompt", ""))}
            if args.get("expected_answer") is not None:
                body["check"] = {"type": "answer", "expected": str(args["expected_answer"])}
            task = await ask("POST", "/v1/tasks", body)
            wait = min(max(float(args.get("wait_s") or 0), 0.0), MAX_WAIT_S)
            deadline = asyncio.get_running_loop().time() + wait
            while wait and task["status"] not in TERMINAL and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.25)
                task = await ask("GET", f"/v1/tasks/{quote(task['id'], safe='')}")
            return _summary(task), False
        if name == "task_status":
            return _summary(await ask("GET", f"/v1/tasks/{quote(str(args.get('task_id', '')), safe='')}")), False
        if name.startswith(LEARNED_PREFIX):
            tool = quote(name.removeprefix(LEARNED_PREFIX), safe="")
            done = await ask("POST", f"/v1/tools/{tool}/call", {"arguments": args})
            return done["text"], not done["ok"]
        raise _Refused(f"there is no tool {name!r}; tools/list names them")

    async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        arguments = dict(params.arguments or {})
        problems = schema_for_call(_SPECS[params.name], arguments) if params.name in _SPECS else []
        try:
            if problems:
                raise ValueError("; ".join(problems))
            result, failed = await run(params.name, arguments)
        except _Refused as exc:
            result, failed = str(exc), True
        except (TypeError, ValueError) as exc:
            result, failed = f"bad arguments: {exc}", True
        text = result if isinstance(result, str) else json.dumps(result, indent=1, ensure_ascii=False)
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=failed)

    return Server(
        "evolver",
        version=__version__,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        instructions="evolver: a self-evolving agent's memory, its learned tools (run in its sandbox) "
        "and its task inbox.",
    )


async def serve_stdio(socket_path: str | Path) -> None:
    server = build_server(socket_path)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def _guarded(manager: StreamableHTTPSessionManager, token: str, address: Loopback) -> Callable:
    """The ASGI app: /mcp only, at ``address`` (each checked header once, an Origin only its own), each request
    with ``Authorization: Bearer <token>``."""
    expected = f"Bearer {token}".encode()

    async def app(scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        try:
            headers = address.headers(scope["headers"])
            if not hmac.compare_digest(headers.get(b"authorization", b""), expected):
                raise Refused(401, "unauthorized", "a valid bearer token is required")
            if not address.same_origin(headers):
                raise Refused(403, "forbidden", "requests from another origin are refused")
            if scope["path"].rstrip("/") != "/mcp":
                raise Refused(404, "not_found", "the MCP endpoint is /mcp")
        except Refused as exc:
            await send(
                {
                    "type": "http.response.start",
                    "status": exc.status,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8")],
                }
            )
            await send({"type": "http.response.body", "body": str(exc).encode()})
            return
        await manager.handle_request(scope, receive, send)

    return app


async def serve_http(socket_path: str | Path, sock: socket.socket, token: str) -> None:
    """Streamable HTTP on a loopback socket the caller bound."""
    import uvicorn

    address = Loopback(sock.getsockname()[1])
    # The SDK checks Host and Origin too (after ours): the same address, the same exact origins.
    manager = StreamableHTTPSessionManager(
        app=build_server(socket_path),
        security_settings=TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=sorted(h.decode() for h in address.hosts),
            allowed_origins=sorted(o.decode() for o in address.origins),
        ),
    )
    server = uvicorn.Server(
        uvicorn.Config(
            _guarded(manager, token, address),
            lifespan="off",
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=2,
        )
    )
    async with manager.run():
        await server.serve(sockets=[sock])
