"""Chat turns never hold the API: each waits for an agent in a thread of its own, and a burst beyond
``[advanced.daemon] chat_queue`` is answered 429 with a Retry-After.

Forty-one non-streaming chats waiting for the two chat slots used to hold every thread of the API's
pool (anyio's 40), and every synchronous route froze until they ended: a test failed before.
"""

from __future__ import annotations

import threading

import httpx

from evolver.testing.daemon import DaemonProcess, make_root, serving, wait_for, write_script

SLOWER = {
    "match": r"\ATask:\nSLOW",
    "on": "task",
    "calls": [{"tool": "run_python", "arguments": {"code": f"import time; time.sleep(2); print({n})"}} for n in (1, 2)],
}
WAITING = 41
LIMIT = WAITING  # full once they are all in


def test_a_burst_of_chats_leaves_the_api_answering_and_beyond_the_queue_is_refused_with_a_retry_hint():
    root = make_root()
    proc = DaemonProcess(
        root,
        model=write_script(root, "script", [SLOWER]),
        settings={"EVOLVER_DAEMON_WORKERS": "1", "EVOLVER_DAEMON_CHAT_QUEUE": str(LIMIT)},
    )
    replies: list[int] = []

    def chat(n: int) -> None:
        try:
            with proc.client(timeout_s=120) as http:
                replies.append(
                    http.post(
                        "/v1/chat/completions",
                        json={"model": "evolver", "messages": [{"role": "user", "content": f"SLOW chat {n}"}]},
                    ).status_code
                )
        except httpx.HTTPError:
            pass  # the daemon stopping at the end of the test ends the turns

    with serving(proc), proc.client(timeout_s=10) as http:
        senders = [threading.Thread(target=chat, args=(n,), daemon=True) for n in range(WAITING)]
        for sender in senders:
            sender.start()
        wait_for(
            lambda: http.get("/v1/status").json()["chat"]["turns"] >= WAITING,
            timeout_s=60,
            what=f"{WAITING} chat turns running or waiting",
        )
        # The synchronous routes still answer (the 10 s client timeout would fail this before).
        assert http.get("/v1/tasks", params={"source": "chat"}).status_code == 200
        assert http.get("/v1/insights").status_code == 200
        extra = [
            http.post(
                "/v1/chat/completions",
                json={"model": "evolver", "stream": stream, "messages": [{"role": "user", "content": "SLOW one more"}]},
                timeout=5,
            )
            for stream in (False, True)
        ]
        assert [r.status_code for r in extra] == [429, 429]
        assert all(r.headers["retry-after"] == "5" for r in extra)
        assert http.get("/v1/status").json()["chat"]["turns"] <= LIMIT
    assert not replies or all(code in (200, 503) for code in replies), (replies, proc.log(60))


def test_refused_chats_say_when_to_come_back():
    root = make_root()
    proc = DaemonProcess(
        root,
        model=write_script(root, "script", [SLOWER]),
        settings={"EVOLVER_DAEMON_WORKERS": "1", "EVOLVER_DAEMON_CHAT_QUEUE": "1"},
    )
    with serving(proc), proc.client(timeout_s=30) as http:
        with http.stream(
            "POST",
            "/v1/chat/completions",
            json={"model": "evolver", "stream": True, "messages": [{"role": "user", "content": "SLOW hold the slot"}]},
        ):
            wait_for(lambda: http.get("/v1/status").json()["chat"]["turns"] == 1, timeout_s=30, what="one turn")
            busy = http.post(
                "/v1/chat/completions",
                json={"model": "evolver", "messages": [{"role": "user", "content": "What is 2 + 2?"}]},
            )
            assert busy.status_code == 429 and busy.headers["retry-after"] == "5"
            error = busy.json()["error"]
            assert error["type"] == "chat_busy" and "[advanced.daemon] chat_queue" in error["message"]
        # The stream closed: its turn is cancelled, and its place is given back when it has ended.
        wait_for(lambda: http.get("/v1/status").json()["chat"]["turns"] == 0, timeout_s=60, what="the turn to end")
