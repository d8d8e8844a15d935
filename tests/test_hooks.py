"""Scaffold policy hooks: they run in a sandbox of their own at four points of the loop, change what the
agent does, and a broken one is recorded and ignored (and fails an evaluation)."""

from __future__ import annotations

import json

import pytest

from evolver.agent.hooks import HookError, check_reply, hook_points
from evolver.agent.scaffold import default_scaffold
from evolver.config import load_config
from evolver.engine import Engine
from evolver.llm import scripted
from memory import TaskKind

# The model hands in its answer as a sentence; the check wants the number alone.
WORDY = [
    {
        "match": r"What is (\d+) \+ (\d+)\?",
        "role": "user",
        "tool": "finish",
        "arguments": {"answer": "The answer is 42."},
    }
]
NORMALISE = (
    "import re\n"
    "def before_finish(data):\n"
    "    numbers = re.findall(r'-?[0-9]+', data['answer'] or '')\n"
    "    return {'answer': numbers[-1]} if numbers else None\n"
)
CHECK = {"type": "answer", "expected": "42"}


@pytest.fixture
def engine_for(open_store, sandbox, tmp_path):
    def make(rules: list[dict], name: str, record=None, **env) -> Engine:
        scripted.register_script(name, {"rules": rules, **({"record": str(record)} if record else {})})
        config = load_config(
            env={"EVOLVER_MODEL_NAME": f"scripted/{name}", **{f"EVOLVER_{k.upper()}": str(v) for k, v in env.items()}}
        )
        return Engine.open(config, data_dir=tmp_path / name, store=open_store(tmp_path / name), sandbox=sandbox)

    return make


def with_hooks(source: str, **parameters):
    base = default_scaffold()
    return base.model_copy(
        update={
            "hooks": source,
            "parameters": base.parameters.model_copy(update={"reflect_retry": False, "max_attempts": 1, **parameters}),
        }
    )


def solve(engine: Engine, source: str, kind: TaskKind = TaskKind.API, **parameters):
    """What is 19 + 23? (checked: 42), as a task of ``kind``, on the seed scaffold with these hooks."""
    task, _ = engine.store.inbox.add_task("What is 19 + 23?", check=CHECK, source=kind)
    return engine.agent(with_hooks(source, **parameters)).run_task(task)


def hook_steps(engine: Engine, result) -> list:
    return [s for t in result.trajectory_ids for s in engine.store.reports.steps(t) if s.role == "hook"]


def test_a_before_finish_hook_turns_a_failing_task_into_a_success(engine_for):
    engine = engine_for(WORDY, "h-finish")
    without = solve(engine, "")
    assert (without.status, without.answer, without.success) == ("failed", "The answer is 42.", False)
    hooked = solve(engine, NORMALISE)
    assert (hooked.status, hooked.answer, hooked.success) == ("done", "42", True)
    (step,) = hook_steps(engine, hooked)
    assert step.content.startswith("before_finish changed answer") and '"42"' in step.content
    assert step.tool_results == [{"hook": "before_finish", "changed": True, "error": None}]


def test_a_rejecting_hook_refuses_the_finish_and_the_model_goes_on(engine_for):
    rules = [
        {"match": "finish was refused: give a number", "role": "tool", "tool": "finish", "arguments": {"answer": "42"}},
        *WORDY,
    ]
    engine = engine_for(rules, "h-reject")
    reject = (
        "def before_finish(data):\n"
        "    if not data['answer'].strip().isdigit():\n"
        "        return {'reject': 'give a number'}\n"
    )
    result = solve(engine, reject)
    assert (result.status, result.answer) == ("done", "42")
    steps = [(s.role, s.content) for s in engine.store.reports.steps(result.trajectory_ids[0])]
    assert [role for role, _ in steps] == ["assistant", "hook", "tool", "assistant", "tool"]
    assert (
        steps[1][1].startswith("before_finish refused the finish")
        and steps[2][1] == "finish was refused: give a number"
    )


def test_after_tool_and_before_model_hooks_change_what_the_model_sees(engine_for, tmp_path):
    record = tmp_path / "seen.jsonl"
    rules = [
        {"match": "NOTE FROM HOOK", "on": "all", "tool": "finish", "arguments": {"answer": "42"}},
        {
            "match": r"What is (\d+) \+ (\d+)\?",
            "role": "user",
            "tool": "run_python",
            "arguments": {"code": r"print(\1 + \2)"},
        },
        {"match": "", "role": "tool", "tool": "run_python", "arguments": {"code": "print(0)"}},
    ]
    engine = engine_for(rules, "h-tool", record=record)
    source = (
        "calls_seen = []\n"
        "def after_tool(data):\n"
        "    calls_seen.append(data['name'])\n"
        "    return {'result': data['result'] + ' NOTE FROM HOOK after ' + str(len(calls_seen))}\n"
        "def before_model(data):\n"
        "    if data['step'] == 1:\n"
        "        return {'messages': data['messages'] + [{'role': 'user', 'content': 'ONE-OFF'}],\n"
        "                'tools': ['run_python', 'finish']}\n"
    )
    result = solve(engine, source)
    assert (result.status, result.answer) == ("done", "42")
    sent = [json.loads(line) for line in record.read_text().splitlines()]
    assert sent[0]["messages"][-1]["content"].endswith("ONE-OFF")  # the first call, as the hook changed it
    assert sent[0]["tools"] == ["run_python", "finish"] and "run_shell" in sent[1]["tools"]
    assert "ONE-OFF" not in json.dumps(sent[1]["messages"])  # the loop's own conversation is kept
    assert "42 NOTE FROM HOOK after 1" in json.dumps(sent[1]["messages"])  # state kept between calls
    points = [s.tool_results[0]["hook"] for s in hook_steps(engine, result)]
    assert points == ["before_model", "after_tool"]


def test_an_on_failure_hook_tells_the_retry_something(engine_for):
    rules = [
        {"match": "Try 42 this time", "on": "all", "role": "user", "tool": "finish", "arguments": {"answer": "42"}},
        {"match": "previous attempt at this task failed", "role": "user", "reply": "I was wrong."},
        {"match": "What is", "role": "user", "tool": "finish", "arguments": {"answer": "41"}},
    ]
    engine = engine_for(rules, "h-failure")
    source = (
        "def on_failure(data):\n"
        "    assert data['feedback'] == \"the answer '41' is wrong\" and data['answer'] == '41'\n"
        "    return {'note': 'Try 42 this time.'}\n"
    )
    result = solve(engine, source, reflect_retry=True, max_attempts=2)
    assert (result.status, result.answer, result.attempts) == ("done", "42", 2)


@pytest.mark.parametrize(
    "source, error",
    [
        ("def before_finish(data):\n    raise RuntimeError('boom')\n", "before_finish failed: RuntimeError: boom"),
        ("def before_finish(data):\n    return ['not', 'an', 'object']\n", "before_finish returned list"),
        ("def before_finish(data):\n    return {'answer': '4', 'reject': 'no'}\n", "both answer and reject"),
        ("def before_finish(data):\n    while True:\n        pass\n", "ran past its 0.5 s timeout"),
        ("def before_finish(data):\n    return {'answer': 'x' * (2 ** 31)}\n", "MemoryError"),
        ("def before_finish(data)\n    return None\n", "the hooks are not valid Python"),
    ],
)
def test_a_broken_hook_is_recorded_and_ignored_and_fails_an_evaluation(engine_for, source, error):
    engine = engine_for(WORDY, f"h-broken-{abs(hash(source))}", AGENT_HOOK_TIMEOUT_S="0.5")
    right = [{"match": r"What is (\d+) \+ (\d+)\?", "role": "user", "tool": "finish", "arguments": {"answer": "42"}}]
    scripted.register_script(engine.config.model.name.removeprefix("scripted/"), {"rules": right})
    result = solve(engine, source)
    assert (result.status, result.answer, result.success) == ("done", "42", True)  # the agent went on
    (step,) = hook_steps(engine, result)
    assert error in step.content and step.tool_results[0]["error"]
    evaluated = solve(engine, source, TaskKind.EVALUATION)
    assert (evaluated.answer, evaluated.success) == ("42", False)
    assert evaluated.verdict.startswith("a hook failed during this evaluation") and error in evaluated.verdict


def test_a_hook_killed_for_its_time_is_loaded_again_for_the_next_call(engine_for):
    rules = [
        {"match": r"What is (\d+) \+ (\d+)\?", "role": "user", "tool": "run_python", "arguments": {"code": "print(1)"}},
        {"match": "^1$", "role": "tool", "tool": "run_python", "arguments": {"code": "print(2)"}},
        {"match": "^2 fresh$", "role": "tool", "tool": "finish", "arguments": {"answer": "42"}},
    ]
    engine = engine_for(rules, "h-reload", AGENT_HOOK_TIMEOUT_S="0.5")
    source = (
        "import time\n"
        "def after_tool(data):\n"
        "    if data['result'] == '1':\n"
        "        time.sleep(60)\n"
        "    return {'result': data['result'] + ' fresh'}\n"
    )
    result = solve(engine, source)
    assert (result.status, result.answer) == ("done", "42")
    first, second = hook_steps(engine, result)
    assert "ran past its 0.5 s timeout" in first.content and second.tool_results[0]["changed"]


def test_hooks_run_in_their_own_sandbox_not_in_the_task_worker_nor_the_daemon(engine_for):
    """The model's own code (run_python) shares nothing with the hooks, and the hooks see an empty
    directory, not the task's workspace."""
    rules = [
        {
            "match": r"What is (\d+) \+ (\d+)\?",
            "role": "user",
            "tool": "run_python",
            "arguments": {
                "code": "open('mine.txt', 'w').write('x')\nIN_THE_TASK_WORKER = 1\n"
                "def after_tool(data):\n    return {'result': 'forged'}\n"
            },
        },
        {"match": "", "role": "tool", "tool": "finish", "arguments": {"answer": "42"}},
    ]
    engine = engine_for(rules, "h-apart")
    source = (
        "import os, sys\n"
        "def after_tool(data):\n"
        "    return {'result': json_line()}\n"
        "def json_line():\n"
        "    import json\n"
        "    return json.dumps({'files': os.listdir('.'), 'worker': 'IN_THE_TASK_WORKER' in globals(),\n"
        "                       'evolver': 'evolver' in sys.modules})\n"
    )
    result = solve(engine, source)
    assert result.answer == "42"
    (hooked,) = hook_steps(engine, result)
    seen = json.loads(json.loads(hooked.content.split(": ", 1)[1])["result"])  # not 'forged'
    assert seen == {"files": [], "worker": False, "evolver": False}


def test_hook_points_and_replies_are_checked():
    assert hook_points("def after_tool(d):\n    pass\ndef helper():\n    pass\n") == ["after_tool"]
    with pytest.raises(HookError, match="define none"):
        hook_points("def helper():\n    pass\n")
    with pytest.raises(HookError, match="not valid Python"):
        hook_points("def (:\n")
    offered = {"tools": ["run_python", "finish"]}
    assert check_reply("before_model", None, offered) is None and check_reply("before_model", {}, offered) is None
    with pytest.raises(HookError, match="only narrow the tools offered; run_shell"):
        check_reply("before_model", {"tools": ["run_shell"]}, offered)
    with pytest.raises(HookError, match="unknown key"):
        check_reply("after_tool", {"answer": "x"}, {})
    with pytest.raises(HookError, match="message 0 needs a role"):
        check_reply("before_model", {"messages": [{"content": "x"}]}, offered)


def test_hooks_that_do_not_load_are_recorded_once_and_not_started_again(engine_for):
    rules = [
        {"match": r"What is (\d+) \+ (\d+)\?", "role": "user", "tool": "run_python", "arguments": {"code": "print(1)"}},
        {"match": "^1$", "role": "tool", "tool": "run_python", "arguments": {"code": "print(2)"}},
        {"match": "^2$", "role": "tool", "tool": "finish", "arguments": {"answer": "42"}},
    ]
    engine = engine_for(rules, "h-noload")
    source = "import nonexistent_module_xyz\ndef after_tool(data):\n    return {'result': 'never'}\n"
    result = solve(engine, source)
    assert (result.status, result.answer) == ("done", "42")
    (step,) = hook_steps(engine, result)
    assert "the hooks did not load: ModuleNotFoundError" in step.content
