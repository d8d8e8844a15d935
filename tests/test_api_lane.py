"""The submit lane: a plainly well-formed submit is answered without FastAPI's route, anything else reaches
the route with its body intact, and both answer alike."""

import asyncio
import json
import time
from types import SimpleNamespace

import pytest
from starlette.testclient import TestClient

from evolver.api import create_app
from evolver.api.lane import SubmitLane
from evolver.config import Config
from evolver.tree.split import Admission
from memory import StoreError, Task

SECRET = "/home/person/private/notes.txt: token=s3cret"


class Intake:
    """Commits at once; remembers what it was given; fails with ``failure`` when one is set."""

    def __init__(self, failure: Exception | None = None) -> None:
        self.admission = Admission()
        self.submitted: list[dict] = []
        self.failure = failure

    async def submit(self, kind, prompt, **item):
        if self.failure is not None:
            raise self.failure
        admitted = self.admission.admit(kind, prompt, **item)
        self.submitted.append(admitted)
        now = time.time()
        task = Task(
            id=admitted["id"],
            prompt=prompt,
            status="queued",
            created_at=now,
            updated_at=now,
            check=admitted.get("check"),
            priority=admitted.get("priority", 0),
            source=admitted["source"],
            metadata=admitted["metadata"],
            idempotency_key=admitted.get("idempotency_key"),
        )
        return task, True


def _host(intake: Intake):
    return SimpleNamespace(config=Config(daemon={"tcp_token_env": "API_LANE_TEST_TOKEN"}), intake=intake, store=None)


@pytest.fixture
def client(monkeypatch):
    """A test client of the whole app over ``intake``; it speaks TCP, which needs the token."""
    monkeypatch.setenv("API_LANE_TEST_TOKEN", "t0ken")

    def open_client(intake: Intake) -> TestClient:
        app = create_app(_host(intake))
        return TestClient(app, headers={"Authorization": "Bearer t0ken"}, raise_server_exceptions=False)

    return open_client


def _scope(headers: list[tuple[bytes, bytes]], path: str = "/v1/tasks", method: str = "POST") -> dict:
    return {"type": "http", "method": method, "path": path, "headers": headers, "query_string": b""}


async def _call(lane: SubmitLane, scope: dict, body: bytes) -> list[dict]:
    sent: list[dict] = []
    chunks = [body[: len(body) // 2], body[len(body) // 2 :]]  # in two messages, as a socket may give it

    async def receive():
        chunk = chunks.pop(0)
        return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

    async def send(message):
        sent.append(message)

    await lane(scope, receive, send)
    return sent


class Route:
    """Stands for FastAPI's routes: records the scope and the whole body it was given."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes]] = []

    async def __call__(self, scope, receive, send) -> None:
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        self.calls.append((scope["path"], body))
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b""})


JSON = (b"content-type", b"application/json")
TASK = json.dumps({"prompt": "say ok", "priority": 3, "metadata": {"marker": "m1"}}).encode()


def test_a_well_formed_submit_is_answered_by_the_lane_alone():
    intake, route = Intake(), Route()
    lane = SubmitLane(route, _host(intake), handlers={})
    sent = asyncio.run(_call(lane, _scope([JSON, (b"idempotency-key", b"k-1")]), TASK))
    assert route.calls == []
    start, body = sent[0], json.loads(sent[1]["body"])
    assert start["status"] == 201
    assert (b"location", f"/v1/tasks/{body['id']}".encode()) in start["headers"]
    assert (body["prompt"], body["priority"], body["metadata"], body["idempotency_key"]) == (
        "say ok",
        3,
        {"marker": "m1"},
        "k-1",
    )
    assert body["attempts"] == 0 and "lease_token" not in body
    assert [s["prompt"] for s in intake.submitted] == ["say ok"]


@pytest.mark.parametrize(
    "headers, body",
    [
        ([(b"content-type", b"application/json; charset=utf-8")], TASK),  # another spelling of JSON
        ([], TASK),  # no content type: the route decides what that means
        ([JSON], b'{"prompt": "say ok",'),  # not JSON
        ([JSON], b'{"prompt": "say ok", "priority": NaN}'),  # JSON's parser lets NaN through; the model does not
        ([JSON], b'["say ok"]'),  # JSON, not a task
        ([JSON], json.dumps({"prompt": "   "}).encode()),  # a task that does not validate
        ([JSON], json.dumps({"prompt": "ok", "colour": "red"}).encode()),  # an unknown field
        ([JSON], b"\xff\xfe\x00"),  # not text
        ([JSON], b"[" * 200_000 + b"]" * 200_000),  # deeper than the parser goes (RecursionError)
        ([JSON, (b"idempotency-key", b"k" * 201)], TASK),  # a key past its bound
        ([JSON, (b"idempotency-key", b"a"), (b"idempotency-key", b"b")], TASK),  # two keys
    ],
)
def test_anything_else_reaches_the_route_with_its_body_intact(headers, body):
    intake, route = Intake(), Route()
    lane = SubmitLane(route, _host(intake), handlers={})
    sent = asyncio.run(_call(lane, _scope(headers), body))
    assert route.calls == [("/v1/tasks", body)]
    assert sent[0]["status"] == 299 and intake.submitted == []


@pytest.mark.parametrize("scope", [_scope([JSON], method="GET"), _scope([JSON], path="/v1/tasks/")])
def test_other_routes_pass_by_the_lane(scope):
    route = Route()
    asyncio.run(_call(SubmitLane(route, _host(Intake()), handlers={}), scope, TASK))
    assert len(route.calls) == 1


def test_the_lane_and_the_route_answer_a_submit_alike(client):
    with client(Intake()) as http:
        answers = []
        for content_type in ("application/json", "application/json; charset=utf-8"):  # the lane, the route
            answer = http.post("/v1/tasks", content=TASK, headers={"Content-Type": content_type})
            answers.append(answer)
    assert [a.status_code for a in answers] == [201, 201]
    lane, route = (a.json() for a in answers)
    assert lane.keys() == route.keys()
    assert {k: v for k, v in lane.items() if k not in ("id", "created_at", "updated_at")} == {
        k: v for k, v in route.items() if k not in ("id", "created_at", "updated_at")
    }
    assert [a.headers["location"] for a in answers] == [f"/v1/tasks/{lane['id']}", f"/v1/tasks/{route['id']}"]


@pytest.mark.parametrize(
    "failure, status, kind",
    [(StoreError("the disk is full"), 503, "store_unavailable"), (RuntimeError(SECRET), 500, "internal_error")],
)
def test_a_failure_in_the_lane_is_answered_by_the_apps_own_handlers(client, failure, status, kind):
    with client(Intake(failure)) as http:
        answer = http.post("/v1/tasks", content=TASK, headers={"Content-Type": "application/json"})
    assert answer.status_code == status
    assert answer.json()["error"]["type"] == kind
    assert "s3cret" not in answer.text
