"""The agent: the loop that solves one task, the scaffold it is parameterized by, and its wiring.

``Agent`` runs a task (context from memory, model calls, tool calls in the
sandbox, the verifier's verdict, reflect-and-retry); ``Scaffold`` is the
editable part (prompts, parameters, tools, hooks); ``Toolbox`` offers the
synthesized tools the store says are active; ``Engine`` builds all of it from
the user's settings.

Imports: ``judge`` (checks and the verifier), ``llm``, ``evolver.config`` and
``storage``, and the ``memory``, ``tools`` and ``sandbox`` packages; never the
tree, the meta-agent, the service, the API or the CLI.
"""

from .engine import Engine, sandbox_limits
from .loop import Agent, TaskResult
from .scaffold import Scaffold, ScaffoldError, default_scaffold, load_scaffold
from .toolbox import Toolbox

__all__ = [
    "Agent",
    "TaskResult",
    "Engine",
    "sandbox_limits",
    "Scaffold",
    "ScaffoldError",
    "default_scaffold",
    "load_scaffold",
    "Toolbox",
]
