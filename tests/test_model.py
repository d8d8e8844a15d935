"""The model layer through litellm with the scripted provider: replies, retries, fallbacks,
the JSON-in-text fallback, the budget guard and the ledger."""

from __future__ import annotations

import json

import pytest

from evolver.config import BudgetSettings, ModelSettings
from evolver.llm import scripted
from evolver.llm.budget import BudgetExceeded, BudgetGuard
from evolver.llm.client import ModelClient, ModelError, parse_text_tool_calls
from evolver.llm.scripted import ScriptError

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run_python",
            "description": "run code",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
        },
    }
]


@pytest.fixture
def client_for(store):
    sleeps: list[float] = []

    def make(model: str, budget: BudgetSettings | None = None, **settings) -> ModelClient:
        client = ModelClient(
            ModelSettings(name=model, **settings),
            ledger=store.ledger,
            budget=BudgetGuard(budget or BudgetSettings(), store.ledger),
            sleep=sleeps.append,
        )
        client.sleeps = sleeps
        return client

    return make


def test_scripted_tool_calls_go_through_litellm_and_are_ledgered(client_for, store):
    scripted.register_script(
        "m-tools",
        {
            "rules": [
                {"match": r"What is (\d+) \+ (\d+)", "tool": "run_python", "arguments": {"code": r"print(\1 + \2)"}},
            ]
        },
    )
    reply = client_for("scripted/m-tools").complete(
        [{"role": "user", "content": "What is 2 + 3?"}], tools=TOOLS, task_id=None, purpose="task"
    )
    assert reply.finish_reason == "tool_calls"
    assert [(c.name, c.arguments) for c in reply.tool_calls] == [("run_python", {"code": "print(2 + 3)"})]
    assert reply.assistant_message["tool_calls"][0]["function"]["name"] == "run_python"
    tokens, usd = store.ledger.spent()
    assert tokens == reply.tokens_in + reply.tokens_out > 0 and usd == 0.0
    row = store.database.writer.execute("SELECT model, purpose FROM ledger").fetchall()
    assert row == [("scripted/m-tools", "task")]


def test_transient_errors_are_retried_with_backoff(client_for):
    scripted.register_script(
        "m-flaky",
        {
            "rules": [
                {"match": "", "error": "rate_limit", "times": 2},
                {"match": "", "reply": "fine now"},
            ]
        },
    )
    client = client_for("scripted/m-flaky", max_retries=3)
    assert client.complete([{"role": "user", "content": "hi"}]).content == "fine now"
    assert client.sleeps == [0.5, 1.0]


def test_giving_up_moves_to_the_fallback_model(client_for, store):
    scripted.register_script("m-down", {"rules": [{"match": "", "error": "server"}]})
    scripted.register_script("m-backup", {"rules": [{"match": "", "reply": "from the backup"}]})
    client = client_for("scripted/m-down", max_retries=1, fallbacks=["scripted/m-backup"])
    reply = client.complete([{"role": "user", "content": "hi"}])
    assert (reply.content, reply.model) == ("from the backup", "scripted/m-backup")


def test_a_bad_request_is_not_retried_and_names_the_error(client_for):
    scripted.register_script("m-bad", {"rules": [{"match": "", "error": "bad_request"}]})
    client = client_for("scripted/m-bad", max_retries=3)
    with pytest.raises(ModelError, match="BadRequestError"):
        client.complete([{"role": "user", "content": "hi"}])
    assert client.sleeps == []


def test_models_without_native_tools_get_tools_in_text_and_their_json_parsed(client_for):
    scripted.register_script(
        "m-text",
        {
            "native_tools": False,
            "rules": [
                {"match": "You can call these tools", "on": "all", "tool": "run_python", "arguments": {"code": "1"}},
            ],
        },
    )
    reply = client_for("scripted/m-text").complete([{"role": "user", "content": "go"}], tools=TOOLS)
    assert reply.finish_reason == "stop" and "```json" in reply.content
    assert [(c.name, c.arguments) for c in reply.tool_calls] == [("run_python", {"code": "1"})]
    assert "tool_calls" not in reply.assistant_message


def test_a_script_with_a_record_file_appends_each_conversation_it_is_sent(client_for, tmp_path):
    record = tmp_path / "sent.jsonl"
    scripted.register_script("m-record", {"record": str(record), "rules": [{"match": "", "reply": "ok"}]})
    client = client_for("scripted/m-record")
    client.complete([{"role": "system", "content": "be brief"}, {"role": "user", "content": "one"}])
    client.complete([{"role": "user", "content": "two"}])
    sent = [json.loads(line)["messages"] for line in record.read_text().splitlines()]
    assert sent == [
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "one"}],
        [{"role": "user", "content": "two"}],
    ]


def test_text_tool_call_parser_reports_bad_json_and_ignores_prose():
    calls = parse_text_tool_calls('thinking...\n```json\n{"tool": "finish", "arguments": {"answer": "4"}}\n```')
    assert [(c.name, c.arguments) for c in calls] == [("finish", {"answer": "4"})]
    broken = parse_text_tool_calls('```json\n{"tool": "finish", "arguments": {"answer": }\n```')
    assert broken[0].error.startswith("invalid JSON")
    assert parse_text_tool_calls("The answer is 4.") == []
    assert parse_text_tool_calls('```json\n{"tool": "x", "arguments": [1]}\n```')[0].error.startswith(
        "arguments must be a JSON object"
    )


def test_malformed_native_arguments_become_a_call_error(client_for):
    scripted.register_script("m-args", {"rules": [{"match": "", "tool": "run_python", "arguments": {}}]})
    client = client_for("scripted/m-args")
    reply = client.complete([{"role": "user", "content": "x"}], tools=TOOLS)
    assert reply.tool_calls[0].arguments == {} and reply.tool_calls[0].error is None


def test_budget_guard_refuses_a_call_past_the_daily_and_task_caps(client_for, store):
    scripted.register_script("m-cheap", {"rules": [{"match": "", "reply": "ok"}]})
    client = client_for("scripted/m-cheap", BudgetSettings(tokens_per_day=1000, tokens_per_task=20))
    task, _ = store.inbox.add_task("count things")
    client.complete([{"role": "user", "content": "x" * 40}], task_id=task.id)  # ~10 + 1 tokens
    with pytest.raises(BudgetExceeded, match="per-task token cap of 20 tokens"):
        client.complete([{"role": "user", "content": "x" * 80}], task_id=task.id)
    store.ledger.record_call(model="other", purpose="task", tokens_in=995, tokens_out=0, cost_usd=0, latency_ms=1)
    with pytest.raises(BudgetExceeded, match="daily token cap of 1000 tokens"):
        client.complete([{"role": "user", "content": "y" * 40}])


def test_background_work_is_held_to_its_share(client_for, store):
    scripted.register_script("m-bg", {"rules": [{"match": "", "reply": "ok"}]})
    client = client_for("scripted/m-bg", BudgetSettings(tokens_per_day=1000, tokens_per_task=0, background_share=0.1))
    store.ledger.record_call(model="x", purpose="distill", tokens_in=99, tokens_out=0, cost_usd=0, latency_ms=1)
    with pytest.raises(BudgetExceeded, match="background token share of 100 tokens"):
        client.complete([{"role": "user", "content": "z" * 40}], purpose="distill")
    assert client.complete([{"role": "user", "content": "z" * 40}], purpose="task").content == "ok"


def test_dollar_caps_refuse_once_reached(client_for, store):
    scripted.register_script("m-usd", {"rules": [{"match": "", "reply": "ok"}]})
    client = client_for("scripted/m-usd", BudgetSettings(usd_per_day=1.0, usd_per_task=0.5, tokens_per_task=0))
    store.ledger.record_call(model="paid", purpose="task", tokens_in=1, tokens_out=1, cost_usd=1.0, latency_ms=1)
    with pytest.raises(BudgetExceeded, match="daily dollar cap"):
        client.complete([{"role": "user", "content": "hi"}])


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ({"rules": "x"}, 'a script is an object with a "rules" list'),
        ({"rules": [{"match": "(", "reply": "x"}]}, "not a valid regex"),
        ({"rules": [{"match": "", "reply": "x", "tool": "y"}]}, "exactly one of reply, tool, calls or error"),
        ({"rules": [{"match": "", "error": "meteor"}]}, "unknown error kind"),
        ({"rules": [{"match": "", "reply": "x", "colour": 1}]}, "rule 0"),
        ({"rules": [], "extra": 1}, "unknown script keys"),
        ({"rules": [], "record": 1}, "must be a file path"),
    ],
)
def test_bad_scripts_are_refused_with_the_reason(script, message):
    with pytest.raises(ScriptError, match=message):
        scripted.register_script("m-broken", script)


def test_an_unknown_script_is_a_model_error(client_for):
    with pytest.raises(ModelError, match="no script named 'nobody'"):
        client_for("scripted/nobody").complete([{"role": "user", "content": "hi"}])


# --- a local OpenAI-compatible server (what llama.cpp's server is to litellm) ----------------


class _FakeServer:
    """A local OpenAI-compatible chat endpoint: it records each request (headers and body) and answers
    at once, or only after ``delay_s`` (a slow generation)."""

    def __init__(self, delay_s: float = 0.0, slots: int = 1) -> None:
        import http.server
        import threading

        self.requests: list[dict] = []
        self.delay_s = delay_s
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append({"authorization": self.headers.get("Authorization"), "body": body})
                import time

                time.sleep(server.delay_s)
                n = body.get("n", 1)
                if n > slots:  # llama-server: at most as many completions as slots
                    self.send_response(400)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(b'{"error": {"message": "n_cmpl is larger than the number of slots"}}')
                    return
                reply = json.dumps(
                    {
                        "id": "x",
                        "object": "chat.completion",
                        "created": 0,
                        "model": "qwen",
                        "choices": [
                            {
                                "index": i,
                                "finish_reason": "stop",
                                "message": {"role": "assistant", "content": "hello" + (f" {i}" if i else "")},
                            }
                            for i in range(n)
                        ],  # the usage of the first alone, as llama-server counts it
                        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
                    }
                )
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(reply)))
                    self.end_headers()
                    self.wfile.write(reply.encode())
                except OSError:
                    pass  # the client gave up

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def local_server():
    servers = []

    def start(delay_s: float = 0.0, slots: int = 1) -> _FakeServer:
        servers.append(_FakeServer(delay_s, slots))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def test_a_local_server_needs_no_api_key(client_for, local_server, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    server = local_server()
    reply = client_for("openai/qwen", api_base=server.url).complete([{"role": "user", "content": "hi"}])
    assert reply.content == "hello"
    assert len(server.requests) == 1 and server.requests[0]["authorization"]  # a dummy key was sent


def test_n_completions_come_from_one_request_and_a_server_with_fewer_slots_is_asked_for_one(
    client_for, local_server, store, monkeypatch
):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    slots = local_server(slots=4)
    reply = client_for("openai/qwen", api_base=slots.url).complete([{"role": "user", "content": "hi"}], n=3)
    assert (reply.content, reply.others) == ("hello", ("hello 1", "hello 2"))
    assert [r["body"].get("n") for r in slots.requests] == [3]
    # the others' tokens, which the server's usage leaves out, estimated from their length for the budget
    assert reply.tokens_out == 1 + round(14 / 5) and store.ledger.spent()[0] == 3 + reply.tokens_out
    fewer = local_server(slots=2)
    reply = client_for("openai/qwen", api_base=fewer.url).complete([{"role": "user", "content": "hi"}], n=3)
    assert (reply.content, reply.others) == ("hello", ())  # the caller asks again for what is missing
    assert [r["body"].get("n") for r in fewer.requests] == [3, None]


def test_a_hosted_model_without_its_key_is_a_clear_error_never_retried(client_for, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    client = client_for("openai/gpt-4o-mini", max_retries=3)
    with pytest.raises(ModelError, match="no API key.*OPENAI_API_KEY"):
        client.complete([{"role": "user", "content": "hi"}])
    assert client.sleeps == []


def test_a_call_that_times_out_is_abandoned_once_not_sent_again(client_for, local_server, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    server = local_server(delay_s=3.0)
    client = client_for("openai/qwen", api_base=server.url, timeout_s=0.5, max_retries=3)
    with pytest.raises(ModelError, match="no reply within 0.5 s"):
        client.complete([{"role": "user", "content": "hi"}])
    # Retrying would queue a new generation behind the abandoned one on a one-slot server.
    assert len(server.requests) == 1 and client.sleeps == []


def test_every_call_bounds_its_output_by_purpose(client_for, local_server, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    server = local_server()
    client = client_for("openai/qwen", api_base=server.url, max_tokens_step=111, max_tokens_propose=222)
    client.complete([{"role": "user", "content": "hi"}], purpose="task")
    client.complete([{"role": "user", "content": "hi"}], purpose="propose")
    client.complete([{"role": "user", "content": "hi"}], purpose="task", max_tokens=33)
    assert [r["body"]["max_tokens"] for r in server.requests] == [111, 222, 33]
    assert server.requests[0]["authorization"] == "Bearer sk-test"  # a key that is set is sent, not the dummy


def test_a_seed_reaches_a_server_that_takes_one_and_no_provider_that_refuses_it(client_for, local_server, monkeypatch):
    """A draft's seed goes to llama.cpp's server in the request; Anthropic's API has no seed and litellm
    refuses it, so a model there is asked unseeded rather than not at all."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    server = local_server()
    client = client_for("openai/qwen", api_base=server.url)
    client.complete([{"role": "user", "content": "hi"}], seed=1234)
    client.complete([{"role": "user", "content": "hi"}])
    assert [r["body"].get("seed") for r in server.requests] == [1234, None]
    assert client._takes_seed("openai/qwen") and not client._takes_seed("anthropic/claude-3-5-sonnet-20240620")


def test_tool_mode_forces_native_or_text_tool_calls(client_for, local_server, monkeypatch, tmp_path):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    server = local_server()
    # litellm knows nothing of a local alias, so "auto" would describe the tools in text.
    client_for("openai/qwen", api_base=server.url, tool_mode="native").complete(
        [{"role": "user", "content": "go"}], tools=TOOLS
    )
    assert server.requests[0]["body"]["tools"] == TOOLS
    record = tmp_path / "sent.jsonl"
    scripted.register_script("m-native", {"record": str(record), "rules": [{"match": "", "reply": "ok"}]})
    client_for("scripted/m-native", tool_mode="text").complete([{"role": "user", "content": "go"}], tools=TOOLS)
    assert "You can call these tools" in json.loads(record.read_text())["messages"][0]["content"]


def test_structured_output_constrains_text_tool_calls_in_the_spelling_the_server_takes(
    client_for, local_server, monkeypatch
):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    server = local_server()
    for spelling in ("json_schema", "json_object"):
        client_for(
            "openai/qwen", api_base=server.url, tool_mode="text", structured_output=True, schema_format=spelling
        ).complete([{"role": "user", "content": "go"}], tools=TOOLS)
    openai_style, llama_style = (r["body"]["response_format"] for r in server.requests[-2:])
    schema = openai_style["json_schema"]["schema"]
    assert [o["properties"]["tool"]["enum"] for o in schema["anyOf"]] == [[t["function"]["name"]] for t in TOOLS]
    assert llama_style == {"type": "json_object", "schema": schema}  # llama-cpp-python's server takes only this
    client_for("openai/qwen", api_base=server.url, tool_mode="text").complete(
        [{"role": "user", "content": "go"}], tools=TOOLS
    )
    assert "response_format" not in server.requests[-1]["body"]  # off unless asked: a server may refuse it


@pytest.mark.parametrize(
    "text",
    [
        '```json\n{"tool": "finish", "arguments": {"answer": "4"},}\n```',  # a trailing comma
        '```json\n{"tool": "finish", "arguments": {"answer": "4"}\n```',  # the final brace missing
        '```json\n{"tool": "finish", "arguments": {"answer": "4"}}',  # the closing fence missing
        "```\n{'tool': 'finish', 'arguments': {'answer': '4'}}\n```",  # single quotes, no double ones
        'I will finish now. {"tool": "finish", "arguments": {"answer": "4"}} That is all.',  # text around it
    ],
)
def test_slightly_malformed_tool_call_json_is_repaired(text):
    calls = parse_text_tool_calls(text)
    assert [(c.name, c.arguments, c.error) for c in calls] == [("finish", {"answer": "4"}, None)]


def test_ambiguous_tool_call_json_is_refused_with_the_expected_shape_and_the_raw_text_kept():
    # An apostrophe inside single-quoted JSON: which quotes delimit strings is a guess, so no repair.
    text = "```json\n{'tool': 'finish', 'arguments': {'answer': 'it's 4'}}\n```"
    (call,) = parse_text_tool_calls(text)
    assert call.arguments is None and call.error.startswith("invalid JSON")
    assert '{"tool": "<name>", "arguments": {' in call.error
    assert call.raw_arguments == "{'tool': 'finish', 'arguments': {'answer': 'it's 4'}}"
