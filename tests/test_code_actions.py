"""Code actions: the model writes Python, the attempt's persistent sandboxed session runs it, the tools are
functions there, finish(answer) ends the attempt; what a code task asks for is delivered and tried on the
task's own examples first. Scripted model through litellm, real store, real sandbox."""

from __future__ import annotations

import dataclasses
import json

import pytest

from evolver.agent.failures import behaviour, count_modes
from evolver.agent.loop import WORK_CHARS, draft_seed, worked_code
from evolver.agent.scaffold import default_scaffold, unused_parts
from evolver.config import load_config
from evolver.engine import Engine
from evolver.llm import scripted

CODE = {"action_format": "code"}


def code_scaffold(**parameters):
    base = default_scaffold()
    return base.model_copy(update={"parameters": base.parameters.model_copy(update={**CODE, **parameters})})


@pytest.fixture
def engine_for(open_store, sandbox, tmp_path):
    def make(script: dict, name: str, **env) -> Engine:
        scripted.register_script(name, script)
        config = load_config(
            env={"EVOLVER_MODEL_NAME": f"scripted/{name}", **{f"EVOLVER_{k.upper()}": str(v) for k, v in env.items()}}
        )
        return Engine.open(config, data_dir=tmp_path / name, store=open_store(tmp_path / name), sandbox=sandbox)

    return make


def block(code: str) -> str:
    return f"Let me run this.\n```python\n{code}\n```"


def observations(engine, result, attempt: int = 0) -> list[str]:
    return [s.content for s in engine.store.reports.steps(result.trajectory_ids[attempt]) if s.role == "tool"]


def test_names_persist_between_blocks_and_finish_from_code_ends_the_attempt(engine_for):
    engine = engine_for(
        {
            "rules": [
                {"match": r"Output of your code:\nset", "role": "user", "reply": block("finish(str(x))")},
                {"match": r"What is 6 times 7", "role": "user", "reply": block("x = 6 * 7\nprint('set')")},
            ]
        },
        "c-persist",
    )
    task, _ = engine.store.inbox.add_task("What is 6 times 7?", check={"type": "answer", "expected": "42"})
    result = engine.agent(code_scaffold()).run_task(task)
    assert (result.status, result.answer, result.success) == ("done", "42", True)
    steps = engine.store.reports.steps(result.trajectory_ids[0])
    assert [s.role for s in steps] == ["assistant", "tool", "assistant", "tool", "work"]
    assert steps[0].tool_calls[0]["arguments"] == {"code": "x = 6 * 7\nprint('set')"}
    # The attempt's work is every block that ran, in order: the last alone, finish(str(x)), shows nothing of
    # how x was found to the next task of the kind.
    assert steps[-1].content == "x = 6 * 7\nprint('set')\n\nfinish(str(x))"


def test_a_block_that_failed_is_not_part_of_the_attempts_work(engine_for):
    engine = engine_for(
        {
            "rules": [
                {"match": r"Output of your code:\nset", "role": "user", "reply": block("finish(str(x))")},
                {"match": r"ZeroDivisionError", "role": "user", "reply": block("x = 6 * 7\nprint('set')")},
                {"match": r"What is 6 times 7", "role": "user", "reply": block("x = 6 / 0")},
            ]
        },
        "c-work-failed",
    )
    task, _ = engine.store.inbox.add_task("What is 6 times 7?", check={"type": "answer", "expected": "42"})
    result = engine.agent(code_scaffold()).run_task(task)
    assert result.success is True
    (work,) = [s.content for s in engine.store.reports.steps(result.trajectory_ids[0]) if s.role == "work"]
    assert work == "x = 6 * 7\nprint('set')\n\nfinish(str(x))"


def test_the_work_shown_keeps_the_end_of_a_long_session():
    assert worked_code([]) is None
    assert worked_code(["a = 1\n", "b = a + 1"]) == "a = 1\n\nb = a + 1"
    assert worked_code(["x = 1" * WORK_CHARS, "y = 2", "finish(y)"]) == "y = 2\n\nfinish(y)"
    assert worked_code(["z = 3" * WORK_CHARS]) == "z = 3" * WORK_CHARS  # one long block is kept; the prompt clips it


def test_the_seed_acts_in_code_for_a_model_without_native_tools_and_in_tool_calls_otherwise(engine_for):
    text = engine_for({"native_tools": False, "rules": [{"match": "", "reply": "Paris"}]}, "c-auto-text")
    native = engine_for({"rules": [{"match": "", "reply": "Paris"}]}, "c-auto-native")
    assert default_scaffold().parameters.action_format == "auto"
    assert text.agent().acts_in_code() and not native.agent().acts_in_code()
    assert not text.agent(
        default_scaffold().model_copy(
            update={"parameters": default_scaffold().parameters.model_copy(update={"action_format": "tools"})}
        )
    ).acts_in_code()


def test_a_reply_without_code_is_the_answer_so_a_chat_turn_always_gets_one(engine_for):
    engine = engine_for({"native_tools": False, "rules": [{"match": "", "reply": "Hello! I am evolver."}]}, "c-plain")
    task, _ = engine.store.inbox.add_task("Hello, who are you?", source="chat", status="running")
    result = engine.agent().run_task(task)
    assert (result.status, result.answer) == ("done", "Hello! I am evolver.")
    assert [s.role for s in engine.store.reports.steps(result.trajectory_ids[0])] == ["assistant"]


def test_a_shell_block_is_not_taken_for_the_answer(engine_for):
    engine = engine_for(
        {
            "rules": [
                {
                    "match": r"Only ```python blocks run here",
                    "role": "user",
                    "reply": block("print(run_shell('echo hi'))"),
                },
                {"match": r"exit code 0\nhi", "role": "user", "reply": "hi"},
                {"match": r"Say hi", "role": "user", "reply": "```bash\necho hi\n```"},
            ]
        },
        "c-shell",
    )
    task, _ = engine.store.inbox.add_task("Say hi with the shell")
    result = engine.agent(code_scaffold()).run_task(task)
    assert (result.status, result.answer) == ("done", "hi")


def test_the_session_offers_the_tools_as_functions_and_says_so(engine_for, tmp_path):
    record = tmp_path / "sent.jsonl"
    engine = engine_for(
        {
            "record": str(record),
            "rules": [
                {"match": r"exit code 0\nhi", "role": "user", "reply": block("finish(read_file('a.txt'))")},
                {
                    "match": r"Write hi",
                    "role": "user",
                    "reply": block("write_file('a.txt', 'hi')\nprint(list_files('.'))\nprint(run_shell('cat a.txt'))"),
                },
            ],
        },
        "c-functions",
    )
    task, _ = engine.store.inbox.add_task("Write hi to a.txt and read it back")
    result = engine.agent(code_scaffold()).run_task(task)
    assert (result.status, result.answer) == ("done", "hi")
    assert "file\t2\ta.txt" in observations(engine, result)[0]
    system = json.loads(record.read_text().splitlines()[0])["messages"][0]["content"]
    for signature in (
        "read_file(path: str)",
        "write_file(path: str, content: str)",
        "list_files(path: str = ...)",
        "run_shell(command: str)",
        "finish(answer: str)",
    ):
        assert signature in system


def test_a_block_that_never_ends_times_out_and_the_attempt_goes_on(engine_for):
    engine = engine_for(
        {
            "rules": [
                {"match": r"timed out", "role": "user", "reply": block("finish('gave up waiting')")},
                {"match": r"Spin", "role": "user", "reply": block("while True:\n    pass")},
            ]
        },
        "c-spin",
        sandbox_timeout_s=2,
    )
    task, _ = engine.store.inbox.add_task("Spin")
    result = engine.agent(code_scaffold()).run_task(task)
    assert (result.status, result.answer) == ("done", "gave up waiting")
    assert "timed out" in observations(engine, result)[0]


def test_huge_output_is_clipped_and_os_exit_restarts_the_session_with_a_notice(engine_for):
    engine = engine_for(
        {
            "rules": [
                {
                    "match": r"names defined by earlier calls are gone",
                    "role": "user",
                    "reply": block("finish('recovered')"),
                },
                {"match": r"more characters cut", "role": "user", "reply": block("import os\nos._exit(3)")},
                {"match": r"Flood", "role": "user", "reply": block("print('x' * 5_000_000)")},
                {"match": r"died", "role": "user", "reply": block("print('after the exit')")},
            ]
        },
        "c-flood",
    )
    task, _ = engine.store.inbox.add_task("Flood the output")
    result = engine.agent(code_scaffold()).run_task(task)
    assert (result.status, result.answer) == ("done", "recovered")
    flood, died, after = observations(engine, result)[:3]
    assert len(flood) < 4200 and "more characters cut" in flood
    assert "died" in died and "exit status 3" in died
    assert "a fresh Python worker was started" in after and "after the exit" in after


def test_run_python_that_calls_finish_ends_the_attempt_in_tool_calls_too(engine_for):
    engine = engine_for(
        {
            "rules": [
                {
                    "match": "Compute",
                    "role": "user",
                    "tool": "run_python",
                    "arguments": {"code": "finish(str(2 ** 10))"},
                }
            ]
        },
        "c-tools-finish",
    )
    task, _ = engine.store.inbox.add_task("Compute 2 to the 10th", check={"type": "answer", "expected": "1024"})
    result = engine.agent(code_scaffold(action_format="tools")).run_task(task)
    assert (result.status, result.answer, result.success) == ("done", "1024", True)


# --- what a code task asks for ---------------------------------------------------------------------------

DOUBLE_TASK = (
    "Write solution.py defining double(n) that returns twice n.\n\n"
    "    >>> double(2)\n    4\n    >>> double(-3)\n    -6\n"
)
DOUBLE_CHECK = {
    "type": "python",
    "code": "def check(answer, workspace):\n"
    "    f = solution('solution').double\n"
    "    return f(21) == 42 and f(0) == 0 and f(-4) == -8\n",
}
DELIVER = {"deliver": {"file": "solution.py", "functions": ["double"]}}


def test_a_function_defined_in_the_session_is_delivered_and_judged_from_the_file(engine_for):
    engine = engine_for(
        {
            "rules": [
                {"match": r"Output of your code:\n4", "role": "user", "reply": block("finish('done')")},
                {
                    "match": r"defining double",
                    "role": "user",
                    "reply": block("import math\n\ndef double(n):\n    return 2 * n\n\nprint(double(2))"),
                },
            ]
        },
        "c-deliver",
    )
    task, _ = engine.store.inbox.add_task(DOUBLE_TASK, check=DOUBLE_CHECK, metadata=DELIVER)
    result = engine.agent(code_scaffold(draft_first=False)).run_task(task)
    assert (result.status, result.success) == ("done", True), result.verdict
    steps = engine.store.reports.steps(result.trajectory_ids[0])
    assert any(s.content.startswith("[delivered]") for s in steps)
    work = steps[-1]
    assert work.role == "work" and work.content == "import math\n\n\ndef double(n):\n    return 2 * n\n"


def test_a_file_the_agent_wrote_itself_wins_over_the_session(engine_for):
    engine = engine_for(
        {
            "rules": [
                {"match": r"Output of your code", "role": "user", "reply": block("finish('done')")},
                {
                    "match": r"defining double",
                    "role": "user",
                    "reply": block(
                        "def double(n):\n    return 2 * n\n\n"
                        "write_file('solution.py', 'def double(n):\\n    return n + n + 1\\n')"
                    ),
                },
            ]
        },
        "c-own-file",
    )
    task, _ = engine.store.inbox.add_task(DOUBLE_TASK, check=DOUBLE_CHECK, metadata=DELIVER)
    result = engine.agent(code_scaffold(example_rounds=0, max_attempts=1)).run_task(task)
    assert result.success is False  # its own (wrong) file was judged, not the session's right function
    assert not any(s.content.startswith("[delivered]") for s in engine.store.reports.steps(result.trajectory_ids[0]))


def test_the_tasks_own_examples_refuse_a_wrong_finish_and_the_model_repairs_it(engine_for):
    engine = engine_for(
        {
            "rules": [
                {
                    "match": r"double\(2\) returned 3, but the task says 4",
                    "role": "user",
                    "reply": block("def double(n):\n    return n * 2\nfinish('done')"),
                },
                {
                    "match": r"defining double",
                    "role": "user",
                    "reply": block("def double(n):\n    return n + 1\nfinish('done')"),
                },
            ]
        },
        "c-examples",
    )
    task, _ = engine.store.inbox.add_task(DOUBLE_TASK, check=DOUBLE_CHECK, metadata=DELIVER)
    result = engine.agent(code_scaffold(draft_first=False)).run_task(task)
    assert (result.status, result.success, result.attempts) == ("done", True, 1), observations(engine, result)
    refused = observations(engine, result)[0]
    assert refused.startswith("finish was refused: the task's own examples fail")
    assert "double(-3) returned -2, but the task says -6" in refused


def test_finishing_before_the_function_is_defined_is_refused_and_a_stub_is_no_definition(engine_for):
    engine = engine_for(
        {
            "rules": [
                {
                    "match": r"is not defined yet",
                    "role": "user",
                    "reply": block("def double(n):\n    return 2 * n\nfinish('ok')"),
                },
                {
                    "match": r"defining double",
                    "role": "user",
                    "reply": block('def double(n):\n    """Twice n."""\nfinish("ok")'),
                },
            ]
        },
        "c-stub",
    )
    task, _ = engine.store.inbox.add_task(DOUBLE_TASK, check=DOUBLE_CHECK, metadata=DELIVER)
    result = engine.agent(code_scaffold()).run_task(task)
    assert (result.status, result.success) == ("done", True)
    assert "`double` is not defined yet" in observations(engine, result)[0]


# --- the draft: the model's own completion first --------------------------------------------------------

STUB = 'def double(n):\n    """Twice n.\n    >>> double(2)\n    4\n    >>> double(-3)\n    -6\n    """\n'
STUB_TASK = f"Write a file solution.py that defines `double` as specified below.\n\n```python\n{STUB}```"
DRAFT = f"Complete the following Python function:\n\n```python\n{STUB}```"


def test_the_draft_is_the_models_own_completion_and_is_handed_in_when_the_examples_pass(engine_for, tmp_path):
    record = tmp_path / "sent.jsonl"
    engine = engine_for(
        {
            "record": str(record),
            "rules": [
                {
                    "match": r"\AComplete the following Python function",
                    "role": "user",
                    "reply": "```python\n    return 2 * n\n```\nThis doubles n.",
                },  # a bare body continues the stub
            ],
        },
        "c-draft",
    )
    task, _ = engine.store.inbox.add_task(STUB_TASK, check=DOUBLE_CHECK, metadata=DELIVER)
    result = engine.agent(code_scaffold()).run_task(task)
    assert (result.status, result.success, result.answer) == ("done", True, "solution.py defines double")
    sent = [json.loads(line) for line in record.read_text().splitlines()]
    # one call, as the model is asked alone: the stub to complete, no system message, temperature 0
    assert len(sent) == 1 and sent[0]["messages"] == [{"role": "user", "content": DRAFT}]
    assert sent[0]["temperature"] == 0.0
    steps = engine.store.reports.steps(result.trajectory_ids[0])
    assert [s.role for s in steps] == ["assistant", "tool", "tool", "work"]
    assert steps[0].tool_calls[0]["arguments"]["code"] == STUB + "    return 2 * n\n"
    assert "latest definition, passing 2 of the task's 2 examples" in steps[2].content


def test_a_draft_that_fails_the_examples_is_repaired_in_code_with_the_failures_as_the_observation(engine_for):
    engine = engine_for(
        {
            "rules": [
                {
                    "match": r"Your draft is not handed in yet: the task's own examples fail",
                    "role": "user",
                    "reply": block("def double(n):\n    return n * 2\nfinish('done')"),
                },
                {
                    "match": r"\AComplete the following Python function",
                    "role": "user",
                    "reply": "```python\ndef double(n):\n    return n + 2\n```",
                },
            ]
        },
        "c-draft-repair",
    )
    task, _ = engine.store.inbox.add_task(STUB_TASK, check=DOUBLE_CHECK, metadata=DELIVER)
    result = engine.agent(code_scaffold()).run_task(task)
    assert (result.status, result.success, result.attempts) == ("done", True, 1)
    assert "double(-3) returned -1, but the task says -6" in observations(engine, result)[0]


def test_a_repair_that_passes_fewer_examples_than_the_draft_is_not_handed_in(engine_for):
    first = {
        "type": "python",
        "code": "def check(answer, workspace):\n    return solution('solution').double(2) == 4\n",
    }
    engine = engine_for(
        {
            "rules": [
                {"match": r"finish was refused", "role": "user", "reply": block("finish('done')")},
                {
                    "match": r"Your draft is not handed in yet",
                    "role": "user",
                    "reply": block("def double(n):\n    return n + 1\nfinish('done')"),
                },
                {
                    "match": r"\AComplete the following Python function",
                    "role": "user",
                    "reply": "```python\ndef double(n):\n    return abs(n) * 2\n```",
                },  # right on 2, wrong on -3
            ]
        },
        "c-draft-best",
    )
    task, _ = engine.store.inbox.add_task(STUB_TASK, check=first, metadata=DELIVER)
    result = engine.agent(code_scaffold(max_attempts=1)).run_task(task)
    assert result.success is True, result.verdict  # the draft (1 of 2 examples), not the repair (0 of 2)
    steps = engine.store.reports.steps(result.trajectory_ids[0])
    delivered = [s.content for s in steps if s.content.startswith("[delivered]")]
    assert delivered and "earlier definition (it passed more examples), passing 1 of the task's 2" in delivered[0]


def test_further_drafts_are_sampled_while_none_passes_the_examples_and_the_first_that_passes_is_handed_in(
    engine_for, tmp_path
):
    record = tmp_path / "sent.jsonl"
    draft = r"\AComplete the following Python function"
    engine = engine_for(
        {
            "record": str(record),
            "rules": [
                {"match": draft, "role": "user", "times": 1, "reply": "```python\n    return n + 2\n```"},
                {"match": draft, "role": "user", "times": 1, "reply": "```python\n    return abs(n) * 2\n```"},
                {"match": draft, "role": "user", "reply": "```python\n    return 2 * n\n```"},
            ],
        },
        "c-drafts",
    )
    task, _ = engine.store.inbox.add_task(STUB_TASK, check=DOUBLE_CHECK, metadata=DELIVER)
    result = engine.agent(code_scaffold(drafts=4, draft_temperature=0.7)).run_task(task)
    assert (result.status, result.success, result.answer) == ("done", True, "solution.py defines double")
    sent = [json.loads(line) for line in record.read_text().splitlines()]
    assert [m["messages"] for m in sent] == [[{"role": "user", "content": DRAFT}]] * 3  # the fourth never asked
    assert [m["temperature"] for m in sent] == [0.0, 0.7, 0.7]
    # Each further draft is sampled with a seed fixed by what is asked and its number: asked again (another
    # agent, another run), the same draws, so a paired comparison of two agents compares what differs.
    seeds = [m.get("seed") for m in sent]
    assert seeds[0] is None and None not in seeds[1:] and seeds[1] != seeds[2]
    assert seeds[1:] == [draft_seed([{"role": "user", "content": DRAFT}], n) for n in (1, 2)]  # not the task id
    steps = engine.store.reports.steps(result.trajectory_ids[0])
    assert [s.role for s in steps] == ["assistant", "tool"] * 3 + ["tool", "work"]
    assert steps[-1].content == STUB + "    return 2 * n\n"
    # with one draft, its temperature is no part a proposal may change to any effect
    assert unused_parts(code_scaffold(drafts=1))["parameters.draft_temperature"] == "drafts is 1"
    assert "parameters.draft_temperature" not in unused_parts(code_scaffold(drafts=2))


def test_further_drafts_are_one_request_of_n_completions_where_the_model_gives_them(engine_for):
    """A server with parallel slots (llama-server) writes the further drafts at once: after the first, alone at
    temperature 0, the rest are one request of n completions, tried in turn until one passes."""
    draft = r"\AComplete the following Python function"
    engine = engine_for(
        {
            "rules": [
                {"match": draft, "role": "user", "times": 1, "reply": "```python\n    return n + 2\n```"},
                {"match": draft, "role": "user", "reply": "```python\n    return n + 3\n```"},
            ]
        },
        "c-drafts-n",
    )
    asked: list[int] = []
    more = ["```python\n    return n + 5\n```", "```python\n    return 2 * n\n```"]

    class Slots:  # the scripted model, with the completions a server of slots adds for n > 1
        def __init__(self, model):
            self.model = model

        def native_tools(self) -> bool:
            return self.model.native_tools()

        def complete(self, messages, n: int = 1, **kwargs):
            asked.append(n)
            return dataclasses.replace(self.model.complete(messages, **kwargs), others=tuple(more[: n - 1]))

    engine.model = Slots(engine.model)
    task, _ = engine.store.inbox.add_task(STUB_TASK, check=DOUBLE_CHECK, metadata=DELIVER)
    result = engine.agent(code_scaffold(drafts=4, draft_temperature=0.7)).run_task(task)
    assert (result.status, result.success) == ("done", True), result.verdict
    assert asked == [1, 3]  # the first alone; the other three in one request
    steps = engine.store.reports.steps(result.trajectory_ids[0])
    assert [s.role for s in steps] == ["assistant", "tool"] * 4 + ["tool", "work"]
    assert steps[-1].content == STUB + "    return 2 * n\n"  # the request's third completion passed


def test_when_no_draft_passes_the_attempt_goes_on_from_the_one_that_passed_the_most(engine_for):
    draft = r"\AComplete the following Python function"
    engine = engine_for(
        {
            "rules": [
                {
                    "match": r"Your draft is not handed in yet",
                    "on": "all",
                    "role": "user",
                    "reply": block("print(double(2), double(-3))"),
                },
                {"match": draft, "role": "user", "times": 1, "reply": "```python\n    return abs(n) * 2\n```"},
                {"match": draft, "role": "user", "reply": "```python\n    return n + 3\n```"},
            ],
        },
        "c-drafts-best",
    )
    task, _ = engine.store.inbox.add_task(STUB_TASK, check=DOUBLE_CHECK, metadata=DELIVER)
    result = engine.agent(code_scaffold(drafts=2, max_steps=2, max_attempts=1)).run_task(task)
    steps = engine.store.reports.steps(result.trajectory_ids[0])
    # the session goes on from the first draft (1 of 2 examples), not from the second (0 of 2), run last
    assert [s.role for s in steps][:5] == ["assistant", "tool", "assistant", "tool", "assistant"]
    assert observations(engine, result)[2].startswith("4 6")


def test_a_learner_reads_whether_every_draft_failed_the_examples_apart_from_the_models_own_calls(engine_for):
    """The drafts are the loop's samples, not calls the model chose: counted among its calls, an attempt whose
    drafts all failed the examples read as "run_python x3" to the proposer, which then never reached the
    ``drafts`` parameter that acts on exactly that."""
    draft = r"\AComplete the following Python function"
    engine = engine_for(
        {
            "rules": [
                {"match": r"Your draft is not handed in yet", "on": "all", "role": "user", "reply": block("print(1)")},
                {"match": draft, "role": "user", "reply": "```python\n    return n + 3\n```"},
            ],
        },
        "c-drafts-fail",
    )
    task, _ = engine.store.inbox.add_task(STUB_TASK, check=DOUBLE_CHECK, metadata=DELIVER)
    result = engine.agent(code_scaffold(drafts=2, max_steps=2, max_attempts=1)).run_task(task)
    trajectory = engine.store.attempts.get_trajectory(result.trajectory_ids[0])
    failed = behaviour(trajectory.status, result.success, engine.store.reports.steps(trajectory.id))
    assert (failed.drafts, failed.draft_handed_in, dict(failed.calls)) == (2, False, {"run_python": 1})
    assert failed.modes == ["no finish", "every draft failed the examples"]
    assert "3 model turns; 2 drafts, none passing the task's own examples; calls: run_python x1" in failed.describe()
    assert count_modes([failed]) == {"no finish": 1, "every draft failed the examples": 1}

    engine = engine_for(
        {
            "rules": [
                {"match": draft, "role": "user", "times": 2, "reply": "```python\n    return n + 2\n```"},
                {"match": draft, "role": "user", "reply": "```python\n    return 2 * n\n```"},
            ],
        },
        "c-drafts-third",
    )
    task, _ = engine.store.inbox.add_task(STUB_TASK, check=DOUBLE_CHECK, metadata=DELIVER)
    result = engine.agent(code_scaffold(drafts=4)).run_task(task)
    trajectory = engine.store.attempts.get_trajectory(result.trajectory_ids[0])
    passed = behaviour(trajectory.status, result.success, engine.store.reports.steps(trajectory.id))
    assert (passed.drafts, passed.draft_handed_in, passed.modes) == (3, True, [])
    assert "3 drafts, the last handed in (it passed the task's own examples); calls: no tool calls" in passed.describe()
    # handed in by a draft that passed the examples and then failed the check: a wrong answer, not a draft failure
    wrong = behaviour(trajectory.status, False, engine.store.reports.steps(trajectory.id))
    assert wrong.modes == ["wrong answer"]


def test_a_draft_is_handed_in_as_it_was_written_with_the_state_its_function_needs(engine_for):
    """A table built by a call is no literal the session's rebuilt module would keep: the draft is delivered
    whole, as the model alone's completion is saved."""
    engine = engine_for(
        {
            "rules": [
                {
                    "match": r"\AComplete the following Python function",
                    "role": "user",
                    "reply": "```python\nFACTOR = int('2')\n\ndef double(n):\n    return FACTOR * n\n```",
                },
            ]
        },
        "c-draft-whole",
    )
    task, _ = engine.store.inbox.add_task(STUB_TASK, check=DOUBLE_CHECK, metadata=DELIVER)
    result = engine.agent(code_scaffold()).run_task(task)
    assert result.success is True, result.verdict
    work = [s.content for s in engine.store.reports.steps(result.trajectory_ids[0]) if s.role == "work"]
    assert work == [STUB + "\n\nFACTOR = int('2')\n\ndef double(n):\n    return FACTOR * n\n"]


def test_a_function_task_in_words_opens_with_its_own_words_as_the_draft_and_draft_first_off_has_none(
    engine_for, tmp_path
):
    """With no stub, the draft is the task's text sent alone, as a person would ask the model alone: the
    agent's first draft is the model alone's answer, and it is handed in when it passes the examples."""
    record = tmp_path / "sent.jsonl"
    engine = engine_for(
        {
            "record": str(record),
            "rules": [
                {"match": r"\AWrite solution.py", "role": "user", "reply": block("def double(n):\n    return 2 * n")},
                {"match": r"", "role": "user", "reply": block("def double(n):\n    return 2 * n\nfinish('done')")},
            ],
        },
        "c-no-draft",
    )
    for text, scaffold in ((DOUBLE_TASK, code_scaffold()), (STUB_TASK, code_scaffold(draft_first=False))):
        task, _ = engine.store.inbox.add_task(text, check=DOUBLE_CHECK)  # no deliver field: read from the words
        assert engine.agent(scaffold).run_task(task).success is True
    sent = [json.loads(line)["messages"] for line in record.read_text().splitlines()]
    assert sent[0] == [{"role": "user", "content": DOUBLE_TASK.strip()}]  # the draft: the words alone
    assert len(sent) == 2 and sent[1][0]["role"] == "system"  # draft_first off: the attempt's own turn


def test_an_attempt_out_of_steps_is_asked_for_its_answer_once_and_says_so(engine_for):
    engine = engine_for(
        {
            "rules": [
                {"match": r"taken word for word as your final answer", "role": "user", "reply": "42"},
                {"match": "", "role": "user", "reply": block("print('still thinking')")},
            ]
        },
        "c-asked",
    )
    task, _ = engine.store.inbox.add_task("What is 6 times 7?", check={"type": "answer", "expected": "42"})
    result = engine.agent(code_scaffold(max_steps=2, repeat_limit=0)).run_task(task)
    assert (result.status, result.answer, result.success) == ("done", "42", True)
    assert engine.store.attempts.get_trajectory(result.trajectory_ids[0]).status == "asked"


# --- worked examples carry the work ----------------------------------------------------------------------


def test_a_worked_example_carries_the_code_that_passed_and_held_out_code_never_appears(engine_for, tmp_path):
    record = tmp_path / "sent.jsonl"
    secret = "HELD_OUT_MARKER = 1"
    engine = engine_for(
        {
            "record": str(record),
            "rules": [
                {"match": r"Output of your code:\n(4|8)", "role": "user", "reply": block("finish('done')")},
                {
                    "match": r"defining triple",
                    "role": "user",
                    "reply": block(f"{secret}\ndef triple(n):\n    return 3 * n\nprint(triple(2) - 2)"),
                },
                {
                    "match": r"defining double",
                    "role": "user",
                    "reply": block("def double(n):\n    return n * 2\nprint(double(2))"),
                },
                {"match": r"defining quadruple", "role": "user", "reply": block("finish('done')")},
            ],
        },
        "c-worked",
    )
    triple_check = {
        "type": "python",
        "code": "def check(answer, workspace):\n    return solution('solution').triple(3) == 9\n",
    }
    held, _ = engine.store.inbox.add_task(
        "Write solution.py defining triple(n) that returns three times n.",
        check=triple_check,
        metadata={"split": "test", "deliver": {"file": "solution.py", "functions": ["triple"]}},
    )
    taught, _ = engine.store.inbox.add_task(DOUBLE_TASK, check=DOUBLE_CHECK, metadata={**DELIVER, "split": "train"})
    agent = engine.agent(code_scaffold(draft_first=False))
    assert agent.run_task(held).success is True and agent.run_task(taught).success is True
    engine.store.sync_index()
    later, _ = engine.store.inbox.add_task(
        "Write solution.py defining quadruple(n) that returns four times n, like double and triple.",
        metadata={"split": "train"},
    )
    engine.agent(code_scaffold(example_rounds=0, draft_first=False)).run_task(later)
    sent = record.read_text().splitlines()[-1]
    prompt = json.loads(sent)["messages"][1]["content"]
    assert "Code that worked:\n```python\ndef double(n):\n    return n * 2\n```" in prompt
    assert secret not in sent and "def triple" not in sent  # the held-out attempt's code is shown to no one


def test_the_code_prompt_names_the_tools_of_mcp_servers_that_a_block_cannot_call(engine_for, tmp_path):
    from tools import ToolSpec

    record = tmp_path / "sent.jsonl"
    engine = engine_for({"record": str(record), "rules": [{"match": "", "reply": "done"}]}, "c-mcp")
    engine.registry.register(
        ToolSpec(
            name="files__read",
            description="[files] read a file",
            origin="mcp",
            parameters={"type": "object", "properties": {"path": {"type": "string"}}},
            runner=lambda arguments: (True, "the user's server answered"),
        )
    )
    task, _ = engine.store.inbox.add_task("Read notes.txt from my files")
    assert engine.agent(code_scaffold()).run_task(task).answer == "done"
    system = json.loads(record.read_text().splitlines()[0])["messages"][0]["content"]
    assert "(Not available in code: files__read; they need action_format tools.)" in system
    assert "- files__read(" not in system


def test_a_synthesized_tool_is_a_function_in_the_session_and_each_call_is_counted(engine_for, tmp_path):
    from tools import ToolFiles

    record = tmp_path / "sent.jsonl"
    engine = engine_for(
        {
            "record": str(record),
            "rules": [
                {"match": r"Output of your code:\n9\n\[error\]", "role": "user", "reply": block("finish('tripled')")},
                {"match": r"Multiply", "role": "user", "reply": block("print(triple(3))\ntriple('x' * 10 ** 8)")},
            ],
        },
        "c-synth",
    )
    code = (
        'def triple(x: int) -> int:\n    """Multiply a whole number by three."""\n'
        '    if not isinstance(x, int):\n        raise TypeError("a whole number")\n    return 3 * x\n'
    )
    digest = ToolFiles(engine.data_dir / "tools").write(
        "triple", 1, code, "def test_it():\n    assert triple(1) == 3\n"
    )
    tool = engine.store.tools.add_tool(
        "triple", description="Multiply a whole number by three", code_hash=digest, origin="synthesized"
    )
    task, _ = engine.store.inbox.add_task("Multiply a whole number by three: 3")
    assert engine.agent(code_scaffold()).run_task(task).answer == "tripled"
    system = json.loads(record.read_text().splitlines()[0])["messages"][0]["content"]
    assert "- triple(x: int): Multiply a whole number by three." in system
    counted = engine.store.tools.get_tool(tool.id)
    assert (counted.uses, counted.successes) == (2, 1)


def test_the_seeds_draft_is_the_model_alones_prompt_whatever_was_learned():
    """Shown worked examples and an insight before the stub, the 0.5B model's drafts were worse than the model
    alone's on the learning curve's held-out tasks: the seed's draft shows nothing learned. A scaffold that
    does show it (an edit the tree measures) gets it before the stub, which comes last: with an example after
    the stub the 0.5B model wrote the example's function again (27 of 36 training tasks)."""
    from evolver.agent.loop import _render, draft_prompt

    stub = 'def correct_bracketing(brackets: str):\n    """Every "<" has its ">"."""\n'
    example = "- Task: find_max\n  Code that worked:\n```python\ndef find_max(words):\n    return max(words)\n```\n"
    learned = _render([example], [])
    alone = f"Complete the following Python function:\n\n```python\n{stub}```"
    seed = default_scaffold()
    assert draft_prompt(seed, stub, learned) == draft_prompt(seed, stub, ("", "")) == alone
    showing = seed.model_copy(
        update={"prompts": seed.prompts.model_copy(update={"draft": "{examples}{insights}" + seed.prompts.draft})}
    )
    shown = draft_prompt(showing, stub, learned)
    assert shown.endswith(f"```python\n{stub}```")
    assert shown.index("def find_max") < shown.index("def correct_bracketing")


# --- a person's words are enough -------------------------------------------------------------------------

RUN_LENGTH_TASK = (
    "Write solution.py defining run_length(s) that compresses runs of the same character into the character "
    "and its count, e.g. run_length('aaabcc') == 'a3b1c2'. run_length('') is ''."
)
RUN_LENGTH_CHECK = {
    "type": "python",
    "code": "def check(answer, workspace):\n"
    "    f = solution('solution').run_length\n"
    "    return f('aaabcc') == 'a3b1c2' and f('') == '' and f('zz') == 'z2'\n",
}
RUN_LENGTH = (
    "def run_length(s):\n    out, n = '', 0\n    for i, c in enumerate(s):\n        n += 1\n"
    "        if i + 1 == len(s) or s[i + 1] != c:\n            out, n = out + c + str(n), 0\n    return out"
)


def test_a_function_task_in_words_is_delivered_after_its_prose_examples_refuse_a_wrong_draft(engine_for):
    """No deliver field, no stub, no docstring: the file, the function and the examples come from the words.
    The draft (the model alone's answer) fails an example, the repair passes them, and the file is judged."""
    engine = engine_for(
        {
            "rules": [
                {"match": r"\AWrite solution.py", "role": "user", "reply": block("def run_length(s):\n    return s")},
                {"match": r"run_length\('aaabcc'\) returned 'aaabcc'", "role": "user", "reply": block(RUN_LENGTH)},
                {"match": r"Output of your code", "role": "user", "reply": "It works: the output matches."},
            ]
        },
        "c-words",
    )
    task, _ = engine.store.inbox.add_task(RUN_LENGTH_TASK, check=RUN_LENGTH_CHECK)
    result = engine.agent(code_scaffold(drafts=1)).run_task(task)
    assert (result.status, result.success) == ("done", True), result.verdict
    said = observations(engine, result)
    assert "run_length('aaabcc') returned 'aaabcc', but the task says 'a3b1c2'" in said[0]


def test_the_loops_own_words_given_back_are_never_the_answer(engine_for):
    """A model that echoes the repeat guard's message in its last turn has given no answer: the attempt ends
    without one, rather than handing the guard's words to the judge."""
    guard = "You have called this code with these same arguments 3 times in a row; it was not run again."
    engine = engine_for(
        {
            "rules": [
                {"match": r"taken word for word as your final answer", "role": "user", "reply": guard},
                {"match": "", "role": "user", "reply": block("print('thinking')")},
            ]
        },
        "c-own-words",
    )
    task, _ = engine.store.inbox.add_task("What is 6 times 7?", check={"type": "answer", "expected": "42"})
    result = engine.agent(code_scaffold(max_attempts=1)).run_task(task)
    assert result.answer is None and result.success is False
    trajectory = engine.store.attempts.get_trajectory(result.trajectory_ids[0])
    assert trajectory.status == "repeating" and trajectory.final_answer is None


def test_an_echoed_instruction_is_refused_as_a_finish_too(engine_for):
    """The code prompt's own instruction, handed back through finish, is no answer: refused, and the model
    goes on to the answer."""
    # the code prompt says "the final answer alone ... with no explanation": given back, it is refused
    system = code_scaffold().prompts.code
    quoted = system[system.index("When you are sure") : system.index("A reply without")].strip()
    engine = engine_for(
        {
            "rules": [
                {"match": r"this conversation's own instruction", "role": "user", "reply": block("finish(6 * 7)")},
                {"match": "", "role": "user", "reply": block(f"finish({quoted!r})")},
            ]
        },
        "c-echo-system",
    )
    task, _ = engine.store.inbox.add_task("What is 6 times 7?", check={"type": "answer", "expected": "42"})
    result = engine.agent(code_scaffold(max_attempts=1)).run_task(task)
    assert (result.answer, result.success) == ("42", True)
    assert observations(engine, result)[0].startswith("finish was refused: that is this conversation's own")


def answered(engine_for, name: str, rules: list[dict], prompt: str, expected: str):
    """The seed's result, in code, on an answer task whose model follows ``rules``."""
    engine = engine_for({"rules": rules}, name)
    task, _ = engine.store.inbox.add_task(prompt, check={"type": "answer", "expected": expected})
    return engine.agent(code_scaffold()).run_task(task)


def test_an_answer_is_shaped_to_the_form_the_task_asks_for_and_one_without_it_is_refused(engine_for):
    rules = [
        {"match": r"and this answer holds no number", "role": "user", "reply": "The product is 42."},
        {"match": "", "role": "user", "reply": "It is the product of the two."},
    ]
    result = answered(engine_for, "c-form", rules, "What is 6 times 7? Answer with the number only.", "42")
    assert (result.answer, result.success) == ("42", True)


def test_a_long_reply_about_the_output_is_talk_and_the_model_is_asked_for_the_answer(engine_for):
    talk = (
        "The output of your code is an empty list, which means that the function did not find any matching "
        "lines in the file. This could be because the pattern is wrong, or because the file does not have "
        "any lines of that kind at all, so we should look at it again more carefully."
    )
    rules = [
        {"match": r"reads as an explanation, not an answer", "role": "user", "reply": block("finish('0')")},
        {"match": r"Output of your code", "role": "user", "reply": talk},
        {"match": "", "role": "user", "reply": block("print([])")},
    ]
    result = answered(engine_for, "c-talk", rules, "Which lines of notes.txt mention rain?", "0")
    assert (result.answer, result.success) == ("0", True)


def test_a_long_reply_is_the_answer_of_a_task_that_asks_for_no_form_and_no_checked_answer(engine_for):
    """A chat turn, or "explain this", may be answered at length: nothing is refused there."""
    essay = "Rain forms when water vapour condenses into droplets heavy enough to fall. " * 4
    engine = engine_for({"rules": [{"match": "", "role": "user", "reply": essay}]}, "c-essay")
    task, _ = engine.store.inbox.add_task("Explain how rain forms.")
    assert engine.agent(code_scaffold()).run_task(task).answer == essay.strip()


def test_the_sessions_finish_cannot_be_redefined_by_the_models_code(engine_for):
    engine = engine_for(
        {
            "rules": [
                {"match": "", "role": "user", "reply": block("def finish(answer):\n    print(answer)\n\nfinish(6 * 7)")}
            ]
        },
        "c-own-finish",
    )
    task, _ = engine.store.inbox.add_task("What is 6 times 7?", check={"type": "answer", "expected": "42"})
    result = engine.agent(code_scaffold()).run_task(task)
    assert (result.status, result.answer, result.success) == ("done", "42", True)


def test_a_definition_that_passes_the_tasks_examples_in_a_later_turn_is_handed_in_at_once(engine_for):
    """As a passing draft is: the model need not call finish (the 0.5B model printed the right results again
    and again, never finishing, until its conversation outgrew the context)."""
    engine = engine_for(
        {
            "rules": [
                {"match": r"\AWrite solution.py", "role": "user", "reply": block("def run_length(s):\n    return s")},
                {
                    "match": r"returned 'aaabcc'",
                    "role": "user",
                    "reply": block(RUN_LENGTH + "\nprint(run_length('aaabcc'))"),
                },
                {"match": "", "role": "user", "reply": block("print('never reached')")},
            ]
        },
        "c-pass-later",
    )
    task, _ = engine.store.inbox.add_task(RUN_LENGTH_TASK, check=RUN_LENGTH_CHECK)
    result = engine.agent(code_scaffold(drafts=1)).run_task(task)
    assert (result.status, result.success) == ("done", True), result.verdict
    said = observations(engine, result)
    assert said[1].endswith("[the task's examples pass: handed in]"), said
    assert not any("never reached" in text for text in said)  # no turn after the one that passed


def test_an_attempt_whose_conversation_outgrows_the_context_still_hands_in_what_it_defined(engine_for):
    engine = engine_for(
        {
            "rules": [
                {"match": r"Output of your code", "role": "user", "error": "context_full"},
                {"match": "", "role": "user", "reply": block(RUN_LENGTH + "\nprint(run_length('zz'))")},
            ]
        },
        "c-context-full",
    )
    words = RUN_LENGTH_TASK.split(", e.g.")[0] + "."  # no examples: nothing is handed in unasked
    task, _ = engine.store.inbox.add_task(words, check=RUN_LENGTH_CHECK)
    result = engine.agent(code_scaffold(draft_first=False)).run_task(task)
    assert (result.status, result.success) == ("done", True), (result.error, result.verdict)
    assert engine.store.attempts.get_trajectory(result.trajectory_ids[0]).status == "context_full"


def test_a_draft_that_defines_nothing_is_not_handed_in_even_with_no_examples_to_try(engine_for):
    engine = engine_for(
        {
            "rules": [
                {"match": r"\AWrite solution.py", "role": "user", "reply": block("print('thinking')")},
                {"match": r"is not defined yet", "role": "user", "reply": block(RUN_LENGTH + "\nfinish('done')")},
            ]
        },
        "c-draft-nothing",
    )
    task, _ = engine.store.inbox.add_task(RUN_LENGTH_TASK, check=RUN_LENGTH_CHECK)
    result = engine.agent(code_scaffold(drafts=1, example_rounds=0)).run_task(task)
    assert (result.status, result.success) == ("done", True), observations(engine, result)
