"""The user's MCP servers ([[mcp.servers]]) as tools the agent is offered like its built-ins.

Each server is started (or, for a URL, connected) once, by the daemon (or by
the one command that opens an engine, ``evolver run``), and held by one
background thread that runs an asyncio loop: each call is handed to that loop
and waited for, with the server's timeout. The daemon's worker processes start
none: they get the daemon's list of tools (``McpServers.offered``) and call
through it (``McpThrough``), so each server runs once however many workers
there are. A server's tools become ``ToolSpec``s of
origin "mcp" named ``SERVER__TOOL``, with the server's own input schema and a
``runner`` that calls it; the loop records each call as a step, as any tool's,
and its exposures are measured like a synthesized tool's.

These servers are the user's: they run outside the sandbox with the user's
rights, so only the user's settings name them. Nothing the meta-agent writes
can add one (a scaffold has no such field), and a synthesized tool cannot take
one's name (``ToolRegistry.register``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import re
import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from tools import ToolSpec

from ..config import McpServerSettings

__all__ = ["ORIGIN", "McpServers", "McpThrough", "Offered", "tool_name"]

log = logging.getLogger(__name__)

ORIGIN = "mcp"
_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]")
PASSED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")  # a server gets these, not evolver's settings or keys
START_TIMEOUT_S = 60.0


def tool_name(server: str, tool: str) -> str:
    """The name the agent sees: SERVER__TOOL, in the characters tool names may have, at most 64."""
    return f"{server}__{_UNSAFE.sub('_', tool)}"[:64]


def _text(result) -> str:
    parts = []
    for item in result.content or []:
        parts.append(item.text if getattr(item, "type", "") == "text" else f"[{getattr(item, 'type', 'content')}]")
    if not parts and result.structured_content is not None:
        parts.append(str(result.structured_content))
    return "\n".join(parts)


@dataclass(frozen=True)
class Offered:
    """The servers' tools as one process offers them to another: what a ``ToolSpec`` needs but its runner."""

    tools: list[dict] = field(default_factory=list)  # each its name (SERVER__TOOL), description, parameters
    problems: dict[str, str] = field(default_factory=dict)  # a server left out: why


def _spec(name: str, description: str, parameters: dict, runner: Callable[[dict], tuple[bool, str]]) -> ToolSpec:
    return ToolSpec(name=name, description=description, parameters=parameters, origin=ORIGIN, runner=runner)


class McpServers:
    """Connected servers and their tools; ``close`` ends them. A server that cannot be started or listed is
    logged and left out (``problems`` says why), and the others serve."""

    def __init__(self, settings: list[McpServerSettings]) -> None:
        self.settings = list(settings)
        self.specs: list[ToolSpec] = []
        self.problems: dict[str, str] = {}
        self._clients: dict[str, Any] = {}
        self._tools: dict[str, tuple[str, str]] = {}  # the agent's name of a tool: its server and its own name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None

    # --- starting and stopping ------------------------------------------------------------

    def start(self) -> list[ToolSpec]:
        """Start every server and list its tools; returns the specs to register."""
        if not self.settings:
            return []
        ready: Future = Future()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="mcp-servers", daemon=True)
        self._thread.start()
        ready.result(timeout=START_TIMEOUT_S * max(1, len(self.settings)))
        for server, why in self.problems.items():
            log.error("MCP server %s is left out: %s", server, why)
        return self.specs

    def _run(self, ready: Future) -> None:
        asyncio.run(self._serve(ready))

    async def _serve(self, ready: Future) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        holders = [asyncio.create_task(self._hold(s)) for s in self.settings]
        started = [
            asyncio.ensure_future(asyncio.wait_for(self._started(s.name), START_TIMEOUT_S)) for s in self.settings
        ]
        await asyncio.gather(*started, return_exceptions=True)
        for s in self.settings:
            if s.name not in self._clients and s.name not in self.problems:
                self.problems[s.name] = f"it did not start within {START_TIMEOUT_S:g} s"
        ready.set_result(None)
        await self._stop.wait()
        for holder in holders:
            holder.cancel()
        await asyncio.gather(*holders, return_exceptions=True)

    async def _started(self, name: str) -> None:
        while name not in self._clients and name not in self.problems:
            await asyncio.sleep(0.02)

    def _client(self, settings: McpServerSettings):
        from mcp import Client
        from mcp.client.stdio import StdioServerParameters

        if settings.url:
            return Client(settings.url)
        env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
        return Client(
            StdioServerParameters(command=settings.command[0], args=settings.command[1:], env={**env, **settings.env})
        )

    async def _hold(self, settings: McpServerSettings) -> None:
        """Keep one server's session open until ``close``; its tools are listed once, at the start."""
        try:
            async with self._client(settings) as client:
                listed = await client.list_tools()
                for tool in listed.tools:
                    name = tool_name(settings.name, tool.name)
                    schema = dict(tool.input_schema or {"type": "object", "properties": {}})
                    description = f"[{settings.name}] {tool.description or tool.name}"
                    runner = functools.partial(self.call, settings, tool.name)
                    self.specs.append(_spec(name, description, schema, runner))
                    self._tools[name] = (settings.name, tool.name)
                self._clients[settings.name] = client
                await asyncio.Event().wait()  # held open until cancelled by close()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - a server that fails is left out, named, not fatal
            self.problems.setdefault(settings.name, f"{type(exc).__name__}: {exc}"[:500])
            self._clients.pop(settings.name, None)

    def close(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(15)

    def offered(self) -> Offered:
        """What another process needs to offer these tools and call them through ``call_offered``."""
        tools = [
            {"name": spec.name, "description": spec.description, "parameters": spec.parameters} for spec in self.specs
        ]
        return Offered(tools=tools, problems=dict(self.problems))

    # --- calling ------------------------------------------------------------------------

    def call_offered(self, name: str, arguments: dict) -> tuple[bool, str]:
        """A call of an offered tool by the agent's name of it (``McpThrough``, in a worker process)."""
        if name not in self._tools:
            return False, f"no MCP tool is named {name}"
        server, tool = self._tools[name]
        settings = next(s for s in self.settings if s.name == server)
        return self.call(settings, tool, arguments)

    def call(self, settings: McpServerSettings, tool: str, arguments: dict) -> tuple[bool, str]:
        """One call of a server's tool, from any thread: (ok, the text it returned or why it failed)."""
        client = self._clients.get(settings.name)
        if client is None or self._loop is None:
            why = self.problems.get(settings.name, "it is not running")
            return False, f"MCP server {settings.name} cannot be called: {why}"
        future = asyncio.run_coroutine_threadsafe(
            client.call_tool(tool, arguments, read_timeout_seconds=settings.timeout_s), self._loop
        )
        try:
            result = future.result(timeout=settings.timeout_s + 5)
        except FutureTimeout:
            future.cancel()
            return False, f"MCP server {settings.name}: {tool} did not answer within {settings.timeout_s:g} s"
        except Exception as exc:  # noqa: BLE001 - the server's failure is the observation
            return False, f"MCP server {settings.name}: {tool} failed: {type(exc).__name__}: {exc}"
        return not result.is_error, _text(result) or "(no content)"


class McpThrough:
    """The daemon's MCP tools in a worker process: the same tools, each call sent to the daemon, whose
    servers answer it (``call``: the name and arguments to ``McpServers.call_offered`` there)."""

    def __init__(self, offered: Offered, call: Callable[[str, dict], tuple[bool, str]]) -> None:
        self.problems = dict(offered.problems)
        self.specs = [
            _spec(t["name"], t["description"], t["parameters"], functools.partial(call, t["name"]))
            for t in offered.tools
        ]

    def start(self) -> list[ToolSpec]:
        return self.specs

    def close(self) -> None:
        """Nothing to end here: the servers are the daemon's."""
