"""Bad input at every door: a clear refusal that names the problem, and nothing lost.

The doors: the settings file (``evolver config check``), task packs (``evolver
bench FILE``), the script of the offline scripted model, and a running
daemon's socket, sent hostile requests (a 10 MB task, a stream or a page that
starts past any id SQLite can hold, bodies nested thousands deep, bodies that
are not UTF-8 or hold numbers JSON does not have). After each the daemon
still answers, and every task it had is still there as it was.

What the unit tests already refuse (tests/test_config.py,
tests/test_taskpack.py, tests/test_model.py, tests/test_daemon.py) is here as
a person meets it: through the command and its exit status, or over the socket.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from evolver.testing.daemon import DaemonProcess, assert_error, list_tasks, make_root, read_events, serving

EVOLVER = str(Path(sys.executable).parent / "evolver")
MAX_ID = 2**63 - 1  # SQLite's largest INTEGER


def run(*args: str, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("EVOLVER_")}
    full_env["COLUMNS"] = "200"
    full_env.update(env or {})
    return subprocess.run([EVOLVER, *args], capture_output=True, text=True, env=full_env, timeout=timeout)


# --- the settings file ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"[advanced.agent]\nmax_stepz = 3\n", ["unknown key 'max_stepz' in [advanced.agent]", "observation_chars"]),
        (b"[agnet]\nobservation_chars = 900\n", ["unknown section [agnet]", "[agent]"]),
        (
            b"[advanced.agent]\nobservation_chars = 'lots'\n",
            ["[advanced.agent] observation_chars = 'lots'", "whole number"],
        ),
        (b"[advanced.agent]\nobservation_chars = [1, 2]\n", ["[advanced.agent] observation_chars", "whole number"]),
        (b"[daemon]\nworkers = 0\n", ["[daemon] workers = 0"]),
        (b"[sandbox]\nrequire_isolation = 'no'\n", ["require_isolation", "true or false"]),
        (b"[advanced.agent]\nobservation_chars = \n", ["not valid TOML", "line 2"]),
        (b"[advanced.agent\nobservation_chars = 900\n", ["not valid TOML", "line 1"]),
        (b"model = 'gpt'\n", ["must be a [model] table"]),
        (b"[advanced.agent]\n# caf\xe9 in Latin-1\nobservation_chars = 900\n", ["cannot be read", "utf-8"]),
    ],
    ids=[
        "unknown-key",
        "unknown-section",
        "string-for-int",
        "list-for-int",
        "out-of-range",
        "string-for-bool",
        "no-value",
        "unclosed-table",
        "value-for-table",
        "not-utf8",
    ],
)
def test_a_bad_settings_file_is_exit_2_and_one_line_naming_the_file_and_key(tmp_path, content, words):
    path = tmp_path / "config.toml"
    path.write_bytes(content)
    result = run("--config", str(path), "config", "check")
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert str(path) in result.stderr
    for word in words:
        assert word in result.stderr, (word, result.stderr)


def test_a_bad_environment_override_is_exit_2_naming_the_variable(tmp_path):
    result = run("config", "check", env={"EVOLVER_AGENT_OBSERVATION_CHARS": "many", "XDG_CONFIG_HOME": str(tmp_path)})
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "EVOLVER_AGENT_OBSERVATION_CHARS" in result.stderr and "observation_chars" in result.stderr


def test_a_variable_that_is_no_setting_stops_nothing_and_a_misspelt_one_is_named(tmp_path):
    # The environment is shared (a token exported for `mcp serve` is seen by every command): only a name
    # that looks like a misspelt setting is worth a word, and its value is never shown.
    misspelt = run(
        "config",
        "check",
        env={
            "EVOLVER_AGENT_OBSERVATION_CHAR": "s3cret",
            "EVOLVER_AGENT_MAX_STEPZ": "3",
            "XDG_CONFIG_HOME": str(tmp_path),
        },
    )
    assert misspelt.returncode == 0 and "Traceback" not in misspelt.stderr
    assert misspelt.stderr.strip() == (
        "environment variable EVOLVER_AGENT_OBSERVATION_CHAR is not a setting and is "
        "ignored: [agent] has no key 'observation_char' (did you mean "
        "EVOLVER_AGENT_OBSERVATION_CHARS?)"
    )


# --- task packs -----------------------------------------------------------------------------------


GOOD = {"id": "t-1", "prompt": "What is 2 + 2?", "check": {"type": "answer", "expected": "4"}}


def test_a_bad_pack_is_exit_2_naming_every_bad_line_and_nothing_runs(tmp_path):
    pack = tmp_path / "pack.jsonl"
    pack.write_text(
        "\n".join(
            [
                json.dumps(GOOD),  # 1: fine
                '{"id": "t-2", "prompt": "What is 3 + 3?", "check": ',  # 2: cut off
                json.dumps({"id": "t-3", "prompt": "What is 4 + 4?"}),  # 3: no check
                json.dumps({**GOOD, "prompt": "What is 2 + 2, again?"}),  # 4: t-1 again
                json.dumps({**GOOD, "id": "t-5", "check": {"type": "answer"}}),  # 5: a check without expected
                "[1, 2, 3]",  # 6: not an object
            ]
        )
        + "\n",
        encoding="utf-8",
    )
    data = tmp_path / "data"
    result = run("--data-dir", str(data), "bench", str(pack))
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    for fragment in (
        f"{pack}:2: not valid JSON",
        f"{pack}:3: task t-3 has no check",
        f"{pack}:4: duplicate id 't-1' (first on line 1)",
        f"{pack}:5: task t-5",
        f"{pack}:6: a task is a JSON object",
    ):
        assert fragment in result.stderr, (fragment, result.stderr)
    assert f"{pack}:1:" not in result.stderr
    assert not data.exists()  # refused whole, before anything ran or a store was made


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b'{"id": "t-1", "prompt": "caf\xe9", "check": {"type": "answer", "expected": "4"}}\n', "cannot be read"),
        (b"# only a comment\n\n", "the pack has no tasks"),
        (b"\x00\x01\x02\n", "not valid JSON"),
    ],
    ids=["not-utf8", "empty", "binary"],
)
def test_a_pack_that_is_not_text_or_holds_no_task_is_refused(tmp_path, content, words):
    pack = tmp_path / "pack.jsonl"
    pack.write_bytes(content)
    result = run("--data-dir", str(tmp_path / "data"), "bench", str(pack))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert str(pack) in result.stderr and words in result.stderr, result.stderr


# --- the scripted model's script ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b'{"rules": [', ["Expecting value"]),
        (b'{"rules": {"match": ""}}', ['a script is an object with a "rules" list']),
        (b'{"rules": [{"match": "(", "reply": "x"}]}', ["rule '('", "not a valid regex"]),
        (b'{"rules": [{"match": "", "reply": "x", "tool": "finish"}]}', ["exactly one of reply, tool, calls or error"]),
        (b'{"rules": [{"match": "", "reply": "x", "colour": "red"}]}', ["rule 0", "colour"]),
        (b"\xff\xfe{}", ["cannot be read", "UTF-8"]),
    ],
    ids=["cut-off", "rules-not-a-list", "bad-regex", "two-actions", "unknown-key", "not-utf8"],
)
def test_a_bad_script_file_is_refused_naming_the_file_or_rule(tmp_path, content, words):
    from evolver.llm.scripted import ScriptError, script_for

    path = tmp_path / "script.json"
    path.write_bytes(content)
    with pytest.raises(ScriptError) as caught:
        script_for("scripted/" + str(path))
    for word in words:
        assert word in str(caught.value), (word, str(caught.value))


def test_a_task_on_a_broken_script_fails_with_a_model_error_naming_the_file(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"rules": [{"match": "", "reply": ', encoding="utf-8")
    result = run(
        "--data-dir",
        str(tmp_path / "data"),
        "run",
        "What is 2 + 2?",
        "--quiet",
        env={"EVOLVER_MODEL_NAME": "scripted/" + str(path)},
    )
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert result.stdout.startswith("failed: model error:"), result.stdout
    assert str(path) in result.stdout and "Expecting value" in result.stdout
    assert "Traceback" not in result.stderr


# --- hostile requests to a running daemon ---------------------------------------------------------


@pytest.fixture(scope="module")
def daemon():
    root = make_root()
    with serving(DaemonProcess(root, name="hostile")) as proc:
        yield proc


@pytest.fixture(scope="module")
def http(daemon):
    with daemon.client(timeout_s=60) as client:
        yield client


@pytest.fixture(scope="module")
def before(daemon, http):
    """Tasks the daemon finished before any hostile request: each test checks they are intact."""
    ids = []
    for prompt in ("What is (12 + 30) * 2?", "What is 17.5% of 2,340?", "What is 6 * 7?"):
        response = http.post("/v1/tasks", json={"prompt": prompt, "metadata": {"from": "before"}})
        assert response.status_code == 201, response.text
        ids.append(response.json()["id"])
    return {task_id: daemon.wait_task(http, task_id, ("done", "failed", "dead")) for task_id in ids}


def _listed(http) -> dict[str, dict]:
    return {t["id"]: t for t in list_tasks(http)}


def assert_still_serving_and_nothing_lost(daemon, http, before: dict) -> None:
    assert daemon.proc.poll() is None, daemon.log()
    assert http.get("/v1/health").json() == {"ok": True}
    listed = _listed(http)
    for task_id, task in before.items():
        assert task_id in listed, task_id
        again = daemon.task(http, task_id)
        for key in ("prompt", "status", "metadata", "attempts", "check"):
            assert again[key] == task[key], (task_id, key)
        assert [t["id"] for t in again["trajectories"]] == [t["id"] for t in task["trajectories"]]


def test_a_10_mb_task_text_is_413_declared_or_streamed_and_nothing_is_lost(daemon, http, before):
    count = len(_listed(http))
    huge = {"prompt": "What is 2 + 2? " + "x" * (10 * 1024 * 1024)}
    error = assert_error(http.post("/v1/tasks", json=huge), 413, "byte cap", "max_body_bytes")
    assert error["type"] == "body_too_large"
    body = json.dumps(huge).encode()
    chunks = (body[i : i + 65536] for i in range(0, len(body), 65536))  # no Content-Length: read until the cap
    assert_error(
        http.post("/v1/tasks", content=chunks, headers={"content-type": "application/json"}), 413, "max_body_bytes"
    )
    # Under the cap but over the prompt's own limit: refused by name.
    error = assert_error(http.post("/v1/tasks", json={"prompt": "y" * 300_000}), 422, "prompt", "200000")
    assert error["param"] == "prompt"
    assert len(_listed(http)) == count  # none of them was stored
    assert_still_serving_and_nothing_lost(daemon, http, before)
    # ...and a task after them runs as usual.
    task = http.post("/v1/tasks", json={"prompt": "What is 6 * 7?"}).json()
    assert daemon.wait_task(http, task["id"], ("done", "failed", "dead"))["status"] == "done"


def test_a_stream_or_page_past_any_possible_id_is_422_or_a_bounded_answer(daemon, http, before):
    task_id = next(iter(before))
    events = f"/v1/tasks/{task_id}/events"
    # Past what SQLite can hold: refused by name, before any stream starts.
    for params in ({"after": 10**30}, {"after": "9" * 5000}, {"after": -1}):
        error = assert_error(http.get(events, params=params), 422, "after")
        assert error["param"] == "query.after"
    for last_event_id in ("9" * 5000, str(10**30), "-1", "\u00b2".encode("latin-1"), "1e9"):
        error = assert_error(http.get(events, headers={"Last-Event-ID": last_event_id}), 400, "Last-Event-ID")
        assert error["param"] == "Last-Event-ID"
    # The last possible id: a bounded answer, the end of a finished task and nothing else.
    with http.stream("GET", events, params={"after": MAX_ID}, timeout=30) as response:
        assert response.status_code == 200
        assert [event for event, _, _ in read_events(response)] == ["end"]
    with http.stream("GET", events, headers={"Last-Event-ID": str(MAX_ID)}, timeout=30) as response:
        assert [event for event, _, _ in read_events(response)] == ["end"]

    # A million of anything per page is refused; a page past the end is empty.
    for path in ("/v1/tasks", "/v1/insights", "/v1/history"):
        assert_error(http.get(path, params={"limit": 1_000_000}), 422, "limit")
    assert_error(http.get("/v1/tasks", params={"offset": 10**30}), 422, "offset")
    assert http.get("/v1/tasks", params={"offset": MAX_ID}).json() == {"tasks": [], "next_offset": None}
    assert_error(http.post(f"/v1/history/{10**30}/revert", json={}), 422, "event_id")
    assert_error(http.post("/v1/memory/search", json={"text": "x", "k": 1_000_000}), 422, "k")
    assert_still_serving_and_nothing_lost(daemon, http, before)


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def test_bodies_nested_thousands_deep_are_refused_and_nothing_is_stored(daemon, http, before):
    count = len(_listed(http))
    post = lambda path, body: http.post(path, content=body, headers={"content-type": "application/json"})  # noqa: E731
    # Deeper than the JSON parser goes: not JSON it can read.
    assert_error(post("/v1/tasks", _nested(200_000)), 400, "body")
    assert_error(post("/v1/tasks", b'{"prompt": "x", "metadata": {"a": ' + _nested(100_000) + b"}}"), 400, "body")
    # Deep enough to exhaust the stack when the stored task is turned back into JSON: refused by name.
    for depth in (40, 900):
        error = assert_error(
            post("/v1/tasks", b'{"prompt": "x", "metadata": {"a": ' + _nested(depth) + b"}}"),
            422,
            "nests deeper than 32 levels",
        )
        assert error["param"] == "metadata"
    assert_error(
        post("/v1/tasks", b'{"prompt": "x", "check": {"type": "answer", "expected": "1", "x": ' + _nested(900) + b"}}"),
        422,
        "check",
    )
    assert_error(
        post(
            "/v1/chat/completions",
            b'{"model": "evolver", "messages": [{"role": "user", "content": '
            b'[{"type": "text", "text": "hi", "extra": ' + _nested(900) + b"}]}]}",
        ),
        422,
        "messages",
    )
    assert_error(post("/v1/memory/search", b'{"text": ' + _nested(900) + b"}"), 422, "text")
    # Nesting a person would write is fine.
    ok = http.post("/v1/tasks", json={"prompt": "What is 6 * 7?", "metadata": {"a": {"b": [[1, {"c": 2}]]}}})
    assert ok.status_code == 201, ok.text
    assert len(_listed(http)) == count + 1
    assert_still_serving_and_nothing_lost(daemon, http, before)


BODY_ROUTES = [
    "/v1/tasks",
    "/v1/tasks/{task}/feedback",
    "/v1/chat/completions",
    "/v1/memory/search",
    "/v1/promote",
    "/v1/rollback",
    "/v1/evolve",
    "/v1/history/1/revert",
]


def test_bodies_that_are_not_utf8_or_hold_what_json_lacks_are_refused_everywhere(daemon, http, before):
    count = len(_listed(http))
    task_id = next(iter(before))

    def post(path, body):
        return http.post(path.format(task=task_id), content=body, headers={"content-type": "application/json"})

    for path in BODY_ROUTES:
        for body in (b"\xff\xfe{}", b'{"prompt": "caf\xe9"}', b"\xc3\x28", b"\x00"):
            error = assert_error(post(path, body), 400, "body")
            assert error["type"] == "invalid_json", (path, body, error)
    # JSON that Python's parser takes but no store or reply can hold: NaN, Infinity, lone surrogates.
    for body, where in (
        (b'{"prompt": "x", "metadata": {"a": NaN}}', "metadata"),
        (b'{"prompt": "x", "metadata": {"a": [Infinity]}}', "metadata"),
        (b'{"prompt": "x", "check": {"type": "answer", "expected": "1", "tolerance": -Infinity}}', "check"),
        (b'{"prompt": "x\\ud800"}', "prompt"),
        (b'{"prompt": "x", "metadata": {"\\udfff": 1}}', "metadata"),
    ):
        error = assert_error(post("/v1/tasks", body), 422, "not")
        assert error["param"] == where, (body, error)
    assert_error(post("/v1/memory/search", b'{"text": "x", "since_hours": Infinity}'), 422, "since_hours")
    assert_error(post("/v1/evolve", b'{"job": "\\ud800"}'), 422, "job")
    assert_error(post("/v1/rollback", b'{"node_id": "\\ud800"}'), 422, "node_id")
    assert_error(
        post("/v1/chat/completions", b'{"model": "evolver", "messages": [{"role": "user", "content": "hi \\ud83d"}]}'),
        422,
        "messages",
    )
    assert_error(
        post(
            "/v1/chat/completions",
            b'{"model": "evolver", "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}',
        ),
        422,
        "text part",
    )
    # Loose types are not guessed at: 0.0 is not false, 1.0 is not a priority.
    assert_error(http.post("/v1/memory/search", json={"text": "x", "success": 0.0}), 422, "success")
    assert_error(http.post("/v1/tasks", json={"prompt": "x", "priority": 1.0}), 422, "priority")
    assert_error(http.post(f"/v1/tasks/{task_id}/feedback", json={"good": 1}), 422, "good")
    assert len(_listed(http)) == count  # nothing was stored, so nothing poisons the listing
    assert_still_serving_and_nothing_lost(daemon, http, before)
