"""The synthesized tools the agent is offered: loaded from the store and their files, counted, retired.

The store says which versions are active; the files under ``<data dir>/tools``
hold their code. ``refresh`` brings the registry in line with the store (it is
cheap when nothing changed, so every new agent calls it: a tool registered,
retired or reverted by any path is offered, or withdrawn, from the next task
on). Every call a synthesized tool carries out is counted; once a tool has
been used enough and too few of its calls succeed, it is retired (an event,
revertible like any other), never deleted. Retirement happens between tasks,
at the next ``refresh``: a task keeps the tool set it started with (each agent
gets a snapshot of the registry), so no tool disappears in the middle of one.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from memory.roles import AgentStore
from tools import (
    ToolFileError,
    ToolFiles,
    ToolRegistry,
    ToolSpec,
    ToolSpecError,
    spec_from_source,
)

__all__ = ["Toolbox"]

log = logging.getLogger(__name__)


class Toolbox:
    def __init__(self, store: AgentStore, registry: ToolRegistry, data_dir: Path) -> None:
        self.store = store
        self.registry = registry
        self.files = ToolFiles(Path(data_dir) / "tools")
        self._loaded: tuple = ()
        self._lock = threading.Lock()

    def refresh(self) -> None:
        """Offer exactly the active synthesized versions (those whose files check out)."""
        with self._lock:
            rows = self.store.list_tools(status="active")
            signature = tuple((r.id, r.code_hash) for r in rows)
            if signature == self._loaded:
                return
            wanted = {}
            for row in rows:
                if row.origin != "synthesized":
                    continue
                try:
                    code, tests = self.files.read(row.name, row.version, row.code_hash)
                    spec = spec_from_source(code, name=row.name, tests=tests, node_id=row.node_id)
                except (ToolFileError, ToolSpecError) as exc:  # never serve a tool that is not what was tested
                    log.error("synthesized tool %s v%s is not offered: %s", row.name, row.version, exc)
                    continue
                wanted[row.name] = ToolSpec(**{**vars(spec), "version": row.version, "tool_id": row.id})
            for spec in self.registry.specs():
                if spec.origin == "synthesized" and spec.name not in wanted:
                    self.registry.remove(spec.name)
            for spec in wanted.values():
                try:
                    self.registry.register(spec)
                except ToolSpecError as exc:  # a name a built-in or the user's MCP server holds
                    log.error("synthesized tool %s v%s is not offered: %s", spec.name, spec.version, exc)
            self._loaded = signature

    def record_use(self, spec: ToolSpec, ok: bool) -> None:
        """Count one call. Only counted: a tool is retired in one place, the prune job, by its measured
        effect on the attempts it was offered to (a call that fails may still serve a task that succeeds)."""
        if spec.tool_id is not None:
            self.store.record_tool_use(spec.tool_id, ok=ok)
