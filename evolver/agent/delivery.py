"""Handing in what a code task asked for, and trying the task's own examples first.

A small model defines the requested function in its session and then never writes
the file (its code would have to travel inside a JSON string). So the agent keeps
the code its session ran, and an attempt that defined the function delivers it: the
module is rebuilt from that code (its imports, then the last definition of each
function, class and constant; never the calls and prints around them). A file the
agent wrote itself wins. The judge does not change: it loads the file in its own
process.

Before an attempt finishes, the examples the task itself gives (doctest lines, or
``f(1) == 2`` lines naming a requested function, with literal arguments and results)
are run against what would be delivered, in a fresh sandboxed process, so a failure
comes back to the model as an observation it can repair. The held-out check's own
tests are never used: only the task's text.

A draft comes first (``draft_code``): the model completes the task's own stub, as it
would alone, and the code it wrote is read the way a plain completion is read.
"""

from __future__ import annotations

import ast
import json
import re
import secrets
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

from sandbox import Limits, Sandbox, SandboxError, read_text

from ..judge.deliverable import Deliverable

__all__ = [
    "FENCE",
    "PYTHON",
    "Example",
    "task_examples",
    "task_stub",
    "draft_code",
    "module_source",
    "delivered_source",
    "try_examples",
]

EXAMPLE_TIMEOUT_S = 10.0
MAX_EXAMPLES = 12
# A fenced block: its language, then its text (one left open at the end of a reply counts).
FENCE = re.compile(r"```([A-Za-z0-9_+-]*)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
PYTHON = ("", "python", "py", "python3")  # the languages of a Python block


@dataclass(frozen=True)
class Example:
    call: str  # an expression calling a requested function with literal arguments
    expected: str  # its result as the task writes it (a literal, or a repr)


def _literal_call(expr: str, functions: tuple[str, ...]) -> bool:
    try:
        node = ast.parse(expr, mode="eval").body
    except SyntaxError:
        return False
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in functions):
        return False
    try:
        for arg in [*node.args, *(k.value for k in node.keywords)]:
            ast.literal_eval(arg)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def _literal(text: str) -> bool:
    try:
        with warnings.catch_warnings():  # "4ish" in a task's prose is no literal, and no warning either
            warnings.simplefilter("ignore", SyntaxWarning)
            ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def task_examples(prompt: str, functions: tuple[str, ...]) -> list[Example]:
    """The examples the task's text gives for the requested functions (at most ``MAX_EXAMPLES``): doctest
    lines, and calls with literal arguments followed by what they give, wherever they stand in a sentence
    ("e.g. f('aaabcc') == 'a3b1c2'", "f(0) is []", "f(1) ➞ 2", "f(3) should return 6")."""
    found: list[Example] = []
    lines = prompt.splitlines()
    for n, line in enumerate(lines):  # doctest lines: ">>> f(1)" and its result on the next line(s)
        head = line.strip()
        if not head.startswith(">>>"):
            continue
        call, want = head[3:].strip(), []
        for after in lines[n + 1 :]:
            text = after.strip()
            if not text or text.startswith((">>>", '"""', "'''", "```")):
                break
            want.append(text)
        expected = " ".join(want)
        if expected and _literal_call(call, functions):
            found.append(Example(call, expected))
    for example in _inline_examples(prompt, functions):
        if not any(e.call == example.call for e in found):  # a doctest line of the same call wins
            found.append(example)
    return found[:MAX_EXAMPLES]


# What a call "gives" in the words of a task, between the call and its result.
_GIVES = re.compile(
    r"\s*(?:==>|➞|→|=>|->|==|should return|should give|should be|returns|return|gives|give|is|equals|"
    r"yields|evaluates to|outputs|produces)\s*",
    re.IGNORECASE,
)
_LONGEST = 300  # characters of a result literal


def _call_end(text: str, start: int) -> int | None:
    """The index just past the parenthesis that closes the one at ``start`` (strings respected)."""
    depth, quote, n = 0, "", start
    while n < len(text):
        c = text[n]
        if quote:
            if c == "\\":
                n += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return n + 1
        n += 1
    return None


# What may not follow a result: an operator (the text goes on computing, "-> 19 - 5 - 6 = 8"), or a letter,
# digit or quote right against it (`== ""aaaaaaa"` is a typo, not the empty string).
_GOES_ON = re.compile(r"[ \t]*(?:[-+*/%<>]|==?)[ \t]*[\w(\[{'\"]|[\w'\"]")


def _result_literal(text: str) -> str | None:
    """The longest literal that ``text`` starts with and that ends there (a bare tuple only in parentheses:
    in "f(2) == 4, f(3) == 9" the result is 4)."""
    for end in range(min(len(text), _LONGEST), 0, -1):
        head = text[:end].strip()
        if text[end - 1].isspace() or not head or not _literal(head):
            continue
        if isinstance(ast.parse(head, mode="eval").body, ast.Tuple) and not head.startswith("("):
            continue
        if _GOES_ON.match(text, end):
            return None  # the longest literal here is part of something longer: no result to read
        if head.endswith(".") and _literal(head[:-1]):  # the sentence's full stop, not "9."
            head = head[:-1]
        return head
    return None


def _inline_examples(prompt: str, functions: tuple[str, ...]) -> list[Example]:
    found: list[Example] = []
    text = prompt.replace(">>>", " ")
    for match in re.finditer(r"(?<![\w.])(" + "|".join(map(re.escape, functions)) + r")\(", text):
        end = _call_end(text, match.end() - 1)
        if end is None:
            continue
        call = text[match.start() : end]
        gives = _GIVES.match(text, end)
        if gives is None or not _literal_call(call, functions):
            continue
        expected = _result_literal(text[gives.end() :].lstrip("`"))
        if expected is not None and Example(call, expected) not in found:
            found.append(Example(call, expected))
    return found


def task_stub(prompt: str, functions: tuple[str, ...]) -> str | None:
    """The code the task gives for a requested function (its fenced python block with the signature and the
    docstring), if it gives one."""
    for match in FENCE.finditer(prompt):
        if match[1].lower() in PYTHON and _defines(match[2], functions):
            return match[2]
    return None


def _defines(code: str, functions: tuple[str, ...]) -> bool:
    """Whether the text has a ``def`` line of a requested function (read as a completion is: no parsing)."""
    return any(f"def {f}(" in code for f in functions)


def draft_code(reply: str, stub: str | None, functions: tuple[str, ...]) -> str:
    """The code of a draft reply, as a plain completion is read: its first block that defines a requested
    function (else its first block, else the reply). After the stub, so the stub's imports and helpers are
    there: a whole definition then replaces the stub's, a bare body continues it."""
    blocks = [m[2] for m in FENCE.finditer(reply)]
    code = next((b for b in blocks if _defines(b, functions)), blocks[0] if blocks else reply)
    if stub is None:
        return code
    if _defines(code, functions):
        return stub + "\n\n" + code
    return stub + code


def module_source(blocks: list[str], functions: tuple[str, ...]) -> str | None:
    """A module rebuilt from the code a session ran: its imports, then the last top-level definition of
    each name (functions, classes, constants without calls); None when no requested function is defined."""
    imports: dict[str, None] = {}
    definitions: dict[str, ast.stmt] = {}
    for block in blocks:
        try:
            tree = ast.parse(block)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                imports[ast.unparse(node)] = None
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not _stub(node):
                definitions.pop(node.name, None)  # its latest definition's place
                definitions[node.name] = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and _constant(node):
                for name in _targets(node):
                    definitions.pop(name, None)
                    definitions[name] = node
    if not any(
        name in definitions and not isinstance(definitions[name], (ast.Assign, ast.AnnAssign)) for name in functions
    ):
        return None
    seen: set[int] = set()
    body = []
    for node in definitions.values():
        if id(node) not in seen:
            seen.add(id(node))
            body.append(ast.unparse(node))
    return "\n".join(imports) + ("\n\n\n" if imports else "") + "\n\n\n".join(body) + "\n"


def _stub(node: ast.stmt) -> bool:
    """A function whose body is only a docstring, ``pass`` or ``...``: the task's signature echoed back,
    not a definition (a small model often starts by copying the task's stub)."""
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    return all(
        isinstance(n, ast.Pass) or (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)) for n in node.body
    )


def _targets(node: ast.Assign | ast.AnnAssign) -> list[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return [t.id for t in targets if isinstance(t, ast.Name)]


def _constant(node: ast.Assign | ast.AnnAssign) -> bool:
    """An assignment of names to a literal (a table, a limit) or a lambda: what a module may hold without
    the session's other state (``x = frame.f_locals[...]`` would not load in a file)."""
    names = _targets(node)
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    if not names or len(names) != len(targets) or node.value is None:
        return False
    return isinstance(node.value, ast.Lambda) or _literal(ast.unparse(node.value))


def delivered_source(workspace: Path, deliverable: Deliverable, blocks: list[str]) -> tuple[str | None, bool]:
    """What would be handed in, and whether the agent wrote the file itself (which then wins)."""
    if (Path(workspace) / deliverable.file).is_file():
        try:
            return read_text(workspace, deliverable.file, max_bytes=1 << 20), True
        except (OSError, SandboxError, ValueError):
            return None, True
    return module_source(blocks, deliverable.functions), False


_RUNNER = """import ast, json, math
SOURCE, FILE, EXAMPLES, MARK = {source!r}, {file!r}, {examples!r}, {mark!r}
failures = []
space = {{"__name__": FILE[:-3].replace("/", ".")}}
try:
    exec(compile(SOURCE, FILE, "exec"), space)
except BaseException as exc:
    failures.append(f"{{FILE}} does not load: {{type(exc).__name__}}: {{exc}}")
    EXAMPLES = []
for call, want in EXAMPLES:
    try:
        got = eval(call, space)
    except Exception as exc:
        failures.append(f"{{call}} raised {{type(exc).__name__}}: {{exc}} (the task says {{want}})")
        continue
    try:
        expected = ast.literal_eval(want)
        same = got == expected or (isinstance(got, float) and isinstance(expected, (int, float))
                                   and math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-9))
    except (ValueError, TypeError, SyntaxError):
        same = repr(got) == want
    if not same:
        failures.append(f"{{call}} returned {{got!r}}, but the task says {{want}}")
print(MARK + json.dumps(failures))
"""


def try_examples(
    sandbox: Sandbox, workspace: Path, file: str, source: str, examples: list[Example], limits: Limits | None
) -> list[str]:
    """Run the examples against ``source`` in a fresh sandboxed process; what failed, in words. This is the
    agent's own check before it finishes, not the judge: code that games it only misleads itself."""
    mark = f"examples-{secrets.token_hex(8)}:"
    code = _RUNNER.format(source=source, file=file, examples=[(e.call, e.expected) for e in examples], mark=mark)
    bounded = replace(limits or Limits(), timeout_s=min((limits or Limits()).timeout_s, EXAMPLE_TIMEOUT_S))
    try:
        result = sandbox.python(code, workspace=workspace, limits=bounded)
    except SandboxError as exc:
        return [f"the examples could not be run: {exc}"]
    for line in reversed(result.stdout.splitlines()):
        if line.startswith(mark):
            try:
                return [str(f) for f in json.loads(line[len(mark) :])]
            except ValueError:
                break
    if result.timed_out:
        return [f"running the task's examples took over {bounded.timeout_s:g} s (an endless loop?)"]
    return [
        f"the examples did not run to the end ({result.killed_by or f'exit code {result.exit_code}'}): "
        f"{(result.stderr or result.error or '').strip()[-500:]}"
    ]
