"""The persistent Python worker's loop, run INSIDE the sandbox (standard library only).

It is passed to the interpreter with ``-c``, so it imports nothing from the project.
Protocol: one JSON object per line. The host sends ``{"op": "exec", "code": …}`` or
``{"op": "call", "name": …, "kwargs": {…}}`` on stdin, each with an ``id``; the worker
answers each with one line on its stdout carrying the same ``id``, ``ok``, ``stdout``,
``stderr`` (what the call printed, its subprocesses included), ``value``, ``error`` and
``error_type``, and ``finished`` with ``answer`` when the code called ``finish(answer)``.

The code runs in this interpreter, so it can reach anything this loop holds, the reply
channel included: it can write a line of its own there. The host takes only the reply
whose ``id`` is the one it just sent (a fresh random one each time) and drops any other,
so a forged line can say no more than the code could by printing or calling ``finish``,
and can never stand in for a later call's reply.

The protocol pipes are moved to private descriptors at start; descriptors 1 and 2
then point at capture files and 0 at /dev/null, so nothing the code prints or reads
can corrupt the conversation.
"""

import ast
import builtins
import json
import linecache
import os
import sys
import tempfile
import traceback

_OWN_FILE = "<string>"  # the file name of this loop's frames, as run by ``python -c``


class Finished(BaseException):
    """Raised by ``finish(answer)``: ends the cell and hands in the answer (a BaseException, so a plain
    ``except Exception`` in the code does not swallow it)."""

    def __init__(self, answer):
        super().__init__(answer)
        self.answer = answer


def finish(answer):
    """End the task with the final answer: only the answer itself, no explanation."""
    raise Finished(answer)


def main():
    cap = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    requests = os.fdopen(os.dup(0), "rb")
    replies = os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.close(null)
    captures = (tempfile.TemporaryFile(buffering=0), tempfile.TemporaryFile(buffering=0))
    os.dup2(captures[0].fileno(), 1)
    os.dup2(captures[1].fileno(), 2)
    real_out, real_err = sys.stdout, sys.stderr

    namespace = {"__name__": "__main__", "__builtins__": builtins, "finish": finish, "final_answer": finish}
    sys.path.insert(0, os.getcwd())
    cells = 0

    def reply(message):
        replies.write(json.dumps(message).encode() + b"\n")
        replies.flush()

    reply({"ready": True, "pid": os.getpid(), "python": sys.version.split()[0]})
    for line in requests:
        try:
            request = json.loads(line)
        except ValueError as exc:
            reply({"ok": False, "error": f"unreadable request: {exc}", "error_type": "ProtocolError"})
            continue
        sys.stdout, sys.stderr = real_out, real_err
        for fd in (1, 2):
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
        response = {
            "id": request.get("id") if isinstance(request, dict) else None,
            "ok": True,
            "value": None,
            "error": None,
            "error_type": None,
        }
        try:
            if request.get("op") == "exec":
                cells += 1
                response["value"] = _run_cell(request.get("code", ""), cells, namespace, cap)
            elif request.get("op") == "call":
                response["value"] = _call(namespace, request.get("name"), request.get("kwargs") or {})
            else:
                raise ValueError(f"unknown op {request.get('op')!r}")
        except Finished as done:
            response.update(finished=True, answer=_text(done.answer))
        except BaseException as exc:  # noqa: BLE001 - everything the code raises is data
            response.update(ok=False, error=_format(exc), error_type=type(exc).__name__)
        for stream in (sys.stdout, sys.stderr, real_out, real_err):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a stream the code closed or replaced
                pass
        for name, fd in (("stdout", 1), ("stderr", 2)):
            size = os.fstat(fd).st_size
            response[name] = os.pread(fd, min(size, cap), 0).decode("utf-8", "replace")
            response[name + "_truncated"] = size > cap
        reply(response)


def _run_cell(code, number, namespace, cap):
    """Execute a cell like a notebook does; the repr of a final expression is its value."""
    filename = f"<cell {number}>"
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    tree = ast.parse(code, filename)
    kept = _keep_finish(tree)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    try:
        exec(compile(tree, filename, "exec"), namespace)
        if last is None:
            return None
        value = eval(compile(last, filename, "eval"), namespace)
    finally:
        namespace.update(finish=finish, final_answer=finish)  # whatever the cell bound to them
        if kept:
            print(f"note: {', '.join(kept)} is the session's own and was not redefined", file=sys.stderr)
    if value is None:
        return None
    namespace["_"] = value
    text = repr(value)
    return text if len(text) <= cap else text[:cap] + " …[truncated]"


_OWN = ("finish", "final_answer")


def _keep_finish(tree):
    """Drop a cell's top-level definitions of ``finish`` (a small model redefines it as a print, then calls
    its own, and the attempt never ends): the session's ``finish`` is the loop's. Returns the names kept."""
    kept, body = [], []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name in _OWN:
            kept.append(node.name)
            continue
        if isinstance(node, ast.Assign):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            if len(names) == len(node.targets) and all(n in _OWN for n in names):
                kept.extend(names)
                continue
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name) in _OWN for a in node.names):
            kept.extend(a.asname or a.name for a in node.names if (a.asname or a.name) in _OWN)
            node.names = [a for a in node.names if (a.asname or a.name) not in _OWN]
            if not node.names:
                continue
        body.append(node)
    tree.body = body
    return list(dict.fromkeys(kept))


def _call(namespace, name, kwargs):
    """Call a function defined by earlier cells; its result must be JSON."""
    function = namespace.get(name) if isinstance(name, str) else None
    if not callable(function):
        raise NameError(f"no function named {name!r} is defined in the worker")
    if not isinstance(kwargs, dict):
        raise TypeError("call arguments must be a JSON object of keyword arguments")
    result = function(**kwargs)
    try:
        json.dumps(result)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name}() returned a value that is not JSON: {exc}") from None
    return result


def _text(answer):
    """The answer as text: a string as it is, anything else as it prints."""
    try:
        return answer if isinstance(answer, str) else str(answer)
    except Exception as exc:  # noqa: BLE001 - an object whose __str__ raises
        return f"<an answer that cannot be shown as text: {type(exc).__name__}>"


def _format(exc):
    """The traceback without this loop's own frames."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == _OWN_FILE:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


if __name__ == "__main__":
    main()
