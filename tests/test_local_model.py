"""[model] local: evolver serves a GGUF itself with llama-server, supervised.

The server here is a stand-in (tests/data/fake_llama_server.py) with llama-server's command line, /health
and API key, so the settings, the key, the restart and the daemon's supervision are tested without a model;
tests/test_real_model.py runs the same paths on the real llama-server and model.
"""

from __future__ import annotations

import os
import signal
import stat
import sys
from pathlib import Path

import httpx
import pytest

from evolver.config import ConfigError, load_config
from evolver.llm.budget import BudgetGuard
from evolver.llm.client import ModelClient
from evolver.llm.local_server import LocalModelError, LocalModels, find_binary, resolve_model
from evolver.testing.daemon import DaemonProcess, make_root, remove_root, wait_for

FAKE = Path(__file__).with_name("data") / "fake_llama_server.py"


@pytest.fixture
def fake_server(tmp_path) -> Path:
    """An executable named llama-server that runs the stand-in."""
    path = tmp_path / "bin" / "llama-server"
    path.parent.mkdir()
    path.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    path.chmod(0o755)
    return path


@pytest.fixture
def gguf(tmp_path) -> Path:
    path = tmp_path / "tiny-model.gguf"
    path.write_bytes(b"GGUF" + bytes(60))
    return path


def _local(tmp_path, fake_server, gguf, **more) -> dict[str, str]:
    return {
        "EVOLVER_MODEL_LOCAL": str(gguf),
        "EVOLVER_MODEL_LOCAL_SERVER": str(fake_server),
        "EVOLVER_DAEMON_RUNTIME_DIR": str(tmp_path / "run"),
        **more,
    }


@pytest.mark.parametrize(
    "env, refused",
    [
        ({"EVOLVER_MODEL_LOCAL": "qwen2.5-coder-0.5b", "EVOLVER_MODEL_NAME": "openai/x"}, "leave name and api_base"),
        ({"EVOLVER_MODEL_LOCAL": "qwen2.5-coder-0.5b", "EVOLVER_MODEL_API_BASE": "http://h"}, "leave name"),
        ({"EVOLVER_META_LOCAL": "qwen2.5-coder-1.5b", "EVOLVER_META_NAME": "openai/y"}, "meta model of its own"),
    ],
)
def test_local_beside_a_named_model_or_server_is_refused_naming_both(env, refused):
    with pytest.raises(ConfigError, match=refused) as caught:
        load_config(env=env)
    assert "local" in str(caught.value)


def test_a_local_model_that_is_neither_known_nor_a_gguf_is_refused_naming_what_is_wanted(tmp_path, monkeypatch):
    monkeypatch.setenv("REAL_MODEL_CACHE", str(tmp_path / "cache"))
    with pytest.raises(LocalModelError, match="neither a GGUF file nor a known model.*qwen2.5-coder-0.5b"):
        resolve_model("llama-70b")
    text = tmp_path / "notes.gguf"
    text.write_text("hello")
    with pytest.raises(LocalModelError, match="not a GGUF file"):
        resolve_model(str(text))
    with pytest.raises(LocalModelError, match="scripts/real-model-setup"):
        resolve_model("qwen2.5-coder-0.5b")  # known, but not fetched into this cache


def test_without_llama_server_the_error_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("REAL_MODEL_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LocalModelError, match="no llama-server.*scripts/real-model-setup"):
        find_binary()
    with pytest.raises(LocalModelError, match="not an executable file"):
        find_binary(str(tmp_path / "nowhere"))


def test_local_models_are_served_behind_a_key_of_their_own_and_stopped(tmp_path, fake_server, gguf, store):
    config = load_config(env=_local(tmp_path, fake_server, gguf))
    models = LocalModels(config, tmp_path / "logs")
    models.start()
    try:
        served = models.served(config)
        (server,) = models.servers.values()
        assert served.model.name == "openai/tiny-model" and served.model.api_base == server.base_url
        assert served.model.local == "" and served.model.structured_output  # a worker given this starts nothing
        key_files = list((tmp_path / "run").glob("llama-model-*.key"))
        assert len(key_files) == 1 and stat.S_IMODE(key_files[0].stat().st_mode) == 0o600
        refused = httpx.post(
            f"{server.base_url}/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}
        )
        assert refused.status_code == 401  # the port is reachable by anyone on the machine; the model is not
        client = ModelClient(served.model, ledger=store.ledger, budget=BudgetGuard(served.budget, store.ledger))
        reply = client.complete([{"role": "user", "content": "ping"}], purpose="task")
        assert reply.content == "ok: ping"
        pid = server.proc.pid
    finally:
        models.stop()
    assert server.proc.poll() is not None and not key_files[0].exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_server_that_dies_is_restarted_on_its_port_with_its_key(tmp_path, fake_server, gguf, store):
    config = load_config(env=_local(tmp_path, fake_server, gguf))
    models = LocalModels(config, tmp_path / "logs")
    models.start()
    try:
        (server,) = models.servers.values()
        port, key, first = server.port, server.key, server.proc.pid
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(10)
        assert models.health()[0]["alive"] is False
        models.supervise()
        wait_for(server.ready, timeout_s=30, what="the restarted server to answer /health")
        assert (server.port, server.key, server.restarts) == (port, key, 1) and server.proc.pid != first
        served = models.served(config)
        client = ModelClient(served.model, ledger=store.ledger, budget=BudgetGuard(served.budget, store.ledger))
        assert client.complete([{"role": "user", "content": "again"}], purpose="task").content == "ok: again"
    finally:
        models.stop()


def test_a_server_that_cannot_start_is_an_error_with_its_log(tmp_path, gguf):
    broken = tmp_path / "llama-server"
    broken.write_text("#!/bin/sh\necho 'error: unknown model architecture' >&2\nexit 3\n")
    broken.chmod(0o755)
    config = load_config(env=_local(tmp_path, broken, gguf))
    with pytest.raises(LocalModelError, match="(?s)exited 3.*unknown model architecture"):
        LocalModels(config, tmp_path / "logs").start()


@pytest.mark.daemon
def test_the_daemon_starts_watches_and_stops_its_local_model(tmp_path, fake_server, gguf):
    root = make_root()
    settings = {"EVOLVER_MODEL_LOCAL": str(gguf), "EVOLVER_MODEL_LOCAL_SERVER": str(fake_server)}
    daemon = DaemonProcess(root, model=None, settings=settings).start()
    try:
        with daemon.client() as http:
            status = http.get("/v1/status").json()
            (served,) = status["local_models"]
            assert status["model"] == "openai/tiny-model" and served["ready"], status
            os.kill(served["pid"], signal.SIGKILL)
            back = wait_for(
                lambda: next(
                    (s for s in http.get("/v1/status").json()["local_models"] if s["ready"] and s["restarts"]), None
                ),
                timeout_s=60,
                what="the daemon to restart its model server",
            )
            assert back["pid"] != served["pid"]
        daemon.terminate(timeout_s=60)
        with pytest.raises(ProcessLookupError):  # `evolver down` took its server with it
            os.kill(back["pid"], 0)
    finally:
        daemon.close()
        remove_root(root)


def test_an_engine_opened_with_model_local_serves_it_until_closed(tmp_path, fake_server, gguf, open_store, sandbox):
    """`evolver run`, `bench` and `packs import` open an engine: with [model] local it serves the model itself."""
    from evolver.engine import Engine

    config = load_config(env=_local(tmp_path, fake_server, gguf))
    engine = Engine.open(config, data_dir=tmp_path / "d", store=open_store(tmp_path / "d"), sandbox=sandbox)
    try:
        assert engine.config.model.name == "openai/tiny-model"
        assert engine.model.complete([{"role": "user", "content": "hi"}], purpose="task").content == "ok: hi"
        proc = engine.local_models.servers["model"].proc
    finally:
        engine.close()
    assert proc.poll() is not None


def test_the_local_pair_is_two_servers_each_behind_its_own_key(tmp_path, fake_server, gguf, store):
    meta_gguf = tmp_path / "bigger-model.gguf"
    meta_gguf.write_bytes(b"GGUF" + bytes(60))
    config = load_config(env=_local(tmp_path, fake_server, gguf, EVOLVER_META_LOCAL=str(meta_gguf)))
    models = LocalModels(config, tmp_path / "logs")
    models.start()
    try:
        served = models.served(config)
        meta = served.meta.settings(served.model)
        assert (served.model.name, meta.name) == ("openai/tiny-model", "openai/bigger-model")
        assert meta.api_base != served.model.api_base and meta.api_key_env != served.model.api_key_env
        assert [h["slots"] for h in models.health()] == [4, 2]  # the meta model's server: [meta] local_slots
        client = ModelClient(meta, ledger=store.ledger, budget=BudgetGuard(served.budget, store.ledger))
        assert client.complete([{"role": "user", "content": "lesson"}], purpose="distill").content == "ok: lesson"
    finally:
        models.stop()
