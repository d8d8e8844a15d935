"""The real-model tier: a real small model drives the real paths.

Qwen2.5-Coder-0.5B-Instruct (Q4_K_M) behind llama.cpp's llama-server, started here on 127.0.0.1 for these
tests, reached through litellm exactly as a user's local server is. The tier asserts that each path works
end to end, never a success rate: litellm reaches the server, the model's tool calls are parsed and run
in the sandbox, a task ends without an internal error, a daemon that serves the model itself answers a
chat and restarts a killed server, and a distill and a propose round end in a valid result or a recorded,
clean refusal.

It needs llama-server and the GGUFs: ``eval "$(scripts/real-model-setup 1.5b)"`` builds and fetches them
(cached) and sets REAL_MODEL_SERVER, REAL_MODEL_GGUF and REAL_MODEL_GGUF_1_5B (the 1.5B model, the meta
model of the pair's test). The servers run as [model] local runs them (``LlamaServer``): loopback, a key
of their own, parallel slots; the daemon's test sets [model] local itself. Without them the tier skips,
saying so; under CI (CI=true) it fails instead.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import httpx
import numpy as np
import pytest

from evolver.agent.answer_stream import AnswerStream
from evolver.agent.scaffold import load_scaffold
from evolver.config import load_config
from evolver.engine import Engine
from evolver.llm.local_server import LlamaServer, LocalModelError, ServerSpec, find_binary
from evolver.meta.distill import distill_round
from evolver.meta.insights import InsightOpError
from evolver.testing.daemon import DaemonProcess, make_root, remove_root
from evolver.tree.incumbent import ensure_root, incumbent
from evolver.tree.search import TreeSearch
from memory import Ending

ALIAS = "qwen2.5-coder-0.5b"
META_ALIAS = "qwen2.5-coder-1.5b"
SETUP = 'eval "$(scripts/real-model-setup 1.5b)"'


def _need(variable: str) -> str:
    """The path ``variable`` names, with llama-server found; skips (fails under CI) without them."""
    model = os.environ.get(variable, "")
    try:
        find_binary(os.environ.get("REAL_MODEL_SERVER", ""))
        ok = bool(model) and Path(model).exists()
    except LocalModelError:
        ok = False
    if not ok:
        message = (
            f"the real-model tier needs llama-server and the model ({variable}): run "
            f"{SETUP} (builds and fetches both, cached; about 5 min the first time)"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return model


def _serve(tmp_path_factory, variable: str, alias: str, slots: int = 4):
    """llama-server for the GGUF that ``variable`` names, as [model] local serves it; yields the server."""
    model = _need(variable)
    spec = ServerSpec(
        binary=find_binary(os.environ.get("REAL_MODEL_SERVER", "")),
        model=Path(model),
        alias=alias,
        slots=slots,
        context=8192,
        threads=os.cpu_count() or 1,
    )
    where = tmp_path_factory.mktemp("llama")
    server = LlamaServer(spec, where / "run", where / "server.log", name=alias)
    try:
        server.start()
        os.environ[_key_env(alias)] = server.key
        yield server
    finally:
        server.stop()


def _key_env(alias: str) -> str:
    return "REAL_TIER_KEY_" + alias.replace(".", "_").replace("-", "_").upper()


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """The 0.5B model's server (the task model); it runs for this module's tests only."""
    yield from _serve(tmp_path_factory, "REAL_MODEL_GGUF", ALIAS)


@pytest.fixture(scope="module")
def llama_meta(tmp_path_factory):
    """The 1.5B model's server, the meta model beside the 0.5B."""
    yield from _serve(tmp_path_factory, "REAL_MODEL_GGUF_1_5B", META_ALIAS)


def _settings(server: LlamaServer, section: str = "model") -> dict[str, str]:
    """What reaches ``server`` from ``section``: its key by the variable that holds it (in this process's
    environment, and in the settings, for a daemon started with them)."""
    return {
        f"EVOLVER_{section.upper()}_NAME": f"openai/{server.spec.alias}",
        f"EVOLVER_{section.upper()}_API_BASE": server.base_url,
        f"EVOLVER_{section.upper()}_API_KEY_ENV": _key_env(server.spec.alias),
        _key_env(server.spec.alias): server.key,
        f"EVOLVER_{section.upper()}_TIMEOUT_S": "600" if section == "meta" else "300",
    } | ({"EVOLVER_MODEL_MAX_RETRIES": "1"} if section == "model" else {})


@pytest.fixture
def engine(llama, open_store, sandbox, tmp_path):
    e = Engine.open(
        load_config(env=_settings(llama)), data_dir=tmp_path / "d", store=open_store(tmp_path / "d"), sandbox=sandbox
    )
    ensure_root(e.store, e.seed_scaffold())
    return e


def _short(e: Engine, **parameters):
    """The seed scaffold with a few steps and one attempt: the tier checks paths, not skill."""
    data = json.loads(e.seed_scaffold().model_dump_json())
    data["parameters"].update({"max_steps": 4, "max_attempts": 1, "temperature": 0.0, **parameters})
    return load_scaffold(data)


def test_litellm_reaches_the_server_with_its_key_and_nothing_does_without(engine, llama):
    refused = httpx.post(f"{llama.base_url}/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert refused.status_code == 401, refused.text  # another user of the machine reaches the port, not the model
    reply = engine.model.complete(
        [{"role": "user", "content": "Say hello in one word."}], purpose="task", max_tokens=16
    )
    assert reply.content.strip() and reply.tokens_out > 0
    tokens, _ = engine.store.ledger.spent(purpose="task")
    assert tokens > 0  # the ledger has the call


def test_a_task_runs_its_tool_calls_in_the_sandbox_and_ends_cleanly(engine):
    task, _ = engine.store.inbox.add_task(
        "Use the run_python tool to print the result of 17 * 23, then call finish with that number.",
        check={"type": "answer", "expected": "391"},
    )
    result = engine.agent(_short(engine, action_format="tools")).run_task(task)
    assert result.ending not in (Ending.INTERNAL_ERROR, Ending.MODEL_ERROR), (result.ending, result.error)
    steps = [step for _, _, step in engine.store.inbox.task_steps(task.id)]
    ran = [r for step in steps for r in (step.tool_results or [])]
    shown = [(step.role, step.content[:300]) for step in steps]
    # The model's call was parsed (repaired if need be) and run: run_python runs in the sandbox.
    assert any(r["ok"] and r["name"] in ("run_python", "run_shell") for r in ran), shown


def test_the_seed_acts_in_code_and_a_code_task_gets_its_function_delivered(engine):
    """The seed's auto format picks code for this text-mode model; its block runs in the session and what the
    session defined is in solution.py for the judge (the tier checks the path, not that the code is right)."""
    from evolver.judge.catalog import resolve_pack

    (pack_task,) = [t for t in resolve_pack("basic") if t.id == "func-02"]  # is_palindrome
    task, _ = engine.store.inbox.add_task(pack_task.prompt, check=pack_task.check_data(), metadata=pack_task.metadata())
    agent = engine.agent(_short(engine))
    assert agent.acts_in_code()
    result = agent.run_task(task)
    assert result.ending not in (Ending.INTERNAL_ERROR, Ending.MODEL_ERROR), (result.ending, result.error)
    steps = [step for _, _, step in engine.store.inbox.task_steps(task.id)]
    shown = [(step.role, step.content[:300]) for step in steps]
    assert any(r["name"] == "run_python" for step in steps for r in (step.tool_results or [])), shown
    work = [step.content for step in steps if step.role == "work"]
    assert work and "def is_palindrome(" in work[-1], shown  # the delivered module, or at least the code run


def test_with_structured_output_every_step_is_a_well_formed_call(llama, open_store, sandbox, tmp_path):
    settings = {
        **_settings(llama),
        "EVOLVER_MODEL_TOOL_MODE": "text",
        "EVOLVER_MODEL_STRUCTURED_OUTPUT": "true",
        "EVOLVER_MODEL_SCHEMA_FORMAT": "json_schema",
    }
    e = Engine.open(
        load_config(env=settings), data_dir=tmp_path / "d", store=open_store(tmp_path / "d"), sandbox=sandbox
    )
    ensure_root(e.store, e.seed_scaffold())
    task, _ = e.store.inbox.add_task(
        "What is 12 * 12? Compute it with run_python, then call finish with it.",
        check={"type": "answer", "expected": "144"},
    )
    result = e.agent(_short(e, max_steps=3, action_format="tools")).run_task(task)
    assert result.ending not in (Ending.INTERNAL_ERROR, Ending.MODEL_ERROR), (result.ending, result.error)
    calls = [c for _, _, step in e.store.inbox.task_steps(task.id) for c in (step.tool_calls or [])]
    assert calls and all(c.get("error") is None for c in calls), calls  # the grammar allows nothing else


def test_a_chat_answer_streams_from_the_real_server_as_it_does_from_the_script(llama, open_store, sandbox, tmp_path):
    """The model's reply streamed (text tool calls constrained by the grammar, usage in the last chunk):
    the answer's pieces arrive as it is written and add up to the finish call's answer."""
    settings = {
        **_settings(llama),
        "EVOLVER_MODEL_TOOL_MODE": "text",
        "EVOLVER_MODEL_STRUCTURED_OUTPUT": "true",
        "EVOLVER_MODEL_SCHEMA_FORMAT": "json_schema",
    }
    e = Engine.open(
        load_config(env=settings), data_dir=tmp_path / "d", store=open_store(tmp_path / "d"), sandbox=sandbox
    )
    finish = [
        {
            "type": "function",
            "function": {
                "name": "finish",
                "description": "Hand in your final answer.",
                "parameters": {"type": "object", "required": ["answer"], "properties": {"answer": {"type": "string"}}},
            },
        }
    ]
    pieces: list[str] = []
    reply = e.model.complete(
        [{"role": "user", "content": "Call finish with the answer: the sky is blue."}],
        tools=finish,
        temperature=0.0,
        purpose="task",
        max_tokens=64,
        stream=AnswerStream(pieces.append).tap(),
    )
    assert reply.tokens_out > 0 and reply.tool_calls and reply.tool_calls[0].error is None, reply
    assert reply.tool_calls[0].name == "finish"  # the grammar allows no other call
    answer = reply.tool_calls[0].arguments["answer"]
    assert len(pieces) > 1 and "".join(pieces) == answer


def test_a_distill_and_a_propose_round_end_valid_or_in_a_clean_refusal(engine):
    task, _ = engine.store.inbox.add_task(
        "What is 6 * 7? Answer with the number only.", check={"type": "answer", "expected": "42"}
    )
    engine.agent(_short(engine, max_steps=2)).run_task(task)
    _distill_and_step(engine)


def _distill_and_step(engine: Engine) -> None:
    """A distill round and a tree step that asks the proposer, with the meta-agent's model: each ends in a
    result or a refusal that says what came back (the job host records it); nothing else."""
    try:
        assert distill_round(engine.store, engine.meta, engine.config)
    except InsightOpError as exc:
        assert "came back" in str(exc) or "not" in str(exc), exc
    root = incumbent(engine.store)
    for _ in range(3):  # enough finished evaluations that the step expands: the proposer is asked
        evaluation = engine.store.tree.start_evaluation(root.id, "pack:x:t", split="train")
        engine.store.tree.finish_evaluation(evaluation.id, success=False)
    summary = TreeSearch(engine, rng=np.random.default_rng(0)).step()
    (child,) = [n for n in engine.store.tree.list_nodes() if n.parent_id is not None]
    # a proposed child whose smoke task is queued, or an invalid node with the reason
    assert child.status in ("proposed", "invalid"), (child.status, summary)
    assert child.status == "proposed" or child.reason, summary


def test_with_the_1_5b_as_meta_model_a_distill_round_and_a_tree_step_are_its_calls(
    llama, llama_meta, open_store, sandbox, tmp_path
):
    """The local pair: the 0.5B answers the task, the 1.5B ([meta]) the distill round and the proposer, each
    call on its own model's line of the ledger. Paths, not skill: a result or a clean refusal."""
    settings = {**_settings(llama), **_settings(llama_meta, "meta")}
    with Engine.open(
        load_config(env=settings), data_dir=tmp_path / "d", store=open_store(tmp_path / "d"), sandbox=sandbox
    ) as engine:
        ensure_root(engine.store, engine.seed_scaffold())
        task, _ = engine.store.inbox.add_task(
            "What is 6 * 7? Answer with the number only.", check={"type": "answer", "expected": "42"}
        )
        engine.agent(_short(engine, max_steps=2)).run_task(task)
        _distill_and_step(engine)
        calls = {(r["purpose"], r["model"]) for r in engine.store.database.all("SELECT purpose, model FROM ledger")}
        assert {p for p, _ in calls} >= {"task", "distill", "propose"}, calls
        assert {m for p, m in calls if p in ("distill", "propose")} == {f"openai/{META_ALIAS}"}, calls
        assert {m for p, m in calls if p == "task"} == {f"openai/{ALIAS}"}, calls


def test_the_real_models_failures_without_an_answer_are_distilled_by_the_real_model(engine):
    """Its own recorded attempts that hit the step limit (tests/data/real_model_failures.json) go to
    distillation, not past it: the round reads them and ends in operations or a clean refusal."""
    from tests.test_distill import real_failures

    ids = engine.store.attempts.ingest(real_failures())
    try:
        summary = distill_round(engine.store, engine.model, engine.config)
    except InsightOpError as exc:
        assert "came back" in str(exc) or "not" in str(exc), exc
        print("the real model's distill answer was refused:", exc)
        return
    assert summary.endswith(f"from {len(ids)} trajectories"), summary  # none skipped
    print("distilled from the real model's failures:", summary, [i.text for i in engine.store.insights.list_insights()])


def test_a_daemon_with_model_local_serves_the_model_itself_and_restarts_it_after_a_kill():
    """[model] local: set one line and the daemon serves the model (llama-server, its own child); a chat
    answers, streamed too; a killed server comes back and a task submitted meanwhile still ends."""
    model = _need("REAL_MODEL_GGUF")
    root = make_root()
    settings = {
        "EVOLVER_MODEL_LOCAL": model,
        "EVOLVER_MODEL_LOCAL_SERVER": os.environ.get("REAL_MODEL_SERVER", ""),
        "EVOLVER_MODEL_LOCAL_SLOTS": "2",
        "EVOLVER_MODEL_TIMEOUT_S": "300",
    }
    daemon = DaemonProcess(root, model=None, settings=settings).start(timeout_s=300)
    try:
        with daemon.client(timeout_s=600.0) as http:
            (served,) = http.get("/v1/status").json()["local_models"]
            assert served["ready"] and served["pid"] and served["slots"] == 2, served
            answer = http.post(
                "/v1/chat/completions",
                json={"model": "evolver", "messages": [{"role": "user", "content": "Reply with the word ready."}]},
            )
            assert answer.status_code == 200, answer.text
            text = answer.json()["choices"][0]["message"]["content"]
            assert text.strip()  # an answer, or the clear sentence saying the turn ended without one
            with http.stream(
                "POST",
                "/v1/chat/completions",
                json={  # the model's reply streamed, too
                    "model": "evolver",
                    "stream": True,
                    "messages": [{"role": "user", "content": "Reply with the word ready."}],
                },
            ) as response:
                chunks = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
            assert len({c["id"] for c in chunks}) == 1 and chunks[-1]["choices"][0]["finish_reason"] == "stop"
            assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks).strip()
            os.kill(served["pid"], signal.SIGKILL)
            task = http.post("/v1/tasks", json={"prompt": "What is 2 + 3? Answer with the number only."}).json()
            ended = daemon.wait_task(http, task["id"], ("done", "failed", "dead"), timeout_s=600)
            assert ended["status"] in ("done", "failed"), ended  # it ended: answered, or failed cleanly
            (back,) = http.get("/v1/status").json()["local_models"]
            assert back["restarts"] >= 1 and back["pid"] not in (None, served["pid"]), back
    finally:
        daemon.close()
        remove_root(root)
