"""`evolver mcp serve`: evolver as an MCP server for desktop and editor hosts, and other agents."""

from __future__ import annotations

import asyncio
import os
import secrets

import click

from .base import EXIT_USAGE, State, cli, echo, err


@cli.group()
def mcp() -> None:
    """MCP (Model Context Protocol): evolver's memory and learned tools for other agents."""


@mcp.command()
@click.option(
    "--http",
    "over_http",
    is_flag=True,
    help="Serve streamable HTTP on 127.0.0.1 (with a bearer token) instead of stdio.",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="With --http: the loopback port (0: any free one).",
)
@click.option(
    "--token-env",
    default=None,
    metavar="VAR",
    help="With --http: take the bearer token from this environment variable (default: a new random one, printed).",
)
@click.pass_obj
def serve(state: State, over_http: bool, port: int, token_env: str | None) -> None:
    """Serve MCP: memory_search, insights, submit_task, task_status, and every active synthesized tool as
    learned_NAME (its calls run in evolver's sandbox, in the daemon). Over stdio by default, which is what
    a host such as Claude Desktop starts; the daemon must be running when tools are called."""
    from ..mcp.serve import serve_http, serve_stdio
    from ..ui.serve import bind_loopback

    if token_env:
        state.secret_variables.add(token_env)  # EVOLVER_MCP_TOKEN is the token, not an [mcp] setting
    if not state.daemon_answers():
        err.print(
            f"warning: the daemon is not running (no answer on {state.socket_path}); tool calls will say so "
            "until `evolver up` starts it"
        )
    if not over_http:
        asyncio.run(serve_stdio(state.socket_path))
        return
    if token_env is not None and not os.environ.get(token_env):
        raise click.UsageError(f"--token-env {token_env}: that environment variable is not set")
    token = os.environ[token_env] if token_env else secrets.token_urlsafe(32)
    try:
        sock = bind_loopback(port)
    except OSError as exc:
        err.print(f"error: cannot listen on 127.0.0.1:{port}: {exc.strerror or exc}")
        raise SystemExit(EXIT_USAGE) from exc
    echo(f"http://127.0.0.1:{sock.getsockname()[1]}/mcp")  # first line of stdout: scripts read it
    if not token_env:
        echo(f"token: {token}")
    err.print("MCP over streamable HTTP at the URL above; send `Authorization: Bearer <token>`. Ctrl-C stops it")
    try:
        asyncio.run(serve_http(state.socket_path, sock, token))
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
