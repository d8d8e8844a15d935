"""`evolver export` and `evolver import`: learned packs (``evolver.meta.packs``) out of one store, into another.

Through the daemon when it runs (it owns the store); otherwise export reads
the store read-only and import opens it (with the sandbox its tools' quarantine
needs) in this process. A refused pack is one line and exit 2, as other bad
input; an import where some item was refused (a tool that failed its tests)
exits 1, after the rest came in.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from pathlib import Path
from typing import NoReturn

import click

from ..meta import packs
from .base import EXIT_USAGE, State, cli, echo, full_id, print_json
from .client import ApiError

IMPORT_TIMEOUT_S = 900.0  # quarantine runs every tool's tests in the sandbox


def _refuse(message: str) -> NoReturn:
    echo(f"error: {message}", err=True)
    sys.exit(EXIT_USAGE)


def _write(path: Path, data: bytes) -> None:
    """Write the pack whole or not at all (a temporary file renamed into place)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@cli.command("export")
@click.option("--insights", is_flag=True, help="The active insights.")
@click.option("--tools", is_flag=True, help="The active synthesized tools.")
@click.option(
    "--node", "node", default=None, metavar="ID", help="A tree node's scaffold (and the synthesized tools it names)."
)
@click.option(
    "-o", "--output", required=True, type=click.Path(dir_okay=False, writable=True), help="The pack file to write."
)
@click.option("--force", is_flag=True, help="Overwrite the output file if it exists.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.pass_obj
def export(
    state: State, insights: bool, tools: bool, node: str | None, output: str, force: bool, as_json: bool
) -> None:
    """Write what was learned to a pack file: with no option, the active insights and tools."""
    path = Path(output)
    if path.exists() and not force:
        raise click.UsageError(f"{path} exists; pass --force to overwrite it")
    node_id = full_id(state, node, "node")["id"] if node else None
    try:
        result = state.view(
            "/v1/export", packs.export_json, state.config.model.name, insights=insights, tools=tools, node=node_id
        )
    except packs.PackError as exc:
        _refuse(str(exc))
    except ApiError as exc:
        if exc.kind != "nothing_to_export":
            raise
        _refuse(str(exc))
    data = base64.b64decode(result.pop("pack"))
    _write(path, data)
    if as_json:
        print_json({**result, "path": str(path)})
        return
    parts = [f"{result['insights']} insights", f"{len(result['tools'])} tools"]
    if result["node"]:
        parts.append(f"node {result['node']}")
    echo(f"wrote pack {result['sha256']} to {path} ({result['bytes']} bytes): {', '.join(parts)}")
    for item in result["left_out"]:
        echo(f"  left out {item['kind']} {item['name']}: {item['reason']}", err=True)


@cli.command("import")
@click.argument("pack", type=click.Path(dir_okay=False, exists=True, readable=True))
@click.option(
    "--expect",
    default=None,
    metavar="ID",
    help="Refuse the pack unless its id is ID, whole: the 64 hex digits its author gave you (`evolver "
    "export` prints them; a prefix is refused).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_obj
def import_(state: State, pack: str, expect: str | None, as_json: bool) -> None:
    """Verify a pack, quarantine its tools in the sandbox, and add what passes (one event, revertible)."""
    path = Path(pack)
    size = path.stat().st_size
    if size > packs.MAX_PACK_BYTES:
        _refuse(f"{path} is {size} bytes, over the {packs.MAX_PACK_BYTES}-byte cap of a pack")
    data = path.read_bytes()
    try:
        if state.daemon_answers():
            report = _through_daemon(state, data, expect)
        else:
            from ..engine import Engine

            with Engine.open(state.config, data_dir=state.data_dir) as engine:
                report = packs.import_pack(engine, data, expect=expect)
    except packs.PackError as exc:
        _refuse(f"{path}: pack refused: {exc}")
    if as_json:
        print_json(report)
    else:
        _print(report)
    if report["refused"]:
        sys.exit(1)


def _through_daemon(state: State, data: bytes, expect: str | None) -> dict:
    body = {"pack": base64.b64encode(data).decode("ascii"), "expect": expect}
    cap = state.config.daemon.max_body_bytes
    size = len(json.dumps(body))
    if size > cap:
        _refuse(
            f"the pack is {len(data)} bytes, {size} as the request, over the daemon's {cap}-byte cap "
            "([advanced.daemon] max_body_bytes); raise it, or stop the daemon and import again"
        )
    with state.client(timeout_s=IMPORT_TIMEOUT_S) as client:
        try:
            return client.post("/v1/import", body)
        except ApiError as exc:
            if exc.kind == "invalid_pack":
                raise packs.PackError(str(exc)) from None
            raise


def _print(report: dict) -> None:
    marks = {"added": "+", "skipped": "=", "refused": "!"}
    echo(
        f"pack {report['sha256']} (from evolver {report['evolver']}"
        f"{', ' + report['model'] if report.get('model') else ''})"
    )
    for item in report["items"]:
        name = item["name"] if item["kind"] != "insight" else json.dumps(item["name"])
        detail = item.get("detail") or {}
        if item["kind"] == "tool" and item["status"] == "added":
            name += f" v{detail['version']}" + (f" (replaces v{detail['replaces']})" if detail.get("replaces") else "")
        elif item["kind"] == "insight" and detail.get("id"):
            name = f"{detail['id']} {name}"
        reason = f": {item['reason']}" if item.get("reason") else ""
        echo(f"  {marks[item['status']]} {item['kind']} {item['status']} {name}{reason}")
    if report["probation"]:
        echo(
            f"  {report['probation']} insight{'s' if report['probation'] > 1 else ''} on probation: shown to no "
            "task of yours until approved (`evolver insights approve ID`) or measured to help on the "
            "promotion split"
        )
    echo(
        f"{report['added']} added, {report['skipped']} skipped, {report['refused']} refused "
        f"(event {report['event_id']}; undo with `evolver history revert {report['event_id']}`)"
    )
