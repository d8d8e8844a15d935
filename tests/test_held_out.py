"""The held-out split never leaks, told through a real daemon: a held-out task solved once (a pack's,
benched through the daemon, and a person's, put in the held-out split at intake) never reaches any
prompt its model is sent afterwards: not as a retrieved example for a similar task, not in a distill
round, a tool-synthesis round or the proposer's prompt. And a held-out task's text is held out through
every door a task comes in by: the API, chat, MCP's submit_task, and with the daemon stopped `evolver run`
and a local `evolver bench`."""

from __future__ import annotations

import asyncio
import json

import pytest
from mcp import Client

from evolver.mcp.serve import build_server
from evolver.testing.daemon import DaemonProcess, demo_rules, make_root, remove_root, run_rounds, wait_for, write_script
from tests.test_cli import run

PACK = (
    "\n".join(
        json.dumps(t)
        for t in [
            {"id": "t1", "prompt": "What is 2 + 3?", "check": {"type": "answer", "expected": "5"}},
            {
                "id": "h1",
                "prompt": "What is 7717 + 1?",
                "check": {"type": "answer", "expected": "7718"},
                "split": "test",
            },
        ]
    )
    + "\n"
)
PROPOSER = {
    "match": "You improve an agent by editing its scaffold",
    "on": "all",
    "reply": json.dumps({"rationale": "fewer steps", "edit": {"parameters": {"max_steps": 8}}}),
}
# A distiller that writes the first task it is shown into an insight, so a leak into distillation
# would travel on into the proposer's "lessons from experience" too.
DISTILLER = {
    "match": r"You maintain a short list of insights[\s\S]*?New experience:\n- Task: (?P<t>[^\n]*)\n",
    "on": "all",
    "reply": '{"operations": [{"op": "ADD", "text": "Learned from: \\g<t>"}]}',
}
SOLVED = ("done",)


@pytest.fixture
def daemon():
    root = make_root()
    (root / "pack.jsonl").write_text(PACK)
    model = write_script(root, "script", [PROPOSER, DISTILLER, *demo_rules()], record=root / "sent.jsonl")
    d = DaemonProcess(
        root,
        model=model,
        settings={
            "EVOLVER_EVOLUTION_ENABLED": "false",  # rounds run only when the test asks
            "EVOLVER_EVOLUTION_EVALUATION_SLOTS": 1,
            "EVOLVER_EVOLUTION_HELD_OUT_SHARE": 0.999,
            "EVOLVER_EVOLUTION_PACKS": json.dumps([str(root / "pack.jsonl")]),
        },
    )
    try:
        yield d.start()
    finally:
        d.close()
        remove_root(root)


def _sent(daemon: DaemonProcess) -> list[list[dict]]:
    path = daemon.root / "sent.jsonl"
    return [json.loads(line)["messages"] for line in path.read_text().splitlines()] if path.exists() else []


def _task_of(conversation: list[dict]) -> str:
    """The task a solving conversation is about (the first line after "Task:"), or "" for a meta round."""
    first = next((m["content"] for m in conversation if m["role"] == "user"), "")
    return first.split("\n")[1] if first.startswith("Task:\n") else ""


def _round(http, job: str) -> str:
    (done,) = run_rounds(http, job)
    assert done["ok"], done
    return done["summary"]


def test_a_held_out_task_solved_once_never_reaches_a_prompt(daemon):
    with daemon.client() as http:
        # A pack's held-out task, benched through the daemon: kept in its split, with its source.
        bench = run("bench", str(daemon.root / "pack.jsonl"), "--split", "test", "--json", env=daemon.env)
        assert bench.returncode == 0, bench.stderr + daemon.log()
        assert json.loads(bench.stdout)["solved"] == 1
        (benched,) = http.get("/v1/tasks", params={"source": "bench"}).json()["tasks"]
        assert benched["metadata"]["split"] == "test" and benched["metadata"]["pack_task"] == "h1"
        # Sent again as a person's task that claims the training split, it is held out all the same.
        again = http.post("/v1/tasks", json={"prompt": "What is 7717 + 1?", "metadata": {"split": "train"}})
        assert again.status_code == 201 and again.json()["metadata"]["split"] == "test", again.text
        assert http.post("/v1/tasks", json={"prompt": "x", "metadata": {"split": "dev"}}).status_code == 422

        # A person's task with a check: its split is decided at intake (about 999 in 1000 held out here;
        # an id that hashes into training is learnable, so take another task then).
        held_out = ["What is 7717 + 1?"]
        for n in range(1, 4):
            prompt, answer = f"What is 88{n}8 + 1?", f"88{n}9"
            task = http.post(
                "/v1/tasks", json={"prompt": prompt, "check": {"type": "answer", "expected": answer}}
            ).json()
            assert task["metadata"].get("split") in ("train", "test"), task
            assert daemon.wait_task(http, task["id"], SOLVED)["status"] == "done"
            if task["metadata"]["split"] == "test":
                held_out.append(prompt)
                break
        assert len(held_out) == 2

        # Its text sent as a chat message is held out too: a chat is no side door into training.
        chat = http.post(
            "/v1/chat/completions",
            json={"model": "evolver", "messages": [{"role": "user", "content": "What is 7717 + 1?"}]},
        )
        assert chat.status_code == 200, chat.text
        (chatted,) = http.get("/v1/tasks", params={"source": "chat"}).json()["tasks"]
        assert chatted["metadata"]["split"] == "test", chatted

        # And handed over by an MCP client's submit_task (a task of the API's, through the socket).
        async def submit_by_mcp() -> dict:
            async with Client(build_server(daemon.socket_path)) as client:
                done = await client.call_tool("submit_task", {"prompt": "What is 7717 + 1?", "wait_s": 60})
                return json.loads(done.content[0].text)

        by_mcp = http.get(f"/v1/tasks/{asyncio.run(submit_by_mcp())['task_id']}").json()
        assert by_mcp["metadata"]["split"] == "test", by_mcp

        # Similar tasks later (no check: nothing to hold out) get examples from memory.
        for prompt in ("What is 7717 + 2?", "What is 8818 + 2?"):
            later = http.post("/v1/tasks", json={"prompt": prompt}).json()
            assert daemon.wait_task(http, later["id"], SOLVED)["status"] == "done"
        assert "from" in _round(http, "distill")
        _round(http, "synthesize")
        assert _round(http, "evolve").startswith("queued 1 evaluations")  # the root on the training task

        def recorded():
            _round(http, "record")
            return sum(n["successes"] + n["failures"] for n in http.get("/v1/tree").json()["nodes"])

        wait_for(recorded, timeout_s=120, what="the root's evaluation recorded")
        assert "smoke task" in _round(http, "evolve")  # an expansion: the proposer is asked

    sent = _sent(daemon)
    kinds = {
        "distill": "You maintain a short list of insights",
        "synthesize": "You write one reusable tool",
        "propose": "You improve an agent by editing its scaffold",
    }
    for kind, marker in kinds.items():
        assert any(marker in m["content"] for c in sent for m in c), f"no {kind} round reached the model"
    proposer = next(c for c in sent if kinds["propose"] in c[0]["content"])
    assert "Learned from: What is" in proposer[1]["content"]  # distilled lessons do reach the proposer
    later = [c for c in sent if _task_of(c) in ("What is 7717 + 2?", "What is 8818 + 2?")]
    assert later, "the later tasks never reached the model"
    for conversation in sent:
        if _task_of(conversation) in held_out:  # the held-out task's own attempt
            continue
        text = "\n".join(m["content"] for m in conversation)
        for prompt in held_out:
            assert prompt.removeprefix("What is ").removesuffix("?") not in text, (prompt, text[:3000])

    # The doors that work on the store with no daemon: `evolver run`, and a local bench of a pack that
    # labels the held-out text as training.
    daemon.close()
    (daemon.root / "sneaky.jsonl").write_text(
        json.dumps({"id": "s1", "prompt": "What is 7717 + 1?", "check": {"type": "answer", "expected": "7718"}}) + "\n"
    )
    for door in (["run", "What is 7717 + 1?", "--quiet"], ["bench", str(daemon.root / "sneaky.jsonl"), "--json"]):
        done = run(*door, env=daemon.env)
        assert done.returncode == 0, door + [done.stdout, done.stderr]
    tasks = json.loads(run("tasks", "--json", "--limit", "100", env=daemon.env).stdout)["tasks"]
    for source in ("cli", "bench"):
        local = [t for t in tasks if t["source"] == source and t["prompt"] == "What is 7717 + 1?"]
        assert local and all(t["metadata"].get("split") == "test" for t in local), (source, local)
