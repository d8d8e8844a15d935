"""ToolSpec: one tool as data, with its JSON schema derived from a typed signature.

A tool is one Python function with annotated parameters and a docstring. Its
schema is never written by hand (or by a model): it is read off the signature
with ``ast``, without importing or running the code, so a spec can be built
for code that has not been trusted yet.
"""

from __future__ import annotations

import ast
import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = ["ToolSpec", "ToolSpecError", "spec_from_source", "schema_for_call", "code_hash"]


class ToolSpecError(ValueError):
    """The tool's code cannot become a tool; the message says which rule it breaks."""


_SIMPLE = {
    "str": {"type": "string"},
    "int": {"type": "integer"},
    "float": {"type": "number"},
    "bool": {"type": "boolean"},
    "dict": {"type": "object"},
    "list": {"type": "array"},
    "Any": {},
    "None": {"type": "null"},
}


def _annotation_schema(node: ast.expr | None, where: str) -> dict:
    if node is None:
        raise ToolSpecError(f"{where} has no type annotation; every parameter of a tool needs one")
    if isinstance(node, ast.Constant) and node.value is None:
        return {"type": "null"}
    if isinstance(node, ast.Name) and node.id in _SIMPLE:
        return dict(_SIMPLE[node.id])
    if isinstance(node, ast.Attribute) and node.attr in _SIMPLE:  # typing.Any
        return dict(_SIMPLE[node.attr])
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):  # X | None
        return {"anyOf": [_annotation_schema(node.left, where), _annotation_schema(node.right, where)]}
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        outer, inner = node.value.id, node.slice
        if outer in ("list", "List"):
            return {"type": "array", "items": _annotation_schema(inner, where)}
        if outer in ("dict", "Dict"):
            return {"type": "object"}
        if outer == "Optional":
            return {"anyOf": [_annotation_schema(inner, where), {"type": "null"}]}
        if outer == "Literal":
            values = inner.elts if isinstance(inner, ast.Tuple) else [inner]
            if all(isinstance(v, ast.Constant) for v in values):
                return {"enum": [v.value for v in values]}
    raise ToolSpecError(
        f"{where} has an annotation tools cannot take ({ast.unparse(node)}); "
        "use str, int, float, bool, list[...], dict, Literal[...] or X | None"
    )


def _docstring_parts(doc: str) -> tuple[str, dict[str, str]]:
    """The description (text before an Args: section) and per-parameter descriptions."""
    summary, params, current = [], {}, None
    in_args = False
    for line in doc.strip().splitlines():
        stripped = line.strip()
        if re.fullmatch(r"(Args|Arguments|Parameters):", stripped):
            in_args = True
            continue
        if in_args and re.fullmatch(r"(Returns|Raises|Examples?):", stripped):
            in_args = False
            continue
        if in_args:
            m = re.match(r"(\w+)\s*(\([^)]*\))?\s*:\s*(.*)", stripped)
            if m:
                current = m.group(1)
                params[current] = m.group(3)
            elif current and stripped:
                params[current] += " " + stripped
        elif not params:
            summary.append(stripped)
    return " ".join(s for s in summary if s).strip(), params


def code_hash(code: str, tests: str) -> str:
    """The identity of one version of a tool: its code and its tests together."""
    return hashlib.sha256((code + "\n#tests\n" + tests).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the keyword arguments
    code: str = ""  # the function's source; empty for built-ins implemented by the host
    tests: str = ""  # pytest-style test functions for synthesized tools
    origin: str = "builtin"  # or "synthesized"
    version: int = 1
    node_id: str | None = None
    returns: dict[str, Any] = field(default_factory=dict)
    tool_id: int | None = None  # the store's row, for a synthesized tool: its usage is counted there
    # A tool the host carries out itself, outside the sandbox (an MCP server the user configured, origin
    # "mcp"): called with the arguments, it returns (ok, text).
    runner: Callable[[dict[str, Any]], tuple[bool, str]] | None = field(default=None, compare=False, repr=False)

    @property
    def code_hash(self) -> str:
        return code_hash(self.code, self.tests)

    def openai_schema(self) -> dict:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def with_version(self, version: int) -> ToolSpec:
        return replace(self, version=version)


NAME = re.compile(r"^[a-z][a-z0-9_]{1,63}$")


def spec_from_source(
    code: str, *, name: str | None = None, tests: str = "", origin: str = "synthesized", node_id: str | None = None
) -> ToolSpec:
    """Build a spec from source holding one public top-level function (helpers may start with _)."""
    try:
        module = ast.parse(code)
    except SyntaxError as exc:
        raise ToolSpecError(f"the tool's code does not parse: line {exc.lineno}: {exc.msg}") from None
    functions = [n for n in module.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")]
    if name is not None:
        functions = [f for f in functions if f.name == name]
    if len(functions) != 1:
        found = ", ".join(f.name for f in functions) or "none"
        raise ToolSpecError(f"a tool is exactly one public function{f' named {name}' if name else ''}; found {found}")
    fn = functions[0]
    if not NAME.match(fn.name):
        raise ToolSpecError(f"tool name {fn.name!r} must be lower_snake_case, 2 to 64 characters")
    doc = ast.get_docstring(fn)
    if not doc:
        raise ToolSpecError(f"{fn.name} has no docstring; it is the tool's description for the model")
    args = fn.args
    if args.vararg or args.kwarg or args.posonlyargs:
        raise ToolSpecError(f"{fn.name}: *args, **kwargs and positional-only parameters cannot be described to a model")
    description, param_docs = _docstring_parts(doc)
    properties, required = {}, []
    defaults = [None] * (len(args.args) - len(args.defaults)) + list(args.defaults)
    for arg, default in [*zip(args.args, defaults), *zip(args.kwonlyargs, args.kw_defaults)]:
        schema = _annotation_schema(arg.annotation, f"parameter {arg.arg!r} of {fn.name}")
        if arg.arg in param_docs:
            schema["description"] = param_docs[arg.arg]
        if default is None:
            required.append(arg.arg)
        elif isinstance(default, ast.Constant):
            schema["default"] = default.value
        properties[arg.arg] = schema
    returns = _annotation_schema(fn.returns, f"the return value of {fn.name}") if fn.returns else {}
    parameters = {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    return ToolSpec(
        name=fn.name,
        description=description or fn.name,
        parameters=parameters,
        code=code,
        tests=tests,
        origin=origin,
        node_id=node_id,
        returns=returns,
    )


_JSON_TYPES = {
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "object": dict,
    "array": list,
    "null": type(None),
}


def _type_errors(value: Any, schema: dict, where: str) -> list[str]:
    if "anyOf" in schema:
        if any(not _type_errors(value, option, where) for option in schema["anyOf"]):
            return []
        return [f"{where} does not match any allowed type"]
    if "enum" in schema:
        return [] if value in schema["enum"] else [f"{where} must be one of {schema['enum']}"]
    kind = schema.get("type")
    if kind is None:
        return []
    expected = _JSON_TYPES[kind]
    if isinstance(value, bool) and kind in ("integer", "number"):
        return [f"{where} must be {kind}, not a boolean"]
    if not isinstance(value, expected):
        return [f"{where} must be {kind}, not {type(value).__name__}"]
    if kind == "array" and "items" in schema:
        return [e for n, item in enumerate(value) for e in _type_errors(item, schema["items"], f"{where}[{n}]")]
    return []


def schema_for_call(spec: ToolSpec, arguments: Any) -> list[str]:
    """What is wrong with these arguments for this tool (empty when they fit)."""
    if not isinstance(arguments, dict):
        return ["arguments must be a JSON object"]
    schema = spec.parameters
    props = schema.get("properties", {})
    errors = [f"missing required argument {r!r}" for r in schema.get("required", []) if r not in arguments]
    errors += [f"unknown argument {k!r} (known: {', '.join(props) or 'none'})" for k in arguments if k not in props]
    for key, value in arguments.items():
        if key in props:
            errors += _type_errors(value, props[key], f"argument {key!r}")
    return errors
