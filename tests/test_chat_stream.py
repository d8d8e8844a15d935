"""A chat reply streamed as the model writes it: the answer's characters leave the daemon while the
model still writes its finish call (the reply used to arrive as one chunk at the end of the turn).

The picking out of the answer (``evolver.agent.answer_stream``) is tested on its own, then through
litellm's streaming with the scripted provider (native and text tool calls), then end to end: a
daemon whose model streams slowly, and an OpenAI-style streaming client.
"""

from __future__ import annotations

import json

import pytest

from evolver.agent.answer_stream import AnswerStream, partial_json_string
from evolver.agent.scaffold import default_scaffold
from evolver.api.chat import NOT_KEPT, rest_of_reply
from evolver.config import BudgetSettings, ModelSettings
from evolver.llm import scripted
from evolver.llm.budget import BudgetGuard
from evolver.llm.client import ModelClient
from evolver.testing.daemon import DaemonProcess, make_root, serving, write_script

# Escapes, a quote, a newline, non-ASCII and a character outside the BMP (a surrogate pair in JSON).
ANSWER = 'The total is "409.5" \\ 100%.\nNaïve café — ok 😀. ' + "More words follow here. " * 6
FINISH = [
    {
        "type": "function",
        "function": {
            "name": "finish",
            "description": "hand in the answer",
            "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
        },
    }
]


def _fed(raw: str, size: int) -> str:
    """What a reply tap passes on when ``raw`` (a reply's text) comes ``size`` characters at a time."""
    got: list[str] = []
    stream = AnswerStream(got.append)
    tap = stream.tap()
    for start in range(0, len(raw), size):
        tap.text(raw[start : start + size])
    assert stream.streamed == "".join(got)
    return "".join(got)


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_the_answer_is_decoded_from_a_call_cut_anywhere(size):
    raw = "```json\n" + json.dumps({"tool": "finish", "arguments": {"answer": ANSWER}}) + "\n```"
    assert _fed(raw, size) == ANSWER
    escaped = json.dumps({"tool": "finish", "arguments": {"answer": ANSWER}}, ensure_ascii=True)  # \\u escapes
    assert _fed(escaped, size) == ANSWER


def test_only_a_finish_answer_is_passed_on():
    assert _fed(json.dumps({"tool": "run_python", "arguments": {"code": "answer = 1"}}), 3) == ""
    assert _fed('{"arguments": {"answer": "before the name"}, "tool": "finish"}', 3) == ""  # unknown until the end
    assert _fed('{"tool": "finish", "arguments": {"answer": 42}}', 3) == ""  # not a string: sent whole at the end
    assert _fed("Just some prose, no call.", 3) == ""
    calls = (
        json.dumps({"tool": "list_files", "arguments": {}})
        + "\n"
        + json.dumps({"tool": "finish", "arguments": {"answer": "done"}})
    )
    assert _fed(calls, 4) == "done"


def test_partial_strings_wait_for_a_cut_escape_and_stop_at_a_bad_one():
    assert partial_json_string("ab\\") == ("ab", False)
    assert partial_json_string("ab\\u00") == ("ab", False)
    assert partial_json_string("ab\\ud83d") == ("ab", False)  # half a pair: wait for the other half
    assert partial_json_string('ab\\ud83d\\ude00c"') == ("ab😀c", True)
    assert partial_json_string("ab\\q rest") == ("ab", True)
    assert partial_json_string("ab\\uzzzz") == ("ab", True)


def test_one_reply_only_is_passed_on():
    got: list[str] = []
    stream = AnswerStream(got.append)
    first = stream.tap()
    first.call(0, "finish", '{"answer": "dr')
    first.call(0, None, 'aft"}')
    assert stream.tap() is None and got == ["dr", "aft"]
    other: list[str] = []
    quiet = AnswerStream(other.append)
    tap = quiet.tap()
    tap.call(0, "run_python", '{"code": "print(1)"}')
    assert other == [] and quiet.tap() is not None  # nothing passed on yet: the next reply may


def test_what_follows_the_streamed_text():
    assert rest_of_reply("Hel", "Hello") == "lo"
    assert rest_of_reply("", "Hello") == "Hello"
    assert rest_of_reply("draft", "final") == NOT_KEPT + "final"
    assert rest_of_reply("  Hello \n", "Hello") == ""  # finish strips the answer it hands in


@pytest.mark.parametrize("native", [True, False])
def test_the_model_client_streams_through_litellm(store, native):
    name = f"stream-{native}"
    scripted.register_script(
        name, {"native_tools": native, "rules": [{"match": "", "tool": "finish", "arguments": {"answer": ANSWER}}]}
    )
    client = ModelClient(
        ModelSettings(name=f"scripted/{name}"), ledger=store.ledger, budget=BudgetGuard(BudgetSettings(), store.ledger)
    )
    plain = client.complete([{"role": "user", "content": "hi"}], tools=FINISH)
    got: list[str] = []
    streamed = client.complete([{"role": "user", "content": "hi"}], tools=FINISH, stream=AnswerStream(got.append).tap())
    assert "".join(got) == ANSWER and len(got) > 5  # piece by piece, not whole
    # The reply put together is the one a call without streaming gets, and it is ledgered alike.
    assert [(c.name, c.arguments) for c in streamed.tool_calls] == [(c.name, c.arguments) for c in plain.tool_calls]
    assert streamed.tool_calls[0].arguments == {"answer": ANSWER}
    assert (streamed.tokens_in, streamed.tokens_out) == (plain.tokens_in, plain.tokens_out) != (0, 0)
    assert streamed.finish_reason == plain.finish_reason


# --- end to end ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def daemon():
    root = make_root()
    rules = [
        # A finish call that cannot be read after its answer was written: refused, then a kept answer.
        {"match": "Tool call refused", "tool": "finish", "arguments": {"answer": "the answer kept"}},
        {"match": r"\ATask:\nDRAFT", "on": "task", "reply": '{"tool": "finish", "arguments": {"answer": "draft" "x"}}'},
        {"match": r"\ATask:\n", "on": "task", "tool": "finish", "arguments": {"answer": ANSWER}},
    ]
    path = write_script(root, "script", rules)
    script = json.loads((root / "script.json").read_text())
    (root / "script.json").write_text(json.dumps({**script, "native_tools": False, "stream_delay_s": 0.02}))
    # The answer streams from a finish call: a model of text tool calls, so the seed acts in tool calls here
    # (its auto format would act in code, where the answer is a whole reply).
    seed = json.loads(default_scaffold().model_dump_json())
    seed["parameters"]["action_format"] = "tools"
    (root / "seed.json").write_text(json.dumps(seed))
    proc = DaemonProcess(root, model=path, settings={"EVOLVER_AGENT_SEED_SCAFFOLD": str(root / "seed.json")})
    with serving(proc):
        yield proc


def _stream(http, content: str):
    return http.stream(
        "POST",
        "/v1/chat/completions",
        json={"model": "evolver", "messages": [{"role": "user", "content": content}], "stream": True},
    )


def test_a_chat_reply_streams_while_the_model_writes_it(daemon):
    with daemon.client() as http, _stream(http, "Tell me the total.") as response:
        pieces, running_at_first = [], None
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            piece = chunk["choices"][0]["delta"].get("content") if chunk["choices"] else None
            if piece:
                if running_at_first is None:  # the turn has not ended: the model is still writing
                    task_id = chunk["id"].removeprefix("chatcmpl-")
                    running_at_first = http.get(f"/v1/tasks/{task_id}").json()["status"]
                pieces.append(piece)
    assert "".join(pieces) == ANSWER
    assert len(pieces) > 10
    assert running_at_first == "running"
    assert http_task(daemon, task_id)["status"] == "done"


def http_task(daemon, task_id: str) -> dict:
    with daemon.client() as http:
        return http.get(f"/v1/tasks/{task_id}").json()


def test_an_answer_the_agent_did_not_keep_is_followed_by_the_reply_and_says_so(daemon):
    with daemon.client() as http, _stream(http, "DRAFT, then think again") as response:
        text = "".join(
            json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
            for line in response.iter_lines()
            if line.startswith("data: {") and '"choices": []' not in line
        )
    assert text == "draft" + NOT_KEPT + "the answer kept"
