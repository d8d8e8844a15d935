"""`evolver mcp serve`, driven by the official MCP SDK's own client, against a real daemon.

The daemon learns a tool first, as the demo does: two percentages computed with
run_python, then one synthesize round, which writes `percent_of` and passes it
through its tests and quarantine. The MCP client (over stdio, as a desktop host
starts it; then over streamable HTTP with its token) lists the tools, calls the
learned one (it runs in the daemon's sandbox: the MCP server holds no tool
code), searches memory, and submits a task.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import httpx2
import pytest
from _helpers import REPO, read_line
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from evolver.cli.client import finished_rounds
from evolver.testing.daemon import DaemonProcess, demo_rules, make_root, serving, write_script
from tests.test_cli import EVOLVER

FIXED = {"memory_search", "insights", "submit_task", "task_status"}


@pytest.fixture(scope="module")
def daemon():
    root = make_root()
    proc = DaemonProcess(
        root, model=write_script(root, "script", demo_rules()), settings={"EVOLVER_EVOLUTION_HELD_OUT_SHARE": "0"}
    )
    with serving(proc), proc.client() as http:
        for prompt, expected in (("What is 17.5% of 2,340?", "409.5"), ("What is 12.5% of 80?", "10")):
            task = http.post(
                "/v1/tasks",
                json={"prompt": prompt, "check": {"type": "answer", "expected": expected, "match": "numeric"}},
            ).json()
            proc.wait_task(http, task["id"], ("done",))
        rounds = http.post("/v1/evolve", json={"job": "synthesize"}).json()["rounds"]
        assert [r["status"] for r in finished_rounds(rounds, lambda p: http.get(p).json())] == ["done"]
        active = [t["name"] for t in http.get("/v1/tools").json()["synthesized"] if t["status"] == "active"]
        assert active == ["percent_of"], active
        yield proc


def _text(result) -> str:
    return "".join(c.text for c in result.content if c.type == "text")


async def _session(client: Client) -> dict:
    """What one MCP session sees and gets: the tools, and the answers of a few calls."""
    async with client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        learned = await client.call_tool("learned_percent_of", {"percent": 17.5, "value": "2,340"})
        bad_args = await client.call_tool("learned_percent_of", {"nope": 1})
        unknown = await client.call_tool("learned_nothing", {})
        search = await client.call_tool("memory_search", {"text": "percent of a number", "k": 3})
        insights = await client.call_tool("insights", {})
        submitted = await client.call_tool(
            "submit_task", {"prompt": "What is 6 * 7?", "expected_answer": "42", "wait_s": 60}
        )
        status = await client.call_tool("task_status", {"task_id": json.loads(_text(submitted))["task_id"]})
    return {
        "tools": tools,
        "learned": learned,
        "bad_args": bad_args,
        "unknown": unknown,
        "search": search,
        "insights": insights,
        "submitted": submitted,
        "status": status,
    }


def _check(seen: dict) -> None:
    tools = seen["tools"]
    assert FIXED | {"learned_percent_of"} == set(tools)
    schema = tools["learned_percent_of"].input_schema
    assert set(schema["properties"]) == {"percent", "value"}  # the tool's own parameters
    assert not seen["learned"].is_error and _text(seen["learned"]).strip() == "409.5"
    assert seen["bad_args"].is_error and "nope" in _text(seen["bad_args"])
    assert seen["unknown"].is_error and "No active synthesized tool named 'nothing'" in _text(seen["unknown"])
    hits = json.loads(_text(seen["search"]))
    assert hits and any("%" in h["prompt"] for h in hits)
    assert not seen["insights"].is_error
    done = json.loads(_text(seen["status"]))
    assert done["status"] == "done" and done["answer"] == "42"
    assert json.loads(_text(seen["submitted"]))["status"] == "done"


def test_mcp_serve_over_stdio_with_the_sdk_client(daemon):
    seen = asyncio.run(_session(Client(StdioServerParameters(command=EVOLVER, args=["mcp", "serve"], env=daemon.env))))
    _check(seen)
    with daemon.client() as http:  # the learned tool ran in the daemon (outside any task), not in the host
        tool = [t for t in http.get("/v1/tools").json()["synthesized"] if t["name"] == "percent_of"][0]
        assert tool["uses"] == 0  # an MCP caller's calls are not the agent's use of the tool


def test_mcp_serve_over_http_needs_its_token_and_its_host(daemon):
    proc = subprocess.Popen(
        [EVOLVER, "mcp", "serve", "--http"], env=daemon.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        url = read_line(proc.stdout, timeout_s=60, what="`evolver mcp serve --http` to print its URL").strip()
        token = read_line(proc.stdout, timeout_s=60, what="its token").strip().removeprefix("token: ")
        assert url.startswith("http://127.0.0.1:") and url.endswith("/mcp") and len(token) > 30
        hello = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
        assert httpx.post(url, json=hello).status_code == 401
        assert httpx.post(url, json=hello, headers={"authorization": "Bearer wrong"}).status_code == 401
        rebound = httpx.post(
            url,
            json=hello,
            headers={
                "authorization": f"Bearer {token}",
                "host": "evil.example",
                "content-type": "application/json",
                "accept": "application/json, text/event-stream",
            },
        )
        assert rebound.status_code in (403, 421), rebound.text

        async def over_http() -> dict:
            async with httpx2.AsyncClient(headers={"authorization": f"Bearer {token}"}, timeout=120) as http:
                return await _session(Client(streamable_http_client(url, http_client=http)))

        _check(asyncio.run(over_http()))
    finally:
        proc.terminate()
        proc.wait(30)


def _recipe(page: Path, marker: str) -> str:
    """The manual's first sh block on ``page`` that contains ``marker``."""
    blocks = re.findall(r"```sh\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S)
    return next(b for b in blocks if marker in b)


def _first_line_matching(stream, pattern: str, *, timeout_s: float) -> str:
    """The first line of ``stream`` that matches ``pattern``, read in a thread so a silent process cannot
    hold the test past its deadline."""
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [*map(lines.put, stream), lines.put(None)], daemon=True).start()
    deadline = time.monotonic() + timeout_s
    seen = []
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(deadline - time.monotonic(), 0.01))
        except queue.Empty:
            break
        if line is None:  # it ended
            break
        seen.append(line)
        if re.fullmatch(pattern, line.strip()):
            return line.strip()
    raise AssertionError(f"no line matching {pattern} within {timeout_s:g} s; the recipe printed: {''.join(seen)}")


def test_the_manuals_http_recipe_runs_as_written_and_the_sdk_client_reaches_it_with_the_token():
    # The recipe exports EVOLVER_MCP_TOKEN before `evolver up`: neither the daemon nor `mcp serve` may read
    # it as an [mcp] setting. It runs in a home of its own; only the port is changed, to any free one.
    recipe = _recipe(REPO / "docs" / "user-guide" / "mcp.md", "--token-env").replace("--port 8765", "--port 0")
    root = make_root()
    (root / "home").mkdir()
    (root / "run").mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EVOLVER_", "XDG_"))}
    env.update(
        HOME=str(root / "home"),
        XDG_RUNTIME_DIR=str(root / "run"),
        COLUMNS="200",
        PATH=f"{Path(EVOLVER).parent}{os.pathsep}{env['PATH']}",
        EVOLVER_EVOLUTION_ENABLED="false",
    )  # no background jobs: this test is about reaching the server
    shell = subprocess.Popen(
        ["bash", "-e", "-c", recipe],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        url = _first_line_matching(shell.stdout, r"http://127\.0\.0\.1:\d+/mcp", timeout_s=180)
        token_file = root / "home" / ".config" / "evolver" / "mcp-token"
        assert token_file.stat().st_mode & 0o077 == 0  # only its owner can read it
        token = token_file.read_text(encoding="utf-8").strip()
        assert httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"}).status_code == 401

        async def reach() -> tuple[set, object]:
            async with httpx2.AsyncClient(headers={"authorization": f"Bearer {token}"}, timeout=120) as http:
                async with Client(streamable_http_client(url, http_client=http)) as client:
                    names = {t.name for t in (await client.list_tools()).tools}
                    return names, await client.call_tool("insights", {})

        names, insights = asyncio.run(reach())
        assert FIXED <= names
        assert not insights.is_error and json.loads(_text(insights)) == []  # the daemon `evolver up` started
    finally:
        os.killpg(shell.pid, signal.SIGTERM)
        shell.wait(30)
        subprocess.run([EVOLVER, "down"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(root, ignore_errors=True)


def test_over_http_each_checked_header_comes_once_and_an_origin_must_be_its_own_exactly():
    # The guard in front of the SDK's session manager, in-process: what passes it reaches the manager.
    from starlette.testclient import TestClient

    from evolver.loopback import Loopback
    from evolver.mcp.serve import _guarded

    class Manager:
        async def handle_request(self, scope, receive, send) -> None:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"reached"})

    port, bearer = 48124, "Bearer s3cret"
    ours = f"127.0.0.1:{port}"
    http = TestClient(_guarded(Manager(), "s3cret", Loopback(port)), base_url=f"http://{ours}")
    assert http.post("/mcp", headers={"authorization": bearer}).text == "reached"
    for name, values in (
        ("host", [ours, "evil.example"]),
        ("origin", [f"http://{ours}", f"http://{ours}"]),
        ("authorization", ["Bearer wrong", bearer]),
        ("authorization", [bearer, "Bearer wrong"]),
    ):
        reply = http.post(
            "/mcp",
            headers=[*([("authorization", bearer)] if name != "authorization" else []), *[(name, v) for v in values]],
        )
        assert (
            reply.status_code == 400 and reply.text == f"the request has two {name.title()} headers; one is allowed"
        ), (name, values)
    for origin in (
        f"https://{ours}",
        f"http://{ours}:1",
        f"http://127.0.0.1:{port + 1}",
        "http://evil.example",
        "null",
    ):
        reply = http.post("/mcp", headers={"authorization": bearer, "origin": origin})
        assert reply.status_code == 403 and "another origin" in reply.text, origin
    assert http.post("/mcp", headers={"authorization": bearer, "origin": f"http://localhost:{port}"}).text == "reached"
    assert http.post("/mcp", headers={"authorization": bearer, "host": "evil.example"}).status_code == 403


def test_a_missing_argument_of_a_tool_is_named_as_missing(tmp_path):
    # In-process, over no daemon: the arguments are checked against the tool's schema before it is asked.
    from evolver.mcp.serve import build_server

    asked = [
        ("memory_search", {}, "bad arguments: missing required argument 'text'"),
        ("submit_task", {"wait_s": 1}, "bad arguments: missing required argument 'prompt'"),
        ("task_status", {}, "bad arguments: missing required argument 'task_id'"),
        ("insights", {"limit": 5, "colour": "red"}, "bad arguments: unknown argument 'colour' (known: limit)"),
        ("memory_search", {"text": "percent", "k": "3"}, "bad arguments: argument 'k' must be integer, not str"),
        ("task_status", {"task_id": "task_x"}, "the evolver daemon is not answering"),
    ]  # its arguments pass

    async def calls() -> list:
        async with Client(build_server(tmp_path / "no-daemon.sock")) as client:
            return [await client.call_tool(name, args) for name, args, _ in asked]

    for (name, args, expected), result in zip(asked, asyncio.run(calls())):
        assert result.is_error and _text(result).startswith(expected), (name, args, _text(result))
