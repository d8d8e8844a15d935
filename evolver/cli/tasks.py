"""Tasks through the daemon: submit (and watch), list, show, cancel, feedback, and chat."""

from __future__ import annotations

import contextlib
import json
import sys
import time

import click
import httpx
from rich.markup import escape

from ..api import views
from ..text import clip, visible
from .base import (
    State,
    _call_text,
    check_options,
    cli,
    echo,
    err,
    full_id,
    out,
    print_json,
    table,
)
from .client import ApiError, decode, server_events


def _print_event_step(step: dict, console=err) -> None:
    """One step on a line: to stderr while following a task (stdout keeps its verdict), to stdout in
    ``show`` (so ``show ID | less`` has them)."""
    text = (step.get("content") or "").strip().replace("\n", " ")
    calls = ", ".join(_call_text(c) for c in (step.get("tool_calls") or []))
    line = calls if step["role"] == "assistant" and calls else text
    console.print(
        f"[dim]{step['attempt']}.{step['seq']:<3} {step['role']:<10}[/dim] {escape(line[:160])}", highlight=False
    )


def _verdict(task: dict) -> tuple[bool | None, str | None]:
    """The last attempt's success and answer."""
    trajectories = task.get("trajectories") or []
    if not trajectories:
        return None, None
    last = trajectories[-1]
    outcome = last.get("outcome") or {}
    return outcome.get("success"), last.get("final_answer")


def judged(outcome: dict | None) -> str:
    """How an attempt was judged, the check's verdict and the person's word each as given: where they
    disagree, both are shown (the person's word never silently replaces the check's, or the reverse)."""
    outcome = outcome or {}
    success, person = outcome.get("success"), outcome.get("person_good")
    parts = []
    if outcome.get("verifier"):
        parts.append("check passed" if success else "check failed")
    elif success is not None and person is None:
        parts.append("succeeded" if success else "failed")
    if person is not None:
        note = (outcome.get("feedback") or "").strip()
        said = f"you said {'good' if person else 'bad'}"
        parts.append(said + (f" ({clip(note, 80)})" if note and note not in ("good", "bad") else ""))
    return "; ".join(parts) or "not judged"


def _verifier_line(outcome: dict | None) -> str | None:
    """What the verifier said about a failed attempt, as one indented line; None when it passed or said
    nothing."""
    outcome = outcome or {}
    said = (outcome.get("verifier_output") or "").strip()
    return f"  the verifier: {clip(said, 500)}" if outcome.get("success") is False and said else None


def _text_of(path: str) -> str:
    """A file for the task's workspace: text, or a usage error that names it."""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except UnicodeDecodeError as exc:
        raise click.BadParameter(
            f"{path} is not UTF-8 text (byte {exc.start}); a task's files are text", param_hint="--file"
        ) from None
    except OSError as exc:
        raise click.BadParameter(f"{path} cannot be read: {exc.strerror}", param_hint="--file") from None


@cli.command()
@click.argument("text")
@check_options
@click.option("--priority", type=click.IntRange(-100, 100), default=0, show_default=True, help="Higher runs first.")
@click.option(
    "--file",
    "files",
    type=click.Path(exists=True, dir_okay=False),
    multiple=True,
    help="Put this file (by its name) into the task's workspace; repeatable.",
)
@click.option("--idempotency-key", default=None, help="Retrying with the same key never makes a duplicate task.")
@click.option("--wait", is_flag=True, help="Stream the steps live; exit 1 if the task fails.")
@click.option("--json", "as_json", is_flag=True, help="Print the task as JSON.")
@click.pass_obj
def submit(
    state: State,
    text: str,
    check: dict | None,
    priority: int,
    files: tuple[str, ...],
    idempotency_key: str | None,
    wait: bool,
    as_json: bool,
) -> None:
    """Hand the daemon a task; it is stored durably before this returns."""
    import os

    body: dict = {"prompt": text, "priority": priority, "check": check}
    if files:
        body["metadata"] = {"files": {os.path.basename(f): _text_of(f) for f in files}}
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
    with state.client() as client:
        task = client.post("/v1/tasks", body, headers=headers)
        if not wait:
            if as_json:
                print_json(task)
            else:
                echo(task["id"])
            return
        err.print(f"[bold]{task['id']}[/bold] queued; following its steps (Ctrl-C stops watching, not the task)")
        for event, data in client.events(task["id"]):
            if event == "step":
                _print_event_step(data)
        detail = client.get(f"/v1/tasks/{task['id']}")
    success, answer = _verdict(detail)
    if as_json:
        print_json(detail)
    else:
        verdict = "" if success is None else (" (check passed)" if success else " (check failed)")
        echo(f"{detail['status']}{verdict}: {answer if answer is not None else detail.get('error')}")
        said = _verifier_line((detail["trajectories"] or [{}])[-1].get("outcome"))
        if said:  # what the verifier said, so the failure can be understood without `show`
            echo(said)
    if detail["status"] != "done" or success is False:
        sys.exit(1)


STATUSES = click.Choice(["queued", "running", "done", "failed", "cancelled", "dead"])


@cli.command()
@click.option("--status", type=STATUSES, default=None, help="Only tasks in this state.")
@click.option("--source", default=None, help="Only tasks from this source (api, chat, cli, bench, ...).")
@click.option("--limit", type=click.IntRange(1, 1000), default=20, show_default=True)
@click.option("--offset", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def tasks(state: State, status: str | None, source: str | None, limit: int, offset: int, as_json: bool) -> None:
    """List tasks, newest first."""
    params = {"status": status, "source": source, "limit": limit, "offset": offset}
    result = state.view("/v1/tasks", views.task_list, **params)
    if as_json:
        print_json(result)
        return
    rows = [{**t, "created": time.strftime("%m-%d %H:%M:%S", time.localtime(t["created_at"]))} for t in result["tasks"]]
    # Short ids (unique prefixes, which every command takes) keep a row on one line at 120 columns.
    rows = [{**r, "id": r.get("short_id") or r["id"]} for r in rows]
    out.print(
        table(
            "tasks",
            rows,
            ["id", "status", "priority", "source", "attempts", "created", "prompt", "error"],
            width={"prompt": 50, "error": 30},
        )
    )
    if result["next_offset"] is not None:
        err.print(f"more: --offset {result['next_offset']}")


@cli.command()
@click.argument("task_id")
@click.option(
    "--memories",
    is_flag=True,
    help="Also what each attempt was given from memory: examples, insights, synthesized tools.",
)
@click.option(
    "--follow",
    "-f",
    is_flag=True,
    help="Then follow the task's steps live until it ends (needs the daemon; Ctrl-C stops watching, not the task).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def show(state: State, task_id: str, memories: bool, follow: bool, as_json: bool) -> None:
    """One task with its trajectories and every step. TASK_ID may be a unique prefix, or a trajectory's
    id (evidence in the history names them): its task is shown."""
    found = full_id(state, task_id, "task", "trajectory")
    task_id = found.get("task_id") or found["id"]
    detail = state.view(f"/v1/tasks/{task_id}", views.task_detail, task_id)
    if as_json:
        print_json(detail)
        return
    out.print(
        f"[bold]{detail['id']}[/bold] {detail['status']} (source {detail['source']}, priority "
        f"{detail['priority']}, attempts {detail['attempts']})",
        highlight=False,
    )
    out.print(escape(detail["prompt"]), highlight=False)
    if detail.get("check"):
        out.print(f"check: {json.dumps(detail['check'])}", highlight=False, markup=False)
    for trajectory in detail["trajectories"]:
        outcome = trajectory.get("outcome") or {}
        asked = "  ← the trajectory asked for" if trajectory["id"] == found["id"] else ""
        out.print(
            f"\n[bold]attempt {trajectory['attempt']}[/bold] {trajectory['id']} ({trajectory['status']}, "
            f"node {trajectory['node_id']}): answer {trajectory['final_answer']!r}, {judged(outcome)}{asked}",
            highlight=False,
        )
        if memories:
            _print_memories(trajectory.get("memories") or {})
        said = _verifier_line(outcome)
        if said:
            out.print(said, highlight=False, markup=False)
        for step in trajectory["steps"]:
            _print_event_step({**step, "attempt": trajectory["attempt"]}, console=out)
    if detail.get("error"):
        out.print(f"error: {detail['error']}", markup=False)
    if follow and detail["status"] in ("queued", "running"):
        _follow(state, detail)


def _follow(state: State, detail: dict) -> None:
    """The steps after those already shown, as they come, then how the task ended."""
    seen = {(t["attempt"], s["seq"]) for t in detail["trajectories"] for s in t["steps"]}
    out.print(f"\n[dim]following {detail['id']} (Ctrl-C stops watching, not the task)…[/dim]", highlight=False)
    try:
        with state.client() as client:
            for event, data in client.events(detail["id"]):
                if event == "step" and (data.get("attempt"), data.get("seq")) not in seen:
                    _print_event_step(data, console=out)
            final = client.get(f"/v1/tasks/{detail['id']}")
    except KeyboardInterrupt:
        return
    last = (final["trajectories"] or [{}])[-1]
    out.print(f"{final['status']}: answer {last.get('final_answer')!r}, {judged(last.get('outcome'))}", highlight=False)


def _print_memories(given: dict) -> None:
    examples, insights, tools = given.get("examples", []), given.get("insights", []), given.get("tools", [])
    if not (examples or insights or tools):
        out.print("  given from memory: nothing", highlight=False)
        return
    out.print(
        f"  given from memory: {len(examples)} examples, {len(insights)} insights, {len(tools)} tools", highlight=False
    )
    for trajectory_id in examples:
        out.print(f"    example {trajectory_id} (evolver show {trajectory_id})", highlight=False, markup=False)
    for insight in insights:
        text = insight["text"] if insight["text"] is not None else "(no longer in the store)"
        out.print(f"    insight {insight['id']}: {clip(text, 150)}", highlight=False, markup=False)
    for name in tools:
        out.print(f"    tool {name}", highlight=False, markup=False)


@cli.command()
@click.argument("task_id")
@click.pass_obj
def cancel(state: State, task_id: str) -> None:
    """Cancel a task (its id or a unique prefix): a queued one at once, a running one at its next step."""
    task_id = full_id(state, task_id, "task")["id"]
    with state.client() as client:
        task = client.post(f"/v1/tasks/{task_id}/cancel")
    echo(f"{task['id']}: {task['status']}" + (" (stopping at its next step)" if task["status"] == "running" else ""))


@cli.command()
@click.argument("task_id")
@click.option("--good/--bad", required=True, help="Whether the answer was right.")
@click.option("--note", default="", help="Why, in a few words.")
@click.pass_obj
def feedback(state: State, task_id: str, good: bool, note: str) -> None:
    """Tell the daemon whether a task's answer was good (its id or a unique prefix)."""
    task_id = full_id(state, task_id, "task")["id"]
    with state.client() as client:
        outcome = client.post(f"/v1/tasks/{task_id}/feedback", {"good": good, "note": note})
    echo(f"{task_id}: recorded; {judged(outcome)}")
    if outcome.get("verifier") and outcome.get("success") is not good:
        echo(
            "  your word is kept beside the check's verdict; the check's decides what the agent learns "
            "from this attempt"
        )


class _Progress:
    """The chat stream's comments say which step the agent is at. On a terminal each overwrites the
    last on one stderr line, which is cleared before the reply is printed (else the reply came out
    over the progress text: "405.0 step step"); elsewhere they are not shown."""

    def __init__(self) -> None:
        self.shown = False

    def __call__(self, comment: str) -> None:
        if err.is_terminal:
            err.file.write(f"\r\x1b[K…{visible(comment)}")  # the daemon's words: shown, never acted on
            err.file.flush()
            self.shown = True

    def clear(self) -> None:
        if self.shown:
            err.file.write("\r\x1b[K")
            err.file.flush()
            self.shown = False


def _stream_reply(state: State, messages: list[dict], *, prefix: str = "") -> str | None:
    """One streamed chat turn; prints ``prefix`` and the reply as it arrives and returns it. Ctrl-C stops
    the turn (the daemon is told to cancel it) and returns None."""
    client = state.client()
    reply: list[str] = []
    progress = _Progress()
    chat_id = None
    try:
        with client.http.stream(
            "POST",
            "/v1/chat/completions",
            json={"model": "evolver", "messages": messages, "stream": True},
            timeout=httpx.Timeout(30.0, read=None),
        ) as response:
            if response.status_code != 200:
                response.read()
                decode(response)
            # Once the reply has begun, progress would overwrite its line: it is no longer shown.
            for _, _, data in server_events(response, on_comment=lambda c: None if reply else progress(c)):
                if "error" in data:
                    raise ApiError(500, data["error"]["type"], data["error"]["message"])
                chat_id = data.get("id") or chat_id
                choices = data.get("choices") or [{"delta": {}}]  # a usage chunk has none
                delta = choices[0]["delta"].get("content") or ""
                if delta:
                    progress.clear()
                    if not reply:
                        out.print(prefix, end="", highlight=False, markup=False)
                    reply.append(delta)
                    out.print(delta, end="", markup=False, highlight=False)
    except KeyboardInterrupt:
        progress.clear()
        task_id = (chat_id or "").removeprefix("chatcmpl-")
        said = "(stopped)"
        if task_id.startswith("task_"):  # closing the stream cancels it too; this says so at once
            with contextlib.suppress(ApiError, httpx.HTTPError):
                task = client.post(f"/v1/tasks/{task_id}/cancel")
                said = (
                    f"(stopped; turn {task_id} cancelled)"
                    if task["status"] in ("running", "cancelled")
                    else f"(stopped; turn {task_id} had already ended: {task['status']})"
                )
        err.print(said, highlight=False)
        return None
    except (httpx.ConnectError, httpx.RemoteProtocolError) as exc:
        raise client._unreachable(exc) from None
    finally:
        progress.clear()
        client.close()
    if not reply:
        out.print(prefix, end="", highlight=False, markup=False)
    out.print()
    return "".join(reply)


CHAT_HELP = """commands (not sent to the agent):
  /help          this list
  /new           forget the conversation so far and start a new one
  /exit, /quit   end the chat (Ctrl-D too)
Ctrl-C while the agent works stops that turn; arrow keys edit the line and recall earlier ones."""


@cli.command()
@click.option("--message", "-m", "once", default=None, help="Send one message, print the reply and exit.")
@click.pass_obj
def chat(state: State, once: str | None) -> None:
    """Talk with the daemon's agent (an interactive REPL, replies streamed). /exit or Ctrl-D ends it."""
    messages: list[dict] = []
    if once is not None:
        if _stream_reply(state, [{"role": "user", "content": once}]) is None:
            sys.exit(130)
        return
    with state.client() as client:
        client.get("/v1/health")  # say now, not after the first message, that the daemon is down
    with contextlib.suppress(ImportError):
        import readline  # noqa: F401  (input() then edits the line and keeps a history, as a shell does)
    err.print("chatting with the evolver daemon; /help lists the commands, /exit or Ctrl-D ends")
    while True:
        try:
            text = input("you> ")
        except EOFError:
            break
        except KeyboardInterrupt:  # at the prompt: a fresh line, as a shell does
            err.print()
            continue
        command = text.strip()
        if command in ("/exit", "/quit"):
            break
        if command == "/help":
            err.print(CHAT_HELP, highlight=False, markup=False)
            continue
        if command == "/new":
            messages = []
            err.print("(a new conversation)")
            continue
        if command.startswith("/") and " " not in command:
            err.print(
                f"unknown command {command}; /help lists them (a message starting with / needs a space or more words)",
                highlight=False,
                markup=False,
            )
            continue
        if not command:
            continue
        messages.append({"role": "user", "content": text})
        said = _stream_reply(state, messages, prefix="evolver> ")
        if said is None:
            messages.pop()  # a stopped turn is not part of the conversation
        else:
            messages.append({"role": "assistant", "content": said})
