"""Tasks: submit (durable before the 201), list, get with trajectory, cancel, feedback, live steps."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Literal

from fastapi import APIRouter, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, StreamingResponse

from memory import TERMINAL_STATUSES, NotFound, TaskKind

from . import views
from .errors import error_response
from .host import ServiceHost
from .models import MAX_ID, FeedbackIn, TaskIn, errors
from .views import task_json

router = APIRouter(tags=["tasks"])

MAX_IDEMPOTENCY_KEY = 200  # characters: the route's bound on the header, and the submit lane's

Status = Literal["queued", "running", "done", "failed", "cancelled", "dead"]


def _daemon(request: Request):
    return request.app.state.daemon


def _unsplit(metadata: dict) -> dict:
    return {k: v for k, v in metadata.items() if k != "split"}


_REPLAYED = {
    "description": "A retry with the same Idempotency-Key and body: the task it made.",
    "content": {"application/json": {"schema": {"type": "object"}}},
}
_STEPS = {
    "description": "``event: step`` (data: the step as JSON, id: its event id), then ``event: end`` "
    "(data: the task as JSON).",
    "content": {
        "text/event-stream": {
            "schema": {  # one event (OpenAPI 3.1 without itemSchema)
                "type": "object",
                "required": ["event", "data"],
                "properties": {
                    "event": {"enum": ["step", "end"]},
                    "data": {"type": "string"},
                    "id": {"type": "string", "pattern": "^[0-9]+$"},
                },
            }
        }
    },
}


@router.post(
    "/tasks",
    status_code=201,
    summary="Submit a task (committed before the reply)",
    responses={200: _REPLAYED, **errors(400, 413, 422, 503)},
)
async def submit(
    body: TaskIn, request: Request, idempotency_key: str | None = Header(default=None, max_length=MAX_IDEMPOTENCY_KEY)
) -> JSONResponse:
    # A body the submit lane (``lane.SubmitLane``) did not take for itself comes here: FastAPI reads and
    # validates it the documented way, and answers its errors. (No docstring: it would be the API reference's.)
    return await accept(_daemon(request), body, idempotency_key)


async def accept(daemon: ServiceHost, body: TaskIn, idempotency_key: str | None) -> JSONResponse:
    """Submit a validated task: 201 once it is committed, 200 for a retry with the same Idempotency-Key and
    body, 422 for that key with another body. Both ways a submit comes in (the lane and the route) end here."""
    # Committed together with whatever other submits arrive meanwhile (group commit), before the reply.
    task, new = await daemon.intake.submit(
        TaskKind.of(body.source),
        body.prompt,
        check=body.check,
        priority=body.priority,
        metadata=body.metadata,
        idempotency_key=idempotency_key,
    )
    if not new:
        # The split is the daemon's to record (``evolver.tree.split``), so it is left out of the comparison.
        same = (task.prompt, task.check, task.priority, task.source, _unsplit(task.metadata)) == (
            body.prompt,
            body.check,
            body.priority,
            body.source,
            _unsplit(body.metadata or {}),
        )
        if not same:
            return error_response(
                422,
                "idempotency_conflict",
                "this Idempotency-Key was already used for a different task",
                "Idempotency-Key",
            )
        shown = await run_in_threadpool(task_json, task, daemon.store)
        return JSONResponse(shown, status_code=200, headers={"Idempotent-Replayed": "true"})
    return JSONResponse(
        task_json(task, daemon.store, attempts=0), status_code=201, headers={"Location": f"/v1/tasks/{task.id}"}
    )


@router.get("/tasks", summary="List tasks, newest first", responses=errors(422, 503))
def list_tasks(
    request: Request,
    status: Status | None = None,
    source: str | None = Query(default=None, max_length=50),
    limit: int = Query(default=50, ge=1, le=1000),
    offset: int = Query(default=0, ge=0, le=MAX_ID),
) -> dict:
    return views.task_list(_daemon(request).store, status=status, source=source, limit=limit, offset=offset)


@router.get("/tasks/{task_id}", summary="A task with its trajectories and steps", responses=errors(404, 422, 503))
def get_task(task_id: str, request: Request) -> dict:
    return views.task_detail(_daemon(request).store, task_id)


@router.post(
    "/tasks/{task_id}/cancel",
    summary="Cancel a queued task now, a running one at its next step",
    responses=errors(404, 413, 422, 503),
)
def cancel(task_id: str, request: Request) -> dict:
    daemon = _daemon(request)
    task = daemon.store.inbox.request_cancel(task_id)
    daemon.feed.publish(task_id)
    return task_json(task, daemon.store)


@router.post(
    "/tasks/{task_id}/feedback",
    summary="Say whether the task's answer was good",
    responses=errors(400, 404, 409, 413, 422, 503),
)
def feedback(task_id: str, body: FeedbackIn, request: Request) -> dict:
    store = _daemon(request).store
    store.inbox.get_task(task_id)
    last = store.reports.last_trajectory(task_id)
    if last is None:
        return error_response(409, "conflict", f"task {task_id} has no answer yet to give feedback on")
    outcome = store.reports.add_feedback(last.id, good=body.good, note=body.note)
    return asdict(outcome)


def _sse(event: str, data: dict, event_id: int | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


@router.get(
    "/tasks/{task_id}/events",
    summary="The task's steps as server-sent events, live",
    response_class=StreamingResponse,
    responses={200: _STEPS, **errors(400, 404, 422, 503)},
)
async def events(
    task_id: str,
    request: Request,
    after: int = Query(default=0, ge=0, le=MAX_ID),
    last_event_id: str | None = Header(default=None),
):
    """Each step is an ``event: step`` whose id resumes the stream (``Last-Event-ID``);
    an ``event: end`` carries the task once it has finished."""
    daemon = _daemon(request)
    try:
        await run_in_threadpool(daemon.store.inbox.get_task, task_id)
    except NotFound as exc:
        return error_response(404, "not_found", str(exc))
    if last_event_id is not None:
        digits = last_event_id.isascii() and last_event_id.isdigit() and len(last_event_id) <= len(str(MAX_ID))
        if not (digits and int(last_event_id) <= MAX_ID):
            return error_response(
                400, "invalid_request", "Last-Event-ID must be an event id from this stream", "Last-Event-ID"
            )
        after = max(after, int(last_event_id))

    async def stream():
        nonlocal after
        quiet = 0.0
        while True:
            task = await run_in_threadpool(daemon.store.inbox.get_task, task_id)
            rows = await run_in_threadpool(daemon.store.inbox.task_steps, task_id, after_id=after)
            for event_id, attempt, step in rows:
                after = event_id
                yield _sse("step", {"attempt": attempt, **asdict(step)}, event_id)
            if rows:
                quiet = 0.0
                continue
            if task.status in TERMINAL_STATUSES:
                yield _sse("end", await run_in_threadpool(task_json, task, daemon.store))
                return
            if daemon.feed.closed.is_set() or await request.is_disconnected():
                return
            await daemon.feed.wait(task_id, timeout=1.0)
            quiet += 1.0
            if quiet >= 15.0:  # a comment keeps proxies and idle timers from closing the stream
                quiet = 0.0
                yield b": keep-alive\n\n"

    return StreamingResponse(
        stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )
