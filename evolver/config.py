"""Settings: one pydantic model per section, documented once, loaded strictly.

The docstring under each field is its documentation: ``render_config()`` turns
the models into the commented ``config.toml`` at the repository root (a test
keeps the two identical), and the same text appears in error messages.

Where settings come from, later wins:
  1. the defaults below;
  2. the file: ``--config PATH``, else ``$EVOLVER_CONFIG``, else
     ``config.toml`` in the user's config dir (if it exists);
  3. environment overrides ``EVOLVER_<SECTION>_<KEY>``, for example
     ``EVOLVER_MODEL_TIMEOUT_S=300`` (values are read as TOML, so ``300`` is a
     number and ``true`` a boolean; anything else is a string).

The settings a person sets are few (``SURFACE``: the model or models, the budget, the data dir, the
workers, isolation, packs, evolution on or off, approval, MCP servers, the evaluator). Every other key is
a tuning knob with its reason, kept in the file under ``[advanced.<section>]``; the code reads both as
``config.<section>.<key>``, and the environment names both ``EVOLVER_<SECTION>_<KEY>``. An advanced key
still set in its section, as an older file does, is read with a warning naming its new place.

In the file, an unknown section or key, a value of the wrong type or an
impossible value is refused with a ``ConfigError`` that names where it came
from, the key, and what is allowed. A known setting's variable with a bad value
is refused the same way. But the environment is shared with other programs and
with the person's own variables (a token exported for one command is seen by
every command), so a name under ``EVOLVER_`` that is not a setting is not proof
of a mistake, and must not stop the daemon: it is ignored, with a warning when
it looks like a misspelt setting. A variable that a setting or the command
names as holding a secret (``tcp_token_env``, ``api_key_env``, ``--token-env``)
is never read as a setting, whatever its name.
"""

from __future__ import annotations

import difflib
import logging
import os
import tomllib
import warnings
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, Literal

import platformdirs
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

__all__ = [
    "Config",
    "ConfigError",
    "ModelSettings",
    "AgentSettings",
    "MemorySettings",
    "SandboxSettings",
    "DaemonSettings",
    "EvolutionSettings",
    "BudgetSettings",
    "load_config",
    "render_config",
    "default_config_path",
]

APP = "evolver"
ENV_PREFIX = "EVOLVER_"
log = logging.getLogger(__name__)


class ConfigError(Exception):
    """A setting was refused; the message says where, which key, and what is allowed."""


class _Section(BaseModel):
    model_config = ConfigDict(
        extra="forbid", strict=True, use_attribute_docstrings=True, validate_default=True, frozen=True
    )


class ModelSettings(_Section):
    """[model] Which language model answers, through litellm."""

    name: str = Field(default="scripted/demo", min_length=1)
    """The litellm model string, for example "ollama/llama3.1", "openai/gpt-4o-mini" or
    "anthropic/claude-sonnet-4-5". "scripted/demo" is the built-in offline model that
    answers from a script; it needs no server and no key."""

    api_base: str = ""
    """The server's base URL, for example "http://localhost:11434" for Ollama. Empty: the
    provider's default."""

    api_key_env: str = ""
    """The name of the environment variable that holds the API key (never the key itself).
    Empty: litellm's usual variable for the provider, such as OPENAI_API_KEY. A server of
    your own (api_base set: llama.cpp, vLLM, Ollama) needs no key: without one a dummy key
    is sent. A hosted provider without its key is an error that names the variable."""

    fallbacks: list[str] = []
    """Models to try, in order, when the main one keeps failing."""

    timeout_s: float = Field(default=120.0, gt=0)
    """Seconds to wait for one model reply."""

    max_retries: int = Field(default=3, ge=0, le=10)
    """Retries, with exponential backoff, after a transient error (rate limit, connection
    or server error). A reply that took longer than timeout_s is not retried: the server may
    still be generating it, and a new request would only queue behind it."""

    tool_mode: Literal["auto", "native", "text"] = "auto"
    """How the model is offered tools. "native": the provider's tool calling (tools= in the
    request); "text": the tools described in the system prompt, calls written back as JSON
    in the reply (for models and servers without tool calling); "auto": native when litellm
    says the model supports function calling, text otherwise."""

    structured_output: bool = False
    """Ask for the meta-agent's JSON answers (insight operations, scaffold edits, tool
    proposals), and for tool calls in text mode, with response_format and a JSON schema,
    so a server that supports it (vLLM, llama.cpp, OpenAI) constrains the reply to valid
    JSON. Off by default: a server that does not support it may refuse the request."""

    schema_format: Literal["json_schema", "json_object"] = "json_schema"
    """How a JSON schema is sent with structured_output: "json_schema" as OpenAI and vLLM take
    it (llama.cpp's server too), or "json_object" (``{"type": "json_object", "schema": ...}``)
    for servers that take only that spelling."""

    local: str = ""
    """A model evolver serves itself with llama.cpp's llama-server: a path to a GGUF file, or
    "qwen2.5-coder-0.5b" / "qwen2.5-coder-1.5b" as scripts/real-model-setup fetches them. The
    daemon starts the server on loopback behind a key of its own, restarts it if it dies and
    stops it with the daemon; name and api_base are then set for you (leave them unset)."""

    local_server: str = ""
    """The llama-server binary for local. Empty: llama-server on PATH, else the build that
    scripts/real-model-setup caches."""

    local_slots: int = Field(default=4, ge=1, le=64)
    """Requests the local server answers at once (its parallel slots, batched together): the
    workers, chat turns and evaluations share them; more wait their turn."""

    local_context: int = Field(default=8192, ge=512, le=1_048_576)
    """Tokens of context per slot of the local server (one KV cache of slots x this is shared)."""

    local_threads: int = Field(default=0, ge=0, le=1024)
    """CPU threads of the local server. 0: one per core."""

    max_tokens_step: int = Field(default=1024, ge=1)
    """Most tokens one reply of an agent step may have (tasks and evaluations), so a model
    that never stops cannot hold a worker for the whole timeout."""

    max_tokens_reflect: int = Field(default=512, ge=1)
    """Most tokens of a reflection on a failed attempt."""

    max_tokens_distill: int = Field(default=1024, ge=1)
    """Most tokens of a distillation answer (insight operations)."""

    max_tokens_propose: int = Field(default=2048, ge=1)
    """Most tokens of the proposer's answer (an edit of the scaffold)."""

    max_tokens_synthesize: int = Field(default=2048, ge=1)
    """Most tokens of a tool proposal (its code and tests)."""

    @model_validator(mode="after")
    def _local_or_server(self) -> ModelSettings:
        if self.local and (self.api_base or "name" in self.model_fields_set):
            raise ValueError(
                "local serves a model of its own: leave name and api_base unset with it "
                f"(local is {self.local!r}, name {self.name!r}, api_base {self.api_base!r})"
            )
        return self

    def max_tokens_for(self, purpose: str) -> int:
        """The output cap of a call made for ``purpose``."""
        return {
            "task": self.max_tokens_step,
            "evaluate": self.max_tokens_step,
            "reflect": self.max_tokens_reflect,
            "distill": self.max_tokens_distill,
            "propose": self.max_tokens_propose,
            "synthesize": self.max_tokens_synthesize,
        }[purpose]


class MetaSettings(_Section):
    """[meta] The meta-agent's model: the one that distills insights, synthesizes tools and proposes scaffold
    edits. Empty: the [model] does it all. Self-improvement with a small task model pays when a stronger
    model writes the improvements (GEPA's reflection model, the Gödel machines' meta-agent): a local pair
    is Qwen2.5-Coder-0.5B for tasks and 1.5B here. Every other [model] setting (tool_mode,
    structured_output, schema_format, max_retries, the max_tokens_* caps) applies to it too; the spend of
    each model is its own line in the ledger."""

    name: str = ""
    """The meta model, a litellm model string as [model] name takes; empty: the [model] answers for the
    meta-agent too."""

    api_base: str = ""
    """Its OpenAI-compatible server, as [model] api_base (empty: the provider's usual endpoint)."""

    api_key_env: str = ""
    """The environment variable that holds its API key, as [model] api_key_env."""

    timeout_s: float = Field(default=300.0, gt=0)
    """Seconds one of its replies may take (a meta-agent's answers are long)."""

    local: str = ""
    """A meta model evolver serves itself, as [model] local takes it (a GGUF path, or
    "qwen2.5-coder-1.5b"); name and api_base are then set for you (leave them unset). It runs
    with [model]'s local_server, local_context and local_threads."""

    local_slots: int = Field(default=2, ge=1, le=64)
    """Requests the meta model's local server answers at once."""

    @model_validator(mode="after")
    def _local_or_server(self) -> MetaSettings:
        if self.local and (self.api_base or self.name):
            raise ValueError(
                "local serves a meta model of its own: leave name and api_base unset with it "
                f"(local is {self.local!r}, name {self.name!r}, api_base {self.api_base!r})"
            )
        return self

    def settings(self, model: ModelSettings) -> ModelSettings:
        """The settings the meta model's calls are made with: [model]'s, with this model, server, key and
        timeout (no fallbacks); [model]'s own when no meta model is set."""
        if not self.name:
            return model
        return model.model_copy(
            update={
                "name": self.name,
                "api_base": self.api_base,
                "fallbacks": [],
                "api_key_env": self.api_key_env,
                "timeout_s": self.timeout_s,
            }
        )


class AgentSettings(_Section):
    """[agent] How the agent works on tasks. What evolution may change (prompts, step limit,
    temperature, retrieval sizes, tools) lives in the scaffold, not here."""

    seed_scaffold: str = ""
    """A scaffold file (JSON) to grow the self-modification tree from. Empty: the bundled
    seed (evolver/data/scaffold.json)."""

    observation_chars: int = Field(default=4000, ge=200, le=1_000_000)
    """How many characters of a tool's output go back to the model; the rest is cut, and
    the model is told so."""

    keep_workspaces: bool = False
    """Keep each task's workspace directory after the task ends (for debugging)."""

    hook_timeout_s: float = Field(default=2.0, gt=0, le=60)
    """Seconds one call of a scaffold's policy hook may take; a slower call is cut off (its
    sandboxed interpreter killed), recorded on the trajectory and ignored."""

    hook_memory_mb: int = Field(default=256, ge=64, le=65_536)
    """Address space of the sandboxed interpreter that runs a task's hooks, in MiB."""


class MemorySettings(_Section):
    """[memory] The experience store: SQLite, the Chroma index and the embedder."""

    fast_queries: bool = True
    """Embed single queries through an ONNX Runtime export of the same model (exported once
    from the bundled weights into the user cache dir): the same vectors, about three times
    faster on a CPU. Stored vectors are always computed by sentence-transformers."""

    embed_batch_size: int = Field(default=64, ge=1, le=4096)
    """Texts per batch when embedding documents."""

    embed_threads: int = Field(default=0, ge=0, le=256)
    """CPU threads for the embedding model; 0 lets torch decide."""

    busy_timeout_ms: int = Field(default=5000, ge=0, le=600_000)
    """How long a write waits for another connection's lock before giving up."""

    rrf_k: int = Field(default=60, ge=1)
    """The constant k of reciprocal rank fusion, 1/(k + rank): larger flattens the ranking."""

    hnsw_ef_search: int = Field(default=100, ge=1)
    """HNSW search breadth: higher finds more true neighbours, more slowly."""

    hnsw_ef_construction: int = Field(default=100, ge=1)
    """HNSW build breadth: higher builds a better graph, more slowly."""

    hnsw_max_neighbors: int = Field(default=16, ge=2, le=128)
    """HNSW links per node (M)."""

    index_server: str = ""
    """A Chroma server holding the vector index ("http://host:8000", started with `chroma run --path
    DIR --host HOST --port 8000`); empty: the index lives in the data dir. The daemon stays its one
    writer; the data dir's collections are named with a prefix of its own, so data dirs can share a
    server. SQLite stays the truth: an empty or lost server index is rebuilt from it at start."""

    @field_validator("index_server")
    @classmethod
    def _http_address(cls, value: str) -> str:
        if value and not value.startswith(("http://", "https://")):
            raise ValueError("index_server must start with http:// or https://")
        return value.rstrip("/")


class SandboxSettings(_Section):
    """[sandbox] Where model-written code runs: bubblewrap, limits, timeouts."""

    require_isolation: bool = True
    """Refuse to run code when bubblewrap is missing, instead of running it in the clearly
    logged degraded mode (a plain subprocess with limits)."""

    timeout_s: float = Field(default=30.0, gt=0, le=3600)
    """Wall-clock seconds one sandboxed run may take; then its whole process group is killed."""

    cpu_s: int = Field(default=30, ge=1)
    """CPU seconds one sandboxed run may use."""

    memory_mb: int = Field(default=1024, ge=64)
    """Address space of a sandboxed process, in MiB."""

    max_processes: int = Field(default=64, ge=1)
    """Processes the sandbox user may run at once (a fork bomb stops here)."""

    max_open_files: int = Field(default=256, ge=16)
    """Open files per sandboxed process."""

    max_file_mb: int = Field(default=64, ge=1)
    """The largest file a sandboxed process may write, in MiB."""

    tmp_mb: int = Field(default=64, ge=1)
    """Size of the sandbox's private /tmp, and of its /dev/shm, in MiB."""

    task_uids: int = Field(default=4096, ge=0, le=1_000_000)
    """When the daemon runs as root (process limits do not bind root), sandboxed code runs as
    an unprivileged uid of its workspace's own, one of this many from task_uid_base taken in
    turn (gid = uid): the process limit counts a uid's processes machine-wide, so a task
    that used up a shared uid's quota would leave every other task unable to fork. 0: every
    sandbox runs as unprivileged_uid."""

    task_uid_base: int = Field(default=2_000_000_000, ge=1, le=4_293_967_294)
    """The first of the task_uids uids. Pick a range no account or container on this machine
    uses."""

    unprivileged_uid: int = Field(default=65534, ge=1)
    """The uid (and gid) sandboxed code runs as when the daemon runs as root and task_uids is
    0."""


class DaemonSettings(_Section):
    """[daemon] The background service, its files and its socket."""

    data_dir: str = ""
    """Where the store, the index and synthesized tools live. Empty: the user's data dir
    (~/.local/share/evolver on Linux)."""

    runtime_dir: str = ""
    """Where the socket lives (a 0700 directory). Empty: the user's runtime dir
    ($XDG_RUNTIME_DIR/evolver)."""

    workers: int = Field(default=2, ge=1, le=64)
    """Tasks worked on at once."""

    chat_queue: int = Field(default=32, ge=1, le=10_000)
    """Chat turns that may be running or waiting for an agent at once; more are answered 429 with a
    Retry-After (each waits in a thread of its own, never in the API's)."""

    max_body_bytes: int = Field(default=1_048_576, ge=1024)
    """The largest request body the API accepts."""

    lease_s: float = Field(default=300.0, gt=0)
    """How long a worker's claim on a task lasts before another may take it over."""

    max_attempts: int = Field(default=3, ge=1, le=100)
    """Attempts at a task before it is dead-lettered with the reason."""

    shutdown_grace_s: float = Field(default=30.0, ge=0)
    """On SIGTERM, how long running tasks get to reach a step boundary."""

    tcp_port: int = Field(default=0, ge=0, le=65535)
    """Also listen on 127.0.0.1 at this port (0: no TCP listener, only the socket)."""

    tcp_token_env: str = ""
    """The environment variable holding the bearer token the TCP listener requires."""

    @model_validator(mode="after")
    def _tcp_needs_token(self) -> DaemonSettings:
        if self.tcp_port and not self.tcp_token_env:
            raise ValueError("tcp_port is set but tcp_token_env is empty: a TCP listener needs a token")
        return self


class EvolutionSettings(_Section):
    """[evolution] The background meta-agent and the self-modification tree."""

    enabled: bool = True
    """Run background jobs (distill insights, synthesize tools, evolve the scaffold)."""

    distill_every_min: float = Field(default=60.0, gt=0)
    """Distil insights at least this often, in minutes."""

    distill_after: int = Field(default=10, ge=1)
    """...or as soon as this many new trajectories have been recorded."""

    retire_after_exposures: int = Field(default=8, ge=2, le=10_000)
    """Measure each learned insight and tool against the attempts without it: after this many
    attempts with it, one that measurably hurts (its 95% interval below zero) is retired; after
    three times as many, one that shows no benefit is retired too (the hourly "prune" job)."""

    synthesize_every_min: float = Field(default=120.0, gt=0)
    """Look for tools to synthesize at least this often, in minutes."""

    synthesize_after: int = Field(default=20, ge=1)
    """...or after this many new trajectories."""

    tools_per_round: int = Field(default=2, ge=1, le=20)
    """Opportunities a tool-synthesis round takes up at most (one model call each)."""

    tool_min_repeats: int = Field(default=2, ge=2)
    """Similar code must have run in this many different tasks before it becomes a tool."""

    tool_code_similarity: float = Field(default=0.9, gt=0, le=1)
    """Code this similar (cosine, literals aside) counts as a repeat of the same code."""

    tool_dedup_threshold: float = Field(default=0.9, gt=0, le=1)
    """A new tool whose description is this similar to an active tool's is refused as a duplicate."""

    evolve_every_min: float = Field(default=240.0, gt=0)
    """Take a step of the self-modification tree search at least this often, in minutes."""

    wait_for_idle: bool = True
    """Hold background jobs while the inbox has work."""

    max_insights: int = Field(default=50, ge=1)
    """The cap on active insights; over it, downvotes weigh more."""

    insight_merge_threshold: float = Field(default=0.9, gt=0, le=1)
    """A new insight this similar (cosine) to an active one upvotes it instead of being added."""

    packs: list[str] = ["basic"]
    """Task packs whose tasks evaluate scaffold nodes: bundled names or JSONL paths (their "test" split is
    held out from the proposer and decides promotion). Past inbox tasks that carried a check are used too."""

    held_out_share: float = Field(default=0.2, ge=0, lt=1)
    """The share of a person's tasks with a check held out for promotion decisions (decided when each comes in)."""

    evaluation_priority: int = -10
    """The inbox priority of evaluation tasks: below a person's tasks (0), so those never wait behind them."""

    evaluation_slots: int = Field(default=1, ge=0, le=64)
    """Evaluations the tree search keeps in flight on the daemon's workers (0: it steps only on its
    interval and by `evolver evolve`, and hands out no evaluations)."""

    evaluation_budget: int = Field(default=0, ge=0)
    """Evaluations the tree search may spend in all (0: no limit). With a limit, the search cools down:
    its posteriors sharpen as the limit nears, and it stops there."""

    race_start: float = Field(default=0.85, gt=0, le=1)
    """With an evaluation_budget, the share of it after which the search stops expanding and races: each
    evaluation goes to the node with the best lower bound or to its strongest challenger (1: no race)."""

    alpha: float = Field(default=0.6, gt=0, le=1)
    """Expand the tree when t^alpha >= number of nodes (t: evaluations spent)."""

    promotion_quantile: float = Field(default=0.05, gt=0, lt=0.5)
    """A node must beat the incumbent on this lower quantile of its Beta posterior."""

    min_evaluations: int = Field(default=10, ge=1)
    """Held-out evaluations a node needs before it can be promoted, and the incumbent before it can be replaced."""

    require_approval: bool = False
    """Wait for `evolver promote NODE` instead of promoting automatically."""


class BudgetSettings(_Section):
    """[budget] Caps on model spending, in tokens and US dollars."""

    tokens_per_day: int = Field(default=2_000_000, ge=0)
    """Tokens (in + out) all model calls may use per day (0: no cap)."""

    usd_per_day: float = Field(default=5.0, ge=0)
    """Dollars all model calls may cost per day (0: no cap)."""

    tokens_per_task: int = Field(default=200_000, ge=0)
    """Tokens one task may use (0: no cap)."""

    usd_per_task: float = Field(default=0.5, ge=0)
    """Dollars one task may cost (0: no cap)."""

    background_share: float = Field(default=0.5, ge=0, le=1)
    """The share of the daily caps that background evolution may spend."""

    @model_validator(mode="after")
    def _task_within_day(self) -> BudgetSettings:
        if self.tokens_per_day and self.tokens_per_task > self.tokens_per_day:
            raise ValueError("tokens_per_task exceeds tokens_per_day: one task could never use it")
        if self.usd_per_day and self.usd_per_task > self.usd_per_day:
            raise ValueError("usd_per_task exceeds usd_per_day: one task could never use it")
        return self


class McpServerSettings(_Section):
    """One MCP server whose tools the agent is offered."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,30}$")
    """Its name: the agent sees its tools as NAME__TOOL (lowercase letters, digits, _)."""

    command: list[str] = Field(default_factory=list)
    """The command that starts it, speaking MCP over stdio, e.g. ["python", "/path/server.py"]."""

    url: str = ""
    """Or the URL of a streamable-HTTP MCP server (http:// or https://)."""

    env: dict[str, str] = Field(default_factory=dict)
    """Environment variables for its command (only these and PATH, HOME, LANG: not evolver's)."""

    timeout_s: float = Field(default=30.0, gt=0, le=3600)
    """Longest a call of one of its tools may take."""

    @model_validator(mode="after")
    def _one_way_to_reach_it(self) -> McpServerSettings:
        if bool(self.command) == bool(self.url):
            raise ValueError(f"server {self.name!r}: give either command or url")
        if self.url and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"server {self.name!r}: url must start with http:// or https://")
        return self


class McpSettings(_Section):
    """[mcp] MCP servers whose tools the agent is offered like its built-ins, one [[mcp.servers]] table each:
        [[mcp.servers]]
        name = "files"
        command = ["python", "/path/to/server.py"]
    They are yours: they run outside evolver's sandbox, with your rights, and nothing evolver learns can add,
    change or shadow one."""

    servers: list[McpServerSettings] = Field(default_factory=list)
    """The servers (none by default); a server that cannot be started is logged and left out."""

    @model_validator(mode="after")
    def _unique_names(self) -> McpSettings:
        names = [s.name for s in self.servers]
        if len(names) != len(set(names)):
            raise ValueError(f"two servers share a name: {sorted(n for n in set(names) if names.count(n) > 1)}")
        return self


class EvaluatorSettings(_Section):
    """[evaluator] Where the tree search's evaluations of candidate scaffolds run.
    "local": on the daemon's own workers. "ray": shipped to Ray tasks on a Ray cluster (`pip install
    'evolver[ray]'`), which run the same agent in the same sandbox on whichever node they land; their
    results come back to the daemon, which alone writes the store. A node without bubblewrap refuses."""

    backend: Literal["local", "ray"] = "local"
    """Which backend runs evaluations."""

    address: str = ""
    """The Ray cluster to join (such as "ray://10.0.0.5:10001" or "10.0.0.5:6379"); empty: start a
    private local Ray instance on loopback."""

    in_flight: int = Field(default=4, ge=1, le=1024)
    """Evaluations shipped to Ray at once (the tree's evaluation_slots still bounds what it hands out)."""


class Config(BaseModel):
    """All settings, one attribute per section."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: ModelSettings = ModelSettings()
    meta: MetaSettings = MetaSettings()
    agent: AgentSettings = AgentSettings()
    memory: MemorySettings = MemorySettings()
    sandbox: SandboxSettings = SandboxSettings()
    daemon: DaemonSettings = DaemonSettings()
    evolution: EvolutionSettings = EvolutionSettings()
    budget: BudgetSettings = BudgetSettings()
    mcp: McpSettings = McpSettings()
    evaluator: EvaluatorSettings = EvaluatorSettings()
    source: str = Field(default="defaults", exclude=True)
    """Where the file came from, for messages."""

    @property
    def data_dir(self) -> Path:
        return (
            Path(self.daemon.data_dir).expanduser() if self.daemon.data_dir else Path(platformdirs.user_data_dir(APP))
        )

    @property
    def runtime_dir(self) -> Path:
        if self.daemon.runtime_dir:
            return Path(self.daemon.runtime_dir).expanduser()
        with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
            warnings.simplefilter("ignore")
            return Path(platformdirs.user_runtime_dir(APP))


SECTIONS: dict[str, type[_Section]] = {
    name: field.annotation for name, field in Config.model_fields.items() if name != "source"
}

# The settings a person sets, by section: the top of config.toml. Every other key is advanced: a tuning knob
# that lives under [advanced.<section>] in the file (its default is right unless a measurement says not).
SURFACE: dict[str, tuple[str, ...]] = {
    "model": ("name", "local", "api_base", "api_key_env", "timeout_s"),
    "meta": ("name", "local", "api_base", "api_key_env", "timeout_s"),
    "daemon": ("data_dir", "workers"),
    "sandbox": ("require_isolation",),
    "evolution": ("enabled", "packs", "require_approval"),
    "budget": ("tokens_per_day", "usd_per_day"),
    "mcp": ("servers",),
    "evaluator": ("backend",),
}
ADVANCED = "advanced"


def is_advanced(section: str, key: str) -> bool:
    return key not in SURFACE.get(section, ())


def place(section: str, key: str) -> str:
    """Where a key is written in the file: ``[model]`` or ``[advanced.model]``."""
    return f"[{ADVANCED}.{section}]" if is_advanced(section, key) else f"[{section}]"


def _keys(section: str, *, advanced: bool) -> list[str]:
    return [k for k in SECTIONS[section].model_fields if is_advanced(section, k) == advanced]


def default_config_path() -> Path:
    return Path(platformdirs.user_config_dir(APP)) / "config.toml"


def _parse_env_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


_KINDS = {
    int: "a whole number",
    float: "a number",
    bool: "true or false",
    str: "a string",
    list[str]: "a list of strings",
}


def _allowed(section: str, key: str) -> str:
    model = SECTIONS[section]
    field = model.model_fields[key]
    constraints = []
    for meta in field.metadata:
        for attr, word in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"), ("min_length", "length >=")):
            if getattr(meta, attr, None) is not None:
                constraints.append(f"{word} {getattr(meta, attr)}")
    kind = _KINDS.get(field.annotation, str(field.annotation))
    return kind + (f" {' and '.join(constraints)}" if constraints else "")


# Keys that were settings and are no longer, with what became of them: a config file written by an older
# `evolver config init` still loads (the key is ignored, with a warning that says why), for one release.
_BY_PRUNE = "a tool is retired in one place, the prune job, by its measured effect on outcomes"
RETIRED_KEYS = {
    ("model", "max_tokens_chat"): "a chat turn's replies are capped by [advanced.model] max_tokens_step, "
    "as a task's are",
    ("evolution", "tool_retire_min_uses"): _BY_PRUNE,
    ("evolution", "tool_retire_below"): _BY_PRUNE,
    ("daemon", "worker_processes"): "the agent workers always run in processes of their own beside the daemon "
    "(worker threads inside the daemon are gone)",
}

# Settings whose value is the name of a variable holding a secret: that variable is never a setting.
_SECRET_HOLDERS = (("daemon", "tcp_token_env"), ("model", "api_key_env"), ("meta", "api_key_env"))


def _secret_variables(data: dict[str, Any], env: Mapping[str, str]) -> set[str]:
    """The variables the file or the environment names as holding a secret."""
    names = set()
    for section, key in _SECRET_HOLDERS:
        raw = env.get(f"{ENV_PREFIX}{section}_{key}".upper())
        value = _parse_env_value(raw) if raw is not None else data.get(section, {}).get(key)
        if isinstance(value, str) and value:
            names.add(value)
    return names


def _not_a_setting(name: str, section: str, key: str) -> None:
    """Warn about a variable under a setting's section that is no setting, when it looks like a misspelt one;
    otherwise it is another program's (or the person's own) and none of our business."""
    keys = list(SECTIONS[section].model_fields)
    close = difflib.get_close_matches(key, keys, n=1, cutoff=0.8)
    if close:
        log.warning(
            "environment variable %s is not a setting and is ignored: [%s] has no key %r (did you mean %s%s_%s?)",
            name,
            section,
            key,
            ENV_PREFIX,
            section.upper(),
            close[0].upper(),
        )


def _fold_advanced(data: dict[str, Any], file: Path, written: dict[tuple[str, str], str]) -> dict[str, Any]:
    """The file's sections with their [advanced.<section>] keys folded in; ``written`` gets the table each key
    was written in, for messages. A key in the wrong one of the two places: an advanced key in its section
    (an older file) is read with a warning naming its new place; a key of the surface under [advanced.*], or
    a key set in both, is refused."""
    advanced = data.pop(ADVANCED, {})
    if not isinstance(advanced, dict):
        raise ConfigError(f"{file}: {ADVANCED} must be a table of [{ADVANCED}.<section>] tables, not a single value.")
    for section, values in [*data.items(), *((f"{ADVANCED}.{s}", v) for s, v in advanced.items())]:
        name = section.removeprefix(f"{ADVANCED}.")
        if name not in SECTIONS:
            raise ConfigError(
                f"{file}: unknown section [{section}]; the sections are "
                + ", ".join(f"[{s}]" for s in SECTIONS)
                + f", and [{ADVANCED}.<section>] for each of them."
            )
        if not isinstance(values, dict):
            raise ConfigError(f"{file}: {section} must be a [{section}] table, not a single value.")
    folded = {section: dict(values) for section, values in data.items()}
    for section, values in data.items():
        for key in values:
            written[(section, key)] = f"[{section}]"
            if key in SECTIONS[section].model_fields and is_advanced(section, key):
                log.warning(
                    "%s: [%s] %s has moved to %s (an advanced setting); it is read from [%s] for this release",
                    file,
                    section,
                    key,
                    place(section, key),
                    section,
                )
    for section, values in advanced.items():
        for key, value in values.items():
            if key in SECTIONS[section].model_fields and not is_advanced(section, key):
                raise ConfigError(
                    f"{file}: [{ADVANCED}.{section}] {key} is not an advanced setting: set it in [{section}]."
                )
            if key in folded.get(section, {}):
                raise ConfigError(f"{file}: {key} is set in both [{section}] and [{ADVANCED}.{section}]: keep one.")
            folded.setdefault(section, {})[key] = value
            written[(section, key)] = f"[{ADVANCED}.{section}]"
    return folded


def load_config(
    path: Path | str | None = None, *, env: Mapping[str, str] | None = None, secret_variables: Collection[str] = ()
) -> Config:
    """Read the settings. Raises ``ConfigError`` with a readable message, never a traceback.
    ``secret_variables``: variables the command was told hold a secret (``--token-env``), never read as settings."""
    env = os.environ if env is None else env
    explicit = path is not None or bool(env.get("EVOLVER_CONFIG"))
    file = Path(path or env.get("EVOLVER_CONFIG") or default_config_path()).expanduser()
    data: dict[str, Any] = {}
    origin: dict[tuple[str, str], str] = {}
    written: dict[tuple[str, str], str] = {}  # the table a key of the file was written in
    if file.exists() or explicit:
        try:
            data = tomllib.loads(file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"{file}: no such config file.") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{file}: cannot be read ({exc}).") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{file}: not valid TOML: {exc}.") from None
        data = _fold_advanced(data, file, written)
        for section, values in data.items():
            for key in values:
                origin[(section, key)] = str(file)
    for (section, key), why in RETIRED_KEYS.items():
        if isinstance(data.get(section), dict) and key in data[section]:
            del data[section][key]
            table = written.get((section, key), f"[{section}]")
            log.warning("%s: %s %s is no longer a setting and is ignored: %s; remove it", file, table, key, why)
    secrets = _secret_variables(data, env) | set(secret_variables)
    for name, raw in env.items():
        if not name.startswith(ENV_PREFIX) or name == "EVOLVER_CONFIG" or name in secrets:
            continue
        section, _, key = name[len(ENV_PREFIX) :].lower().partition("_")
        if section not in SECTIONS:
            continue  # another program's variable (EVOLVER_TCP_TOKEN): not ours to refuse
        if key not in SECTIONS[section].model_fields:
            _not_a_setting(name, section, key)
            continue
        data.setdefault(section, {})[key] = _parse_env_value(raw)
        origin[(section, key)] = f"environment variable {name}"
    try:
        return Config(**data, source=str(file) if file.exists() else "defaults")
    except ValidationError as exc:
        raise ConfigError(_explain(exc, origin, written, file)) from None


def _explain(
    exc: ValidationError, origin: dict[tuple[str, str], str], written: dict[tuple[str, str], str], file: Path
) -> str:
    lines = []
    for error in exc.errors():
        loc = [str(p) for p in error["loc"]]
        section = loc[0] if loc else ""
        key = loc[1] if len(loc) > 1 else ""
        where = origin.get((section, key), str(file))
        table = written.get((section, key)) or (place(section, key) if section in SECTIONS else f"[{section}]")
        field = SECTIONS[section].model_fields.get(key) if section in SECTIONS else None
        if len(loc) > 2 and field is not None and field.annotation not in _KINDS:  # in a table ([[mcp.servers]])
            path = key + "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in loc[2:])
            message = error["msg"].removeprefix("Value error, ")
            shown = "" if error["type"] == "missing" else f" = {error.get('input')!r}"
            lines.append(f"{where}: {table} {path}{shown} is refused: {message}.")
        elif error["type"] == "extra_forbidden" and section in SECTIONS:
            surface, advanced = _keys(section, advanced=False), _keys(section, advanced=True)
            allowed = (f"the keys of [{section}] are: {', '.join(surface)}; " if surface else "") + (
                f"those of [{ADVANCED}.{section}]: {', '.join(advanced)}"
            )
            lines.append(f"{where}: unknown key {key!r} in {written.get((section, key), f'[{section}]')}; {allowed}.")
        elif key and section in SECTIONS and key in SECTIONS[section].model_fields:
            lines.append(
                f"{where}: {table} {key} = {error.get('input')!r} is refused: "
                f"{error['msg']} (allowed: {_allowed(section, key)})."
            )
        else:
            message = error["msg"].removeprefix("Value error, ")
            lines.append(f"{where}: [{section}] {message}.")
    return "\n".join(lines)


# --- the documented config.toml -------------------------------------------------


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def render_config() -> str:
    """The documented default config.toml, generated from the models' docstrings: the settings a person
    sets first, then the advanced ones, each with its default and what it does."""
    out = [
        "# evolver configuration. Every setting, with its default and what it does.",
        "# Copy to ~/.config/evolver/config.toml (or pass --config PATH) and change what you need;",
        "# any setting can also be overridden by an environment variable EVOLVER_<SECTION>_<KEY>.",
        "# This file is generated from evolver/config.py (`evolver config show --defaults`).",
    ]
    for name, model in SECTIONS.items():
        keys = _keys(name, advanced=False)
        if keys:
            out.append("")
            out += [f"# {line.strip()}" for line in (model.__doc__ or "").strip().splitlines()]
            out.append(f"[{name}]")
            out += _render_keys(name, model, keys)
    out += [
        "",
        "# ---------------------------------------------------------------------------------------------",
        "# Advanced: tuning knobs, each with its reason. Their defaults are measured or reasoned; change",
        "# one when a measurement on your machine says so. Same names in the environment (EVOLVER_<SECTION>_<KEY>).",
    ]
    for name, model in SECTIONS.items():
        keys = _keys(name, advanced=True)
        if keys:
            out.append("")
            title = (model.__doc__ or "").strip().splitlines()[0].removeprefix(f"[{name}]").strip()
            out.append(f"# {title}")
            out.append(f"[{ADVANCED}.{name}]")
            out += _render_keys(name, model, keys)
    return "\n".join(out) + "\n"


def _render_keys(name: str, model: type[_Section], keys: list[str]) -> list[str]:
    out = []
    for key in keys:
        field = model.model_fields[key]
        out.append("")
        for line in (field.description or "").splitlines():
            out.append(f"# {line.strip()}")
        default = field.get_default(call_default_factory=True)
        if isinstance(default, list) and not default and model is McpSettings:
            out.append(f"# {key}: add [[{name}.{key}]] tables (above)")  # `servers = []` would clash with them
            continue
        out.append(f"{key} = {_toml_value(default)}")
    return out
