"""Text from outside never drives the terminal: every CLI output of stored text shows control characters
as escapes.

A store is filled, as a person's tasks, a model's answers, an old pack or a
tool from before the daemon refused them could fill it, with texts that carry
terminal escapes: a title change, a screen clear, a colour, a C1 CSI, and a CR
LF that would forge a line "evolver: import OK". Every command that prints one
of those texts (while the daemon is down, from the store) must show it escaped:
no byte of its output is a control character other than newline and tab.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
from pathlib import Path

import pytest

from evolver.agent.scaffold import default_scaffold
from memory import NewTool, Store
from tests.test_cli import EVOLVER
from tools import ToolFiles

REPO = Path(__file__).resolve().parents[1]
HOSTILE = "\x1b]0;pwned\x07 \x1b[2J\x1b[31m red \x9b1m\r\nevolver: import OK"
# What a terminal acts on: C0 but newline and tab, DEL, C1.
ACTS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")

CODE = f'''
def shout(text: str) -> str:
    """Upper-case a text. {HOSTILE!r}

    Args:
        text: what to shout
    """
    return text.upper()  # {HOSTILE!r}
'''


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> dict:
    """A data dir whose every kind of stored text carries terminal escapes; the ids to ask for."""
    root = tmp_path_factory.mktemp("hostile")
    with Store.open(root / "data") as store:
        task, _ = store.inbox.add_task(f"prompt {HOSTILE}", check={"type": "answer", "expected": f"expected {HOSTILE}"})
        trajectory = store.attempts.start_trajectory(task.id)
        store.attempts.add_step(trajectory.id, role="user", content=f"user {HOSTILE}")
        store.attempts.add_step(
            trajectory.id,
            role="assistant",
            content=f"thinking {HOSTILE}",
            tool_calls=[{"id": "c1", "name": "run_python", "arguments": {"code": f"print({HOSTILE!r})"}}],
        )
        store.attempts.add_step(
            trajectory.id,
            role="tool",
            content=f"observation {HOSTILE}",
            tool_results=[{"id": "c1", "name": "run_python", "ok": True}],
        )
        store.attempts.finish_trajectory(trajectory.id, status="done", final_answer=f"answer {HOSTILE}")
        store.attempts.record_outcome(
            trajectory.id, success=False, verifier="answer", verifier_output=f"verdict {HOSTILE}"
        )
        store.inbox.set_task_status(task.id, "failed", error=f"error {HOSTILE}")
        store.insights.record_insight_changes(
            "distill",
            f"what {HOSTILE}",
            [{"op": "ADD", "text": f"insight {HOSTILE}", "importance": 2, "provenance": [trajectory.id]}],
            why=f"why {HOSTILE}",
            evidence=[trajectory.id],
        )
        digest = ToolFiles(root / "data" / "tools").write("shout", 1, CODE, f"def test_shout():\n    '{HOSTILE!r}'\n")
        tool_event = store.tools.apply_tool_changes(
            "synthesize",
            f"registered {HOSTILE}",
            why=f"why {HOSTILE}",
            new=NewTool(name="shout", description=f"describes {HOSTILE}", code_hash=digest, version=1),
        )
        scaffold = default_scaffold()
        store.tree.put_scaffold(scaffold.hash, scaffold.canonical_json())
        node = store.tree.add_node(
            scaffold.hash, status="proposed", rationale=f"rationale {HOSTILE}", diff=f"--- a\n+++ b\n+{HOSTILE}"
        )
        events = [e.id for e in store.reports.list_events(limit=100)]
    (root / "data" / "daemon.log").write_text(f"INFO evolver.service: task failed: {HOSTILE}\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVOLVER_")}
    env.update(
        COLUMNS="200", EVOLVER_DAEMON_DATA_DIR=str(root / "data"), EVOLVER_DAEMON_RUNTIME_DIR=str(root / "run")
    )  # nothing answers there: the CLI reads the store
    assert tool_event.id in events
    return {"env": env, "task": task.id, "trajectory": trajectory.id, "node": node.id, "events": events}


def _commands(ids: dict) -> list[list[str]]:
    return [
        ["tasks"],
        ["show", ids["task"]],
        ["show", ids["trajectory"], "--memories"],
        ["insights"],
        ["insights", "--status", "all"],
        ["tools"],
        ["tools", "show", "shout"],
        ["history"],
        *[["history", "show", str(e)] for e in ids["events"]],
        ["node", ids["node"]],
        ["tree"],
        ["memory", "search", "prompt"],
        ["memory", "search", "insight", "--kind", "insights"],
        ["memory", "search", "shout", "--kind", "tools"],
        ["logs"],
    ]


# Listings show one item a row: a newline in a text stays inside its cell, so no line of the output can
# pass for one of evolver's own. Detail views show a multi-line text (a prompt, code) as its lines.
LISTINGS = {"tasks", "insights", "tools", "history", "memory"}


def test_every_command_that_prints_stored_text_shows_its_control_characters_escaped(hostile):
    for args in _commands(hostile):
        result = subprocess.run([EVOLVER, *args], capture_output=True, env=hostile["env"], timeout=240)
        text = (result.stdout + result.stderr).decode("utf-8")
        assert result.returncode == 0, f"evolver {' '.join(args)}: {text}"
        acting = sorted(set(ACTS.findall(text)))
        assert not acting, f"evolver {' '.join(args)} printed raw {acting}:\n{text}"
        assert "\\x1b]0;pwned\\x07" in text, f"evolver {' '.join(args)} did not show the text:\n{text}"
        if args[0] in LISTINGS and args[1:2] != ["show"]:
            forged = [line for line in text.splitlines() if line.startswith("evolver: import OK")]
            assert not forged, f"evolver {' '.join(args)} let a line be forged:\n{text}"


def test_the_cli_prints_only_through_its_escaping_outputs():
    # `out`, `err` (rich consoles that escape every string) and `echo` (click.echo of escaped text) are the
    # only ways out: a bare click.echo, print or stream write would let stored text through as it is.
    allowed = {("base.py", "echo"), ("tasks.py", "_Progress")}  # echo itself; the progress line's own codes
    offenders = []
    for path in sorted((REPO / "evolver" / "cli").glob("*.py")):
        for top in ast.parse(path.read_text(encoding="utf-8")).body:
            if (path.name, getattr(top, "name", "")) in allowed:
                continue
            for node in ast.walk(top):
                called = ast.unparse(node.func) if isinstance(node, ast.Call) else ""
                if called in ("click.echo", "click.secho", "print") or called.endswith(
                    ("stdout.write", "stderr.write", "file.write", "get_binary_stream")
                ):
                    offenders.append(f"{path.name}:{node.lineno} {called}")
    assert not offenders, offenders
