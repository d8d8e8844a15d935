"""The API fuzzed from its own OpenAPI schema: no 5xx, and every answer as the schema declares it.

Two doors, the same checks (evolver/testing/fuzz.py): in-process through the ASGI app
over a real daemon object, and black-box over a real daemon's loopback TCP
listener with its bearer token (and without it: 401 everywhere, in the error
shape). Every operation is fuzzed but ``POST /v1/shutdown``, which would stop
the daemon under test; each in schemathesis's positive and negative modes, a
bounded, derandomized number of cases, so a run is the same run every time.
A bigger budget: ``python benchmarks/reliability_fuzz.py``.
"""

from __future__ import annotations

import json

import httpx
import pytest

from evolver.testing.daemon import DaemonProcess, free_port, make_root, serving
from evolver.testing.fuzz import EXCLUDED, InProcessDaemon, black_box, fuzz, known_ids, tcp_settings

# Cases per operation and mode (positive, negative).
IN_PROCESS_EXAMPLES = 25
BLACK_BOX_EXAMPLES = 25
TOKEN = "fuzz-s3cret"


@pytest.fixture(scope="module")
def inprocess():
    daemon = InProcessDaemon()
    try:
        yield daemon.start()
    finally:
        daemon.close()


@pytest.fixture(scope="module")
def tcp_daemon():
    root = make_root()
    port = free_port()
    with serving(DaemonProcess(root, settings=tcp_settings(port, TOKEN), name="fuzzed")) as proc:
        proc.base_url = f"http://127.0.0.1:{port}"
        yield proc


def _operations(schema: dict) -> list[tuple[str, str]]:
    return [(method.upper(), path) for path, item in schema["paths"].items() for method in item]


def _report(report) -> str:
    return "\n".join(str(f) for f in report.unique())


def test_every_error_a_route_declares_is_the_error_shape(inprocess):
    """What the fuzzer checks answers against: no route still documents FastAPI's own 422 body."""
    schema = json.loads(json.dumps(inprocess.app.openapi()))
    assert "HTTPValidationError" not in json.dumps(schema)
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            statuses = operation["responses"]
            assert {"401", "500"} <= set(statuses), (method, path)
            for status, response in statuses.items():
                if status.startswith(("4", "5")):
                    ref = response["content"]["application/json"]["schema"]["$ref"]
                    assert ref == "#/components/schemas/ErrorOut", (method, path, status)
    assert schema["components"]["schemas"]["ErrorOut"]["required"] == ["error"]


def test_in_process_fuzzing_finds_no_5xx_and_no_answer_off_the_schema(inprocess):
    report = inprocess.fuzz(max_examples=IN_PROCESS_EXAMPLES)
    schema = inprocess.app.openapi()
    assert report.operations == len(_operations(schema)) - len(EXCLUDED)
    assert report.cases >= report.operations * IN_PROCESS_EXAMPLES  # both modes together, at least
    assert not report.findings, f"{report.summary()}\n{_report(report)}"
    # Still serving, with a working store: the tasks the fuzzer submitted are all listed.
    from starlette.testclient import TestClient

    with TestClient(inprocess.app, headers=inprocess.headers) as http:
        assert http.get("/v1/health").json() == {"ok": True}
        listed = http.get("/v1/tasks", params={"limit": 1000})
        assert listed.status_code == 200, listed.text


def test_black_box_fuzzing_over_tcp_with_the_token_finds_no_5xx_and_no_answer_off_the_schema(tcp_daemon):
    schema, send, headers = black_box(tcp_daemon.base_url, TOKEN)
    with httpx.Client(base_url=tcp_daemon.base_url, headers=headers, timeout=60) as http:
        known = known_ids(http)
        before = {t["id"]: t for t in http.get("/v1/tasks", params={"limit": 1000}).json()["tasks"]}
        report = fuzz(schema, send, max_examples=BLACK_BOX_EXAMPLES, known=known, validate_headers=headers)
        assert report.operations == len(_operations(schema.raw_schema)) - len(EXCLUDED)
        assert not report.findings, f"{report.summary()}\n{_report(report)}"

        # The daemon process lived through it, answers, and lost none of the tasks it had before.
        assert tcp_daemon.proc.poll() is None, tcp_daemon.log()
        assert http.get("/v1/health").json() == {"ok": True}
        after = {t["id"]: t for t in http.get("/v1/tasks", params={"limit": 1000}).json()["tasks"]}
    assert set(before) <= set(after)
    assert all(after[i]["prompt"] == task["prompt"] for i, task in before.items())


def test_black_box_without_the_token_every_operation_is_401_in_the_error_shape(tcp_daemon):
    schema, _, _ = black_box(tcp_daemon.base_url, TOKEN)

    def send(case):
        return case.call(base_url=tcp_daemon.base_url, headers={"Authorization": "Bearer wrong"}, timeout=60)

    statuses = []

    def send_and_note(case):
        response = send(case)
        statuses.append(response.status_code)
        return response

    report = fuzz(schema, send_and_note, max_examples=2)
    assert not report.findings, _report(report)
    assert statuses and set(statuses) == {401}
