"""The model layer: every model call goes through litellm here.

``ModelClient`` adds retries, timeouts, fallbacks, the text tool-call fallback
for models without native tool calls, and a token and cost ledger; the
``BudgetGuard`` refuses calls over the day's caps (background work has its own
share); ``scripted`` is the deterministic offline model, a litellm custom
provider used by the tests and the demo.

Imports: ``evolver.config`` and ``memory`` (the ledger), nothing else of evolver.
"""

from .budget import BACKGROUND_PURPOSES, BudgetExceeded, BudgetGuard
from .client import Model, ModelClient, ModelError, ModelReply, ToolCall

__all__ = [
    "Model",
    "ModelClient",
    "ModelReply",
    "ModelError",
    "ToolCall",
    "BudgetGuard",
    "BudgetExceeded",
    "BACKGROUND_PURPOSES",
    "scripted",
]
