"""A model per purpose: the task model answers tasks, the meta model ([meta]) answers the meta-agent, and each
is charged to its own line of the ledger."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from evolver.agent.scaffold import default_scaffold
from evolver.config import ConfigError, load_config
from evolver.engine import Engine
from evolver.llm import scripted
from evolver.meta.jobs import builtin_jobs
from tests.test_cli import run

TASK_RULES = [
    {"match": r"Say the word (\w+)", "on": "task", "tool": "finish", "arguments": {"answer": r"\1"}},
    {"match": "", "reply": "a task model cannot distill"},
]
DISTILLED = "Answer with the asked word alone."
META_RULES = [{"match": "", "reply": json.dumps({"operations": [{"op": "ADD", "text": DISTILLED}]})}]


@pytest.fixture
def engine(open_store, sandbox, tmp_path):
    scripted.register_script("task-side", {"rules": TASK_RULES})
    scripted.register_script("meta-side", {"rules": META_RULES})
    config = load_config(
        env={
            "EVOLVER_MODEL_NAME": "scripted/task-side",
            "EVOLVER_META_NAME": "scripted/meta-side",
            "EVOLVER_EVOLUTION_DISTILL_AFTER": "1",
        }
    )
    e = Engine.open(config, data_dir=tmp_path / "d", store=open_store(tmp_path / "d"), sandbox=sandbox)
    yield e
    e.close()


def _ledger(store) -> list[tuple[str, str]]:
    return [(r["model"], r["purpose"]) for r in store.database.all("SELECT model, purpose FROM ledger ORDER BY id")]


def test_a_task_step_goes_to_the_task_model_and_a_distill_answer_to_the_meta_model_each_on_its_own_line(engine):
    store = engine.store
    scaffold = default_scaffold()
    scaffold = scaffold.model_copy(
        update={"parameters": scaffold.parameters.model_copy(update={"reflect_retry": False, "max_attempts": 1})}
    )
    task, _ = store.inbox.add_task("Say the word blue.", check={"type": "answer", "expected": "blue"})
    assert engine.agent(scaffold).run_task(task).success is True
    (distill,) = [j for j in builtin_jobs(engine.config) if j.name == "distill"]
    host = SimpleNamespace(config=engine.config, engine=engine, tree=None, store=store)
    assert distill.run(host).startswith("1 operations (ADD)")
    assert [i.text for i in store.insights.list_insights()] == [
        DISTILLED
    ]  # the meta model's answer, not the task model's
    assert _ledger(store) == [("scripted/task-side", "task"), ("scripted/meta-side", "distill")]
    by_model = store.reports.spent_by_model()
    assert set(by_model) == {"scripted/task-side", "scripted/meta-side"}
    assert sum(t for t, _ in by_model.values()) == store.ledger.spent()[0]


def test_without_a_meta_model_the_task_model_is_the_meta_agents(open_store, sandbox, tmp_path):
    config = load_config(env={"EVOLVER_MODEL_NAME": "scripted/demo"})
    with Engine.open(config, data_dir=tmp_path / "d", store=open_store(tmp_path / "d"), sandbox=sandbox) as e:
        assert e.meta is e.model


def test_the_meta_model_takes_its_own_server_key_and_timeout_and_the_rest_of_model():
    config = load_config(
        env={
            "EVOLVER_MODEL_NAME": "openai/small",
            "EVOLVER_MODEL_API_BASE": "http://127.0.0.1:8080/v1",
            "EVOLVER_MODEL_STRUCTURED_OUTPUT": "true",
            "EVOLVER_MODEL_FALLBACKS": '["openai/x"]',
            "EVOLVER_META_NAME": "openai/large",
            "EVOLVER_META_API_BASE": "http://127.0.0.1:8081/v1",
            "EVOLVER_META_API_KEY_ENV": "META_KEY",
            "META_KEY": "sk-not-a-setting",
        }
    )
    meta = config.meta.settings(config.model)
    assert (meta.name, meta.api_base, meta.api_key_env, meta.timeout_s) == (
        "openai/large",
        "http://127.0.0.1:8081/v1",
        "META_KEY",
        300.0,
    )
    assert meta.structured_output is True and meta.fallbacks == []  # [model]'s own settings, its fallbacks not
    assert config.model.name == "openai/small"


def test_a_misspelt_meta_key_is_refused_naming_it(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("[meta]\nnme = 'openai/large'\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"nme"):
        load_config(path, env={})


def test_config_check_names_a_missing_meta_key_without_printing_any_key(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(
        '[model]\nname = "scripted/demo"\n[meta]\nname = "openai/gpt-4o-mini"\napi_key_env = "EVOLVER_TEST_META_KEY"\n',
        encoding="utf-8",
    )
    missing = run("--config", str(config), "config", "check")
    assert missing.returncode == 2
    assert (
        "[meta] openai/gpt-4o-mini: no API key: the environment variable EVOLVER_TEST_META_KEY "
        "([meta] api_key_env) is not set"
    ) in missing.stderr
    present = run("--config", str(config), "config", "check", env={"EVOLVER_TEST_META_KEY": "sk-secret-123"})
    assert present.returncode == 0, present.stderr
    shown = run("--config", str(config), "config", "show", env={"EVOLVER_TEST_META_KEY": "sk-secret-123"})
    assert "sk-secret-123" not in shown.stdout + shown.stderr and "EVOLVER_TEST_META_KEY" in shown.stdout


@pytest.mark.daemon
def test_the_daemons_status_shows_each_models_spend():
    from evolver.testing.daemon import DaemonProcess, make_root, run_rounds, serving, write_script

    root = make_root()
    task_model, meta = write_script(root, "task-side", TASK_RULES), write_script(root, "meta-side", META_RULES)
    # No task held out by chance (a held-out attempt is never distilled): the one below must be learned from.
    daemon = DaemonProcess(
        root,
        model=task_model,
        settings={
            "EVOLVER_META_NAME": meta,
            "EVOLVER_EVOLUTION_ENABLED": "false",
            "EVOLVER_EVOLUTION_HELD_OUT_SHARE": "0",
        },
    )
    with serving(daemon), daemon.client() as http:
        task = http.post(
            "/v1/tasks", json={"prompt": "Say the word blue.", "check": {"type": "answer", "expected": "blue"}}
        ).json()
        daemon.wait_task(http, task["id"], ("done",))
        (distilled,) = run_rounds(http, "distill")
        assert distilled["ok"] and distilled["summary"].startswith("1 operations"), distilled["summary"]
        status = http.get("/v1/status").json()
        assert (status["model"], status["meta_model"]) == (task_model, meta)
        assert set(status["budget"]["by_model"]) == {task_model, meta}
        shown = run("status", env=daemon.env)
        assert shown.returncode == 0, shown.stderr
        text = " ".join(shown.stdout.split())  # as a person reads it, however rich wrapped it
        assert f"meta model {meta}" in text and f"{meta} " in text.split("spent today:")[1]
