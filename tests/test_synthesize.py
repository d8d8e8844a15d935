"""Tool synthesis rounds with the scripted model: quarantine in the real sandbox, events, watermark, revert."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evolver.config import load_config
from evolver.engine import Engine
from evolver.llm import scripted
from evolver.llm.budget import BudgetExceeded
from evolver.meta.revert import RevertError, revert_event
from evolver.meta.synthesize import WATERMARK_KEY, SynthesisError, normalized_code, synthesize_round
from memory import NewTrajectory, NotFound

REVERSE = '''
def reverse_text(text: str) -> str:
    """Reverse a string, character by character.

    Args:
        text: the string to reverse
    """
    return text[::-1]
'''
REVERSE_TESTS = """
def test_reverses():
    assert reverse_text("abc") == "cba"

def test_empty():
    assert reverse_text("") == ""
"""
SHOUT = '''
def shout(text: str) -> str:
    """Upper-case a text and add an exclamation mark.

    Args:
        text: what to shout
    """
    return text.upper() + "!"
'''
SHOUT_TESTS = """
def test_shout():
    assert shout("hi") == "HI!"
"""


def verbatim(reply: str) -> str:
    """A reply the scripted model sends as it is (it expands backslashes as a regex template would)."""
    return reply.replace("\\", "\\\\")


def proposal(
    code=REVERSE, tests=REVERSE_TESTS, name="reverse_text", replays=None, words=("hello", "abc"), **extra
) -> str:
    if replays is None:  # the recorded calls, new ones first
        replays = [{"call": n, "arguments": {"text": word}} for n, word in enumerate(words, start=1)]
    return json.dumps(
        {
            "name": name,
            "code": code,
            "tests": tests,
            "replays": replays,
            "rationale": "reversing strings came up in several tasks",
            **extra,
        }
    )


# A second round's window repeats the words; its look back holds the first round's calls.
AGAIN = ("hello", "abc", "hello", "abc")


def _python_call(code: str, output: str, n: int) -> list[dict]:
    return [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": f"c{n}", "name": "run_python", "arguments": {"code": code}, "error": None}],
        },
        {"role": "tool", "content": output, "tool_results": [{"id": f"c{n}", "name": "run_python", "ok": True}]},
    ]


def reversals(store) -> list[str]:
    """Two tasks, one after the other, that each reversed a word with the same code, on other data."""
    return [
        *store.attempts.ingest(
            [
                NewTrajectory(
                    prompt="Reverse the word hello",
                    final_answer="olleh",
                    success=True,
                    steps=_python_call("word = 'hello'\nprint(word[::-1])", "olleh", 1),
                )
            ]
        ),
        *store.attempts.ingest(
            [
                NewTrajectory(
                    prompt="Reverse the word abc",
                    final_answer="cba",
                    success=True,
                    steps=_python_call("word = 'abc'\nprint(word[::-1])", "cba", 2),
                )
            ]
        ),
    ]


def shouts(store) -> list[str]:
    """Two tasks, one after the other (so their calls are shown in that order), that shouted a word."""
    return [
        *store.attempts.ingest(
            [
                NewTrajectory(
                    prompt="Shout hi",
                    final_answer="HI!",
                    success=True,
                    steps=_python_call("s = 'hi'\nprint(s.upper() + '!')", "HI!", 3),
                )
            ]
        ),
        *store.attempts.ingest(
            [
                NewTrajectory(
                    prompt="Shout yes",
                    final_answer="YES!",
                    success=True,
                    steps=_python_call("s = 'yes'\nprint(s.upper() + '!')", "YES!", 4),
                )
            ]
        ),
    ]


@pytest.fixture
def engine(open_store, sandbox, tmp_path):
    opened = []

    def make(rules, name: str, data: Path | None = None, **env) -> Engine:
        scripted.register_script(name, {"rules": rules})
        config = load_config(env={"EVOLVER_MODEL_NAME": f"scripted/{name}", **env})
        data = data or tmp_path / "d"
        e = Engine.open(config, data_dir=data, store=open_store(data), sandbox=sandbox)
        opened.append(e)
        return e

    yield make


def _only(reply: str) -> list[dict]:
    return [{"match": "", "reply": reply}]


def _tool_events(store) -> list:
    return [e for e in store.reports.list_events(limit=1000) if e.kind.startswith("tool_") or e.kind == "revert"]


def test_literals_do_not_make_code_different():
    assert normalized_code("print('abc'[::-1])") == normalized_code("print('hello'[::-1])")
    assert normalized_code("print(x[::-1])") != normalized_code("print(x.upper())")
    assert normalized_code("def (:") is None


def test_a_round_registers_a_tool_that_passes_quarantine(engine):
    e = engine(_only(proposal()), "synth-ok")
    evidence = reversals(e.store)
    summary = synthesize_round(e)
    assert summary.startswith("registered reverse_text v1")
    (tool,) = e.store.tools.list_tools()
    assert (tool.name, tool.version, tool.origin, tool.status) == ("reverse_text", 1, "synthesized", "active")
    (event,) = e.store.reports.list_events(kind="tool_registered")
    assert tool.event_id == event.id and sorted(event.evidence) == sorted(evidence)
    assert event.payload["quarantine"] == "2/2 tests passed, 2/2 recorded calls reproduced"
    assert event.payload["tool_changes"] == [
        {"id": tool.id, "name": "reverse_text", "version": 1, "before": None, "after": "active"}
    ]
    assert (e.data_dir / "tools" / "reverse_text" / "v1.py").read_text() == REVERSE
    # Offered to the next task, and found by what it does.
    e.agent()
    spec = e.registry.get("reverse_text")
    assert spec is not None and spec.tool_id == tool.id and spec.parameters["required"] == ["text"]
    assert e.store.retrieval.search_tools("reverse a string", k=1)[0].name == "reverse_text"
    assert synthesize_round(e) == "no new trajectories since the last round"
    assert len(e.store.reports.list_events(kind="tool_registered")) == 1
    # `evolver tools show reverse_text` and `evolver history show EVENT` (no command showed either before)
    from evolver.api import views

    shown = views.tool_detail(e.store, "reverse_text")
    (version,) = shown["versions"]
    assert version["code"] == REVERSE and "def test_" in version["tests"]
    assert [(x["id"], x["kind"]) for x in version["events"]] == [(event.id, "tool_registered")]
    assert shown["effect"]["exposures"] == 0
    detail = views.event_detail(e.store, event.id)
    assert detail["tool_changes"] == event.payload["tool_changes"] and detail["reverted_by"] == []
    with pytest.raises(NotFound, match="No synthesized tool named 'nope'"):
        views.tool_detail(e.store, "nope")


def test_the_registered_tool_runs_for_a_task_and_its_use_is_counted(engine):
    rules = [
        {"match": "^desserts$", "role": "tool", "tool": "finish", "arguments": {"answer": "desserts"}},
        {"match": "Reverse the word", "on": "task", "tool": "reverse_text", "arguments": {"text": "stressed"}},
        {"match": "", "reply": proposal()},
    ]
    e = engine(rules, "synth-use")
    reversals(e.store)
    synthesize_round(e)
    task, _ = e.store.inbox.add_task("Reverse the word stressed", check={"type": "answer", "expected": "desserts"})
    result = e.agent().run_task(task)
    assert result.status == "done" and result.answer == "desserts"
    (tool,) = e.store.tools.list_tools()
    assert (tool.uses, tool.successes, tool.failures) == (1, 1, 0)


@pytest.mark.parametrize(
    "reply, reason",
    [
        (
            proposal(tests="def test_wrong():\n    assert reverse_text('ab') == 'ab'\n"),
            "1 of 1 tests failed; test_wrong",
        ),
        (proposal(code="def reverse_text(text: str) -> str:\n    return text[::-1\n"), "does not parse"),
        (
            proposal(
                code=REVERSE.replace("text[::-1]", "text[::-1].upper()"),
                tests="def test_runs():\n    assert reverse_text('a') == 'A'\n",
            ),
            "recorded calls not reproduced",
        ),
        (proposal(replays=[{"call": 1, "arguments": {"text": "hello"}}]), "no arguments for recorded call(s) 2"),
        (proposal(tests="x = 1\n"), "brings no tests"),
        (
            proposal(
                code=REVERSE.replace("text: str", "text"),
            ),
            "has no type annotation",
        ),
        (proposal(name="run_shell", code=REVERSE.replace("reverse_text", "run_shell")), "built-in tool's name"),
        # A schema no model call could carry would break every task the tool is offered to.
        (proposal(code=REVERSE.replace("text: str", 'text: str = b""')), "its schema is not JSON"),
        (proposal(code=REVERSE.replace("text: str", "text: str = ...")), "its schema is not JSON"),
        # Its texts are shown to the model and printed on people's terminals: no control character in them.
        (
            verbatim(proposal(code=REVERSE.replace("by character", "by\x1b]0;pwned\x07 character"))),
            "control character \\x1b at line 3, column 38 in its code",
        ),
        (
            verbatim(proposal(code=REVERSE.replace("by character", "by\\x1b[2J character"))),
            "control character \\x1b at character 31 in its description",
        ),
        (
            verbatim(proposal(code=REVERSE.replace("the string", "the\\x1b[31m string"))),
            "control character \\x1b at character 4 in its description of parameter 'text'",
        ),
        (verbatim(proposal(tests=REVERSE_TESTS.replace("cba", "c\x9bba"))), "control character \\x9b"),
    ],
)
def test_a_tool_that_fails_quarantine_is_rejected_with_the_reason(engine, reply, reason):
    e = engine(_only(reply), f"synth-reject-{abs(hash(reason))}")
    reversals(e.store)
    assert synthesize_round(e).startswith("rejected")
    assert e.store.tools.list_tools(status=None) == []
    assert not (e.data_dir / "tools" / "reverse_text").exists()
    (event,) = e.store.reports.list_events(kind="tool_rejected")
    assert reason in event.payload["reason"], event.payload["reason"]
    assert event.payload["code"] and event.payload["tool_changes"] == []
    assert json.loads(e.store.get_meta(WATERMARK_KEY))["until"] is None  # the window is done: not proposed again
    assert synthesize_round(e) == "no new trajectories since the last round"


@pytest.mark.parametrize(
    "reply, problem",
    [
        ("Here is a tool: def f(): pass", "not JSON"),
        (json.dumps({"name": "reverse_text", "code": REVERSE}), "needs 'tests'"),
        (proposal(replays=[{"call": 9, "arguments": {}}]), "numbered 1 to 2"),
        (proposal(extra_field=1), "unknown fields"),
    ],
)
def test_a_malformed_answer_fails_the_round_and_changes_nothing(engine, reply, problem):
    e = engine(_only(reply), f"synth-bad-{abs(hash(problem))}")
    reversals(e.store)
    with pytest.raises(SynthesisError, match=problem):
        synthesize_round(e)
    assert e.store.tools.list_tools(status=None) == [] and _tool_events(e.store) == []
    assert e.store.get_meta(WATERMARK_KEY) is None  # the same window is seen again


def test_the_model_may_decline(engine):
    e = engine(_only(json.dumps({"tool": None, "why": "too trivial to be a tool"})), "synth-decline")
    reversals(e.store)
    assert synthesize_round(e).startswith("skipped")
    (event,) = e.store.reports.list_events(kind="tool_skipped")
    assert event.why == "too trivial to be a tool" and e.store.tools.list_tools(status=None) == []


def test_code_seen_in_one_task_only_is_no_opportunity(engine):
    e = engine(_only(proposal()), "synth-once")
    e.store.attempts.ingest(
        [
            NewTrajectory(
                prompt="Reverse hello",
                final_answer="olleh",
                success=True,
                steps=_python_call("print('hello'[::-1])", "olleh", 1),
            )
        ]
    )
    assert synthesize_round(e).startswith("no opportunity")
    assert e.store.database.one("SELECT count(*) AS n FROM ledger")["n"] == 0  # no model call for nothing
    assert json.loads(e.store.get_meta(WATERMARK_KEY))["until"] is None


def test_a_failure_that_lacked_a_capability_is_an_opportunity(engine):
    tool = proposal(replays=[])
    e = engine([{"match": "failed for want of a capability", "reply": tool}], "synth-gap")
    e.store.attempts.ingest(
        [
            NewTrajectory(
                prompt="Reverse the letters of 'stressed'",
                final_answer="stressed",
                success=False,
                steps=[{"role": "reflection", "content": "I could not reverse the text; I lacked a tool for it."}],
            )
        ]
    )
    assert synthesize_round(e).startswith("registered reverse_text v1")


def test_budget_exhaustion_stops_mid_round_and_the_next_round_resumes(engine, tmp_path):
    # The first answer is long (a rationale of ~10,000 tokens); after it the background share
    # (6,000 tokens) cannot pay for the second opportunity's call.
    long = "x" * 40_000
    rules = [
        {"match": r"\[::-1\]", "reply": proposal(rationale=long)},
        {
            "match": r"upper",
            "reply": json.dumps(
                {
                    "name": "shout",
                    "code": SHOUT,
                    "tests": SHOUT_TESTS,
                    "replays": [{"call": 1, "arguments": {"text": "hi"}}, {"call": 2, "arguments": {"text": "yes"}}],
                    "rationale": long,
                }
            ),
        },
    ]
    env = {"EVOLVER_BUDGET_TOKENS_PER_DAY": "12000", "EVOLVER_BUDGET_TOKENS_PER_TASK": "0"}
    e = engine(rules, "synth-budget", **env)
    reversals(e.store)
    shouts(e.store)
    with pytest.raises(BudgetExceeded):
        synthesize_round(e)
    (first,) = e.store.tools.list_tools()
    state = json.loads(e.store.get_meta(WATERMARK_KEY))
    assert state["until"] is not None and len(state["done"]) == 1  # the window stays open, one opportunity done
    assert len(e.store.reports.list_events(kind="tool_registered")) == 1
    e.close()
    # More budget, a new daemon: the round picks up the other opportunity, not the first one again.
    e2 = engine(
        rules,
        "synth-budget",
        data=e.data_dir,
        EVOLVER_BUDGET_TOKENS_PER_DAY="100000",
        EVOLVER_BUDGET_TOKENS_PER_TASK="0",
    )
    summary = synthesize_round(e2)
    assert summary.startswith("registered") and first.name not in summary
    assert sorted(t.name for t in e2.store.tools.list_tools()) == ["reverse_text", "shout"]
    assert json.loads(e2.store.get_meta(WATERMARK_KEY))["until"] is None


def test_a_better_version_replaces_the_old_and_must_pass_its_tests(engine, tmp_path):
    e = engine(_only(proposal()), "synth-v1")
    reversals(e.store)
    synthesize_round(e)
    e.close()
    # Version 2 documents itself better; it must still pass version 1's tests.
    better = REVERSE.replace(
        "Reverse a string, character by character.", "Reverse a string, character by character (Unicode code points)."
    )
    e2 = engine(_only(proposal(code=better, words=AGAIN)), "synth-v2", data=e.data_dir)
    reversals(e2.store)
    assert synthesize_round(e2).startswith("registered reverse_text v2"), e2.store.reports.list_events(
        kind="tool_rejected"
    )[0].why
    rows = {t.version: t.status for t in e2.store.tools.list_tools(status=None)}
    assert rows == {1: "replaced", 2: "active"}
    e2.agent()
    assert e2.registry.get("reverse_text").version == 2
    e2.close()
    # A "version" that breaks the old tests is refused.
    broken = REVERSE.replace("return text[::-1]", "return text[::-1] if text else 'empty'")
    e3 = engine(
        _only(
            proposal(
                code=broken, tests="def test_mine():\n    assert reverse_text('ab') == 'ba'\n", words=AGAIN + ("hello",)
            )
        ),  # five calls are shown at most
        "synth-v3",
        data=e.data_dir,
    )
    reversals(e3.store)
    assert synthesize_round(e3).startswith("rejected")
    assert "test_empty" in e3.store.reports.list_events(kind="tool_rejected")[0].payload["reason"]
    assert {t.version: t.status for t in e3.store.tools.list_tools(status=None)} == {1: "replaced", 2: "active"}


def test_a_near_duplicate_under_another_name_is_refused(engine):
    e = engine(_only(proposal()), "synth-dup1")
    reversals(e.store)
    synthesize_round(e)
    e.close()
    twin = REVERSE.replace("reverse_text", "reverse_string")
    e2 = engine(
        _only(
            proposal(
                code=twin,
                name="reverse_string",
                words=AGAIN,
                tests=REVERSE_TESTS.replace("reverse_text", "reverse_string"),
            )
        ),
        "synth-dup2",
        data=e.data_dir,
        EVOLVER_EVOLUTION_TOOL_DEDUP_THRESHOLD="0.8",
    )
    reversals(e2.store)
    assert synthesize_round(e2).startswith("rejected")
    assert "duplicates tool 'reverse_text'" in e2.store.reports.list_events(kind="tool_rejected")[0].payload["reason"]


def test_revert_of_a_registration_and_of_a_replacement(engine):
    e = engine(_only(proposal()), "synth-revert1")
    reversals(e.store)
    synthesize_round(e)
    e.close()
    better = REVERSE.replace("character by character.", "character by character, in order.")
    e2 = engine(_only(proposal(code=better, words=AGAIN)), "synth-revert2", data=e.data_dir)
    reversals(e2.store)
    synthesize_round(e2)
    first, second = sorted(e2.store.reports.list_events(kind="tool_registered"), key=lambda ev: ev.id)
    with pytest.raises(RevertError, match="changed again after event"):
        revert_event(e2.store, first.id)
    revert = revert_event(e2.store, second.id)
    assert {t.version: t.status for t in e2.store.tools.list_tools(status=None)} == {1: "active", 2: "reverted"}
    e2.agent()
    assert e2.registry.get("reverse_text").version == 1
    with pytest.raises(RevertError, match="already reverted"):
        revert_event(e2.store, second.id)
    assert revert.payload["tool_changes"] and revert.reverts == second.id
    revert_event(e2.store, first.id)
    assert [t.status for t in e2.store.tools.list_tools(status=None)] == ["reverted", "reverted"]
    e2.agent()
    assert e2.registry.get("reverse_text") is None


def test_recording_a_use_only_counts_it(engine):
    """A tool is retired in one place, the prune job, by its measured effect; its calls are only counted."""
    e = engine(_only(proposal()), "synth-count")
    reversals(e.store)
    synthesize_round(e)
    e.agent()
    spec = e.registry.get("reverse_text")
    for ok in (True, False, False, False):
        e.toolbox.record_use(spec, ok)
    e.agent()
    (tool,) = e.store.tools.list_tools(status=None)
    assert tool.status == "active" and (tool.uses, tool.successes) == (4, 1)
    assert e.registry.get("reverse_text") is not None and not e.store.reports.list_events(kind="tool_retired")


def test_a_tool_whose_file_changed_on_disk_is_not_offered(engine):
    e = engine(_only(proposal()), "synth-tamper")
    reversals(e.store)
    synthesize_round(e)
    e.agent()
    assert e.registry.get("reverse_text").code == REVERSE
    (e.data_dir / "tools" / "reverse_text" / "v1.py").write_text(REVERSE.replace("[::-1]", "[::1]"))
    e.agent()
    assert e.registry.get("reverse_text").code == REVERSE  # what was checked stays what is served
    e.close()
    restarted = engine(_only(proposal()), "synth-tamper", data=e.data_dir)
    restarted.agent()
    assert restarted.registry.get("reverse_text") is None


def test_a_proposal_with_a_trailing_comma_and_its_last_brace_missing_is_repaired(engine):
    e = engine(_only("```json\n" + proposal()[:-1] + ",\n```"), "synth-repair")
    reversals(e.store)
    assert synthesize_round(e).startswith("registered reverse_text v1")
