"""Tools: specs with schemas derived from typed signatures, the registry, the built-ins,
and running a task's tool calls in the sandbox. Depends only on ``sandbox``."""

from .builtin import BUILTIN_SOURCES, Observation, TaskTools, builtin_specs
from .library import ToolFileError, ToolFiles
from .quarantine import QuarantineReport, Replay, defined_tests, quarantine
from .registry import ToolRegistry
from .session import SESSION_BUILTINS, signature
from .spec import ToolSpec, ToolSpecError, code_hash, schema_for_call, spec_from_source

__all__ = [
    "ToolSpec",
    "ToolSpecError",
    "spec_from_source",
    "schema_for_call",
    "ToolRegistry",
    "builtin_specs",
    "BUILTIN_SOURCES",
    "TaskTools",
    "Observation",
    "SESSION_BUILTINS",
    "signature",
    "ToolFiles",
    "ToolFileError",
    "code_hash",
    "quarantine",
    "QuarantineReport",
    "Replay",
    "defined_tests",
]
