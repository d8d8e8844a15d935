"""The `evolver` command as a person runs it: the installed console script, in a subprocess."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EVOLVER = str(Path(sys.executable).parent / "evolver")


def run(*args: str, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("EVOLVER_")}
    full_env["COLUMNS"] = "200"  # rich wraps at 80 columns when not on a terminal
    full_env.update(env or {})
    return subprocess.run([EVOLVER, *args], capture_output=True, text=True, env=full_env, timeout=timeout)


def test_defaults_printed_by_the_cli_are_the_repository_config_toml():
    result = run("config", "show", "--defaults")
    assert result.returncode == 0, result.stderr
    assert result.stdout == (REPO / "config.toml").read_text(encoding="utf-8")


def test_a_bad_config_is_one_line_and_exit_code_2_never_a_traceback(tmp_path):
    bad = tmp_path / "config.toml"
    bad.write_text("[advanced.agent]\nobservation_chars = -3\n")
    result = run("--config", str(bad), "config", "check")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert f"{bad}: [advanced.agent] observation_chars = -3 is refused" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_config_check_accepts_the_documented_file():
    result = run("--config", str(REPO / "config.toml"), "config", "check")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"ok: {REPO / 'config.toml'}")


def test_config_check_reports_a_hosted_model_without_its_key_but_not_a_local_server(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    env = {"EVOLVER_MODEL_NAME": "openai/gpt-4o-mini"}
    missing = run("--config", str(REPO / "config.toml"), "config", "check", env=env)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert "openai/gpt-4o-mini: no API key: set OPENAI_API_KEY" in missing.stderr
    local = run(
        "--config",
        str(REPO / "config.toml"),
        "config",
        "check",
        env={**env, "EVOLVER_MODEL_API_BASE": "http://127.0.0.1:8080/v1"},
    )
    assert local.returncode == 0, local.stderr


def test_search_without_a_store_says_how_to_create_one(tmp_path):
    result = run("--data-dir", str(tmp_path / "none"), "memory", "search", "csv")
    assert result.returncode == 3
    assert "There is no store at" in result.stderr and "Traceback" not in result.stderr


def test_empty_search_text_is_a_usage_error(tmp_path):
    result = run("--data-dir", str(tmp_path), "memory", "search", "   ")
    assert result.returncode == 2
    assert "TEXT is empty" in result.stderr


def test_memory_commands_on_a_real_store(tmp_path):
    from memory import NewTrajectory, Store

    with Store.open(tmp_path) as store:
        store.attempts.ingest(
            [
                NewTrajectory(prompt="Sum the amount column of sales.csv", final_answer="1200", success=True),
                NewTrajectory(prompt="Count ERROR lines in server.log", final_answer="37", success=False),
            ]
        )
    found = run("--data-dir", str(tmp_path), "memory", "search", "add up a csv column", "--json", "-k", "1")
    assert found.returncode == 0, found.stderr
    payload = json.loads(found.stdout)
    assert payload["vector_search"] is True
    assert [h["prompt"] for h in payload["hits"]] == ["Sum the amount column of sales.csv"]

    failed = run("--data-dir", str(tmp_path), "memory", "search", "log errors", "--failed", "--json")
    assert [h["success"] for h in json.loads(failed.stdout)["hits"]] == [False]

    checked = run("--data-dir", str(tmp_path), "memory", "check")
    assert checked.returncode == 0, checked.stderr
    assert "database: ok" in checked.stdout and "'trajectories': 2" in checked.stdout

    rebuilt = run("--data-dir", str(tmp_path), "memory", "reindex")
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "reindexed 2 rows" in rebuilt.stdout


def test_demo_runs_a_real_daemon_offline_and_leaves_nothing_behind():
    # A short temp dir of its own (socket paths are limited to 107 bytes), to see the demo clean up.
    runtime = Path(tempfile.mkdtemp(prefix="evd-", dir="/tmp"))
    try:
        result = run("demo", "--keep", env={"TMPDIR": str(runtime)})
        assert result.returncode == 0, result.stderr
        # --keep names the data dir, which the inspection commands open (it named the folder above it).
        kept = re.search(
            r"kept the demo's data dir (\S+): look inside with `evolver --data-dir (\S+) tree`", result.stdout
        )
        assert kept and kept.group(1) == kept.group(2), result.stdout
        inspected = run("--data-dir", kept.group(1), "tree", "--json")
        assert inspected.returncode == 0 and json.loads(inspected.stdout)["incumbent"], inspected.stderr
        shutil.rmtree(Path(kept.group(1)).parent)
        left = sorted(str(p.relative_to(runtime)) for p in runtime.rglob("*"))
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
    assert "seeded memory with 24 past trajectories and 5 insights" in result.stdout
    # Memory: the money-column task finds the insight about currency strings.
    assert "similar successful trajectories" in result.stdout and "Strip currency symbols" in result.stdout
    # The daemon's workers solve the pack with the scripted model, in the sandbox, checked.
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if line.startswith("│ demo-")}
    assert set(rows) == {"demo-01", "demo-02", "demo-03", "demo-04", "demo-05"}
    assert all("done" in rows[t] and "passed" in rows[t] for t in ("demo-01", "demo-02", "demo-03", "demo-04"))
    assert "failed" in rows["demo-05"]
    assert "'What is 2 * (3 + 4)?' → '14'" in result.stdout
    assert "reconcile: ok" in result.stdout
    assert "distill: ok: 1 operations (ADD)" in result.stdout  # the demo model proposes one insight
    # ...and turns the percentages it computed twice into a tool that passed quarantine.
    assert "synthesized tools: percent_of v1 (active)" in result.stdout
    assert "★ incumbent" in result.stdout and "seed" in result.stdout
    # The demo model proposes edits too: offline, the tree grows a validated child, and no round failed.
    assert re.search(r"scaffold tree \([2-9]\d* nodes\)", result.stdout), result.stdout
    assert re.search(r"node_\w+ (evaluating|evaluated|promoted), own", result.stdout), result.stdout
    assert "FAILED" not in result.stdout and "job_failed" not in result.stdout
    assert re.search(r"daemon \d+ stopped", result.stdout)
    # Besides what it kept, nothing: only the (empty) runtime dir remains, without the socket.
    assert left in ([], ["runtime-0", "runtime-0/evolver"]), left


def _commands(group, prefix=()):
    import click

    for name, command in group.commands.items():
        path = (*prefix, name)
        if isinstance(command, click.Group):
            yield from _commands(command, path)
        else:
            yield " ".join(path)


def test_every_command_is_documented_in_the_readme_and_has_help():
    from evolver.cli import cli

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    commands = list(_commands(cli))
    assert "memory search" in commands
    for command in commands:
        assert re.search(rf"evolver {re.escape(command)}\b", readme), f"`evolver {command}` is not in the README"
        helped = run(*command.split(), "--help")
        assert helped.returncode == 0 and "Usage:" in helped.stdout


def test_run_solves_a_task_with_the_offline_model_and_reports_the_check(tmp_path):
    result = run("--data-dir", str(tmp_path), "run", "What is 6 * 7?", "--check-answer", "42", "--json")
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert (payload["status"], payload["answer"], payload["success"]) == ("done", "42", True)
    wrong = run("--data-dir", str(tmp_path), "run", "What is 6 * 7?", "--check-answer", "41", "--quiet")
    assert wrong.returncode == 1 and wrong.stdout.startswith("failed (check failed)")


def test_run_refuses_two_checks_and_a_bad_regex(tmp_path):
    both = run("--data-dir", str(tmp_path), "run", "x", "--check-answer", "1", "--check-cmd", "true")
    assert both.returncode == 2 and "at most one of" in both.stderr
    bad = run("--data-dir", str(tmp_path), "run", "x", "--check-regex", "(")
    assert bad.returncode == 2 and "not a valid regex" in bad.stderr


def test_bench_runs_a_pack_file_and_refuses_a_bad_one(tmp_path):
    pack = tmp_path / "pack.jsonl"
    pack.write_text(
        '{"id": "a", "prompt": "What is 2 + 2?", "check": {"type": "answer", "expected": "4"}}\n'
        '{"id": "b", "prompt": "Name the colour of the sky.", "check": {"type": "answer", "expected": "blue"},'
        ' "split": "test"}\n'
    )
    result = run("--data-dir", str(tmp_path / "d"), "bench", str(pack), "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert (summary["tasks"], summary["solved"]) == (2, 1)
    assert {r["id"]: r["success"] for r in summary["results"]} == {"a": True, "b": False}
    held_out = json.loads(
        run("--data-dir", str(tmp_path / "d"), "bench", str(pack), "--split", "test", "--json").stdout
    )
    assert [r["id"] for r in held_out["results"]] == ["b"]
    # Stored as a benchmark's tasks, each in its pack's split (so "b" is hidden from every learner).
    listed = json.loads(run("--data-dir", str(tmp_path / "d"), "tasks", "--json", "--limit", "100").stdout)["tasks"]
    assert {(t["metadata"]["pack_task"], t["source"], t["metadata"].get("split")) for t in listed} == {
        ("a", "bench", "train"),
        ("b", "bench", "test"),
    }
    # A pack that labels a configured pack's held-out task "train" cannot bring it into training here either.
    relabelled = tmp_path / "relabelled.jsonl"
    relabelled.write_text(
        '{"id": "c", "prompt": "Name the colour of the sky.", "check": {"type": "answer", '
        '"expected": "blue"}, "split": "train"}\n'
    )
    configured = {"EVOLVER_EVOLUTION_PACKS": json.dumps([str(pack)])}
    assert run("--data-dir", str(tmp_path / "d"), "bench", str(relabelled), env=configured).returncode == 0
    listed = json.loads(run("--data-dir", str(tmp_path / "d"), "tasks", "--json", "--limit", "100").stdout)["tasks"]
    assert {t["metadata"].get("split") for t in listed if t["metadata"]["pack_task"] == "c"} == {"test"}
    pack.write_text('{"id": "a", "prompt": "no check"}\n')
    refused = run("--data-dir", str(tmp_path / "d"), "bench", str(pack))
    assert refused.returncode == 2 and "pack.jsonl:1: task a has no check" in refused.stderr


def test_bench_runs_a_family_of_the_generated_pack_and_counts_by_family(tmp_path):
    """`evolver bench families --family NAME` runs that family's instances and sums them by family; an unknown
    family is refused with the pack's families named."""
    result = run(
        "--data-dir", str(tmp_path / "d"), "bench", "families", "--family", "weekday", "--limit", "2", "--json"
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert [r["family"] for r in summary["results"]] == ["weekday", "weekday"]
    assert summary["families"] == {"weekday": {"tasks": 2, "solved": summary["solved"]}}
    refused = run("--data-dir", str(tmp_path / "d"), "bench", "families", "--family", "nope")
    assert refused.returncode == 2 and "no family 'nope'" in refused.stderr and "loan-payment" in refused.stderr


def test_a_daemon_that_dies_while_starting_is_one_line_with_its_own_reason(tmp_path):
    root = Path(tempfile.mkdtemp(prefix="evf-", dir="/tmp"))  # short: socket paths are limited to 107 bytes
    try:
        data = root / "data"
        data.mkdir()
        (data / "evolver.db").write_bytes(b"this is not a SQLite database, " * 64)  # the daemon cannot open it
        result = run(
            "up",
            env={
                "EVOLVER_MODEL_NAME": "scripted/demo",
                "EVOLVER_DAEMON_DATA_DIR": str(data),
                "EVOLVER_DAEMON_RUNTIME_DIR": str(root / "run"),
            },
        )
        assert "Traceback" not in result.stderr
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith("Error: the daemon stopped while starting: ")
        assert "database" in line and f"(its log: {data / 'daemon.log'})" in line
        assert result.returncode == 3  # the daemon's own: the store refused
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_demo_whose_daemon_dies_keeps_its_log_and_says_where():
    runtime = Path(tempfile.mkdtemp(prefix="evd-", dir="/tmp"))
    try:
        (runtime / "a-file").write_text("")  # a runtime dir under a file: the daemon cannot bind its socket
        result = run(
            "demo", env={"TMPDIR": str(runtime), "EVOLVER_DAEMON_RUNTIME_DIR": str(runtime / "a-file" / "run")}
        )
        assert "Traceback" not in result.stderr
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith("Error: the daemon stopped while starting: ")
        (log,) = runtime.glob("evolver-demo-*/daemon.log")
        assert f"(its log: {log})" in line and f"kept the demo's data dir {log.parent / 'data'}" in result.stdout
        assert result.returncode == 4  # a daemon that crashed: the engine could not work
    finally:
        shutil.rmtree(runtime, ignore_errors=True)


def test_a_file_that_is_not_utf8_text_is_one_line_and_exit_code_2(tmp_path):
    binary = tmp_path / "image.bin"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    result = run("--data-dir", str(tmp_path / "d"), "submit", "describe it", "--file", str(binary))
    assert result.returncode == 2, result.stderr
    assert "image.bin is not UTF-8 text" in result.stderr and "Traceback" not in result.stderr
