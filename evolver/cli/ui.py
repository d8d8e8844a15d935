"""`evolver ui`: the live dashboard, served on loopback while the command runs."""

from __future__ import annotations

import webbrowser

import click

from .base import EXIT_NO_DAEMON, EXIT_USAGE, State, cli, echo, err


@cli.command()
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="The loopback port to listen on (0: any free one).")
@click.option("--open/--no-open", "open_browser", default=False, show_default=True,
              help="Open the dashboard in the default browser.")
@click.pass_obj
def ui(state: State, port: int, open_browser: bool) -> None:
    """Serve the live dashboard on 127.0.0.1 until Ctrl-C: the queue and running tasks with their steps,
    the tree, the learning curve, insights and tools with their effect, the history (with revert) and
    spend against the caps. The printed URL carries a one-time token; without it the page is refused."""
    from ..ui import serve_ui

    if not state.daemon_answers():
        err.print(f"error: the daemon is not running (no answer on {state.socket_path}); start it with "
                  "`evolver up`, then run `evolver ui` again")
        raise SystemExit(EXIT_NO_DAEMON)

    def ready(url: str) -> None:
        echo(url, nl=True)  # first line of stdout: scripts read it
        err.print("the dashboard is served at the URL above (only with its token); Ctrl-C stops it")
        if open_browser:
            webbrowser.open(url)

    try:
        serve_ui(state.socket_path, port=port, on_ready=ready)
    except OSError as exc:
        err.print(f"error: cannot listen on 127.0.0.1:{port}: {exc.strerror or exc}")
        raise SystemExit(EXIT_USAGE) from exc
