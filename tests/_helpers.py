"""Helpers of the tests that run code in other processes."""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, TYPE_CHECKING, NoReturn

import pytest

if TYPE_CHECKING:
    from memory import Embedder

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def without_bubblewrap(reason: object) -> NoReturn:
    """Skip a test that needs the real sandbox where bubblewrap cannot start; on CI (``CI=true``) fail it
    instead, so a CI machine without a working sandbox can never pass by skipping them all."""
    if os.environ.get("CI", "").strip().lower() == "true":
        pytest.fail(
            f"bubblewrap cannot run on this CI machine (CI=true), and the sandbox's tests need it: {reason}",
            pytrace=False,
        )
    pytest.skip(f"bubblewrap cannot run here: {reason}")


def run_python(
    code: str,
    *args: str,
    prefix: list[str] | None = None,
    env: dict | None = None,
    timeout: float = 120,
    input: str | None = None,
) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter of this venv (optionally under ``prefix``, e.g. unshare)."""
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    return subprocess.run(
        [*(prefix or []), PYTHON, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        input=input,
        cwd=str(REPO),
    )


def last_json(proc: subprocess.CompletedProcess) -> dict:
    """The JSON object a helper script printed last; fails with its output otherwise."""
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no JSON from the script (rc={proc.returncode})\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return json.loads(lines[-1])


def works(*command: str) -> bool:
    """Whether a command (a namespace or privilege tool) runs here."""
    if shutil.which(command[0]) is None:
        return False
    try:
        return subprocess.run(list(command), capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


class OtherModel:
    """The session's embedder under another model's name: a different vector space to the index."""

    def __init__(self, inner: Embedder, model_id: str = "some-other-model/384") -> None:
        self._inner = inner
        self.model_id = model_id
        self.dimensions = inner.dimensions

    def embed_documents(self, texts):
        return self._inner.embed_documents(texts)

    def embed_query(self, text, **kwargs):
        return self._inner.embed_query(text, **kwargs)


def read_line(stream: IO[str], *, timeout_s: float, what: str) -> str:
    """The next line a child writes, waited for until a deadline: a bare ``readline()`` on a child that never
    writes (a cold start, a crash before its first line) hangs the test instead of failing it. The reading
    thread ends when the caller's cleanup kills the child (end of file)."""
    box: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: box.put(stream.readline()), daemon=True).start()
    try:
        return box.get(timeout=timeout_s)
    except queue.Empty:
        raise AssertionError(f"no line within {timeout_s:g} s: {what}") from None


def index_writes(index, monkeypatch) -> list[tuple[str, str, list[str]]]:
    """Every write of rows to ``index`` from now on, as (``upsert`` or ``update_metadata``, collection, ids):
    each of Chroma's writes holds the GIL of the process that owns the index, so tests count them."""
    writes: list[tuple[str, str, list[str]]] = []
    for name in ("upsert", "update_metadata"):
        original = getattr(index, name)

        def spy(collection, ids, *rest, _name=name, _original=original):
            if ids:
                writes.append((_name, collection, list(ids)))
            return _original(collection, ids, *rest)

        monkeypatch.setattr(index, name, spy)
    return writes
