"""The `evolver` command: a thin layer, one store or API call per subcommand.

Errors from the layers below become one readable line and a distinct exit code
in one place (``main``), never a traceback.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from importlib import resources
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from memory import Filters, NewTrajectory, StoreError
from sandbox import SandboxError

from .budget import BudgetExceeded

from .config import ConfigError, default_config_path, load_config, render_config
from .model import ModelError
from .scaffold import ScaffoldError
from .storage import open_store

# Exit codes: 1 the task or check failed, 2 bad arguments or settings, 3 the store refused,
# 4 the engine could not work (no sandbox, the model unreachable, a bad scaffold, no budget).
EXIT_USAGE, EXIT_STORE, EXIT_ENGINE = 2, 3, 4

out = Console()
err = Console(stderr=True)


class State:
    def __init__(self, config_path: str | None, data_dir: str | None) -> None:
        self.config_path = config_path
        self.data_dir = Path(data_dir) if data_dir else None
        self._config = None

    @property
    def config(self):
        if self._config is None:
            self._config = load_config(self.config_path)
        return self._config

    def store(self, **kwargs):
        return open_store(self.config, data_dir=self.data_dir, **kwargs)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="Settings file (default: $EVOLVER_CONFIG or ~/.config/evolver/config.toml).")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Store location, overriding [daemon] data_dir.")
@click.version_option(package_name="evolver")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None, data_dir: str | None) -> None:
    """evolver: a self-evolving agent daemon with experience memory."""
    ctx.obj = State(config_path, data_dir)


# --- config ------------------------------------------------------------------------


@cli.group()
def config() -> None:
    """Show, check and create the settings file."""


@config.command("show")
@click.option("--defaults", is_flag=True, help="Print the documented defaults (the repository's config.toml).")
@click.pass_obj
def config_show(state: State, defaults: bool) -> None:
    """Print the settings in effect, as TOML-like sections."""
    if defaults:
        click.echo(render_config(), nl=False)
        return
    cfg = state.config
    click.echo(f"# from {cfg.source}")
    for section, values in cfg.model_dump().items():
        click.echo(f"\n[{section}]")
        for key, value in values.items():
            click.echo(f"{key} = {json.dumps(value)}")


@config.command("path")
def config_path() -> None:
    """Print where the user's settings file is read from."""
    click.echo(str(default_config_path()))


@config.command("init")
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
def config_init(force: bool) -> None:
    """Write the documented defaults to the user's settings file."""
    path = default_config_path()
    if path.exists() and not force:
        raise click.UsageError(f"{path} already exists; pass --force to overwrite it.")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_config(), encoding="utf-8")
    click.echo(f"wrote {path}")


@config.command("check")
@click.pass_obj
def config_check(state: State) -> None:
    """Load the settings and say whether they are valid."""
    cfg = state.config
    click.echo(f"ok: {cfg.source}; data dir {state.data_dir or cfg.data_dir}")


# --- memory ------------------------------------------------------------------------


@cli.group()
def memory() -> None:
    """Search and maintain the experience store."""


def _hits_table(title: str, rows: list[dict], columns: list[str]) -> Table:
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*[("" if row.get(c) is None else f"{row[c]:.3f}" if isinstance(row[c], float) else str(row[c]))
                        for c in columns])
    return table


@memory.command("search")
@click.argument("text")
@click.option("--kind", type=click.Choice(["trajectories", "insights", "tools"]), default="trajectories",
              show_default=True)
@click.option("-k", "--limit", "k", type=click.IntRange(1, 100), default=5, show_default=True)
@click.option("--successful/--failed", "success", default=None, help="Only successful (or failed) trajectories.")
@click.option("--node", default=None, help="Only trajectories run by this scaffold node.")
@click.option("--since-hours", type=click.FloatRange(min=0), default=None, help="Only trajectories this recent.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def memory_search(state: State, text: str, kind: str, k: int, success: bool | None, node: str | None,
                  since_hours: float | None, as_json: bool) -> None:
    """Find past trajectories, insights or tools similar to TEXT."""
    if not text.strip():
        raise click.UsageError("TEXT is empty; give some words to search for.")
    with state.store(readonly=True) as store:
        if kind == "trajectories":
            since = time.time() - since_hours * 3600 if since_hours is not None else None
            hits = store.search_trajectories(text, k=k, filters=Filters(success=success, node_id=node, since=since))
        elif kind == "insights":
            hits = store.search_insights(text, k=k)
        else:
            hits = store.search_tools(text, k=k)
        vector = store.index is not None
    rows = [asdict(h) for h in hits]
    if as_json:
        click.echo(json.dumps({"kind": kind, "vector_search": vector, "hits": rows}, indent=2))
        return
    columns = {"trajectories": ["score", "similarity", "keyword_rank", "success", "prompt"],
               "insights": ["score", "similarity", "keyword_rank", "importance", "text"],
               "tools": ["score", "similarity", "keyword_rank", "name", "description"]}[kind]
    out.print(_hits_table(f"{kind} like {text!r}", rows, columns))
    if not vector:
        err.print("note: the daemon owns the vector index, so these are keyword matches only.")


@memory.command("reindex")
@click.pass_obj
def memory_reindex(state: State) -> None:
    """Rebuild the vector index from the database (after a model change or damage)."""
    with state.store(rebuild_index=True) as store:
        with out.status("re-embedding…") as status:
            total = store.reindex(progress=lambda done, of: status.update(f"re-embedding {done}/{of}"))
    click.echo(f"reindexed {total} rows with {store.embedder.model_id}")


@memory.command("check")
@click.pass_obj
def memory_check(state: State) -> None:
    """Check the database's integrity and reconcile the index with it."""
    with state.store() as store:
        verdict = store.check()
        fixed = store.reconcile()
        counts = {c: store.index.count(c) for c in ("trajectories", "insights", "tools")}
    click.echo(f"database: {', '.join(verdict)}")
    click.echo(f"index: {counts}; repaired {sum(fixed.values())} entries")
    if verdict != ["ok"]:
        sys.exit(1)


# --- solving tasks in the foreground ----------------------------------------------------


def _check_from_options(answer: str | None, numeric: float | None, regex: str | None, cmd: str | None) -> dict | None:
    given = [c for c in (answer, numeric, regex, cmd) if c is not None]
    if len(given) > 1:
        raise click.UsageError("give at most one of --check-answer, --check-numeric, --check-regex, --check-cmd")
    if answer is not None:
        return {"type": "answer", "expected": answer}
    if numeric is not None:
        return {"type": "answer", "expected": numeric, "match": "numeric"}
    if regex is not None:
        return {"type": "answer", "expected": regex, "match": "regex"}
    if cmd is not None:
        return {"type": "command", "command": cmd}
    return None


def _print_step(step, console: Console = err) -> None:
    text = step.content.strip().replace("\n", " ")
    calls = ", ".join(f"{c['name']}({json.dumps(c.get('arguments'))[:80]})" for c in (step.tool_calls or []))
    line = calls if step.role == "assistant" and calls else text
    console.print(f"[dim]{step.seq:>3} {step.role:<10}[/dim] {escape(line[:160])}", markup=True, highlight=False)


@cli.command()
@click.argument("text")
@click.option("--check-answer", default=None, help="Success when the final answer equals this.")
@click.option("--check-numeric", type=float, default=None, help="Success when the answer is this number.")
@click.option("--check-regex", default=None, help="Success when the whole answer matches this regex.")
@click.option("--check-cmd", default=None, help="Success when this shell command exits 0 in the workspace.")
@click.option("--quiet", is_flag=True, help="Do not show the steps.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_obj
def run(state: State, text: str, check_answer, check_numeric, check_regex, check_cmd, quiet: bool,
        as_json: bool) -> None:
    """Solve one task now, in the foreground, and record it in the store."""
    from .checks import CheckError, parse_check
    from .engine import Engine

    if not text.strip():
        raise click.UsageError("TEXT is empty; say what the task is.")
    check = _check_from_options(check_answer, check_numeric, check_regex, check_cmd)
    if check is not None:
        try:
            parse_check(check)
        except CheckError as exc:
            raise click.UsageError(str(exc)) from None
    with Engine.open(state.config, data_dir=state.data_dir) as engine:
        task, _ = engine.store.add_task(text, check=check, source="cli")
        result = engine.agent().run_task(task, on_step=None if quiet else _print_step)
    if as_json:
        click.echo(json.dumps(asdict(result), indent=2))
    else:
        verdict = "" if result.success is None else (" (check passed)" if result.success else " (check failed)")
        click.echo(f"{result.status}{verdict}: {result.answer if result.answer is not None else result.error}")
    if result.status != "done" or result.success is False:
        sys.exit(1)


@cli.command()
@click.argument("pack")
@click.option("--split", type=click.Choice(["train", "test", "all"]), default="all", show_default=True)
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Run at most this many tasks.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.pass_obj
def bench(state: State, pack: str, split: str, limit: int | None, as_json: bool) -> None:
    """Run a task pack (a JSONL file, "basic", or "humaneval") and report the success rate."""
    from .engine import Engine
    from .humaneval import humaneval_tasks
    from .taskpack import TaskPackError, bundled_pack, load_pack

    try:
        if pack == "humaneval":
            tasks = humaneval_tasks()
        elif Path(pack).exists():
            tasks = load_pack(pack)
        else:
            tasks = bundled_pack(pack)
    except TaskPackError as exc:
        raise click.UsageError(str(exc)) from None
    tasks = [t for t in tasks if split == "all" or t.split == split][:limit]
    results = []
    with Engine.open(state.config, data_dir=state.data_dir) as engine:
        agent = engine.agent()
        with out.status(f"0/{len(tasks)}") as status:
            for n, pack_task in enumerate(tasks, start=1):
                task, _ = engine.store.add_task(pack_task.prompt, check=pack_task.check_data(), source="bench",
                                                metadata={"pack_task": pack_task.id, "files": pack_task.files})
                result = agent.run_task(task, purpose="evaluate")
                results.append({"id": pack_task.id, "split": pack_task.split, "success": bool(result.success),
                                "status": result.status, "answer": result.answer, "attempts": result.attempts})
                status.update(f"{n}/{len(tasks)}: {sum(r['success'] for r in results)} solved")
    solved = sum(r["success"] for r in results)
    summary = {"pack": pack, "split": split, "tasks": len(results), "solved": solved,
               "success_rate": round(solved / len(results), 4) if results else 0.0, "results": results}
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    table = Table(title=f"{pack}: {solved}/{len(results)} solved", title_justify="left")
    for column in ("id", "split", "success", "status", "answer"):
        table.add_column(column, overflow="fold")
    for r in results:
        table.add_row(r["id"], r["split"], "yes" if r["success"] else "no", r["status"], str(r["answer"])[:60])
    out.print(table)


# --- demo ----------------------------------------------------------------------------


def _sample(name: str) -> list[dict]:
    text = resources.files("evolver").joinpath("data", name).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@cli.command()
@click.option("--keep", is_flag=True, help="Keep the temporary data dir and print where it is.")
@click.pass_obj
def demo(state: State, keep: bool) -> None:
    """Show memory and the agent at work, offline, in a temporary data dir.

    Builds a store from bundled sample trajectories, shows what memory retrieves
    for new tasks, then solves a few tasks with the scripted offline model, with
    tool calls in the sandbox and checks by the verifier. Your own store is not touched.
    """
    data_dir = Path(tempfile.mkdtemp(prefix="evolver-demo-"))
    try:
        with out.status("loading the embedding model…"):
            store = open_store(state.config, data_dir=data_dir)
        with store:
            trajectories = [NewTrajectory(prompt=t["prompt"], final_answer=t["final_answer"],
                                          success=t["success"], source="demo") for t in _sample("sample_trajectories.jsonl")]
            started = time.perf_counter()
            store.ingest(trajectories)
            for insight in _sample("sample_insights.jsonl"):
                store.add_insight(insight["text"])
            elapsed = time.perf_counter() - started
            out.print(f"stored and indexed {len(trajectories)} trajectories and "
                      f"{len(_sample('sample_insights.jsonl'))} insights in {elapsed:.2f} s at {data_dir}")
            for query in ("Add up the price column of invoices.csv; values look like '$1,024.00'.",
                          "Combine two nested JSON settings files into one."):
                started = time.perf_counter()
                context = store.context(query)
                ms = (time.perf_counter() - started) * 1000
                out.print(f"\n[bold]task:[/bold] {query}  [dim](context in {ms:.1f} ms)[/dim]")
                out.print(_hits_table("similar successful trajectories",
                                      [asdict(h) for h in context.trajectories], ["score", "similarity", "prompt"]))
                out.print(_hits_table("relevant insights", [asdict(h) for h in context.insights][:3],
                                      ["score", "similarity", "text"]))
            failed = store.search_trajectories("sum money column csv", k=3, filters=Filters(success=False))
            out.print(_hits_table("past failures on similar tasks", [asdict(h) for h in failed],
                                  ["score", "similarity", "prompt", "final_answer"]))
            _demo_agent(state, store, data_dir)
    finally:
        if keep:
            out.print(f"kept {data_dir}")
        else:
            shutil.rmtree(data_dir, ignore_errors=True)


DEMO_TASKS = [
    ("What is 17.5% of 2,340?", {"type": "answer", "expected": 409.5, "match": "numeric"}),
    ("What is (12 + 30) * 2?", {"type": "answer", "expected": "84"}),
    ("Write a haiku about the sea.", None),
]


def _demo_agent(state: State, store, data_dir: Path) -> None:
    """Solve a few tasks with the offline scripted model, in the sandbox, verified."""
    from .config import ModelSettings
    from .engine import Engine

    config = state.config.model_copy(update={"model": ModelSettings(name="scripted/demo")})
    try:
        # The engine borrows the demo's store; the store's own `with` block closes it.
        engine = Engine.open(config, data_dir=data_dir, store=store)
    except SandboxError as exc:
        err.print(f"\nskipping the agent part of the demo: {exc}", markup=False)
        return
    agent = engine.agent()
    for prompt, check in DEMO_TASKS:
        task, _ = store.add_task(prompt, check=check, source="demo")
        out.print(f"\n[bold]solving:[/bold] {prompt}")
        result = agent.run_task(task, on_step=lambda step: _print_step(step, out))
        verdict = {True: "check passed", False: "check failed", None: "no check: success unknown until feedback"}
        out.print(f"→ {result.status}: {result.answer!r} ({verdict[result.success]})")


def main() -> None:
    """Entry point: run the CLI, turning known errors into one line and an exit code."""
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        err.print("aborted")
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(EXIT_USAGE)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except ConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    except StoreError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_STORE)
    except (SandboxError, ModelError, ScaffoldError, BudgetExceeded) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_ENGINE)


if __name__ == "__main__":
    main()
