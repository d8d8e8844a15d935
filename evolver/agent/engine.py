"""Wiring: the parts of the agent built from the user's settings, in one place."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

from memory import ExperienceStore
from sandbox import Limits, Sandbox, make_sandbox
from tools import ToolRegistry, builtin_specs

from ..config import Config
from ..llm.budget import BudgetGuard
from ..llm.client import Model, ModelClient
from ..storage import open_store
from .loop import Agent
from .scaffold import Scaffold, default_scaffold, load_scaffold
from .toolbox import Toolbox

__all__ = ["Engine", "sandbox_limits", "hook_limits"]

log = logging.getLogger(__name__)


def sandbox_limits(config: Config) -> Limits:
    s = config.sandbox
    return Limits(timeout_s=s.timeout_s, cpu_s=s.cpu_s, memory_mb=s.memory_mb, max_processes=s.max_processes,
                  max_open_files=s.max_open_files, max_file_mb=s.max_file_mb, tmp_mb=s.tmp_mb)


def hook_limits(config: Config) -> Limits:
    """The hooks' interpreter: the sandbox's limits with the hooks' own memory. Its timeout only bounds
    the start; each call has ``[agent] hook_timeout_s``."""
    return replace(sandbox_limits(config), memory_mb=config.agent.hook_memory_mb)


@dataclass
class Engine:
    config: Config
    store: ExperienceStore
    model: Model
    sandbox: Sandbox
    registry: ToolRegistry
    data_dir: Path
    toolbox: Toolbox

    @classmethod
    def open(cls, config: Config, *, data_dir: Path | None = None, store: ExperienceStore | None = None,
             sandbox: Sandbox | None = None) -> "Engine":
        data_dir = Path(data_dir or config.data_dir)
        store = store or open_store(config, data_dir=data_dir)
        try:
            limits = sandbox_limits(config)
            sandbox = sandbox or make_sandbox(require_isolation=config.sandbox.require_isolation,
                                              unprivileged_uid=config.sandbox.unprivileged_uid, limits=limits,
                                              task_uids=config.sandbox.task_uids,
                                              task_uid_base=config.sandbox.task_uid_base)
            if not sandbox.isolated:
                log.warning("SANDBOX DEGRADED: bubblewrap is unavailable; model-written code runs as a plain "
                            "subprocess with limits, not isolated from your files")
            model = ModelClient(config.model, store=store, budget=BudgetGuard(config.budget, store))
        except BaseException:
            store.close()
            raise
        registry = ToolRegistry(builtin_specs())
        return cls(config=config, store=store, model=model, sandbox=sandbox, registry=registry, data_dir=data_dir,
                   toolbox=Toolbox(store, registry, data_dir, config.evolution))

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def seed_scaffold(self) -> Scaffold:
        path = self.config.agent.seed_scaffold
        return load_scaffold(Path(path).expanduser()) if path else default_scaffold()

    def agent(self, scaffold: Scaffold | None = None, *, node_id: str | None = None) -> Agent:
        self.toolbox.refresh()  # between tasks: retirements and new tools take effect here
        return Agent(store=self.store, model=self.model, sandbox=self.sandbox, registry=self.registry.snapshot(),
                     scaffold=scaffold or self.seed_scaffold(), workspace_root=self.data_dir / "workspaces",
                     node_id=node_id, observation_chars=self.config.agent.observation_chars,
                     keep_workspaces=self.config.agent.keep_workspaces, limits=sandbox_limits(self.config),
                     on_tool_use=self.toolbox.record_use, reflection_tokens=self.config.model.max_tokens_reflect,
                     hook_limits=hook_limits(self.config), hook_timeout_s=self.config.agent.hook_timeout_s)
