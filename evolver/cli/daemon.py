"""Starting, stopping and asking after the daemon; installing it as a systemd user service."""

from __future__ import annotations

import codecs
import logging
import os
import subprocess
import sys
import time

import click

from ..service.systemd import render_unit, unit_path
from .base import (
    EXIT_ENGINE,
    EXIT_NO_DAEMON,
    EXIT_REFUSED,
    EXIT_USAGE,
    DaemonDied,
    State,
    cli,
    echo,
    err,
    out,
    print_json,
    table,
)
from .client import ClientError, DaemonNotRunning


def _log_path(state: State):
    return (state.data_dir or state.config.data_dir).expanduser() / "daemon.log"


def _tail(path, lines: int) -> tuple[list[bytes], int]:
    """The last ``lines`` lines of a file and the offset its end had."""
    with open(path, "rb") as handle:
        end = handle.seek(0, os.SEEK_END)
        chunk, start = b"", end
        while start > 0 and chunk.count(b"\n") <= lines:
            start = max(0, start - 65536)
            handle.seek(start)
            chunk = handle.read(end - start)
    return chunk.splitlines(keepends=True)[-lines:] if lines else [], end


@cli.command()
@click.option(
    "--lines",
    "-n",
    type=click.IntRange(min=0),
    default=50,
    show_default=True,
    help="How many of the last lines to print.",
)
@click.option("--follow", "-f", is_flag=True, help="Keep printing lines as they are written (Ctrl-C ends).")
@click.pass_obj
def logs(state: State, lines: int, follow: bool) -> None:
    """The daemon's log, as `evolver up` writes it to DATA_DIR/daemon.log (under systemd the journal has
    it: journalctl --user -u evolver)."""
    path = _log_path(state)
    if not path.exists():
        raise click.ClickException(
            f"there is no log at {path} yet: a daemon started by `evolver up` writes it "
            "(one run by systemd logs to the journal: journalctl --user -u evolver)"
        )
    last, offset = _tail(path, lines)
    # The log quotes prompts, answers and errors: shown through echo, escaped, like every stored text. Read
    # in pieces, a character may be cut between two: the decoder keeps its first bytes for the next.
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    echo(decoder.decode(b"".join(last)), nl=False)
    if not follow:
        return
    try:
        while True:
            time.sleep(0.25)
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                continue  # being replaced: wait for the new one
            if size < offset:
                offset = 0  # a new log (a restart truncates it): from its start
            if size > offset:
                with open(path, "rb") as handle:
                    handle.seek(offset)
                    data = handle.read(size - offset)
                offset += len(data)
                echo(decoder.decode(data), nl=False)
    except KeyboardInterrupt:
        return


@cli.command()
@click.option("--foreground", is_flag=True, help="Run in this process (for systemd and debugging) until stopped.")
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=1),
    default=180,
    show_default=True,
    help="Seconds to wait for a background daemon to answer.",
)
@click.pass_obj
def up(state: State, foreground: bool, timeout_s: float) -> None:
    """Start the daemon (in the background unless --foreground)."""
    from ..service.daemon import Daemon

    if foreground:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        for noisy in ("LiteLLM", "httpx", "sentence_transformers", "apscheduler"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
        sys.exit(Daemon(state.config, data_dir=state.data_dir).serve())
    path = state.socket_path
    if state.daemon_answers():
        echo(f"the daemon is already running on {path}")
        return
    log = _log_path(state)
    status = spawn_daemon(state, log=log, timeout_s=timeout_s)
    echo(f"evolver daemon {status['pid']} is up: socket {path}, data dir {status['data_dir']}, log {log}")


def _reason(log, start: int) -> str:
    """The daemon's own last word in its log since ``start``: its one-line error (the CLI's "error: ..."),
    else the last line, which after a traceback names the exception."""
    with open(log, "rb") as f:
        f.seek(start)
        lines = [line.strip() for line in f.read().decode(errors="replace").splitlines() if line.strip()]
    errors = [line.removeprefix("error: ") for line in lines if line.startswith("error: ")]
    return (errors or lines or ["it wrote nothing to its log"])[-1]


def spawn_daemon(state: State, *, log, timeout_s: float, env: dict | None = None) -> dict:
    """Start `evolver up --foreground` in its own session and wait until it answers; its status."""
    log.parent.mkdir(parents=True, exist_ok=True, mode=0o700)  # the data dir: its owner's alone
    args = [sys.executable, "-m", "evolver"]
    if state.config_path:
        args += ["--config", os.path.abspath(state.config_path)]
    if state.data_dir:
        args += ["--data-dir", os.path.abspath(state.data_dir)]
    with open(log, "ab") as sink:
        start = sink.tell()  # the log may hold earlier runs: only this one's lines give the reason
        child = subprocess.Popen(
            [*args, "up", "--foreground"],
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=sink,
            start_new_session=True,  # its own session: closing this terminal leaves it running
            env={**os.environ, **(env or {})},
        )
    deadline = time.monotonic() + timeout_s
    with err.status("starting the daemon…"):
        while time.monotonic() < deadline:
            if child.poll() is not None:
                raise DaemonDied(
                    f"the daemon stopped while starting: {_reason(log, start)} (its log: {log})",
                    # its own exit code when it is one of the CLI's; a crash is the engine's
                    child.returncode if EXIT_USAGE <= child.returncode <= EXIT_REFUSED else EXIT_ENGINE,
                )
            if state.daemon_answers():
                try:
                    with state.client(timeout_s=5) as client:
                        status = client.get("/v1/status")
                except ClientError:
                    status = None
                # It answers before its jobs run; `up` returns once a command such as `evolve` would work.
                if status is not None and status.get("mood") != "starting":
                    return status
            time.sleep(0.1)
    raise click.ClickException(f"the daemon did not answer within {timeout_s:g} s; see {log}")


@cli.command()
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=1),
    default=None,
    help="Seconds to wait for it to exit (default: the shutdown grace period plus 30).",
)
@click.pass_obj
def down(state: State, timeout_s: float | None) -> None:
    """Stop the daemon gracefully: running tasks stop at a step boundary and are re-queued."""
    try:
        pid = stop_daemon(state, timeout_s=timeout_s or state.config.daemon.shutdown_grace_s + 30)
    except DaemonNotRunning:
        echo(f"the daemon is not running (nothing answers on {state.socket_path})")
        return
    echo(f"evolver daemon {pid} stopped")


def stop_daemon(state: State, *, timeout_s: float) -> int:
    """Ask the daemon to stop and wait until its socket is gone; its pid."""
    with state.client() as client:
        pid = client.get("/v1/status")["pid"]
        client.post("/v1/shutdown")
    deadline = time.monotonic() + timeout_s
    with err.status(f"stopping daemon {pid}…"):
        while time.monotonic() < deadline:
            if not state.daemon_answers():
                return pid
            time.sleep(0.1)
    raise click.ClickException(f"daemon {pid} is still running after {timeout_s:g} s; `kill {pid}` stops it harder")


def _queue_line(queue: dict[str, int]) -> str:
    """The inbox now (queued, running) and the tasks so far by how they ended; ``queue`` is every task's
    status counted."""
    now = f"{queue.get('queued', 0)} queued, {queue.get('running', 0)} running"
    ended = ", ".join(f"{queue[k]} {k}" for k in ("done", "failed", "cancelled", "dead") if queue.get(k))
    return f"queue: {now}" + (f" (so far: {ended})" if ended else "")


def _relative(at: float | None, now: float) -> str:
    """A time as how long ago or from now it is (inspect's ``_when`` prints the clock time)."""
    if at is None:
        return "-"
    seconds = at - now
    ago = seconds < 0
    seconds = abs(seconds)
    text = (
        f"{seconds:.0f} s"
        if seconds < 90
        else f"{seconds / 60:.0f} min"
        if seconds < 5400
        else f"{seconds / 3600:.1f} h"
        if seconds < 86400 * 2
        else f"{seconds / 86400:.0f} d"
    )
    return f"{text} ago" if ago else f"in {text}"


def _pace(job: dict) -> str:
    minutes = job["every_min"]
    every = f"every {minutes:g} min" if minutes < 120 else f"every {minutes / 60:g} h"
    return every + (f", or after {job['after']} new" if job.get("after") else "")


def _jobs_table(jobs: list[dict], now: float):
    rows = []
    for j in jobs:
        last = j.get("last")
        said = (
            "-"
            if not last
            else (
                f"{_relative(last['at'], now)}: "
                + ("" if last["ok"] else "FAILED ")
                + last["summary"].split(": ", 1)[-1]
            )
        )
        nxt = (
            "running now"
            if j.get("running")
            else _relative(j["next_run_at"], now)
            if j["next_run_at"]
            else "not scheduled"
        )
        if j.get("failures"):
            nxt += f" (backing off: {j['failures']} failed rounds in a row)"
        rows.append({"job": j["job"], "runs": _pace(j), "last round": said, "next": nxt})
    return table("background jobs", rows, ["job", "runs", "last round", "next"], width={"last round": 70})


def _rate(counts: dict) -> str:
    judged = counts["succeeded"] + counts["failed"]
    if not judged:
        return "none judged" + (f" ({counts['unjudged']} unjudged)" if counts["unjudged"] else "")
    extra = f", {counts['unjudged']} unjudged" if counts["unjudged"] else ""
    return f"{counts['succeeded']}/{judged} succeeded ({counts['rate']:.0%}){extra}"


def _learning_table(learning: dict):
    from rich.table import Table

    view = Table(title="is it learning?", title_justify="left")
    view.add_column("")
    for name in learning["windows"]:
        view.add_column(f"last {name}")
    w = list(learning["windows"].values())
    lines = [
        ("your tasks", [_rate(x["person"]) for x in w]),
        ("evaluations", [_rate(x["evaluations"]) for x in w]),
        ("insights", [f"+{x['insights_added']} added, {x['insights_retired']} retired" for x in w]),
        ("tools", [f"+{x['tools_added']} added, {x['tools_retired']} retired" for x in w]),
        (
            "spent on your tasks",
            [f"{x['spend']['person']['tokens']} tokens, ${x['spend']['person']['usd']:.4f}" for x in w],
        ),
        (
            "spent in the background",
            [f"{x['spend']['background']['tokens']} tokens, ${x['spend']['background']['usd']:.4f}" for x in w],
        ),
    ]
    for label, cells in lines:
        view.add_row(label, *cells)
    return view


def _print_learning(learning: dict, now: float) -> None:
    out.print(_learning_table(learning))
    best = learning.get("best_candidate")
    line = f"incumbent node: {learning['incumbent']}"
    if best:
        s, n = best["held_out"]
        line += f"; best other candidate {best['node']} (held-out {s}/{n}): {best['why_not_serving']}"
    out.print(line, highlight=False, markup=False)
    for failure in learning.get("job_failures") or []:
        out.print(f"job failed {_relative(failure['at'], now)}: {failure['what']}", highlight=False, markup=False)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def status(state: State, as_json: bool) -> None:
    """Whether the daemon runs, what it is doing (queue, workers, budget, jobs), and whether it is
    learning (success over the last day and week, what was learned and retired, the incumbent and the
    best candidate, background spend apart from yours)."""
    from ..api.learning import learning

    now = time.time()
    try:
        with state.client(timeout_s=10) as client:
            info = client.get("/v1/status")
    except DaemonNotRunning:
        info = {"mood": "not running", "socket": str(state.socket_path)}
        try:
            with state.store(readonly=True) as store:
                info.update(queue=store.inbox.queue_depth(), learning=learning(store, state.config, now=now))
        except Exception as exc:  # no store yet, or unreadable: say so, the status itself still stands
            info["store"] = str(exc)
        if as_json:
            print_json(info)
        else:
            out.print(f"evolver daemon: not running (socket {info['socket']}); start it with `evolver up`")
            if "queue" in info:
                out.print(_queue_line(info["queue"]))
                _print_learning(info["learning"], now)
        sys.exit(EXIT_NO_DAEMON)
    if as_json:
        print_json(info)
        return
    budget = info["budget"]
    meta = f", meta model {info['meta_model']}" if info.get("meta_model", info["model"]) != info["model"] else ""
    out.print(f"evolver daemon {info['pid']}: {info['mood']}, up {info['uptime_s']:.0f} s, model {info['model']}{meta}")
    out.print(
        f"socket {info['socket']}; data dir {info['data_dir']}"
        + ("" if info["sandbox_isolated"] else "; SANDBOX DEGRADED (no bubblewrap)")
    )
    pids = info.get("worker_pids") or []
    workers = f"{info['workers']} (processes {', '.join(map(str, pids))})" if pids else f"{info['workers']}"
    out.print(
        f"{_queue_line(info['queue'])}; workers: {workers}, running: "
        f"{', '.join(r['task_id'] for r in info['running']) or 'nothing'}"
    )
    for served in info.get("local_models") or []:
        health = "ready" if served["ready"] else ("loading" if served["alive"] else "down, restarting")
        out.print(
            f"local [{served['section']}] {served['model']}: {health}, pid {served['pid'] or '-'}, "
            f"{served['slots']} slots x {served['context_per_slot']} tokens, restarts {served['restarts']}; "
            f"log {served['log']}",
            markup=False,
            highlight=False,
        )
    by_model = budget.get("by_model") or {}
    shares = (
        "; " + ", ".join(f"{m} {s['tokens']} tokens, ${s['usd']:.4f}" for m, s in by_model.items())
        if len(by_model) > 1
        else ""
    )  # a task model and a meta model: each one's line of the ledger
    out.print(
        f"spent today: {budget['tokens_today']} tokens of {budget['tokens_per_day'] or 'unlimited'}, "
        f"${budget['usd_today']:.4f} of ${budget['usd_per_day']:g}{shares}",
        markup=False,
        highlight=False,
    )
    _print_learning(info["learning"], now)
    if info["jobs"]:
        out.print(_jobs_table(info["jobs"], now))


@cli.group()
def service() -> None:
    """Run the daemon as a systemd user service."""


@service.command("install")
@click.option("--print", "to_stdout", is_flag=True, help="Print the unit instead of writing it.")
@click.option("--force", is_flag=True, help="Overwrite an existing unit file.")
@click.pass_obj
def service_install(state: State, to_stdout: bool, force: bool) -> None:
    """Write a systemd user unit that runs `evolver up --foreground`."""
    unit = render_unit(
        config_path=state.config_path,
        data_dir=str(state.data_dir) if state.data_dir else None,
        stop_timeout_s=state.config.daemon.shutdown_grace_s,
    )
    if to_stdout:
        echo(unit, nl=False)
        return
    path = unit_path()
    if path.exists() and not force:
        raise click.UsageError(f"{path} already exists; pass --force to overwrite it.")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(unit, encoding="utf-8")
    echo(f"wrote {path}\nstart it with: systemctl --user daemon-reload && systemctl --user enable --now evolver")
