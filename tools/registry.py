"""The tool registry: which tools exist, validated, and their schemas for the model."""

from __future__ import annotations

import threading
from collections.abc import Iterable

from .spec import ToolSpec, ToolSpecError, schema_for_call, spec_from_source

__all__ = ["ToolRegistry"]


class ToolRegistry:
    """Tools by name. Registering validates: the code parses and the schema is the
    one derived from the signature (a spec cannot claim parameters its code lacks)."""

    def __init__(self, specs: Iterable[ToolSpec] = ()) -> None:
        self._specs: dict[str, ToolSpec] = {}
        self._lock = threading.Lock()
        for spec in specs:
            self.register(spec)

    def register(self, spec: ToolSpec) -> ToolSpec:
        if spec.code:
            derived = spec_from_source(spec.code, name=spec.name, origin=spec.origin)
            if derived.parameters != spec.parameters:
                raise ToolSpecError(f"tool {spec.name}: its schema does not match its signature")
        with self._lock:
            held = self._specs.get(spec.name)
            # What evolution makes never takes the name of what the user or evolver itself provides (a
            # built-in, a tool of the user's MCP server): it would run in its place.
            if held is not None and held.origin != "synthesized" and spec.origin == "synthesized":
                raise ToolSpecError(f"tool {spec.name}: the name belongs to a {held.origin} tool")
            self._specs[spec.name] = spec
        return spec

    def snapshot(self) -> ToolRegistry:
        """A copy that later registrations and removals leave alone: one task sees one tool set."""
        copy = ToolRegistry()
        with self._lock:
            copy._specs = dict(self._specs)
        return copy

    def remove(self, name: str) -> None:
        with self._lock:
            self._specs.pop(name, None)

    def get(self, name: str) -> ToolSpec | None:
        return self._specs.get(name)

    def names(self) -> list[str]:
        return sorted(self._specs)

    def specs(self, names: Iterable[str] | None = None) -> list[ToolSpec]:
        if names is None:
            return [self._specs[n] for n in self.names()]
        return [self._specs[n] for n in names if n in self._specs]

    def schemas(self, names: Iterable[str]) -> list[dict]:
        return [spec.openai_schema() for spec in self.specs(names)]

    def check_call(self, name: str, arguments: object) -> list[str]:
        """What is wrong with a call (unknown tool, bad arguments); empty when it can run."""
        spec = self._specs.get(name)
        if spec is None:
            return [f"unknown tool {name!r}; the tools are: {', '.join(self.names())}"]
        return schema_for_call(spec, arguments)
