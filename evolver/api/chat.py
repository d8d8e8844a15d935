"""OpenAI-compatible chat: `/v1/chat/completions` (streaming and not) and `/v1/models`.

A chat turn is answered by the incumbent agent, with its memory and tools, and
recorded as a task of source "chat" (its success unknown until feedback). A
streaming reply sends the role at once, SSE comments while the agent works
(OpenAI clients skip them), the answer's text as the model writes it in its
finish call (``evolver.agent.answer_stream``; all at the end when a
``before_finish`` hook may still change it, or the model wrote the answer as
plain text), the usage when ``stream_options.include_usage`` asks for it, and
``[DONE]``; every chunk carries the one completion id. Should the turn end
with another reply than the text streamed (that finish call was unusable),
the stream says so and sends the reply whole. A client that goes away
mid-turn, or `evolver cancel` on the turn's task, stops the turn at its next
step, and the task ends cancelled. Each turn waits for an agent in a thread of its own, never in the
API's; at most ``[advanced.daemon] chat_queue`` turns run or wait at once, and more are answered 429 with a
Retry-After.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, StreamingResponse

from memory import Ending, new_id

from ..llm.budget import BudgetExceeded
from .errors import error_response, internal_message
from .host import Stopping
from .models import ChatIn, errors

log = logging.getLogger(__name__)

router = APIRouter(tags=["chat"])

MODEL_ID = "evolver"


@router.get("/models", summary="The models this daemon serves (OpenAI-compatible)", responses=errors())
def models(request: Request) -> dict:
    daemon = request.app.state.daemon
    return {
        "object": "list",
        "data": [{"id": MODEL_ID, "object": "model", "created": int(daemon.started_at), "owned_by": "evolver"}],
    }


def _prompt(body: ChatIn) -> str:
    """The conversation as one task text: earlier turns as a transcript, the last user message as the task."""
    last_user = max(i for i, m in enumerate(body.messages) if m.role == "user" and m.text().strip())
    instructions = [m.text() for m in body.messages if m.role in ("system", "developer") and m.text().strip()]
    earlier = [
        f"{m.role}: {m.text()}"
        for m in body.messages[:last_user]
        if m.role in ("user", "assistant") and m.text().strip()
    ]
    parts = []
    if instructions:
        parts.append("Instructions from the user:\n" + "\n".join(instructions))
    if earlier:
        parts.append("Conversation so far:\n" + "\n".join(earlier))
    parts.append(body.messages[last_user].text() if not parts else "Reply to:\n" + body.messages[last_user].text())
    return "\n\n".join(parts)


REPEATED = 3  # the same call this many times in a row at the end of a turn: the model was stuck


def _repetition(store, trajectory_id: str) -> str:
    """A clause naming the call the turn ended on when it was made again and again, or ""."""
    calls = [
        (c["name"], json.dumps(c.get("arguments")))
        for step in store.reports.steps(trajectory_id)
        for c in (step.tool_calls or [])
    ]
    if not calls:
        return ""
    run = 1
    while run < len(calls) and calls[-1 - run] == calls[-1]:
        run += 1
    return f"; it repeated the same call, {calls[-1][0]} {calls[-1][1]}, {run} times" if run >= REPEATED else ""


def reply_text(store, result) -> str:
    """The answer, or a sentence that says the turn ended without one and why (a chat has no check to
    fall back on: a weak model's silence must not reach the person as an empty or cryptic reply)."""
    if result.answer is not None:
        return result.answer
    why = result.error or result.status
    if result.ending is Ending.NO_ANSWER and result.trajectory_ids:
        last = store.attempts.get_trajectory(result.trajectory_ids[-1])
        if last.status == "step_limit":
            steps = sum(1 for s in store.reports.steps(last.id) if s.role == "assistant")
            why = (
                f"the agent used all {steps} of its steps without calling finish"
                f"{_repetition(store, last.id)}. A model too weak for the tools often does this; "
                "a stronger model, or the scaffold's max_steps, may help"
            )
    elif result.ending is Ending.MODEL_ERROR:
        why = f"the model failed: {(result.error or '').removeprefix('model error: ')}"
    elif result.ending is Ending.BUDGET:
        why = f"the budget is spent: {result.error}"
    return f"The turn ended without an answer: {why.rstrip('.')}."


NOT_KEPT = "\n\n[the agent did not keep the answer above; its reply:]\n\n"


def rest_of_reply(streamed: str, text: str) -> str:
    """What to send after ``streamed`` so the client holds the reply ``text``: its remainder, or, when
    the text streamed was not the start of it, a line that says so and the reply whole. The answer
    handed in is stripped (``finish``), so whitespace around what was streamed is not a difference."""
    if text.startswith(streamed):
        return text[len(streamed) :]
    if streamed.strip() == text.strip():
        return ""
    return NOT_KEPT + text


def _usage(daemon, task_id: str) -> dict:
    tokens_in = tokens_out = 0
    for trajectory in daemon.store.reports.trajectories_of(task_id):
        tokens_in += trajectory.tokens_in
        tokens_out += trajectory.tokens_out
    return {"prompt_tokens": tokens_in, "completion_tokens": tokens_out, "total_tokens": tokens_in + tokens_out}


RETRY_AFTER_S = 5


class _Admission:
    """How many chat turns are running or waiting: counted on the event loop (no lock needed), bounded
    by ``[advanced.daemon] chat_queue``, so a burst of chats is answered 429 instead of piling up."""

    def __init__(self) -> None:
        self.turns = 0


def _admit(request: Request) -> bool:
    state = request.app.state
    if not hasattr(state, "chat_admission"):
        state.chat_admission = _Admission()
    if state.chat_admission.turns >= state.daemon.config.daemon.chat_queue:
        return False
    state.chat_admission.turns += 1
    return True


def _leave(request: Request) -> None:
    request.app.state.chat_admission.turns -= 1


def _busy(request: Request) -> JSONResponse:
    limit = request.app.state.daemon.config.daemon.chat_queue
    response = error_response(
        429,
        "chat_busy",
        f"{limit} chat turns are already running or waiting ([advanced.daemon] chat_queue); try again shortly",
    )
    response.headers["Retry-After"] = str(RETRY_AFTER_S)
    return response


def _in_a_thread(fn, *args, **kwargs) -> asyncio.Future:
    """``fn`` in a thread of its own, as an awaitable: a chat turn waits for an agent there, never in the
    API's thread pool (forty waiting turns used to hold all of it, and every other route froze). A
    thread of its own for the whole turn also because sandboxes die with the thread that started them."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def run() -> None:
        try:
            value = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting request (bound: `exc` is unset after)
            loop.call_soon_threadsafe(lambda error=exc: future.done() or future.set_exception(error))
        else:
            loop.call_soon_threadsafe(lambda: future.done() or future.set_result(value))

    threading.Thread(target=run, name="chat", daemon=True).start()
    return future


def _model_failure(result) -> JSONResponse | None:
    if result.ending is Ending.BUDGET:
        return error_response(429, "budget_exceeded", result.error or "the budget is spent")
    if result.ending is Ending.MODEL_ERROR:
        return error_response(502, "model_error", result.error or "the model failed")
    return None


async def _until_done_or_gone(request: Request, cancel: threading.Event, turn):
    """The turn's result; a client that disconnects meanwhile sets ``cancel`` (the turn then stops at its
    next step and ends cancelled, instead of running on for nobody)."""
    running = asyncio.ensure_future(turn)
    while True:
        done, _ = await asyncio.wait({running}, timeout=0.5)
        if done:
            return running.result()
        if not cancel.is_set() and await request.is_disconnected():
            cancel.set()


_REPLY = {
    "description": "The reply (a chat.completion), or with ``stream`` its chunks as server-sent events "
    "ending with ``data: [DONE]``.",
    "content": {
        "application/json": {"schema": {"type": "object"}},
        "text/event-stream": {
            "schema": {  # one event (OpenAPI 3.1 without itemSchema)
                "type": "object",
                "required": ["data"],
                "properties": {"event": {"const": "message"}, "data": {"type": "string"}},
            }
        },
    },
}


@router.post(
    "/chat/completions",
    summary="Chat with the incumbent agent (OpenAI-compatible)",
    responses={200: _REPLY, **errors(400, 404, 413, 422, 429, 502, 503)},
)
async def completions(body: ChatIn, request: Request):
    daemon = request.app.state.daemon
    if body.model != MODEL_ID:
        return error_response(
            404, "model_not_found", f"there is no model {body.model!r}; this daemon serves {MODEL_ID!r}", "model"
        )
    prompt = _prompt(body)
    created = int(time.time())
    # The turn's task id is chosen now, so every chunk of a stream carries the one completion id.
    task_id = new_id("task")
    chat_id = f"chatcmpl-{task_id}"
    cancel = threading.Event()
    if not _admit(request):
        return _busy(request)
    if not body.stream:
        try:
            result = await _until_done_or_gone(
                request, cancel, _in_a_thread(daemon.chat, prompt, task_id=task_id, cancel=cancel)
            )
        except BudgetExceeded as exc:
            return error_response(429, "budget_exceeded", str(exc))
        finally:
            _leave(request)
        failure = _model_failure(result)
        if failure is not None:
            return failure
        usage = await run_in_threadpool(_usage, daemon, result.task_id)
        text = await run_in_threadpool(reply_text, daemon.store, result)
        return {
            "id": chat_id,
            "object": "chat.completion",
            "created": created,
            "model": MODEL_ID,
            "usage": usage,
            "evolver": {"task_id": result.task_id, "status": result.status},
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
        }

    loop = asyncio.get_running_loop()
    progress: asyncio.Queue = asyncio.Queue()
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["result"] = daemon.chat(
                prompt,
                on_step=lambda step: loop.call_soon_threadsafe(progress.put_nowait, ("step", step.role)),
                on_answer=lambda piece: loop.call_soon_threadsafe(progress.put_nowait, ("answer", piece)),
                task_id=task_id,
                cancel=cancel,
            )
            outcome["text"] = reply_text(daemon.store, outcome["result"])
        except BaseException as exc:  # reported in the stream
            outcome["error"] = exc
        finally:
            loop.call_soon_threadsafe(progress.put_nowait, None)
            loop.call_soon_threadsafe(_leave, request)  # its place is given up when the turn has ended

    # A thread of its own for the whole turn: sandboxes die with the thread that started them.
    threading.Thread(target=run, name="chat", daemon=True).start()

    def chunk(delta: dict | None, finish: str | None = None, usage: dict | None = None) -> bytes:
        data = {
            "id": chat_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": MODEL_ID,
            "choices": [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        if usage is not None or body.include_usage():  # OpenAI: "usage": null on every chunk but the last
            data["usage"] = usage
        return f"data: {json.dumps(data)}\n\n".encode()

    async def stream():
        finished = False
        try:
            yield chunk({"role": "assistant", "content": ""})
            streamed = ""
            while (item := await progress.get()) is not None:
                kind, value = item
                if kind == "answer":
                    streamed += value
                    yield chunk({"content": value})
                else:
                    yield f": {value} step\n\n".encode()
            if "error" in outcome:
                error = {"error": _stream_error(outcome["error"], chat_id)}
                yield f"data: {json.dumps(error)}\n\n".encode()
                finished = True
                return
            rest = rest_of_reply(streamed, outcome["text"])
            if rest:
                yield chunk({"content": rest})
            yield chunk({}, "stop")
            if body.include_usage():
                yield chunk(None, usage=await run_in_threadpool(_usage, daemon, task_id))
            yield b"data: [DONE]\n\n"
            finished = True
        finally:
            if not finished:  # the client went away mid-turn: the turn stops at its next step
                cancel.set()

    return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _stream_error(exc: BaseException, chat_id: str) -> dict:
    """The error event that ends a streamed turn. The budget and a daemon stopping say what happened, as
    their JSON answers do; any other failure is logged with its traceback and the client gets a generic message
    (an exception's text may carry paths, prompts or a server's reply, none of which is the client's)."""
    if isinstance(exc, BudgetExceeded):
        return {"type": "budget_exceeded", "message": str(exc), "param": None}
    if isinstance(exc, Stopping):
        return {"type": "stopping", "message": str(exc), "param": None}
    log.error("chat turn %s failed", chat_id, exc_info=exc)
    return {
        "type": "internal_error",
        "message": internal_message("the daemon failed on this chat turn", exc),
        "param": None,
    }
