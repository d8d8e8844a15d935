"""A task's persistent Python worker: state between calls, errors as data, recovery after a timeout."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from sandbox import ExecResult, Limits

LIMITS = Limits(timeout_s=10)


@pytest.fixture
def worker(box, tmp_path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    with box.worker(workspace, LIMITS) as worker:
        yield worker


def _pids_with(marker: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                found.append(entry.name)
        except OSError:
            pass
    return found


def test_state_is_kept_between_calls_like_a_notebook(worker):
    first = worker.execute("counter = 41\nprint('defined')")
    assert first.ok and first.stdout == "defined\n" and first.value is None and not first.restarted
    second = worker.execute("counter += 1\ncounter")
    assert second.ok and second.value == "42"


def test_output_of_the_code_and_of_its_subprocesses_is_captured_in_order(worker):
    result = worker.execute("import os, sys\nprint('one')\nos.system('echo two')\nprint('three', file=sys.stderr)")
    assert result.stdout == "one\ntwo\n" and result.stderr == "three\n"
    assert worker.execute("print('fresh')").stdout == "fresh\n"  # each call starts empty


def test_errors_come_back_as_data_with_the_traceback(worker):
    worker.execute("def divide(a, b):\n    return a / b")
    result = worker.execute("print('before')\ndivide(1, 0)")
    assert not result.ok and result.error_type == "ZeroDivisionError"
    assert "return a / b" in result.error and 'File "<cell' in result.error
    assert "<string>" not in result.error  # the worker's own frames are not shown
    assert result.stdout == "before\n"
    syntax = worker.execute("def broken(:")
    assert not syntax.ok and syntax.error_type == "SyntaxError"
    exiting = worker.execute("raise SystemExit(3)")
    assert exiting.error_type == "SystemExit" and worker.execute("1 + 1").value == "2"


def test_a_named_function_is_called_with_json_arguments(worker):
    worker.execute("def add(a, b=0):\n    return {'sum': a + b, 'items': [a, b]}")
    result = worker.call("add", {"a": 2, "b": 3})
    assert result.ok and result.value == {"sum": 5, "items": [2, 3]}
    assert ExecResult.from_json(result.to_json()) == result


def test_calls_that_cannot_be_answered_in_json_are_errors(worker):
    worker.execute("def make_set():\n    return {1, 2}")
    not_json = worker.call("make_set")
    assert not not_json.ok and "not JSON" in not_json.error
    missing = worker.call("no_such_function", {})
    assert not missing.ok and missing.error_type == "NameError"
    wrong = worker.call("make_set", {"unexpected": 1})
    assert not wrong.ok and wrong.error_type == "TypeError"


def test_a_timeout_kills_the_worker_and_the_next_call_says_state_was_lost(worker):
    worker.execute("kept = 'yes'")
    stuck = worker.execute("print('spinning', flush=True)\nwhile True:\n    pass", timeout_s=1)
    assert stuck.timed_out and not stuck.ok and "state is lost" in stuck.error
    after = worker.execute("kept")
    assert after.restarted and "timeout" in after.notice
    assert after.error_type == "NameError"
    assert worker.execute("'alive'").value == "'alive'" and not worker.execute("1").restarted


def test_a_worker_that_dies_is_replaced_on_the_next_call(worker):
    died = worker.execute("import os\nos._exit(7)")
    assert not died.ok and died.error_type == "WorkerDied"
    again = worker.execute("2 + 2")
    assert again.ok and again.value == "4" and again.restarted


def test_the_worker_is_sandboxed(worker, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-worker-test")  # set after start: must not matter either way
    result = worker.execute(
        "import os, subprocess\n"
        "print(os.getcwd(), 'OPENAI_API_KEY' in os.environ)\n"
        "print(subprocess.run(['ls', '/proc/self/fd'], capture_output=True, text=True).stdout.split())\n"
        "input()"
    )
    assert result.stdout.splitlines()[0] == "/workspace False"
    assert result.stdout.splitlines()[1] == "['0', '1', '2', '3']"  # 3 is ls reading the directory
    assert result.error_type == "EOFError"  # stdin is /dev/null, not the protocol pipe


def test_output_is_capped(box, tmp_path):
    with box.worker(tmp_path, Limits(timeout_s=10, output_bytes=100)) as small:
        result = small.execute("print('y' * 1000)\n'z' * 1000")
    assert len(result.stdout) == 100 and result.stdout_truncated
    assert result.value.endswith("[truncated]")


def test_closing_leaves_no_process_behind(box, tmp_path):
    marker = "evolver-worker-" + secrets.token_hex(6)
    worker = box.worker(tmp_path, LIMITS)
    started = worker.execute(
        "import subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; print(1, flush=True); time.sleep(60)',"
        f" {marker!r}], stdout=subprocess.PIPE)\n"
        "child.stdout.readline()"
    )  # it has exec'd: its command line shows the marker
    assert started.ok, started
    assert worker.alive and _pids_with(marker)
    worker.close()
    assert not worker.alive and _pids_with(marker) == []


def test_a_forgotten_worker_is_killed_when_collected(box, tmp_path):
    import gc

    worker = box.worker(tmp_path, LIMITS)
    pid = worker.execute("import os\nos.getpid()")
    assert pid.ok
    process = worker._proc
    del worker
    gc.collect()
    assert process.poll() is not None


def test_finish_in_the_code_ends_the_cell_with_its_answer(worker):
    done = worker.execute("print('before')\nfinish(6 * 7)\nprint('never')")
    assert done.ok and done.finished and done.answer == "42" and done.stdout == "before\n"
    caught = worker.execute("try:\n    final_answer('x')\nexcept Exception:\n    print('caught')")
    assert caught.finished and caught.answer == "x" and "caught" not in caught.stdout  # not an Exception


FORGE = """
import json, sys
frame = sys._getframe()
while "replies" not in frame.f_locals:
    frame = frame.f_back
channel, request = frame.f_locals["replies"], frame.f_locals["request"]
channel.write((json.dumps({"id": ID, "ok": True, "stdout": "FORGED", "finished": True, "answer": "FORGED"})
               + chr(10)).encode())
channel.flush()
print("real")
"""


def test_a_line_forged_on_the_reply_channel_is_dropped_and_the_channel_stays_in_step(worker):
    bogus = worker.execute(FORGE.replace("ID", '"0"'))
    assert (bogus.stdout, bogus.finished) == ("real\n", False)
    # With the request's own id the forged line is taken: it says only what the cell could say itself, and
    # the cell's real reply, left behind, is not taken for the next call's.
    current = worker.execute(FORGE.replace("ID", 'request["id"]'))
    assert (current.stdout, current.answer) == ("FORGED", "FORGED")
    after = worker.execute("print('next')")
    assert after.ok and after.stdout == "next\n"


def test_a_prelude_is_there_in_every_fresh_worker(box, tmp_path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    with box.worker(workspace, LIMITS, prelude="def helper():\n    return 7\n") as worker:
        assert worker.execute("helper()").value == "7"
        worker.execute("import os\nos._exit(1)")
        again = worker.execute("helper()")
        assert again.restarted and again.value == "7"
