"""The checker's side of a verdict; runs inside the sandbox, standard library only.

Never imported by the host: ``sandbox.judged`` reads this file and starts it as

    python3 -I -c <this file> judge NONCE_FD VERDICT_FD    the job, as JSON, on stdin
    python3 -c <this file> subject MODULE                  started by the judge (below)

As the judge it reads the run's secret nonce from NONCE_FD (the host wrote it and closed its end),
makes itself undumpable, and only then lets the attempt's code run: always in a child process (the
subject), which inherits neither descriptor. Code under judgement, running as the same user in the
same sandbox, can then neither read the nonce from this process's memory nor open its descriptors
through /proc, so it cannot write a verdict: the host counts as success only a report on
VERDICT_FD that carries the nonce, written after the checker's own assertions ran. An early exit,
a patched test framework or a forged line on stdout all end without that report: a failure.

As the subject it imports the attempt's module in its own interpreter and answers calls over a
pipe. Arguments and results cross as plain data (tagged JSON), so an object with a forged
``__eq__``, or a patched builtin, never reaches the checker.
"""

import builtins
import contextlib
import io
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from importlib.machinery import PathFinder

_MESSAGE_CHARS = 6000
_OUTPUT_BYTES = 1 << 20  # per stream, for commands the checker runs
_REPLY_BYTES = 64 << 20
_DEPTH = 1000  # values cross nested this deep (the recursion limit is raised to match)


def _tail(exc, chars=1500):
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()[-chars:]


# --- plain data across the pipe ----------------------------------------------------------------


def encode(value, depth=0):
    if depth > _DEPTH:
        raise TypeError(f"a value nested deeper than {_DEPTH} levels")
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return (
            value if value == value and value not in (float("inf"), float("-inf")) else {"$": "float", "v": repr(value)}
        )
    if isinstance(value, list):
        return [encode(v, depth + 1) for v in value]
    for kind in (tuple, set, frozenset):
        if isinstance(value, kind):
            return {"$": kind.__name__, "v": [encode(v, depth + 1) for v in value]}
    if isinstance(value, dict):
        return {"$": "dict", "v": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if isinstance(value, (bytes, bytearray)):
        return {"$": "bytes", "v": bytes(value).hex()}
    if isinstance(value, complex):
        return {"$": "complex", "v": [value.real, value.imag]}
    raise TypeError(
        f"a {type(value).__name__}, which cannot cross to the checker: give plain data "
        "(numbers, strings, bytes, lists, tuples, dicts, sets)"
    )


def decode(data, depth=0):
    """Only exact built-in types come out, whatever the other side sent."""
    if depth > _DEPTH + 1:
        raise ValueError("nested too deep")
    if data is None or type(data) in (bool, int, float, str):
        return data
    if type(data) is list:
        return [decode(v, depth + 1) for v in data]
    if type(data) is dict and set(data) == {"$", "v"}:
        kind, v = data["$"], data["v"]
        if kind == "float" and v in ("nan", "inf", "-inf"):
            return float(v)
        if kind == "bytes" and type(v) is str:
            return bytes.fromhex(v)
        if kind == "complex" and type(v) is list and len(v) == 2:
            return complex(float(v[0]), float(v[1]))
        if type(v) is list:
            items = [decode(x, depth + 1) for x in v]
            if kind == "tuple":
                return tuple(items)
            if kind == "set":
                return set(items)
            if kind == "frozenset":
                return frozenset(items)
            if kind == "dict" and all(type(p) is list and len(p) == 2 for p in items):
                return {k: val for k, val in items}
    raise ValueError(f"not plain data: {str(data)[:100]}")


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


# --- the subject: the attempt's code, in a process of its own ----------------------------------


def subject(module_name):
    import importlib

    channel = os.dup(1)  # before any of the attempt's code can print: its prints go to stderr
    os.dup2(2, 1)

    def send(message):
        _write_all(channel, (json.dumps(message) + "\n").encode())

    try:
        module = importlib.import_module(module_name)
    except BaseException as exc:
        send({"ready": False, "error": _tail(exc)})
        return
    send({"ready": True})
    for line in sys.stdin:
        request = json.loads(line)
        name = request["call"]
        function = getattr(module, name, None)
        if not callable(function):
            send({"error": {"type": "AttributeError", "message": f"{module_name}.py defines no function {name}"}})
            continue
        out = io.StringIO()
        try:
            args, kwargs = decode(request["args"]), decode(request["kwargs"])
            with contextlib.redirect_stdout(out) if request.get("capture") else contextlib.nullcontext():
                value = function(*args, **kwargs)
        except BaseException as exc:  # SystemExit too: the attempt's, reported as a failed call
            send({"error": {"type": type(exc).__name__, "message": _tail(exc)}})
            continue
        try:
            reply = {"value": encode(value), "args": encode(list(args))}
        except (TypeError, RecursionError) as exc:
            send({"error": {"type": "Unsendable", "message": f"{name} returned {exc}"}})
            continue
        if request.get("capture"):
            reply.update(stdout=out.getvalue()[-100_000:], repr=repr(value)[:100_000])
        send(reply)


# --- the judge ---------------------------------------------------------------------------------


class AttemptError(Exception):
    """The attempt's code failed in a way that is not one of Python's built-in exceptions."""


class _Clock:
    def __init__(self, seconds):
        self.deadline = time.monotonic() + seconds

    def left(self):
        return max(0.0, self.deadline - time.monotonic())


CLOCK = _Clock(60.0)
SOURCE = ""
SUBJECTS: "list[Subject]" = []  # quoted: Subject comes below, and annotations here are evaluated


def _kill(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


class Subject:
    """A module of the attempt, loaded in a child process; its functions are called through the pipe."""

    def __init__(self, module="solution"):
        self._module = module
        self._stderr = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(
            [sys.executable, "-c", SOURCE, "subject", module],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            close_fds=True,
            start_new_session=True,
        )
        SUBJECTS.append(self)
        self._buffer = b""
        try:
            hello = self._reply()
            self.load_error = None if hello.get("ready") else str(hello.get("error"))
        except AttemptError as exc:  # it ended (os._exit at import) or wrote nonsense before answering
            self.load_error = str(exc)

    def _stderr_tail(self):
        self._stderr.seek(0, os.SEEK_END)
        self._stderr.seek(max(0, self._stderr.tell() - 1500))
        text = self._stderr.read().decode("utf-8", "replace").strip()
        return f"; its stderr: {text}" if text else ""

    def _reply(self):
        assert self._proc.stdout is not None  # a pipe (``__init__``)
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = CLOCK.left()
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                _kill(self._proc)
                raise TimeoutError(f"{self._module}.py did not answer before the check's time ran out")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                status = self._proc.wait()
                raise AttemptError(
                    f"{self._module}.py's process ended (exit status {status}) without answering{self._stderr_tail()}"
                )
            self._buffer += chunk
            if len(self._buffer) > _REPLY_BYTES:
                _kill(self._proc)
                raise AttemptError(f"{self._module}.py answered with more than {_REPLY_BYTES} bytes")
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            raise AttemptError(f"{self._module}.py's process wrote something that is not an answer") from None

    def call(self, name, args, kwargs, capture=False):
        if self.load_error is not None:
            raise AttemptError(f"{self._module}.py does not load: {self.load_error}")
        request = {"call": name, "args": encode(list(args)), "kwargs": encode(dict(kwargs)), "capture": capture}
        assert self._proc.stdin is not None  # a pipe (``__init__``)
        try:
            self._proc.stdin.write((json.dumps(request) + "\n").encode())
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError):
            status = self._proc.wait()
            raise AttemptError(
                f"{self._module}.py's process ended (exit status {status}){self._stderr_tail()}"
            ) from None
        reply = self._reply()
        if "error" in reply:
            kind, message = str(reply["error"].get("type")), str(reply["error"].get("message"))
            known = getattr(builtins, kind, None)
            if isinstance(known, type) and issubclass(known, Exception) and kind != "Unsendable":
                raise known(f"(in {self._module}.py) {message}")
            raise AttemptError(f"{self._module}.py: {message}")
        try:
            value = decode(reply["value"])
            after = decode(reply["args"])
        except (KeyError, ValueError, TypeError) as exc:
            raise AttemptError(f"{self._module}.py's answer is not plain data: {exc}") from None
        for given, changed in zip(args, after if type(after) is list else []):
            _update_in_place(given, changed)  # a function that changes its arguments, as a test may check
        if capture:
            return value, str(reply.get("stdout", "")), str(reply.get("repr", ""))
        return value

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)

        def function(*args, **kwargs):
            return self.call(name, args, kwargs)

        function.__name__ = name
        return function

    def close(self):
        _kill(self._proc)
        self._stderr.close()


def _update_in_place(given, changed):
    if isinstance(given, list) and type(changed) is list:
        given[:] = changed
    elif isinstance(given, dict) and type(changed) is dict or isinstance(given, set) and type(changed) is set:
        given.clear()
        given.update(changed)


def solution(module="solution"):
    """The attempt's module (``solution.py`` by default), loaded in its own process."""
    return Subject(module)


class Ran:
    def __init__(self, returncode, stdout, stderr, timed_out):
        self.returncode, self.stdout, self.stderr, self.timed_out = returncode, stdout, stderr, timed_out

    @property
    def ok(self):
        return self.returncode == 0 and not self.timed_out


def run(argv, *, stdin=None, timeout=None):
    """Run a command (an argv list, or a shell line) as a child; its output is capped, it never sees the verdict."""
    if isinstance(argv, str):
        argv = ["/bin/sh", "-c", argv]
    limit = CLOCK.left() if timeout is None else min(timeout, CLOCK.left())
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            close_fds=True,
            start_new_session=True,
        )
        timed_out = False
        try:
            if stdin is not None:
                assert proc.stdin is not None  # a pipe, as there is something to write
                proc.stdin.write(stdin.encode() if isinstance(stdin, str) else stdin)
                proc.stdin.close()
            proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            timed_out = True
        except BrokenPipeError:
            pass
        finally:
            _kill(proc)

        def read(handle):
            handle.seek(0)
            return handle.read(_OUTPUT_BYTES).decode("utf-8", "replace")

        return Ran(proc.returncode, read(out), read(err), timed_out)


def run_unittest(*cases):
    """Run unittest TestCase classes here; (ok, message) for a check to return."""
    import unittest

    suite = unittest.TestSuite(unittest.defaultTestLoader.loadTestsFromTestCase(c) for c in cases)
    result = unittest.TestResult()
    suite.run(result)
    problems = result.failures + result.errors
    if not problems and result.testsRun:
        return True, f"{result.testsRun} tests passed"
    if not problems:
        return False, "no tests ran"
    test, text = problems[0]
    return False, (
        f"{len(problems)} of {result.testsRun} tests failed; {test.id().rsplit('.', 1)[-1]}: "
        f"{text.strip().splitlines()[-1][:1500]}"
    )


class _NoAttemptImports:
    """A checker that imports the attempt's code would run it here, beside the verdict: refused."""

    def __init__(self, root):
        self.root = os.path.realpath(root) + os.sep

    def find_spec(self, name, path=None, target=None):
        spec = PathFinder.find_spec(name, path)
        origin = getattr(spec, "origin", None) or ""
        if origin and os.path.realpath(origin).startswith(self.root):
            raise ImportError(
                f"the checker may not import {name} from the workspace into its own process; "
                "call the attempt's code through solution() or run()"
            )


def _python_check(job):
    namespace: dict = {
        "__name__": "evolver_check",
        "solution": solution,
        "run": run,
        "run_unittest": run_unittest,
        "AttemptError": AttemptError,
    }
    exec(compile(job["code"], "<check>", "exec"), namespace)
    try:
        result = namespace["check"](job.get("answer"), os.getcwd())
    except Exception as exc:  # a failed assertion is the commonest verdict
        return {"success": False, "message": "the check failed: " + _tail(exc)}
    ok, message = result if isinstance(result, tuple) else (result, "")
    return {"success": bool(ok), "message": str(message) or ("check passed" if ok else "check failed")}


def _command_check(job):
    ran = run(["/bin/sh", "-c", job["command"]])
    status = "timed out" if ran.timed_out else f"exited {ran.returncode}"
    output = "\n".join(p for p in (ran.stdout.strip(), ran.stderr.strip()) if p)
    return {"success": ran.ok, "message": f"`{job['command']}` {status}\n{output[-4000:]}".strip()}


def _tool_check(job):
    """A synthesized tool's tests and recorded calls; the tool runs in the subject, the tests here."""
    name = job["name"]
    tool = Subject(job["module"])
    report: dict = {"tests": [], "replays": [], "load_error": tool.load_error}
    if tool.load_error is None:
        for path, source in job["tests"]:
            namespace = {"__name__": "evolver_tool_tests", name: getattr(tool, name)}
            try:
                exec(compile(source, path, "exec"), namespace)
            except BaseException as exc:
                report["tests"].append({"name": path, "ok": False, "error": "the tests do not load: " + _tail(exc)})
                continue
            for test_name in [n for n in list(namespace) if n.startswith("test_") and callable(namespace[n])]:
                try:
                    namespace[test_name]()
                    report["tests"].append({"name": test_name, "ok": True, "error": None})
                except BaseException as exc:
                    report["tests"].append({"name": test_name, "ok": False, "error": _tail(exc)})
        for arguments in job["replays"]:
            try:
                value, stdout, shown = tool.call(name, (), arguments, capture=True)
            except BaseException as exc:
                report["replays"].append({"got": None, "error": _tail(exc)})
                continue
            parts = [stdout.rstrip("\n")] if stdout else []
            if value is not None:
                parts.append(value if isinstance(value, str) else json.dumps(value, default=repr))
            report["replays"].append({"got": ["\n".join(parts), shown], "error": None})
    return {"success": True, "message": "", "report": report}


RUNNERS = {"python": _python_check, "command": _command_check, "tool": _tool_check}


def _protect():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE, 0
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def judge(nonce_fd, verdict_fd):
    global CLOCK, SOURCE
    nonce = os.read(nonce_fd, 256).decode().strip()
    os.close(nonce_fd)
    os.set_inheritable(verdict_fd, False)
    try:
        _protect()
        job = json.loads(sys.stdin.buffer.read())
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        CLOCK, SOURCE = _Clock(float(job["timeout_s"])), job["source"]
        sys.meta_path.insert(0, _NoAttemptImports(os.getcwd()))
        report = RUNNERS[job["kind"]](job)
    except BaseException as exc:
        report = {
            "success": False,
            "message": "the checker failed: "
            + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).strip()[-3000:],
        }
    finally:
        for held in SUBJECTS:
            with contextlib.suppress(Exception):
                held.close()
    report["message"] = str(report.get("message", ""))[:_MESSAGE_CHARS]
    report["nonce"] = nonce
    _write_all(verdict_fd, json.dumps(report).encode())
    os.close(verdict_fd)


if __name__ == "__main__":
    sys.setrecursionlimit(10_000)
    if sys.argv[1] == "judge":
        judge(int(sys.argv[2]), int(sys.argv[3]))
    else:
        subject(sys.argv[2])
    sys.stdout.flush()
    os._exit(0)
