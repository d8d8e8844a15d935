"""`evolver chat` on a real terminal (a pseudo-terminal), and `evolver show --follow`, against a real daemon.

What a person at the REPL sees: the progress text is cleared before the reply
(it was left on the line: "405.0 step step"), /help is answered by the REPL
and never sent to the agent, and Ctrl-C while the agent works stops that turn
(the daemon cancels it) and leaves the REPL running (it left the REPL while
the turn ran on). Each failed before.
"""

from __future__ import annotations

import os
import pty
import re
import signal
import subprocess
import threading
import time

import pytest

from evolver.testing.daemon import (
    SLOW_STEP,
    DaemonProcess,
    demo_rules,
    make_root,
    serving,
    write_script,
)
from tests.test_cli import EVOLVER


@pytest.fixture(scope="module")
def daemon():
    root = make_root()
    slow = {"match": r"\ATask:\nSLOW", "on": "task", **SLOW_STEP}
    proc = DaemonProcess(root, model=write_script(root, "script", [slow, *demo_rules()]))
    with serving(proc):
        yield proc


class Terminal:
    """``evolver chat`` with a pseudo-terminal for its stdin, stdout and stderr."""

    def __init__(self, env: dict) -> None:
        self.master, slave = pty.openpty()
        # As a shell's foreground job, whatever runs the tests: a suite started in the background (`pytest &`)
        # has SIGINT ignored, the chat would inherit that, and Python then never turns Ctrl-C into an interrupt.
        self.proc = subprocess.Popen(
            [EVOLVER, "chat"],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            close_fds=True,
            env={**env, "TERM": "xterm", "COLUMNS": "200", "NO_COLOR": "1"},
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        os.close(slave)
        self.raw = b""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 4096)
            except OSError:
                return
            if not data:
                return
            self.raw += data

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def wait_for(self, pattern: str, timeout_s: float = 60.0, *, since: int = 0) -> None:
        """Until ``pattern`` shows in the output after its first ``since`` bytes."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if re.search(pattern, "\n".join(self.screen(since))):
                return
            time.sleep(0.05)
        raise AssertionError(f"{pattern!r} never appeared; the terminal shows:\n{self.screen()}")

    def screen(self, since: int = 0) -> list[str]:
        """The lines as a terminal would show them: a carriage return goes back to the line's start,
        ESC[K clears the rest of the line, other escape sequences change nothing visible here."""
        text = self.raw[since:].decode(errors="replace").replace("\r\n", "\n")
        lines = []
        for line in text.split("\n"):
            shown: list[str] = []
            col = 0
            for token in re.split(r"(\r|\x1b\[K|\x1b\[[0-9;?]*[A-Za-z])", line):
                if token == "\r":
                    col = 0
                elif token == "\x1b[K":
                    del shown[col:]
                elif token.startswith("\x1b["):
                    continue
                else:
                    for ch in token:
                        if col < len(shown):
                            shown[col] = ch
                        else:
                            shown.append(ch)
                        col += 1
            lines.append("".join(shown))
        return lines

    def close(self) -> int:
        try:
            return self.proc.wait(timeout=30)
        finally:
            os.close(self.master)


def test_the_repl_on_a_terminal(daemon):
    term = Terminal(daemon.env)
    try:
        term.wait_for(r"you> ")
        term.type("/help\n")
        term.wait_for(r"commands \(not sent to the agent\)")

        term.type("What is 17.5% of 2,340?\n")
        term.wait_for(r"evolver> 409\.5")
        assert "evolver> 409.5" in term.screen()  # nothing of the progress text left on the line

        term.type("/new\n")  # so the next turn's task is its message alone (the script spins on it)
        term.wait_for(r"\(a new conversation\)")
        before = len(term.raw)
        term.type("SLOW chat at the terminal\n")
        term.wait_for(r"…\w+ step", since=before)  # the agent is working on this turn
        term.proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        term.wait_for(r"\(stopped; turn task_\w+ cancelled\)")
        task_id = re.search(r"turn (task_\w+) cancelled", "\n".join(term.screen())).group(1)

        term.type("/exit\n")
        assert term.close() == 0  # the REPL went on after Ctrl-C, until /exit
    finally:
        if term.proc.poll() is None:
            term.proc.kill()
    with daemon.client() as http:
        assert daemon.wait_task(http, task_id, ("done", "failed", "cancelled"))["status"] == "cancelled"
        chats = http.get("/v1/tasks", params={"source": "chat", "limit": 100}).json()["tasks"]
    assert not [t for t in chats if t["prompt"].strip().startswith("/help")]  # never sent to the agent


def test_show_follow_prints_the_steps_as_they_come_until_the_task_ends(daemon):
    with daemon.client() as http:
        task = http.post("/v1/tasks", json={"prompt": "SLOW task to follow"}).json()
        daemon.wait_task(http, task["id"], ("running",))
    shown = subprocess.run(
        [EVOLVER, "show", task["id"][:18], "--follow"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**daemon.env, "COLUMNS": "200"},
    )
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    following = next(i for i, line in enumerate(lines) if line.startswith(f"following {task['id']}"))
    assert any("run_python" in line for line in lines[following:])  # steps that came while it was watched
    assert re.match(r"(done|failed): answer ", lines[-1]), lines[-1]  # and how it ended
