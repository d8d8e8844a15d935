"""What the API tells a client when the daemon fails underneath it: what happened, never the failure's text."""

import json
from types import SimpleNamespace

from starlette.testclient import TestClient

from evolver.api import create_app
from evolver.config import Config

SECRET = "/home/person/private/notes.txt: token=s3cret"


def _host(monkeypatch, chat):
    monkeypatch.setenv("API_ERRORS_TEST_TOKEN", "t0ken")  # the test client speaks TCP, which needs the token
    config = Config(daemon={"tcp_token_env": "API_ERRORS_TEST_TOKEN"})
    return SimpleNamespace(config=config, jobs=None, chat=chat)


def test_a_streamed_chat_turn_that_fails_says_so_without_the_exception_text(monkeypatch, caplog):
    def chat(prompt, **_):
        raise RuntimeError(SECRET)

    app = create_app(_host(monkeypatch, chat))
    body = {"model": "evolver", "stream": True, "messages": [{"role": "user", "content": "hello"}]}
    with TestClient(app, headers={"Authorization": "Bearer t0ken"}) as http:
        with http.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            events = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    errors = [json.loads(e)["error"] for e in events if e != "[DONE]" and "error" in json.loads(e)]
    assert len(errors) == 1, events
    assert errors[0]["type"] == "internal_error" and "RuntimeError" in errors[0]["message"]
    assert "s3cret" not in json.dumps(events) and "/home/person" not in json.dumps(events)
    assert any(SECRET in (r.exc_text or "") or SECRET in str(r.exc_info) for r in caplog.records)  # the log has it
