"""The agent: the loop that solves one task, the scaffold it is parameterized by, and its wiring.

``Agent`` runs a task (context from memory, model calls, tool calls in the
sandbox, the verifier's verdict, reflect-and-retry); ``Scaffold`` is the
editable part (prompts, parameters, tools, hooks); ``Toolbox`` offers the
synthesized tools the store says are active; ``evolver.engine.Engine`` builds
all of it from the user's settings.

Imports: ``judge`` (checks and the verifier), ``llm``, ``evolver.config``, the
``tools`` and ``sandbox`` packages, and of ``memory`` only the store's
agent-facing role (``memory.roles.AgentStore``), its records and errors; never
the store itself, the tree, the meta-agent, the service, the API or the CLI.
"""

from .loop import Agent, TaskResult
from .scaffold import Scaffold, ScaffoldError, default_scaffold, load_scaffold
from .toolbox import Toolbox

__all__ = [
    "Agent",
    "TaskResult",
    "Scaffold",
    "ScaffoldError",
    "default_scaffold",
    "load_scaffold",
    "Toolbox",
]
