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

from memory import ExperienceStore
from tools import (
    ToolFileError,
    ToolFiles,
    ToolRegistry,
    ToolSpec,
    ToolSpecError,
    spec_from_source,
)

from ..config import EvolutionSettings

__all__ = ["Toolbox"]

log = logging.getLogger(__name__)


class Toolbox:
    def __init__(
        self, store: ExperienceStore, registry: ToolRegistry, data_dir: Path, settings: EvolutionSettings
    ) -> None:
        self.store = store
        self.registry = registry
        self.files = ToolFiles(Path(data_dir) / "tools")
        self.settings = settings
        self._loaded: tuple = ()
        self._lock = threading.Lock()
        self._due: set[int] = set()  # tools whose record says retire, at the next refresh
        self._due_lock = threading.Lock()

    def refresh(self) -> None:
        """Retire the tools found failing since the last refresh, then offer exactly the active
        synthesized versions (those whose files check out)."""
        with self._lock:
            self._retire_failing()
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
        """Count one call; a tool whose record now says it does more harm than good is retired at
        the next refresh (between tasks), not under the task that is using it."""
        if spec.tool_id is None:
            return
        record = self.store.record_tool_use(spec.tool_id, ok=ok)
        s = self.settings
        if (
            record.status == "active"
            and record.uses >= s.tool_retire_min_uses
            and record.successes / record.uses < s.tool_retire_below
        ):
            with self._due_lock:
                self._due.add(record.id)

    def _retire_failing(self) -> None:
        with self._due_lock:
            due, self._due = self._due, set()
        s = self.settings
        for tool_id in sorted(due):
            record = self.store.get_tool(tool_id)
            if record.status != "active":  # retired, replaced or reverted meanwhile
                continue
            rate = record.successes / record.uses
            self.store.apply_tool_changes(
                "tool_retired",
                f"retired tool {record.name} v{record.version}: {record.successes} of {record.uses} calls succeeded",
                why=f"success rate {rate:.0%} under tool_retire_below {s.tool_retire_below:.0%}",
                node_id=record.node_id,
                status={record.id: "retired"},
                payload={"uses": record.uses, "successes": record.successes},
            )
