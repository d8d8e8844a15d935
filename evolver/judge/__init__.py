"""The judge: checks, the verifier, task packs and HumanEval — what evolution may never edit.

A check says how an answer is judged (``checks``); the verifier runs it
(``verify``), in the sandbox whenever it runs code; task packs and HumanEval
are the evaluation tasks with their checks (``taskpack``, ``humaneval``,
``catalog``). Every file here is part of the harness the canaries protect.

Imports: only the ``sandbox`` package (and the standard library); nothing that
evolution can change (agent, llm, meta, tree) nor what runs it (service, api,
cli).
"""

from .catalog import resolve_pack
from .checks import (
    AnswerCheck,
    Check,
    CheckError,
    CommandCheck,
    PythonCheck,
    parse_check,
)
from .taskpack import (
    SPLITS,
    PackTask,
    TaskPackError,
    bundled_pack,
    load_pack,
    parse_pack,
)
from .verify import Verdict, verify

__all__ = [
    "Check",
    "AnswerCheck",
    "CommandCheck",
    "PythonCheck",
    "CheckError",
    "parse_check",
    "Verdict",
    "verify",
    "PackTask",
    "TaskPackError",
    "SPLITS",
    "load_pack",
    "parse_pack",
    "bundled_pack",
    "resolve_pack",
]
