"""The agent loop end to end: scripted model through litellm, real store, real sandbox."""

from __future__ import annotations

import itertools
import threading

import pytest
from _helpers import index_writes

from evolver.agent.scaffold import default_scaffold
from evolver.config import load_config
from evolver.engine import Engine
from evolver.llm import scripted
from memory import Ending, NewTrajectory
from tools import ToolFiles

ADD = [
    {
        "match": r"What is (\d+) \+ (\d+)\?",
        "role": "user",
        "tool": "run_python",
        "arguments": {"code": r"print(\1 + \2)"},
    },
    {"match": r"^(?P<out>-?\d+)\s*$", "role": "tool", "tool": "finish", "arguments": {"answer": r"\g<out>"}},
]


@pytest.fixture
def engine_for(open_store, sandbox, tmp_path):
    engines = []

    def make(script: dict, name: str, **env) -> Engine:
        scripted.register_script(name, script)
        config = load_config(
            env={"EVOLVER_MODEL_NAME": f"scripted/{name}", **{f"EVOLVER_{k.upper()}": str(v) for k, v in env.items()}}
        )
        store = open_store(tmp_path / name)
        engine = Engine.open(config, data_dir=tmp_path / name, store=store, sandbox=sandbox)
        engines.append(engine)
        return engine

    yield make


def scaffold_with(**parameters):
    base = default_scaffold()
    return base.model_copy(update={"parameters": base.parameters.model_copy(update=parameters)})


def test_the_task_is_shown_with_its_files_pasted_after_its_words(engine_for):
    """As a person pastes a log after the question (and as the model alone is asked): the first message is the
    task's words, then its files; the files are in the workspace too."""
    pasted = r"\ATask:\nHow many errors are in app\.log\?\n\napp\.log:\n```\nERROR a\nINFO b\nERROR c\n```"
    engine = engine_for(
        {"rules": [{"match": pasted, "role": "user", "tool": "finish", "arguments": {"answer": "2"}}]}, "a-pasted"
    )
    task, _ = engine.store.inbox.add_task(
        "How many errors are in app.log?",
        check={"type": "answer", "expected": "2"},
        metadata={"files": {"app.log": "ERROR a\nINFO b\nERROR c\n"}},
    )
    result = engine.agent(scaffold_with(max_attempts=1)).run_task(task)
    assert (result.answer, result.success) == ("2", True)


def test_a_task_is_solved_with_tools_verified_and_recorded_step_by_step(engine_for):
    engine = engine_for({"rules": ADD}, "a-add")
    task, _ = engine.store.inbox.add_task("What is 19 + 23?", check={"type": "answer", "expected": "42"})
    seen = []
    result = engine.agent().run_task(task, on_step=lambda step: seen.append((step.seq, step.role)))
    assert (result.status, result.answer, result.success, result.attempts) == ("done", "42", True, 1)
    assert seen == [(1, "assistant"), (2, "tool"), (3, "assistant"), (4, "tool")]
    steps = engine.store.reports.steps(result.trajectory_ids[0])
    assert steps[0].tool_calls[0]["name"] == "run_python" and steps[1].content == "42"
    assert steps[0].tokens_in > 0
    trajectory = engine.store.attempts.get_trajectory(result.trajectory_ids[0])
    assert (trajectory.status, trajectory.final_answer) == ("finished", "42")
    assert trajectory.tokens_in == sum(s.tokens_in for s in steps)
    outcome = engine.store.reports.outcome(trajectory.id)
    assert outcome.success and outcome.verifier == "answer:exact"
    assert engine.store.inbox.get_task(task.id).status == "done"


# Wrong at first; right once told by the verdict and reflecting on it.
RETRIED = {
    "rules": [
        {"match": "wrote 41", "on": "all", "role": "user", "tool": "finish", "arguments": {"answer": "42"}},
        {"match": "previous attempt at this task failed", "role": "user", "reply": "I wrote 41 by mistake."},
        {"match": "What is", "role": "user", "tool": "finish", "arguments": {"answer": "41"}},
    ]
}


def test_a_failed_attempt_is_reflected_on_and_retried(engine_for):
    engine = engine_for(RETRIED, "a-retry")
    task, _ = engine.store.inbox.add_task("What is 19 + 23?", check={"type": "answer", "expected": "42"})
    result = engine.agent(scaffold_with(reflect_retry=True, max_attempts=2)).run_task(task)
    assert (result.status, result.answer, result.attempts) == ("done", "42", 2)
    first, second = (engine.store.attempts.get_trajectory(t) for t in result.trajectory_ids)
    assert (
        engine.store.reports.outcome(first.id).success is False
        and engine.store.reports.outcome(second.id).success is True
    )
    assert [s.role for s in engine.store.reports.steps(first.id)][-1] == "reflection"
    assert (second.attempt, first.attempt) == (2, 1)
    # Run here, not leased by a worker: the task views still count its two attempts.
    from evolver.api import views

    (listed,) = views.task_list(engine.store)["tasks"]
    assert listed["attempts"] == views.task_detail(engine.store, task.id)["attempts"] == 2
    assert listed["claims"] == 0  # no worker ever leased it


def test_each_attempt_enters_the_index_once_with_its_outcome(engine_for, monkeypatch):
    """The agent records an attempt's outcome before it ends it, so the index writes each trajectory once."""
    engine = engine_for(RETRIED, "a-indexed")
    writes = index_writes(engine.store.index, monkeypatch)
    task, _ = engine.store.inbox.add_task("What is 19 + 23?", check={"type": "answer", "expected": "42"})
    result = engine.agent(scaffold_with(reflect_retry=True, max_attempts=2)).run_task(task)
    first, second = result.trajectory_ids
    assert writes == [("upsert", "trajectories", [first]), ("upsert", "trajectories", [second])]
    indexed = engine.store.index.metadata_of("trajectories", [first, second])
    assert (indexed[first]["success"], indexed[second]["success"]) == (0, 1)


def test_a_held_out_task_gets_one_attempt_whatever_the_scaffold_allows(engine_for):
    """A retry starts from the check's verdict; on a held-out task that verdict is the measurement, so a
    scaffold that raised max_attempts would be scored with the judge's answer in hand (the same script
    retried into a success above)."""
    engine = engine_for(RETRIED, "a-held-out")
    retrying = engine.agent(scaffold_with(reflect_retry=True, max_attempts=3))
    for source in ("evaluation", "api"):
        task, _ = engine.store.inbox.add_task(
            "What is 19 + 23?", check={"type": "answer", "expected": "42"}, source=source, metadata={"split": "test"}
        )
        result = retrying.run_task(task)
        assert (result.status, result.success, result.attempts) == ("failed", False, 1), source
        steps = engine.store.reports.steps(result.trajectory_ids[0])
        assert "reflection" not in [s.role for s in steps]
    trained, _ = engine.store.inbox.add_task(
        "What is 19 + 23?", check={"type": "answer", "expected": "42"}, source="evaluation", metadata={"split": "train"}
    )
    assert retrying.run_task(trained).attempts == 2


def test_without_reflect_retry_a_wrong_answer_fails_the_task_with_the_verdict(engine_for):
    engine = engine_for({"rules": [{"match": "", "tool": "finish", "arguments": {"answer": "41"}}]}, "a-wrong")
    task, _ = engine.store.inbox.add_task("What is 19 + 23?", check={"type": "answer", "expected": "42"})
    result = engine.agent(scaffold_with(reflect_retry=False)).run_task(task)
    assert (result.status, result.success, result.attempts) == ("failed", False, 1)
    assert result.error == "answer '41' is not expected '42'"
    assert engine.store.inbox.get_task(task.id).error == result.error


def test_the_step_limit_ends_an_attempt(engine_for):
    engine = engine_for({"rules": [{"match": "", "tool": "run_python", "arguments": {"code": "1"}}]}, "a-loop")
    task, _ = engine.store.inbox.add_task("Loop forever")
    result = engine.agent(scaffold_with(max_steps=3)).run_task(task)
    assert result.status == "failed" and result.error == "no answer (step_limit)"
    trajectory = engine.store.attempts.get_trajectory(result.trajectory_ids[0])
    # three turns and their results, then the last turn that may only answer (this model answers with a call)
    steps = engine.store.reports.steps(trajectory.id)
    assert trajectory.status == "step_limit" and len(steps) == 7
    assert steps[-1].role == "answer" and not steps[-1].tool_calls


def test_a_call_repeated_is_answered_from_before_and_too_many_repeats_end_the_attempt(engine_for):
    # A small model repeated one identical call for 20 steps: after repeat_limit identical calls in a row
    # it is told what it already has, and after twice that many the attempt ends.
    engine = engine_for({"rules": [{"match": "", "tool": "run_python", "arguments": {"code": "print(7)"}}]}, "a-repeat")
    task, _ = engine.store.inbox.add_task("Loop forever")
    result = engine.agent(scaffold_with(max_steps=20, repeat_limit=2)).run_task(task)
    assert result.status == "failed" and result.error == "no answer (repeating)"
    trajectory = engine.store.attempts.get_trajectory(result.trajectory_ids[0])
    observations = [s.content for s in engine.store.reports.steps(trajectory.id) if s.role == "tool"]
    assert trajectory.status == "repeating" and len(observations) == 4
    assert observations[0].strip() == "7"
    assert "2 times in a row" in observations[1] and "7" in observations[1] and "something else" in observations[1]
    assert "3 times in a row" in observations[2]
    assert "This attempt ends" in observations[3] and "4 times in a row" in observations[3]


def test_the_budget_stops_a_task_with_a_recorded_reason(engine_for):
    engine = engine_for(
        {"rules": [{"match": "", "tool": "run_python", "arguments": {"code": "1"}}]},
        "a-budget",
        budget_tokens_per_task=400,
    )
    task, _ = engine.store.inbox.add_task("Spend everything")
    result = engine.agent(scaffold_with(max_steps=50, repeat_limit=0)).run_task(task)  # the same call, on and on
    assert result.status == "failed" and "per-task token cap of 400 tokens" in result.error
    trajectory = engine.store.attempts.get_trajectory(result.trajectory_ids[0])
    assert trajectory.status == "budget" and engine.store.reports.steps(trajectory.id)
    assert engine.store.ledger.spent(task_id=task.id)[0] <= 400


def test_cancellation_stops_at_the_next_step(engine_for):
    engine = engine_for({"rules": [{"match": "", "tool": "run_python", "arguments": {"code": "1"}}]}, "a-cancel")
    task, _ = engine.store.inbox.add_task("Run until cancelled")
    cancel = threading.Event()

    def on_step(step):
        if step.seq == 4:
            cancel.set()

    result = engine.agent(scaffold_with(max_steps=50)).run_task(task, cancel=cancel, on_step=on_step)
    assert result.status == "cancelled"
    assert engine.store.attempts.get_trajectory(result.trajectory_ids[0]).status == "cancelled"
    assert len(engine.store.reports.steps(result.trajectory_ids[0])) == 4


def test_malformed_tool_calls_become_observations_and_the_task_goes_on(engine_for):
    script = {
        "rules": [
            {
                "match": "Tool call refused: unknown tool 'teleport'",
                "role": "tool",
                "tool": "read_file",
                "arguments": {"name": "x"},
            },
            {
                "match": "Tool call refused: missing required argument 'path'",
                "role": "tool",
                "tool": "finish",
                "arguments": {"answer": "recovered"},
            },
            {"match": "", "role": "user", "tool": "teleport", "arguments": {}},
        ]
    }
    engine = engine_for(script, "a-malformed")
    task, _ = engine.store.inbox.add_task("Do something odd")
    result = engine.agent().run_task(task)
    assert (result.status, result.answer) == ("done", "recovered")
    observations = [s.content for s in engine.store.reports.steps(result.trajectory_ids[0]) if s.role == "tool"]
    assert observations[0].startswith("Tool call refused: unknown tool 'teleport'")


def test_a_model_without_native_tools_works_through_json_in_text(engine_for):
    script = {
        "native_tools": False,
        "rules": [
            {
                "match": r"Result of run_python:\n(?P<out>\d+)",
                "role": "user",
                "tool": "finish",
                "arguments": {"answer": r"\g<out>"},
            },
            {
                "match": r"What is (\d+) \+ (\d+)\?",
                "role": "user",
                "tool": "run_python",
                "arguments": {"code": r"print(\1 + \2)"},
            },
        ],
    }
    engine = engine_for(script, "a-text")
    task, _ = engine.store.inbox.add_task("What is 2 + 2?", check={"type": "answer", "expected": "4"})
    result = engine.agent(scaffold_with(action_format="tools")).run_task(task)
    assert (result.status, result.answer, result.success) == ("done", "4", True)


def test_a_plain_text_answer_said_twice_is_taken(engine_for):
    engine = engine_for({"rules": [{"match": "", "reply": "Paris"}]}, "a-plain")
    task, _ = engine.store.inbox.add_task("Capital of France?", check={"type": "answer", "expected": "Paris"})
    result = engine.agent().run_task(task)
    assert (result.status, result.answer, result.success) == ("done", "Paris", True)


def test_retrieved_experience_reaches_the_prompt(engine_for):
    script = {
        "rules": [
            {
                "match": "Other tasks of this kind, solved before.*Sum the amount column of sales.csv"
                ".*Lessons from experience:.*Strip currency symbols",
                "on": "all",
                "role": "user",
                "tool": "finish",
                "arguments": {"answer": "used memory"},
            },
            {"match": "", "role": "user", "tool": "finish", "arguments": {"answer": "no memory"}},
        ]
    }
    engine = engine_for(script, "a-memory")
    engine.store.attempts.ingest(
        [NewTrajectory(prompt="Sum the amount column of sales.csv", final_answer="1200", success=True)]
    )
    engine.store.insights.add_insight("Strip currency symbols before converting money to float.")
    task, _ = engine.store.inbox.add_task("Add up the price column of invoices.csv")
    assert engine.agent().run_task(task).answer == "used memory"


def test_a_tight_budget_keeps_the_insights_measured_to_help_then_the_more_important():
    from evolver.agent.loop import fit_context
    from memory import Context, InsightHit

    def hit(n: int, importance: int, measured: str | None = None) -> InsightHit:
        return InsightHit(n, f"insight number {n} " + "x" * 60, importance, 1 / n, None, None, measured)

    retrieved = [hit(1, 4), hit(2, 2, "helps"), hit(3, 2), hit(4, 3)]  # by relevance
    context = Context(trajectories=[], insights=retrieved, tools=[], vector_search=False)
    assert [i.insight_id for i in fit_context(context, 10_000)[1]] == [2, 1, 4, 3]
    assert [i.insight_id for i in fit_context(context, 40)[1]] == [2, 1]


def test_only_offered_tools_can_be_called(engine_for):
    script = {
        "rules": [
            {
                "match": "is not available for this task",
                "role": "tool",
                "tool": "finish",
                "arguments": {"answer": "no"},
            },
            {"match": r"^9$", "role": "tool", "tool": "finish", "arguments": {"answer": "yes"}},
            {"match": "", "role": "user", "tool": "triple", "arguments": {"x": 3}},
        ]
    }
    engine = engine_for(script, "a-offered")
    code = 'def triple(x: int) -> int:\n    """Multiply a whole number by three."""\n    return 3 * x\n'
    task, _ = engine.store.inbox.add_task("Triple three")
    assert engine.agent().run_task(task).answer == "no"  # not a tool the agent has
    digest = ToolFiles(engine.data_dir / "tools").write(
        "triple", 1, code, "def test_it():\n    assert triple(1) == 3\n"
    )
    engine.store.tools.add_tool(
        "triple", description="Multiply a whole number by three", code_hash=digest, origin="synthesized"
    )
    task, _ = engine.store.inbox.add_task("Multiply a whole number by three: 3")
    assert engine.agent().run_task(task).answer == "yes"  # registered: loaded and retrieved as relevant


def test_a_model_failure_mid_task_leaves_a_readable_prefix(engine_for):
    script = {
        "rules": [
            {"match": "^1$", "role": "tool", "error": "bad_request"},
            {"match": "", "role": "user", "tool": "run_python", "arguments": {"code": "print(1)"}},
        ]
    }
    engine = engine_for(script, "a-crash")
    task, _ = engine.store.inbox.add_task("Start, then break")
    result = engine.agent().run_task(task)
    assert result.status == "failed" and result.error.startswith("model error: ")
    # How it ended is a typed field, on the result and stored with the task: nobody parses the error.
    assert result.ending is Ending.MODEL_ERROR and engine.store.inbox.get_task(task.id).ending is Ending.MODEL_ERROR
    trajectory = engine.store.attempts.get_trajectory(result.trajectory_ids[0])
    assert trajectory.status == "error"
    assert [s.role for s in engine.store.reports.steps(trajectory.id)] == ["assistant", "tool"]


def test_pack_files_are_put_in_the_workspace(engine_for):
    script = {
        "rules": [
            {"match": r"^(?P<n>\d+)\s*$", "role": "tool", "tool": "finish", "arguments": {"answer": r"\g<n>"}},
            {"match": "", "role": "user", "tool": "run_shell", "arguments": {"command": "wc -l < data.txt"}},
        ]
    }
    engine = engine_for(script, "a-files")
    task, _ = engine.store.inbox.add_task(
        "How many lines in data.txt?",
        check={"type": "answer", "expected": "3"},
        metadata={"files": {"data.txt": "a\nb\nc\n"}},
    )
    result = engine.agent().run_task(task)
    assert (result.answer, result.success) == ("3", True)


def test_plan_first_asks_for_a_plan_before_acting(engine_for):
    script = {
        "rules": [
            {"match": "write a short numbered plan", "role": "user", "reply": "1. add the numbers 2. finish"},
            {
                "match": r"What is (\d+) \+ (\d+)\?.*add the numbers.*carry out the plan",
                "on": "all",
                "role": "user",
                "tool": "run_python",
                "arguments": {"code": r"print(\1 + \2)"},
            },
            ADD[1],
        ]
    }
    engine = engine_for(script, "a-plan")
    task, _ = engine.store.inbox.add_task("What is 1 + 2?", check={"type": "answer", "expected": "3"})
    result = engine.agent(scaffold_with(plan_first=True)).run_task(task)
    roles = [s.role for s in engine.store.reports.steps(result.trajectory_ids[0])]
    assert result.success and roles[0] == "plan" and roles[1:] == ["assistant", "tool", "assistant", "tool"]


def test_an_internal_failure_is_recorded_on_the_task_not_raised(engine_for, monkeypatch):
    engine = engine_for({"rules": ADD}, "a-internal")
    task, _ = engine.store.inbox.add_task("What is 1 + 1?")

    def broken(*args, **kwargs):
        raise RuntimeError("the tool layer broke")

    monkeypatch.setattr("tools.builtin.TaskTools.run", broken)
    result = engine.agent().run_task(task)
    assert result.status == "failed" and result.error == "internal error: RuntimeError: the tool layer broke"
    assert engine.store.inbox.get_task(task.id).status == "failed"
    assert (
        result.ending is Ending.INTERNAL_ERROR and engine.store.inbox.get_task(task.id).ending is Ending.INTERNAL_ERROR
    )
    assert engine.store.attempts.get_trajectory(result.trajectory_ids[0]).status == "error"


def test_a_chat_turn_without_an_answer_says_so_and_why(engine_for):
    from evolver.api.chat import reply_text

    # A weak model that never finishes: it lists the files again and again until the step limit.
    engine = engine_for({"rules": [{"match": "", "tool": "list_files", "arguments": {"path": "."}}]}, "a-chat-loop")
    task, _ = engine.store.inbox.add_task("Hello, who are you?", source="chat", status="running")
    result = engine.agent(scaffold_with(max_steps=4)).run_task(task)
    text = reply_text(engine.store, result)
    assert text.startswith("The turn ended without an answer: ")
    assert "used all 4 of its steps without calling finish" in text
    assert 'it repeated the same call, list_files {"path": "."}, 4 times' in text
    assert "(no answer" not in text

    # A model that cannot be reached: the reason is the model's error.
    engine = engine_for({"rules": [{"match": "", "error": "server", "times": 100}]}, "a-chat-down")
    task, _ = engine.store.inbox.add_task("Hello?", source="chat", status="running")
    text = reply_text(engine.store, engine.agent().run_task(task))
    assert text.startswith("The turn ended without an answer: the model failed: ")


def test_text_tool_calls_send_one_system_message_then_strictly_alternating_roles(engine_for, tmp_path):
    # Two calls in one reply give two tool results; chat templates (Qwen's, Llama's) want one system
    # message and user/assistant turns that alternate.
    record = tmp_path / "sent.jsonl"
    script = {
        "native_tools": False,
        "record": str(record),
        "rules": [
            {"match": r"Result of list_files", "role": "user", "tool": "finish", "arguments": {"answer": "done"}},
            {
                "match": "Tidy up",
                "role": "user",
                "calls": [{"tool": "list_files", "arguments": {}}, {"tool": "list_files", "arguments": {}}],
            },
        ],
    }
    engine = engine_for(script, "a-roles")
    task, _ = engine.store.inbox.add_task("Tidy up")
    assert engine.agent(scaffold_with(action_format="tools")).run_task(task).status == "done"
    import json

    for line in record.read_text().splitlines():
        roles = [m["role"] for m in json.loads(line)["messages"]]
        assert roles[0] == "system" and "system" not in roles[1:], roles
        assert all(a != b for a, b in itertools.pairwise(roles[1:])), roles
        assert roles[1] == "user"
    last = json.loads(record.read_text().splitlines()[-1])["messages"]
    assert "You can call these tools" in last[0]["content"] and "Result of list_files" in last[-1]["content"]


def test_an_unreadable_text_tool_call_is_refused_with_the_expected_shape_and_shown_as_sent(engine_for, capsys):
    from dataclasses import asdict

    from evolver.cli.tasks import _print_event_step

    sent = "```json\n{'tool': 'finish', 'arguments': {'answer': 'it's 4'}}\n```"  # ambiguous: not repaired
    script = {
        "native_tools": False,
        "rules": [
            {"match": "Tool call refused", "role": "user", "tool": "finish", "arguments": {"answer": "4"}},
            {"match": "", "role": "user", "reply": sent},
        ],
    }
    engine = engine_for(script, "a-unreadable")
    task, _ = engine.store.inbox.add_task("What is 2 + 2?")
    result = engine.agent(scaffold_with(action_format="tools")).run_task(task)
    assert (result.status, result.answer) == ("done", "4")
    steps = engine.store.reports.steps(result.trajectory_ids[0])
    refused = next(s for s in steps if s.role == "tool")
    assert '{"tool": "<name>", "arguments": {...}}' in refused.content
    (call,) = steps[0].tool_calls
    assert call["raw"] == "{'tool': 'finish', 'arguments': {'answer': 'it's 4'}}"
    _print_event_step({**asdict(steps[0]), "attempt": 1})
    shown = " ".join(capsys.readouterr().err.split())  # rich wraps long lines
    assert "(null)" not in shown and "'answer': 'it's 4'" in shown
