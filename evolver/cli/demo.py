"""`evolver demo`: the whole daemon at work, offline, in a temporary data dir.

Seeds memory with bundled sample trajectories and shows what it retrieves,
starts a daemon with the scripted offline model on its own socket, submits
the bundled demo task pack and follows it, chats once, runs one round of every
background job, prints the tree and the history, and stops the daemon. The
user's own store and daemon are never touched.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict
from importlib import resources
from pathlib import Path

import click

from memory import NewTrajectory

from ..config import load_config
from ..judge.taskpack import bundled_pack
from ..storage import open_store
from .base import DaemonDied, State, cli, out, table
from .daemon import spawn_daemon, stop_daemon
from .inspect import hook_effects_line, show_tree


def _sample(name: str) -> list[dict]:
    text = resources.files("evolver").joinpath("data", name).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _seed_memory(state: State, data_dir: Path) -> None:
    with out.status("loading the embedding model…"):
        store = open_store(state.config, data_dir=data_dir)
    with store:
        started = time.perf_counter()
        store.attempts.ingest(
            [
                NewTrajectory(prompt=t["prompt"], final_answer=t["final_answer"], success=t["success"])
                for t in _sample("sample_trajectories.jsonl")
            ]
        )
        for insight in _sample("sample_insights.jsonl"):
            store.insights.add_insight(insight["text"])
        out.print(
            f"seeded memory with {len(_sample('sample_trajectories.jsonl'))} past trajectories and "
            f"{len(_sample('sample_insights.jsonl'))} insights in {time.perf_counter() - started:.2f} s"
        )
        query = "Add up the price column of invoices.csv; values look like '$1,024.00'."
        started = time.perf_counter()
        context = store.retrieval.context(query)
        ms = (time.perf_counter() - started) * 1000
        out.print(f"\n[bold]memory, for a new task:[/bold] {query}  [dim](context in {ms:.1f} ms)[/dim]")
        out.print(
            table(
                "similar successful trajectories",
                [asdict(h) for h in context.trajectories],
                ["score", "similarity", "prompt"],
            )
        )
        out.print(
            table("relevant insights", [asdict(h) for h in context.insights][:3], ["score", "similarity", "text"])
        )


def _wait_all(client, ids: list[str], timeout_s: float) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    with out.status("the daemon's workers are solving the pack…") as status:
        while True:
            tasks = [client.get(f"/v1/tasks/{i}") for i in ids]
            finished = [t for t in tasks if t["status"] in ("done", "failed", "cancelled", "dead")]
            status.update(f"{len(finished)}/{len(ids)} tasks finished")
            if len(finished) == len(ids) or time.monotonic() > deadline:
                return tasks
            time.sleep(0.2)


def _grow_tree(client, timeout_s: float) -> None:
    """Step the tree search (evolve, then record what ended) until a child of the seed is validated."""
    deadline = time.monotonic() + timeout_s
    with out.status("growing the scaffold tree…"):
        while time.monotonic() < deadline:
            if any(
                n["parent_id"] and n["status"] in ("evaluating", "evaluated", "promoted")
                for n in client.get("/v1/tree")["nodes"]
            ):
                return
            for r in client.run_rounds("record") + client.run_rounds("evolve"):
                if r["ok"] and not r["summary"].startswith(("no evaluation", "waiting")):
                    out.print(f"  {r['job']}: {r['summary']}", markup=False)
                elif not r["ok"]:
                    out.print(f"  {r['job']}: FAILED: {r['summary']}", markup=False)
            time.sleep(0.5)


def _show_hooks(client) -> None:
    """What the validated child's hooks (the proposer's code) did on the tasks it ran."""
    for n in client.get("/v1/tree")["nodes"]:
        node = client.get(f"/v1/nodes/{n['id']}")
        if not node["scaffold"].get("hooks", "").strip():
            continue
        out.print(
            f"\n[bold]hooks of {node['id']}[/bold] (run in the sandbox at points of the loop): "
            f"{hook_effects_line(node.get('hook_effects'))}"
        )


@cli.command()
@click.option("--keep", is_flag=True, help="Keep the temporary data dir and print where it is.")
@click.pass_obj
def demo(state: State, keep: bool) -> None:
    """Run the daemon offline on a temporary data dir: tasks, chat, background jobs, tree, history."""
    root = Path(tempfile.mkdtemp(prefix="evolver-demo-"))
    # Importing sentence-transformers makes torch create its compile cache dir under TMPDIR; the
    # demo's (and its daemon's) goes in the demo's own dir, removed with it.
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(root / "torchinductor"))
    # The socket goes in the usual runtime dir (a temp path may be too long for a socket); its name
    # is derived from the data dir, so it never meets the user's own daemon.
    # The tree search evaluates nodes on the demo pack, which the scripted model can mostly solve.
    # Background jobs run only when the demo asks, so what it shows does not depend on a scheduled
    # round having run first on a busy machine.
    env = {
        "EVOLVER_MODEL_NAME": "scripted/demo",
        "EVOLVER_DAEMON_DATA_DIR": str(root / "data"),
        "EVOLVER_EVOLUTION_PACKS": '["demo"]',
        "EVOLVER_EVOLUTION_ENABLED": "false",
        "TORCHINDUCTOR_CACHE_DIR": os.environ["TORCHINDUCTOR_CACHE_DIR"],
    }
    config = load_config(state.config_path, env={**os.environ, **env})
    demo_state = State(state.config_path, str(root / "data"))
    demo_state._config = config
    started = False
    try:
        _seed_memory(demo_state, root / "data")
        try:
            info = spawn_daemon(demo_state, log=root / "daemon.log", timeout_s=180, env=env)
        except DaemonDied:
            keep = True  # its log holds the whole story of why: never delete it
            raise
        started = True
        out.print(
            f"\n[bold]daemon {info['pid']}[/bold] serving {info['data_dir']} on {info['socket']} with "
            f"{info['workers']} workers and the scripted offline model"
        )
        pack = bundled_pack("demo")
        with demo_state.client() as client:
            # As `evolver bench` sends them: each keeps its pack's split (demo-05 is held out of
            # learning), so what the background jobs learn from is the same on every run.
            ids = [
                client.post(
                    "/v1/tasks",
                    {
                        "prompt": t.prompt,
                        "check": t.check_data(),
                        "source": "bench",
                        "metadata": {"pack_task": t.id, **t.metadata()},
                    },
                )["id"]
                for t in pack
            ]
            out.print(f"submitted the bundled demo pack: {len(ids)} tasks, each committed before its 201")
            tasks = _wait_all(client, ids, timeout_s=300)
            rows = []
            for pack_task, task in zip(pack, tasks):
                last = (task["trajectories"] or [{}])[-1]
                rows.append(
                    {
                        "task": pack_task.id,
                        "status": task["status"],
                        "attempts": task["attempts"],
                        "answer": last.get("final_answer"),
                        "check": {True: "passed", False: "failed", None: "-"}[
                            (last.get("outcome") or {}).get("success")
                        ],
                        "prompt": task["prompt"],
                    }
                )
            out.print(
                table(
                    "the demo pack",
                    rows,
                    ["task", "status", "check", "attempts", "answer", "prompt"],
                    width={"answer": 40, "prompt": 45},
                )
            )
            reply = client.post(
                "/v1/chat/completions",
                {"model": "evolver", "messages": [{"role": "user", "content": "What is 2 * (3 + 4)?"}]},
            )
            out.print(
                f"\n[bold]chat[/bold] (OpenAI-compatible, over the socket): 'What is 2 * (3 + 4)?' → "
                f"{reply['choices'][0]['message']['content']!r}"
            )
            rounds = client.run_rounds()
            out.print("\n[bold]one round of every background job:[/bold]")
            for r in rounds:
                out.print(f"  {r['job']}: {'ok' if r['ok'] else 'FAILED'}: {r['summary']}", markup=False)
            # Whichever round registered it (this one, or a scheduled one that ran first on a busy machine).
            made = client.get("/v1/tools")["synthesized"]
            out.print(
                "synthesized tools: "
                + (", ".join(f"{t['name']} v{t['version']} ({t['status']})" for t in made) or "none yet"),
                markup=False,
            )
            out.print("\n[bold]the tree search, until the seed has a validated child:[/bold]")
            _grow_tree(client, timeout_s=120)
            out.print()
            show_tree(client.get("/v1/tree"))
            _show_hooks(client)
            events = client.get("/v1/history", limit=20)["events"]
            out.print(
                table(
                    "history",
                    [{**e, "when": time.strftime("%H:%M:%S", time.localtime(e["at"]))} for e in events],
                    ["id", "when", "kind", "what"],
                    width={"what": 90},
                )
            )
        pid = stop_daemon(demo_state, timeout_s=60)
        started = False
        out.print(f"daemon {pid} stopped")
    finally:
        if started:  # something failed mid-way: never leave the demo's daemon behind
            try:
                stop_daemon(demo_state, timeout_s=60)
            except Exception:
                pass
        if keep:  # the data dir itself, which the inspection commands take (the folder above it is not one)
            out.print(
                f"kept the demo's data dir {root / 'data'}: look inside with `evolver --data-dir "
                f"{root / 'data'} tree` (or tasks, history, insights, ...); its daemon's log: "
                f"{root / 'daemon.log'}",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
        else:
            shutil.rmtree(root, ignore_errors=True)
