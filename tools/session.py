"""The task's tools as plain Python functions inside its persistent sandboxed session.

In code actions the model writes Python, and what it can do is what the session
defines: the built-ins (files and shell), the task's synthesized tools, and
``finish(answer)`` (defined by the worker loop itself). The built-ins here run
inside the sandbox like any code of the model's, so the sandbox is their only
boundary, as it is for ``run_python``: they are conveniences with the same
names, arguments and results as the tools, not a new door. Each call of a
synthesized tool is counted in the session, and ``uses()`` collects the counts
for the tool's usage statistics.
"""

from __future__ import annotations

import inspect

from .spec import ToolSpec

__all__ = ["SESSION_BUILTINS", "session_prelude", "signature", "USES_FUNCTION"]

USES_FUNCTION = "_evolver_tool_uses"
SESSION_BUILTINS = ("read_file", "write_file", "list_files", "run_shell", "finish")

_BUILTINS = '''
import os as _evolver_os
import subprocess as _evolver_subprocess


def read_file(path: str) -> str:
    """Read a text file from the workspace."""
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()


def write_file(path: str, content: str) -> str:
    """Write a text file in the workspace, creating parent directories."""
    folder = _evolver_os.path.dirname(path)
    if folder:
        _evolver_os.makedirs(folder, exist_ok=True)
    data = str(content).encode("utf-8")
    with open(path, "wb") as handle:
        handle.write(data)
    return f"wrote {len(data)} bytes to {path}"


def list_files(path: str = ".") -> str:
    """List a directory of the workspace (kind, size, name)."""
    lines = []
    for entry in sorted(_evolver_os.scandir(path), key=lambda e: e.name):
        kind = "dir" if entry.is_dir(follow_symlinks=False) else "link" if entry.is_symlink() else "file"
        size = entry.stat(follow_symlinks=False).st_size if kind == "file" else 0
        lines.append(f"{kind}\\t{size}\\t{entry.name}")
    return "\\n".join(lines) or "[empty]"


def run_shell(command: str) -> str:
    """Run a shell command (sh -c) in the workspace; returns exit code, stdout and stderr."""
    done = _evolver_subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True,
                                   stdin=_evolver_subprocess.DEVNULL, errors="replace")
    text = f"exit code {done.returncode}"
    if done.stdout:
        text += "\\n" + done.stdout.rstrip()
    if done.stderr:
        text += "\\n[stderr]\\n" + done.stderr.rstrip()
    return text


_evolver_uses = []


def _evolver_tool_uses():
    """The synthesized tools' calls since the last ask: [[name, ok], ...]."""
    taken = list(_evolver_uses)
    del _evolver_uses[:]
    return taken


def _evolver_counted(name, function):
    def counted(*args, **kwargs):
        try:
            result = function(*args, **kwargs)
        except Exception:
            _evolver_uses.append([name, False])
            raise
        _evolver_uses.append([name, True])
        return result
    counted.__name__, counted.__doc__, counted.__wrapped__ = function.__name__, function.__doc__, function
    return counted


def _evolver_load(name, code):
    """Define one synthesized tool; one that does not load is left out, and the load says why."""
    space = dict(globals())
    try:
        exec(compile(code, f"<tool {name}>", "exec"), space)
        globals()[name] = _evolver_counted(name, space[name])
    except Exception as exc:
        print(f"[tool {name} could not be loaded: {type(exc).__name__}: {exc}]")
'''


def session_prelude(synthesized: list[ToolSpec]) -> str:
    """The source a fresh session runs first: the built-ins as functions, then each synthesized tool."""
    loads = "".join(f"_evolver_load({spec.name!r}, {spec.code!r})\n" for spec in synthesized if spec.code)
    return _BUILTINS + loads


def signature(spec: ToolSpec) -> str:
    """``name(arg: type, ...)`` and the first line of its description, as the model is shown it."""
    types = {"string": "str", "integer": "int", "number": "float", "boolean": "bool", "array": "list", "object": "dict"}
    properties = spec.parameters.get("properties", {})
    required = set(spec.parameters.get("required", []))
    params = []
    for name, schema in properties.items():
        kind = types.get(schema.get("type"), "object") if isinstance(schema, dict) else "object"
        params.append(f"{name}: {kind}" + ("" if name in required else " = ..."))
    summary = inspect.cleandoc(spec.description or "").split("\n", 1)[0]
    return f"{spec.name}({', '.join(params)})" + (f": {summary}" if summary else "")
