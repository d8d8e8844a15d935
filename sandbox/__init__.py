"""Isolated execution of model-written code (bubblewrap, limits, timeouts).

Every piece of model-written code runs here, never in the daemon's process. The
package depends on no other package of the project (standard library only).

    make_sandbox()                    -> Sandbox (BubblewrapSandbox, or DegradedSandbox if allowed)
    Sandbox.run(argv, workspace=…)    -> RunResult   one command, in a fresh sandbox
    Sandbox.python(code, workspace=…) -> RunResult   one Python snippet
    Sandbox.worker(workspace)         -> PythonWorker   a warm interpreter per task
    PythonWorker.execute(code) / .call(name, kwargs) -> ExecResult
    run_judged(sandbox, workspace, job) -> Judged   a check's verdict the judged code cannot forge
    read_text / read_bytes / write_text / list_dir   host-side file access that never leaves the workspace

Errors (everything sandboxed code does comes back as data instead):

    SandboxError
    ├── SandboxUnavailable   isolation demanded, bubblewrap missing or not working
    └── WorkspaceError       a path that leaves the workspace
"""

from .base import Sandbox
from .bwrap import WORKSPACE, BubblewrapSandbox
from .degraded import DegradedSandbox
from .errors import SandboxError, SandboxUnavailable, WorkspaceError
from .factory import make_sandbox
from .judged import Judged, run_judged
from .limits import Limits
from .result import ExecResult, RunResult
from .worker import PythonWorker
from .workspace import Entry, list_dir, read_bytes, read_text, write_text

__all__ = [
    "WORKSPACE",
    "BubblewrapSandbox",
    "DegradedSandbox",
    "Entry",
    "ExecResult",
    "Judged",
    "Limits",
    "PythonWorker",
    "RunResult",
    "Sandbox",
    "SandboxError",
    "SandboxUnavailable",
    "WorkspaceError",
    "list_dir",
    "make_sandbox",
    "read_bytes",
    "read_text",
    "run_judged",
    "write_text",
]
