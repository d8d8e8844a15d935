"""Fuzzing the daemon's API from its own OpenAPI schema (schemathesis 4), for tests and the benchmark.

``fuzz(schema, send)`` walks every operation of the schema, generates cases
with Hypothesis in both of schemathesis's modes (positive: data the schema
allows; negative: data it forbids), sends each through ``send`` and runs the
checks below on the response. It never stops at the first failure: every
finding is collected, so the test can show them all and the benchmark can
count them. Generation is derandomized and the example database is off, so a
run is the same run every time. Random ids mostly meet a 404, so an operation
whose path names an id is fuzzed a second time with ids that exist
(``known_ids``).

Two ways to reach the API:

- ``InProcessDaemon``: a real ``evolver.service.daemon.Daemon`` serving in a thread of
  this process (its store, intake, workers and jobs are real), and a second
  ASGI app over it that schemathesis calls in-process;
- ``evolver.testing.daemon``'s ``DaemonProcess`` with its loopback TCP listener,
  called black-box over HTTP with the bearer token.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import hypothesis
import schemathesis
from hypothesis import HealthCheck, Phase
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import Failure, FailureGroup, ServerError
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

# No 5xx; the status is one the operation declares; the content type too; the body matches the
# declared schema for that status (the error shape included); and data the schema forbids is refused.
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
NEGATIVE_CHECKS = [*CHECKS, negative_data_rejection]

# Operations left out, each for a reason that is not "it failed":
EXCLUDED = {
    # Stops the daemon (202, then it exits): every later case would find no one listening.
    # tests/test_daemon_lifecycle.py tests it on a daemon of its own.
    ("POST", "/v1/shutdown"),
}

TOKEN_ENV = "FUZZ_DAEMON_TOKEN"  # not EVOLVER_*: those are read as settings

# Given explicitly (no schemathesis.toml is looked for): a body over [advanced.daemon] max_body_bytes is refused
# with 413 before anything reads it, which is how the daemon rejects invalid data that big.
CONFIG = {
    "checks": {
        "negative_data_rejection": {
            "expected-statuses": [
                "400",
                "401",
                "403",
                "404",
                "405",
                "406",
                "409",
                "413",
                "415",
                "422",
                "428",
                "429",
                "5xx",
            ]
        }
    }
}


def config() -> schemathesis.Config:
    return schemathesis.Config.from_dict(CONFIG)


@dataclass
class Finding:
    operation: str
    mode: str
    kind: str  # "server_error", "schema_violation" or "no_response"
    status: int | None
    message: str
    request: str

    def __str__(self) -> str:
        return f"{self.operation} [{self.mode}] {self.kind} {self.status}: {self.message}\n    request: {self.request}"


@dataclass
class FuzzReport:
    operations: int = 0
    cases: int = 0
    seconds: float = 0.0
    findings: list[Finding] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)

    def count(self, kind: str) -> int:
        return sum(f.kind == kind for f in self.findings)

    def summary(self) -> dict:
        return {
            "operations": self.operations,
            "cases": self.cases,
            "server_errors": self.count("server_error"),
            "schema_violations": self.count("schema_violation"),
            "no_response": self.count("no_response"),
            "seconds": round(self.seconds, 1),
        }

    def unique(self) -> list[Finding]:
        """One finding per operation, mode, kind and status (what a person needs to read)."""
        seen, out = set(), []
        for f in self.findings:
            key = (f.operation, f.mode, f.kind, f.status, f.message.splitlines()[0] if f.message else "")
            if key not in seen:
                seen.add(key)
                out.append(f)
        return out


def _request(case) -> str:
    body = getattr(case, "body", None)
    text = repr(body)
    if len(text) > 300:
        text = text[:300] + "..."
    return f"{case.method.upper()} {case.formatted_path} query={case.query!r} headers={case.headers!r} body={text}"


def _kind(failure: Failure) -> str:
    return "server_error" if isinstance(failure, ServerError) else "schema_violation"


def fuzz(
    schema,
    send: Callable,
    *,
    max_examples: int,
    modes: tuple[GenerationMode, ...] = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE),
    known: dict[str, object] | None = None,
    validate_headers: dict | None = None,
    raised: str = "no_response",
) -> FuzzReport:
    """Fuzz every operation of ``schema`` but the excluded ones; ``send(case)`` returns the response.

    An operation whose path parameters are all in ``known`` (ids that exist: see ``known_ids``) is
    fuzzed a second time with them fixed, so what lies behind the 404 of a random id is fuzzed too.

    ``raised`` is the kind of finding an exception out of ``send`` is: over HTTP a timeout or a dropped
    connection ("no_response"); in-process an exception the app let escape, which a client would
    see as a 500 ("server_error")."""
    report = FuzzReport(excluded=[f"{m} {p}" for m, p in sorted(EXCLUDED)])
    started = time.perf_counter()
    for result in schema.get_all_operations():
        operation = result.ok()
        if (operation.method.upper(), operation.path) in EXCLUDED:
            continue
        report.operations += 1
        names = re.findall(r"{(\w+)}", operation.path)
        fixed = [None] + ([{n: known[n] for n in names}] if names and known and set(names) <= set(known) else [])
        for path_parameters in fixed:
            for mode in modes:
                _fuzz_operation(operation, mode, path_parameters, send, max_examples, report, validate_headers, raised)
    report.seconds = time.perf_counter() - started
    return report


def _fuzz_operation(operation, mode, path_parameters, send, max_examples, report, validate_headers, raised) -> None:
    checks = NEGATIVE_CHECKS if mode is GenerationMode.NEGATIVE else CHECKS
    label = mode.value + (" (known ids)" if path_parameters else "")

    # Findings are recorded, never raised: Hypothesis would stop there and shrink, and one
    # operation's failure would hide the rest. Shrinking is off for the same reason.
    @hypothesis.settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    @hypothesis.given(case=operation.as_strategy(generation_mode=mode, path_parameters=path_parameters))
    def run(case) -> None:
        report.cases += 1
        try:
            response = send(case)
        except Exception as exc:  # a finding, not a crash of the fuzzer
            report.findings.append(
                Finding(operation.label, label, raised, None, f"{type(exc).__name__}: {exc}", _request(case))
            )
            return
        try:
            case.validate_response(response, checks=checks, headers=validate_headers)
        except FailureGroup as group:
            for failure in group.exceptions:
                report.findings.append(
                    Finding(
                        operation.label,
                        label,
                        _kind(failure),
                        response.status_code,
                        f"{failure.title}: {failure.message}"[:2000],
                        _request(case),
                    )
                )
        except Failure as failure:
            report.findings.append(
                Finding(
                    operation.label,
                    label,
                    _kind(failure),
                    response.status_code,
                    f"{failure.title}: {failure.message}"[:2000],
                    _request(case),
                )
            )

    try:
        run()
    except hypothesis.errors.Unsatisfiable:
        pass  # schemathesis found nothing to generate in this mode (no parameters to break, say)


def known_ids(http, *, timeout_s: float = 120.0) -> dict[str, object]:
    """Ids that exist in the daemon behind ``http`` (an httpx-like client): a finished task, the
    served node, the oldest event. Fuzzing them reaches past the lookups into the routes' work."""
    from evolver.testing.daemon import wait_for

    task = http.post("/v1/tasks", json={"prompt": "What is (12 + 30) * 2?"})
    assert task.status_code == 201, task.text
    task_id = task.json()["id"]
    wait_for(
        lambda: http.get(f"/v1/tasks/{task_id}").json()["status"] in ("done", "failed", "dead"),
        timeout_s=timeout_s,
        what=f"task {task_id} to finish",
        interval_s=0.3,
    )
    events = http.get("/v1/history", params={"limit": 1000}).json()["events"]
    return {"task_id": task_id, "node_id": http.get("/v1/tree").json()["incumbent"], "event_id": events[-1]["id"]}


# --- an in-process daemon -------------------------------------------------------------------


# A daemon under fuzzing: one worker, no background evolution. With evolution off and no evaluation
# slots, ``POST /v1/evolve`` and the jobs stay bounded bookkeeping (no tree search hands out evaluation
# tasks); fuzzed tasks still run on the worker with the offline model.
SETTINGS = {
    "EVOLVER_DAEMON_WORKERS": "1",
    "EVOLVER_EVOLUTION_ENABLED": "false",
    "EVOLVER_EVOLUTION_EVALUATION_SLOTS": "0",
    "EVOLVER_DAEMON_TCP_TOKEN_ENV": TOKEN_ENV,
}


class InProcessDaemon:
    """A real Daemon serving in a thread (stopped with ``request_stop``) and an ASGI app over it.

    The app's TCP-token middleware treats the in-process client as TCP (its scope names a server
    port), so the app is built with a token and every request carries it: that door is fuzzed too."""

    def __init__(self, *, token: str = "fuzz-token") -> None:
        from evolver.config import load_config
        from evolver.service.daemon import Daemon

        self.root = Path(tempfile.mkdtemp(prefix="evf-", dir="/tmp"))  # short: socket paths are limited
        self.token = token
        self.headers = {"Authorization": f"Bearer {token}"}
        env = {
            **SETTINGS,
            "EVOLVER_MODEL_NAME": "scripted/demo",
            "EVOLVER_DAEMON_DATA_DIR": str(self.root / "data"),
            "EVOLVER_DAEMON_RUNTIME_DIR": str(self.root / "run"),
        }
        self.daemon = Daemon(load_config(env=env))
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="fuzzed-daemon", daemon=True)
        self._failed: BaseException | None = None
        self.app = None

    def _serve(self) -> None:
        try:
            self.daemon.serve(on_ready=lambda _: self._ready.set())
        except BaseException as exc:  # reported by start()
            self._failed = exc
            self._ready.set()

    def start(self, timeout_s: float = 180.0) -> InProcessDaemon:
        from evolver.api import create_app

        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise AssertionError(f"the in-process daemon did not start within {timeout_s:g} s")
        if self._failed is not None:
            raise AssertionError(f"the in-process daemon failed to start: {self._failed!r}")
        previous = os.environ.get(TOKEN_ENV)
        os.environ[TOKEN_ENV] = self.token
        try:
            self.app = create_app(self.daemon)  # reads the token now
        finally:
            if previous is None:
                os.environ.pop(TOKEN_ENV, None)
            else:
                os.environ[TOKEN_ENV] = previous
        return self

    def schema(self):
        return schemathesis.openapi.from_asgi("/openapi.json", self.app, config=config(), headers=self.headers)

    def send(self, case):
        return case.call(headers=self.headers)

    def client(self):
        from starlette.testclient import TestClient

        return TestClient(self.app, headers=self.headers)

    def fuzz(self, *, max_examples: int) -> FuzzReport:
        with self.client() as http:
            known = known_ids(http)
        return fuzz(
            self.schema(),
            self.send,
            max_examples=max_examples,
            known=known,
            validate_headers=self.headers,
            raised="server_error",
        )

    def close(self) -> None:
        self.daemon.request_stop("the fuzzing is over")
        self._thread.join(120)
        if not self._thread.is_alive():
            shutil.rmtree(self.root, ignore_errors=True)


def tcp_settings(port: int, token: str) -> dict:
    """``DaemonProcess`` settings for a daemon under fuzzing that also listens on loopback TCP."""
    return {**SETTINGS, "EVOLVER_DAEMON_TCP_PORT": str(port), TOKEN_ENV: token}


def black_box(base_url: str, token: str, *, timeout_s: float = 60.0):
    """The schema of a daemon over its TCP listener, and a ``send`` that calls it with the token."""
    headers = {"Authorization": f"Bearer {token}"}
    schema = schemathesis.openapi.from_url(
        f"{base_url}/openapi.json", config=config(), headers=headers, timeout=timeout_s
    )

    def send(case):
        return case.call(base_url=base_url, headers=headers, timeout=timeout_s)

    return schema, send, headers
