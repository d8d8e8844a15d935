"""Commands that work on the store in this process: settings, memory upkeep, run, bench, demo."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict

import click

from memory import TaskKind

from ..api import views
from ..config import default_config_path, is_advanced, place, render_config
from .base import State, _print_step, check_options, cli, echo, err, out, print_json, table

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
        echo(render_config(), nl=False)
        return
    cfg = state.config
    echo(f"# from {cfg.source}")
    for advanced in (False, True):
        for section, values in cfg.model_dump().items():
            keys = [k for k in values if is_advanced(section, k) == advanced]
            if keys:
                echo(f"\n{place(section, keys[0])}")
            for key in keys:
                echo(f"{key} = {json.dumps(values[key])}")


@config.command("path")
def config_path() -> None:
    """Print where the user's settings file is read from."""
    echo(str(default_config_path()))


@config.command("init")
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
def config_init(force: bool) -> None:
    """Write the documented defaults to the user's settings file."""
    path = default_config_path()
    if path.exists() and not force:
        raise click.UsageError(f"{path} already exists; pass --force to overwrite it.")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_config(), encoding="utf-8")
    echo(f"wrote {path}")


@config.command("check")
@click.pass_obj
def config_check(state: State) -> None:
    """Load the settings and say whether they are valid (and whether each model has its API key)."""
    from ..config import ConfigError
    from ..llm.client import credentials_problem

    cfg = state.config
    problems = [f"[model] {problem}" for problem in [credentials_problem(cfg.model)] if problem]
    if cfg.meta.name:
        problems += [
            f"[meta] {problem}" for problem in [credentials_problem(cfg.meta.settings(cfg.model), "meta")] if problem
        ]
    problems += _local_problems(cfg)
    if problems:  # valid settings still, but the first model call would fail
        raise ConfigError(f"{cfg.source}: {'; '.join(problems)}")
    echo(f"ok: {cfg.source}; data dir {state.data_dir or cfg.data_dir}")
    for note in _slot_notes(cfg):
        echo(f"note: {note}")


def _local_problems(cfg) -> list[str]:
    """What keeps [model] local / [meta] local from being served: a missing llama-server or GGUF."""
    from ..llm.local_server import LocalModelError, specs

    try:
        specs(cfg)
    except LocalModelError as exc:
        return [str(exc)]
    return []


def _slot_notes(cfg) -> list[str]:
    """Whether the local server's slots fit the daemon's requests: its task lanes (tasks and evaluations) and
    chat lanes each send one at a time; llama-server serves its slots first come, first served, so a slot more
    than the task lanes keeps a person's chat turn from waiting behind background work."""
    from ..service.workers import chat_lanes

    m, workers = cfg.model, cfg.daemon.workers
    if not m.local:
        return []
    chats = chat_lanes(workers)
    notes = []
    if m.local_slots <= workers:
        notes.append(
            f"[model] local_slots is {m.local_slots} for {workers} workers: a chat turn may wait behind "
            f"background work; {workers + 1} or more keeps a slot for it"
        )
    elif m.local_slots < workers + chats:
        notes.append(
            f"[model] local_slots {m.local_slots}: {workers} task lanes and {chats} chat lanes may ask at once; "
            "the rest wait their turn"
        )
    return notes


# --- memory ------------------------------------------------------------------------


@cli.group()
def memory() -> None:
    """Search and maintain the experience store."""


@memory.command("search")
@click.argument("text")
@click.option(
    "--kind", type=click.Choice(["trajectories", "insights", "tools"]), default="trajectories", show_default=True
)
@click.option("-k", "--limit", "k", type=click.IntRange(1, 100), default=5, show_default=True)
@click.option("--successful/--failed", "success", default=None, help="Only successful (or failed) trajectories.")
@click.option("--node", default=None, help="Only trajectories run by this scaffold node.")
@click.option("--since-hours", type=click.FloatRange(min=0), default=None, help="Only trajectories this recent.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def memory_search(
    state: State,
    text: str,
    kind: str,
    k: int,
    success: bool | None,
    node: str | None,
    since_hours: float | None,
    as_json: bool,
) -> None:
    """Find past trajectories, insights or tools similar to TEXT."""
    if not text.strip():
        raise click.UsageError("TEXT is empty; give some words to search for.")
    body = {"text": text, "kind": kind, "k": k, "success": success, "node": node, "since_hours": since_hours}
    result = state.view("/v1/memory/search", views.search, post=True, **body)
    if as_json:
        print_json(result)
        return
    columns = {
        "trajectories": ["score", "similarity", "keyword_rank", "success", "prompt"],
        "insights": ["score", "similarity", "keyword_rank", "importance", "measured", "text"],
        "tools": ["score", "similarity", "keyword_rank", "measured", "name", "description"],
    }[kind]
    out.print(table(f"{kind} like {text!r}", result["hits"], columns))
    if not result["vector_search"]:
        err.print("note: another process owns the vector index, so these are keyword matches only.")


@memory.command("reindex")
@click.pass_obj
def memory_reindex(state: State) -> None:
    """Rebuild the vector index from the database (after a model change or damage)."""
    with state.store(rebuild_index=True) as store:
        with out.status("re-embedding…") as status:
            total = store.reindex(progress=lambda done, of: status.update(f"re-embedding {done}/{of}"))
    echo(f"reindexed {total} rows with {store.embedder.model_id}")


@memory.command("check")
@click.pass_obj
def memory_check(state: State) -> None:
    """Check the database's integrity and reconcile the index with it."""
    with state.store() as store:
        verdict = store.check()
        fixed = store.reconcile()
        counts = {c: store.index.count(c) for c in ("trajectories", "insights", "tools")}
    echo(f"database: {', '.join(verdict)}")
    echo(f"index: {counts}; repaired {sum(fixed.values())} entries")
    if verdict != ["ok"]:
        sys.exit(1)


# --- solving tasks in the foreground ----------------------------------------------------


@cli.command()
@click.argument("text")
@check_options
@click.option("--quiet", is_flag=True, help="Do not show the steps.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_obj
def run(state: State, text: str, check: dict | None, quiet: bool, as_json: bool) -> None:
    """Solve one task now, in the foreground, and record it in the store."""
    from ..engine import Engine
    from ..judge.checks import CheckError, parse_check
    from ..tree.split import Admission

    if not text.strip():
        raise click.UsageError("TEXT is empty; say what the task is.")
    if check is not None:
        try:
            parse_check(check)
        except CheckError as exc:
            raise click.UsageError(str(exc)) from None
    item = Admission.of(state.config).admit(TaskKind.CLI, text, check=check)
    with Engine.open(state.config, data_dir=state.data_dir) as engine:
        ((task, _),) = engine.store.inbox.add_tasks([item])
        result = engine.agent().run_task(task, on_step=None if quiet else _print_step)
    if as_json:
        echo(json.dumps(asdict(result), indent=2))
    else:
        verdict = "" if result.success is None else (" (check passed)" if result.success else " (check failed)")
        echo(f"{result.status}{verdict}: {result.answer if result.answer is not None else result.error}")
    if result.status != "done" or result.success is False:
        sys.exit(1)


@cli.command()
@click.argument("pack")
@click.option("--split", type=click.Choice(["train", "test", "all"]), default="all", show_default=True)
@click.option(
    "--family",
    "families",
    multiple=True,
    metavar="NAME",
    help="Run only the tasks of this family (repeatable); a pack's families are its tasks' `family` field.",
)
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Run at most this many tasks.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.pass_obj
def bench(state: State, pack: str, split: str, families: tuple[str, ...], limit: int | None, as_json: bool) -> None:
    """Run a task pack (a JSONL file, "basic", "prose", "families" or "humaneval") and report the success rate,
    by family where its tasks name one.

    With the daemon running, its workers solve the pack (as low-priority tasks);
    otherwise it runs here, in the foreground."""
    from ..judge.catalog import resolve_pack
    from ..judge.taskpack import TaskPackError

    try:
        tasks = resolve_pack(pack)
    except TaskPackError as exc:
        raise click.UsageError(str(exc)) from None
    known = sorted({t.family for t in tasks if t.family})
    unknown = [f for f in families if f not in known]
    if unknown:
        raise click.UsageError(
            f"the pack {pack} has no family {', '.join(map(repr, unknown))}; its families: {', '.join(known) or 'none'}"
        )
    tasks = [t for t in tasks if (split == "all" or t.split == split) and (not families or t.family in families)]
    tasks = tasks[:limit]
    if state.daemon_answers():
        results = _bench_through_daemon(state, tasks)
    else:
        results = _bench_here(state, tasks)
    solved = sum(r["success"] for r in results)
    summary = {
        "pack": pack,
        "split": split,
        "tasks": len(results),
        "solved": solved,
        "success_rate": round(solved / len(results), 4) if results else 0.0,
        **({"families": _by_family(results)} if any(r.get("family") for r in results) else {}),
        "results": results,
    }
    if as_json:
        echo(json.dumps(summary, indent=2))
        return
    rows = [{**r, "success": "yes" if r["success"] else "no", "answer": str(r["answer"])} for r in results]
    out.print(
        table(
            f"{pack}: {solved}/{len(results)} solved",
            rows,
            ["id", "split", "success", "status", "answer"],
            width={"answer": 60},
        )
    )
    for family, counts in summary.get("families", {}).items():
        echo(f"  {family}: {counts['solved']}/{counts['tasks']} solved")


def _by_family(results: list[dict]) -> dict[str, dict]:
    """Tasks and solved counts per family, in the order the families first come."""
    counts: dict[str, dict] = {}
    for r in results:
        row = counts.setdefault(r.get("family") or "(none)", {"tasks": 0, "solved": 0})
        row["tasks"] += 1
        row["solved"] += bool(r["success"])
    return counts


def _result(pack_task, status: str, success, answer, attempts: int) -> dict:
    return {
        "id": pack_task.id,
        **({"family": pack_task.family} if pack_task.family else {}),
        "split": pack_task.split,
        "success": bool(success),
        "status": status,
        "answer": answer,
        "attempts": attempts,
    }


def _bench_here(state: State, tasks) -> list[dict]:
    from ..engine import Engine
    from ..tree.split import Admission

    results = []
    admission = Admission.of(state.config)
    with Engine.open(state.config, data_dir=state.data_dir) as engine:
        agent = engine.agent()
        with out.status(f"0/{len(tasks)}") as status:
            for n, pack_task in enumerate(tasks, start=1):
                # By the daemon's door: a held-out task's text stays held out, whatever its label.
                item = admission.admit(
                    TaskKind.BENCH,
                    pack_task.prompt,
                    check=pack_task.check_data(),
                    metadata={"pack_task": pack_task.id, **pack_task.metadata()},
                )
                ((task, _),) = engine.store.inbox.add_tasks([item])
                result = agent.run_task(task)
                results.append(_result(pack_task, result.status, result.success, result.answer, result.attempts))
                status.update(f"{n}/{len(tasks)}: {sum(r['success'] for r in results)} solved")
    return results


def _bench_through_daemon(state: State, tasks) -> list[dict]:
    with state.client() as client:
        ids = [
            client.post(
                "/v1/tasks",
                {
                    "prompt": t.prompt,
                    "check": t.check_data(),
                    "priority": -10,
                    "source": "bench",
                    "metadata": {"pack_task": t.id, **t.metadata()},
                },
            )["id"]
            for t in tasks
        ]
        pending, done = dict(zip(ids, tasks)), {}
        with out.status(f"the daemon is solving 0/{len(tasks)}") as status:
            while pending:
                for task_id in list(pending):
                    detail = client.get(f"/v1/tasks/{task_id}")
                    if detail["status"] in ("done", "failed", "cancelled", "dead"):
                        last = (detail["trajectories"] or [{}])[-1]
                        done[task_id] = _result(
                            pending.pop(task_id),
                            detail["status"],
                            (last.get("outcome") or {}).get("success"),
                            last.get("final_answer"),
                            len(detail["trajectories"]),
                        )
                status.update(f"the daemon is solving: {len(done)}/{len(tasks)} finished")
                if pending:
                    time.sleep(0.25)
    return [done[i] for i in ids]
