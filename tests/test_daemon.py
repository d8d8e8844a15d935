"""The socket API of a real daemon process, through its real Unix socket.

One daemon serves the whole module: one worker (so a task can be held in the
queue behind a slow one), a small body cap, and a script that answers the
demo's arithmetic and spins forever on tasks that start with "SLOW".
"""

from __future__ import annotations

import json
import sqlite3
import uuid

import httpx
import openai
import pytest

from evolver.cli.client import finished_rounds
from evolver.testing.daemon import (
    SLOW_STEP,
    DaemonProcess,
    assert_error,
    demo_rules,
    make_root,
    read_events,
    serving,
    wait_for,
    write_script,
)

MAX_BODY = 4096


@pytest.fixture(scope="module")
def daemon():
    root = make_root()
    slow = {"match": r"\ATask:\nSLOW", "on": "task", **SLOW_STEP}
    model = write_script(root, "script", [slow, *demo_rules()])
    proc = DaemonProcess(
        root, model=model, settings={"EVOLVER_DAEMON_WORKERS": 1, "EVOLVER_DAEMON_MAX_BODY_BYTES": MAX_BODY}
    )
    with serving(proc):
        yield proc


@pytest.fixture
def http(daemon):
    with daemon.client() as client:
        yield client


def submit(http: httpx.Client, prompt: str, **body) -> dict:
    response = http.post("/v1/tasks", json={"prompt": prompt, **body})
    assert response.status_code == 201, response.text
    return response.json()


# --- tasks ---------------------------------------------------------------------------------


def test_submit_answers_201_with_an_id_only_after_the_task_is_committed(daemon, http):
    response = http.post("/v1/tasks", json={"prompt": "What is (12 + 30) * 2?"})
    assert response.status_code == 201, response.text
    task = response.json()
    assert task["id"].startswith("task_") and task["status"] == "queued" and task["source"] == "api"
    assert response.headers["location"] == f"/v1/tasks/{task['id']}"
    # Durable before the reply: another connection to the database file already sees it.
    db = sqlite3.connect(f"file:{daemon.data_dir / 'evolver.db'}?mode=ro", uri=True)
    try:
        row = db.execute("SELECT prompt FROM tasks WHERE id = ?", [task["id"]]).fetchone()
    finally:
        db.close()
    assert row == ("What is (12 + 30) * 2?",)
    # ...and the API reads it back at once.
    again = daemon.task(http, task["id"])
    assert again["id"] == task["id"] and again["status"] in ("queued", "running", "done")
    assert "lease_token" not in again
    done = daemon.wait_task(http, task["id"], ("done", "failed", "dead"))
    assert done["status"] == "done", done


def test_the_event_stream_shows_each_step_and_ends_with_the_task(daemon, http):
    task = submit(http, "What is 17.5% of 2,340?")
    with http.stream("GET", f"/v1/tasks/{task['id']}/events") as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = read_events(response)
    steps = [e for e in events if e[0] == "step"]
    assert events[-1][0] == "end", events
    end = events[-1][2]
    assert end["id"] == task["id"] and end["status"] == "done", (end, daemon.log())
    ids = [event_id for _, event_id, _ in steps]
    assert len(steps) >= 2 and all(i is not None for i in ids)
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert all(data["attempt"] == 1 for _, _, data in steps)
    # The steps are the run: run_python computed it, finish answered it.
    calls = [c["name"] for _, _, data in steps for c in (data.get("tool_calls") or [])]
    assert calls == ["run_python", "finish"]
    assert any(data["role"] == "tool" and data["content"].strip() == "409.5" for _, _, data in steps)

    # Resuming with Last-Event-ID gives only the later events, then the end.
    with http.stream("GET", f"/v1/tasks/{task['id']}/events", headers={"Last-Event-ID": str(ids[0])}) as response:
        resumed = read_events(response)
    assert [i for e, i, _ in resumed if e == "step"] == ids[1:]
    assert resumed[-1][0] == "end"
    # ...and so does ?after=.
    with http.stream("GET", f"/v1/tasks/{task['id']}/events", params={"after": ids[-2]}) as response:
        after = read_events(response)
    assert [i for e, i, _ in after if e == "step"] == ids[-1:]
    assert after[-1][0] == "end" and after[-1][2]["status"] == "done"
    # After the last one: only the end.
    with http.stream("GET", f"/v1/tasks/{task['id']}/events", params={"after": ids[-1]}) as response:
        assert [e for e, _, _ in read_events(response)] == ["end"]


def test_a_retry_with_the_same_idempotency_key_returns_the_same_task(daemon, http):
    key = f"retry-{uuid.uuid4()}"
    body = {"prompt": "What is (12 + 30) * 2?", "priority": 3, "metadata": {"from": "retry test"}}
    first = http.post("/v1/tasks", json=body, headers={"Idempotency-Key": key})
    assert first.status_code == 201, first.text
    second = http.post("/v1/tasks", json=body, headers={"Idempotency-Key": key})
    assert second.status_code == 200, second.text
    assert second.json()["id"] == first.json()["id"]
    assert second.headers.get("idempotent-replayed") == "true"
    listed = http.get("/v1/tasks", params={"limit": 1000}).json()["tasks"]
    assert [t["id"] for t in listed if t["idempotency_key"] == key] == [first.json()["id"]]

    different = http.post(
        "/v1/tasks", json={**body, "prompt": "What is 17.5% of 2,340?"}, headers={"Idempotency-Key": key}
    )
    error = assert_error(different, 422, "Idempotency-Key")
    assert error["type"] == "idempotency_conflict" and error["param"] == "Idempotency-Key"
    assert daemon.wait_task(http, first.json()["id"], ("done", "failed", "dead"))["status"] == "done"


def test_cancel_ends_a_queued_task_at_once_and_a_running_one_at_a_step_boundary(daemon, http):
    slow = submit(http, "SLOW: spin until stopped")
    running = daemon.wait_task(http, slow["id"], ("running",), timeout_s=60)
    # Wait for the first step, so the cancel lands mid-run.
    wait_for(
        lambda: (
            daemon.task(http, slow["id"])["trajectories"] and daemon.task(http, slow["id"])["trajectories"][0]["steps"]
        ),
        timeout_s=30,
        what="the slow task's first step",
    )
    assert running["claims"] == 1

    # The only worker is busy: a second task stays queued, and cancelling it ends it now.
    queued = submit(http, "What is (12 + 30) * 2?", priority=-5)
    cancelled = http.post(f"/v1/tasks/{queued['id']}/cancel")
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled" and cancelled.json()["cancel_requested"] is True
    assert daemon.task(http, queued["id"])["trajectories"] == []  # it never ran

    # A running task is asked to stop; it ends cancelled at its next step.
    asked = http.post(f"/v1/tasks/{slow['id']}/cancel")
    assert asked.status_code == 200, asked.text
    assert asked.json()["cancel_requested"] is True and asked.json()["status"] in ("running", "cancelled")
    with http.stream("GET", f"/v1/tasks/{slow['id']}/events") as response:
        events = read_events(response)
    assert events[-1][0] == "end" and events[-1][2]["status"] == "cancelled", events[-1]
    ended = daemon.task(http, slow["id"])
    assert ended["status"] == "cancelled" and ended["trajectories"][-1]["status"] == "cancelled"
    # Cancelling a finished task changes nothing.
    again = http.post(f"/v1/tasks/{queued['id']}/cancel")
    assert again.status_code == 200 and again.json()["status"] == "cancelled"


def test_feedback_decides_the_outcome_of_an_unchecked_task(daemon, http):
    task = submit(http, "What is (12 + 30) * 2?")
    done = daemon.wait_task(http, task["id"], ("done", "failed", "dead"))
    assert done["status"] == "done" and done["trajectories"][-1]["outcome"] is None

    good = http.post(f"/v1/tasks/{task['id']}/feedback", json={"good": True, "note": "right: 84"})
    assert good.status_code == 200, good.text
    assert good.json()["success"] is True and good.json()["feedback"] == "right: 84"
    outcome = daemon.task(http, task["id"])["trajectories"][-1]["outcome"]
    assert outcome["success"] is True and outcome["feedback"] == "right: 84"

    bad = http.post(f"/v1/tasks/{task['id']}/feedback", json={"good": False})
    assert bad.status_code == 200, bad.text
    outcome = daemon.task(http, task["id"])["trajectories"][-1]["outcome"]
    assert outcome["success"] is False and outcome["feedback"] == "bad"

    assert_error(http.post("/v1/tasks/task_nope/feedback", json={"good": True}), 404, "task_nope")
    assert_error(http.post(f"/v1/tasks/{task['id']}/feedback", json={"good": "very"}), 422, "good")


def test_list_filters_by_status_and_source_and_pages(daemon, http):
    made = [submit(http, "What is (12 + 30) * 2?") for _ in range(3)]
    for task in made:
        daemon.wait_task(http, task["id"], ("done", "failed", "dead"))

    everything = http.get("/v1/tasks", params={"limit": 1000}).json()
    assert everything["next_offset"] is None
    ids = [t["id"] for t in everything["tasks"]]
    assert len(ids) == len(set(ids)) >= 3
    assert ids[:3] == [t["id"] for t in reversed(made)]  # newest first

    paged, offset = [], 0
    while offset is not None:
        page = http.get("/v1/tasks", params={"limit": 2, "offset": offset}).json()
        assert len(page["tasks"]) <= 2
        paged += [t["id"] for t in page["tasks"]]
        assert page["next_offset"] in (None, offset + 2)
        offset = page["next_offset"]
    assert paged == ids

    done = http.get("/v1/tasks", params={"status": "done", "limit": 1000}).json()["tasks"]
    assert done and all(t["status"] == "done" for t in done)
    assert {t["id"] for t in made} <= {t["id"] for t in done}
    api = http.get("/v1/tasks", params={"source": "api", "status": "done", "limit": 1000}).json()["tasks"]
    assert {t["id"] for t in api} == {t["id"] for t in done if t["source"] == "api"}
    assert http.get("/v1/tasks", params={"source": "nowhere"}).json() == {"tasks": [], "next_offset": None}

    assert_error(http.get("/v1/tasks", params={"status": "sleeping"}), 422, "status")
    assert_error(http.get("/v1/tasks", params={"limit": 0}), 422, "limit")
    assert_error(http.get("/v1/tasks", params={"offset": -1}), 422, "offset")


# --- OpenAI-compatible chat -----------------------------------------------------------------


@pytest.fixture
def openai_client(daemon):
    transport = httpx.HTTPTransport(uds=str(daemon.socket_path))
    with httpx.Client(transport=transport, timeout=60) as http_client:
        yield openai.OpenAI(base_url="http://evolver/v1", api_key="unused", http_client=http_client, max_retries=0)


def test_the_openai_client_lists_the_model_and_chats(http, openai_client):
    assert "evolver" in [m.id for m in openai_client.models.list()]

    reply = openai_client.chat.completions.create(
        model="evolver", messages=[{"role": "user", "content": "What is 17.5% of 2,340?"}]
    )
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == "409.5"
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.total_tokens > 0
    # The turn is recorded as a task of source "chat".
    task_id = reply.id.removeprefix("chatcmpl-")
    chat_task = http.get(f"/v1/tasks/{task_id}").json()
    assert chat_task["source"] == "chat" and chat_task["status"] == "done"


def test_the_openai_client_streams_a_chat(openai_client):
    stream = openai_client.chat.completions.create(
        model="evolver", messages=[{"role": "user", "content": "What is 17.5% of 2,340?"}], stream=True
    )
    text, finishes = "", []
    for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            if choice.finish_reason:
                finishes.append(choice.finish_reason)
    assert text == "409.5"
    assert finishes == ["stop"]


def _chat_stream(http, content: str, **extra):
    return http.stream(
        "POST",
        "/v1/chat/completions",
        json={"model": "evolver", "messages": [{"role": "user", "content": content}], "stream": True, **extra},
    )


def _chunks(response) -> list[dict]:
    return [
        json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ") and line != "data: [DONE]"
    ]


def test_a_streamed_chat_has_one_id_and_its_usage_when_asked(http):
    """The first chunk's id was "chatcmpl-pending" and the later ones another (clients that group chunks
    by id broke), and ``stream_options.include_usage`` was ignored: a test failed before."""
    with _chat_stream(http, "What is 17.5% of 2,340?", stream_options={"include_usage": True}) as response:
        chunks = _chunks(response)
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1 and ids.pop().startswith("chatcmpl-task_")
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == "409.5"
    *rest, last = chunks
    assert last["choices"] == [] and last["usage"]["total_tokens"] > 0
    assert all(c["usage"] is None for c in rest)  # as OpenAI sends them: null until the last
    with _chat_stream(http, "What is 17.5% of 2,340?") as response:
        assert all("usage" not in c for c in _chunks(response))  # not asked: no usage field


def test_a_chat_turn_stops_when_its_client_goes_away_or_it_is_cancelled(daemon, http):
    """A client that disconnected left its turn running for nobody, and cancelling a chat turn said
    "stopping at its next step" but it ended done: tests failed before."""
    with _chat_stream(http, "SLOW chat, then go away") as response:
        lines = response.iter_lines()
        first = json.loads(next(line for line in lines if line.startswith("data: "))[6:])
        next(line for line in lines if line.startswith(":"))  # a step has run
    gone = first["id"].removeprefix("chatcmpl-")
    assert daemon.wait_task(http, gone, ("done", "failed", "cancelled"), timeout_s=60)["status"] == "cancelled"

    with _chat_stream(http, "SLOW chat, then be cancelled") as response:
        lines = response.iter_lines()
        first = json.loads(next(line for line in lines if line.startswith("data: "))[6:])
        task_id = first["id"].removeprefix("chatcmpl-")
        assert http.post(f"/v1/tasks/{task_id}/cancel").status_code == 200
        said = "".join(
            json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
            for line in lines
            if line.startswith("data: {")
        )
    assert "without an answer" in said and "cancelled" in said
    assert http.get(f"/v1/tasks/{task_id}").json()["status"] == "cancelled"


def test_an_unknown_model_is_not_found(openai_client):
    with pytest.raises(openai.NotFoundError) as caught:
        openai_client.chat.completions.create(model="gpt-nothing", messages=[{"role": "user", "content": "hi"}])
    assert "gpt-nothing" in str(caught.value)


# --- bad input ------------------------------------------------------------------------------


def test_every_bad_request_gets_a_4xx_json_error_and_the_daemon_keeps_serving(daemon, http):
    def post(path, content):
        return http.post(path, content=content, headers={"content-type": "application/json"})

    assert_error(post("/v1/tasks", b'{"prompt": "x",'), 400, "not valid JSON")
    assert_error(post("/v1/tasks", b"\xff\xfe not UTF-8"), 400, "body")
    assert_error(post("/v1/tasks", b""), 422, "JSON body is required")

    error = assert_error(http.post("/v1/tasks", json={"prompt": 42}), 422, "prompt")
    assert error["param"] == "prompt"
    assert_error(http.post("/v1/tasks", json={"prompt": "x", "priority": "high"}), 422, "priority")
    assert_error(http.post("/v1/tasks", json={"prompt": "x", "priority": 1000}), 422, "priority")
    assert_error(http.post("/v1/tasks", json=["prompt"]), 422)
    error = assert_error(http.post("/v1/tasks", json={"prompt": "x", "colour": "red"}), 422, "colour", "unknown field")
    assert error["param"] == "colour"
    assert_error(http.post("/v1/tasks", json={"prompt": ""}), 422, "empty")
    assert_error(http.post("/v1/tasks", json={"prompt": " \n\t "}), 422, "empty")
    assert_error(http.post("/v1/tasks", json={}), 422, "prompt")
    assert_error(http.post("/v1/tasks", json={"prompt": "x", "check": {"type": "telepathy"}}), 422, "check")
    assert_error(http.post("/v1/tasks", json={"prompt": "x", "check": {"type": "answer"}}), 422, "check")
    assert_error(
        http.post("/v1/tasks", json={"prompt": "x", "check": {"type": "answer", "expected": "a", "match": "numeric"}}),
        422,
        "check",
    )
    assert_error(
        http.post("/v1/tasks", json={"prompt": "x", "metadata": {"files": {"a.txt": 3}}}), 422, "metadata.files"
    )

    # Over [advanced.daemon] max_body_bytes: refused before any route reads it, declared or streamed.
    big = {"prompt": "What is 1 + 1? " + "x" * (MAX_BODY * 2)}
    error = assert_error(http.post("/v1/tasks", json=big), 413, f"{MAX_BODY}-byte")
    assert error["type"] == "body_too_large"
    chunks = (json.dumps(big).encode()[i : i + 1000] for i in range(0, len(json.dumps(big)), 1000))
    assert_error(
        http.post("/v1/tasks", content=chunks, headers={"content-type": "application/json"}), 413, "max_body_bytes"
    )

    for path in ("/v1/tasks/task_nope", "/v1/tasks/task_nope/events"):
        assert_error(http.get(path), 404, "task_nope")
    assert_error(http.post("/v1/tasks/task_nope/cancel"), 404, "task_nope")
    assert_error(http.get("/v1/nodes/node_nope"), 404, "node_nope")
    error = assert_error(http.get("/v1/nothing/here"), 404, "/v1/nothing/here")
    assert error["type"] == "not_found"
    error = assert_error(http.delete("/v1/tasks"), 405)
    assert error["type"] == "method_not_allowed"
    assert_error(http.put("/v1/health"), 405)

    # Chat requests that cannot be answered.
    chat = "/v1/chat/completions"
    assert_error(
        http.post(chat, json={"model": "evolver", "messages": [{"role": "system", "content": "Be brief."}]}),
        422,
        "no user message",
    )
    assert_error(
        http.post(chat, json={"model": "evolver", "messages": [{"role": "user", "content": "   "}]}),
        422,
        "no user message",
    )
    assert_error(http.post(chat, json={"model": "evolver", "messages": []}), 422, "messages")
    assert_error(
        http.post(chat, json={"model": "evolver", "messages": [{"role": "wizard", "content": "hi"}]}), 422, "role"
    )
    assert_error(http.post(chat, json={"messages": [{"role": "user", "content": "hi"}]}), 422, "model")
    assert_error(post(chat, b"{nope"), 400, "not valid JSON")
    assert_error(http.post("/v1/memory/search", json={"text": "  "}), 422, "empty")
    assert_error(http.post("/v1/promote", json={}), 422, "node_id")

    # Still serving, and still working.
    assert http.get("/v1/health").json() == {"ok": True}
    task = submit(http, "What is (12 + 30) * 2?")
    assert daemon.wait_task(http, task["id"], ("done", "failed", "dead"))["status"] == "done"
    error = assert_error(
        http.get(f"/v1/tasks/{task['id']}/events", headers={"Last-Event-ID": "yesterday"}), 400, "Last-Event-ID"
    )
    assert error["param"] == "Last-Event-ID"
    assert http.get("/v1/health").json() == {"ok": True}


def test_the_openapi_schema_is_served(http):
    response = http.get("/openapi.json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    for path in (
        "/v1/tasks",
        "/v1/tasks/{task_id}",
        "/v1/tasks/{task_id}/events",
        "/v1/chat/completions",
        "/v1/models",
        "/v1/health",
        "/v1/status",
    ):
        assert path in paths, path
    assert "post" in paths["/v1/tasks"] and "get" in paths["/v1/tasks"]


# --- inspection and steering -----------------------------------------------------------------


def test_status_reports_the_daemon(daemon, http):
    status = http.get("/v1/status").json()
    assert status["pid"] == daemon.proc.pid
    assert status["mood"] == "running" and status["workers"] == 1
    assert status["data_dir"] == str(daemon.data_dir) and status["socket"] == str(daemon.socket_path)
    assert status["incumbent"] and isinstance(status["queue"], dict)


def test_the_tree_has_one_root_which_is_served_and_promote_or_rollback_without_a_target_conflict(http):
    tree = http.get("/v1/tree").json()
    assert len(tree["nodes"]) == 1
    root = tree["nodes"][0]
    assert root["parent_id"] is None and tree["incumbent"] == root["id"]
    node = http.get(f"/v1/nodes/{root['id']}").json()
    assert node["incumbent"] is True and node["scaffold"]["parameters"]["max_steps"] > 0

    error = assert_error(http.post("/v1/promote", json={"node_id": "node_nope"}), 409, "node_nope")
    assert error["type"] == "conflict"
    assert_error(http.post("/v1/promote", json={"node_id": root["id"]}), 409, "already the incumbent")
    assert_error(http.post("/v1/rollback", json={}), 409, "no earlier incumbent")
    assert http.get("/v1/tree").json()["incumbent"] == root["id"]
    kinds = [e["kind"] for e in http.get("/v1/history").json()["events"]]
    assert "seed" in kinds and "promote" not in kinds and "rollback" not in kinds


def test_evolve_queues_the_reconcile_job_on_the_job_host_and_a_round_that_changed_nothing_is_no_event(http):
    response = http.post("/v1/evolve", json={"job": "reconcile"})
    assert response.status_code == 202, response.text  # queued, not run inside the request
    (queued,) = response.json()["rounds"]
    assert queued["job"] == "reconcile" and queued["status"] == "queued" and queued["ok"] is None
    rounds = finished_rounds([queued], lambda path: http.get(path).json())
    assert [r["job"] for r in rounds] == ["reconcile"] and rounds[0]["ok"] is True
    assert rounds[0]["status"] == "done" and rounds[0]["id"] == queued["id"]
    assert_error(http.get("/v1/evolve/round-999999"), 404, "no round")
    # The index agreed: nothing changed, so `evolver history` gets no event; status shows the round.
    assert rounds[0]["event_id"] is None and "repaired 0 entries" in rounds[0]["summary"]
    events = http.get("/v1/history", params={"kind": "job"}).json()["events"]
    assert not [e for e in events if e["payload"]["job"] == "reconcile"]
    (reconcile,) = [j for j in http.get("/v1/status").json()["jobs"] if j["job"] == "reconcile"]
    assert reconcile["last"]["ok"] and "repaired 0 entries" in reconcile["last"]["summary"]
    assert_error(http.post("/v1/evolve", json={"job": "nope"}), (404, 409), "nope", "reconcile")
