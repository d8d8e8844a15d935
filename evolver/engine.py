"""Wiring: the parts of the agent built from the user's settings, in one place: the store it opens, the
models, the sandbox, the tools and the MCP servers (the agent package itself never opens a store)."""

from __future__ import annotations

import logging
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from memory import ExperienceStore, NotFound
from sandbox import Limits, Sandbox, make_sandbox
from tools import TaskTools, ToolRegistry, builtin_specs

from .agent.loop import Agent
from .agent.mcp_tools import McpServers, McpThrough
from .agent.scaffold import Scaffold, default_scaffold, load_scaffold
from .agent.toolbox import Toolbox
from .config import Config
from .llm.budget import BudgetGuard
from .llm.client import Model, ModelClient
from .llm.local_server import LocalModels
from .storage import open_store

__all__ = ["Engine", "sandbox_limits", "hook_limits"]

log = logging.getLogger(__name__)


def sandbox_limits(config: Config) -> Limits:
    s = config.sandbox
    return Limits(
        timeout_s=s.timeout_s,
        cpu_s=s.cpu_s,
        memory_mb=s.memory_mb,
        max_processes=s.max_processes,
        max_open_files=s.max_open_files,
        max_file_mb=s.max_file_mb,
        tmp_mb=s.tmp_mb,
    )


def hook_limits(config: Config) -> Limits:
    """The hooks' interpreter: the sandbox's limits with the hooks' own memory. Its timeout only bounds
    the start; each call has ``[advanced.agent] hook_timeout_s``."""
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
    mcp: McpServers | McpThrough | None = None  # the user's MCP servers, whose tools are the agent's too
    meta_model: Model | None = None
    """The meta-agent's model ([meta]): distillation, tool synthesis, scaffold proposals; None: ``model``."""
    local_models: LocalModels | None = None
    """The llama-server children of [model] local / [meta] local, when this engine started them; ``config``
    then points at them (a worker process given that config starts none)."""

    @property
    def meta(self) -> Model:
        """The model the meta-agent asks: [meta]'s when one is set, else the task model."""
        return self.meta_model or self.model

    @classmethod
    def open(
        cls,
        config: Config,
        *,
        data_dir: Path | None = None,
        store: ExperienceStore | None = None,
        sandbox: Sandbox | None = None,
        mcp: McpThrough | None = None,
    ) -> Engine:
        """``mcp``: another process's MCP servers, called through it (a worker process's, the daemon's);
        without it the engine starts the configured servers itself."""
        data_dir = Path(data_dir or config.data_dir)
        store = store or open_store(config, data_dir=data_dir)
        local = None
        try:
            if config.model.local or config.meta.local:  # before any model client: they call these servers
                local = LocalModels(config, data_dir / "logs")
                local.start()  # LocalModelError names what is missing
                config = local.served(config)
            limits = sandbox_limits(config)
            sandbox = sandbox or make_sandbox(
                require_isolation=config.sandbox.require_isolation,
                unprivileged_uid=config.sandbox.unprivileged_uid,
                limits=limits,
                task_uids=config.sandbox.task_uids,
                task_uid_base=config.sandbox.task_uid_base,
            )
            if not sandbox.isolated:
                log.warning(
                    "SANDBOX DEGRADED: bubblewrap is unavailable; model-written code runs as a plain "
                    "subprocess with limits, not isolated from your files"
                )
            budget = BudgetGuard(config.budget, store.ledger)  # one set of caps over both models
            model = ModelClient(config.model, ledger=store.ledger, budget=budget)
            meta = (
                ModelClient(config.meta.settings(config.model), ledger=store.ledger, budget=budget, section="meta")
                if config.meta.name
                else None
            )
        except BaseException:
            if local is not None:
                local.stop()
            store.close()
            raise
        registry = ToolRegistry(builtin_specs())
        servers = mcp or McpServers(config.mcp.servers)
        try:
            for spec in servers.start():
                registry.register(spec)
        except BaseException:
            servers.close()
            if local is not None:
                local.stop()
            store.close()
            raise
        return cls(
            config=config,
            store=store,
            model=model,
            sandbox=sandbox,
            registry=registry,
            data_dir=data_dir,
            toolbox=Toolbox(store.agent, registry, data_dir),
            mcp=servers,
            meta_model=meta,
            local_models=local,
        )

    def close(self) -> None:
        if self.mcp is not None:
            self.mcp.close()
        if self.local_models is not None:
            self.local_models.stop()
        self.store.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def seed_scaffold(self) -> Scaffold:
        path = self.config.agent.seed_scaffold
        return load_scaffold(Path(path).expanduser()) if path else default_scaffold()

    def call_tool(self, name: str, arguments: dict) -> dict:
        """Run one active synthesized tool outside any task (an MCP client asks for it): in the sandbox,
        with the tasks' limits, in a fresh workspace of its own that is removed after. Not counted in
        the tool's usage, which measures the agent's use (a caller's bad arguments are not the tool's
        failures). NotFound for a tool that is not active; ValueError for arguments its schema refuses."""
        self.toolbox.refresh()
        spec = self.registry.get(name)
        if spec is None or spec.origin == "builtin":
            raise NotFound(f"No active synthesized tool named {name!r}; `evolver tools` lists them")
        problems = self.registry.check_call(name, arguments)
        if problems:
            raise ValueError("; ".join(problems))
        root = self.data_dir / "workspaces"
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        workspace = Path(tempfile.mkdtemp(prefix="call-", dir=root))
        try:
            with TaskTools(
                self.registry.snapshot(),
                self.sandbox,
                workspace,
                limits=sandbox_limits(self.config),
                observation_chars=self.config.agent.observation_chars,
                allowed=[name],
            ) as tools:
                seen = tools.run(name, arguments)
        finally:
            shutil.rmtree(workspace, ignore_errors=True)
        return {
            "tool": name,
            "version": spec.version,
            "ok": seen.ok,
            "text": seen.text,
            "duration_ms": round(seen.duration_ms, 1),
        }

    def agent(self, scaffold: Scaffold | None = None, *, node_id: str | None = None) -> Agent:
        self.toolbox.refresh()  # between tasks: retirements and new tools take effect here
        return Agent(
            store=self.store.agent,
            model=self.model,
            sandbox=self.sandbox,
            registry=self.registry.snapshot(),
            scaffold=scaffold or self.seed_scaffold(),
            workspace_root=self.data_dir / "workspaces",
            node_id=node_id,
            observation_chars=self.config.agent.observation_chars,
            keep_workspaces=self.config.agent.keep_workspaces,
            limits=sandbox_limits(self.config),
            on_tool_use=self.toolbox.record_use,
            reflection_tokens=self.config.model.max_tokens_reflect,
            hook_limits=hook_limits(self.config),
            hook_timeout_s=self.config.agent.hook_timeout_s,
        )
