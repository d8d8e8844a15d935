"""`evolver ui`: the live dashboard, served on loopback while the command runs."""

from __future__ import annotations

import webbrowser
from pathlib import Path

import click

from .base import EXIT_NO_DAEMON, EXIT_USAGE, State, cli, echo, err


@cli.command()
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="The loopback port to listen on (0: any free one).",
)
@click.option(
    "--open/--no-open",
    "open_browser",
    default=False,
    show_default=True,
    help="Open the dashboard in the default browser (through a page only you can read, so the token is "
    "on no command line; then the printed URL has no token).",
)
@click.pass_obj
def ui(state: State, port: int, open_browser: bool) -> None:
    """Serve the live dashboard on 127.0.0.1 until Ctrl-C: the queue and running tasks with their steps,
    the tree, the learning curve, insights and tools with their effect, the history (with revert) and
    spend against the caps. The printed URL carries a one-time token: the first browser to open it gets
    the session, and the token is refused from then on."""
    from ..ui import serve_ui
    from ..ui.serve import opener_page

    if not state.daemon_answers():
        err.print(
            f"error: the daemon is not running (no answer on {state.socket_path}); start it with "
            "`evolver up`, then run `evolver ui` again"
        )
        raise SystemExit(EXIT_NO_DAEMON)
    opener: list[Path] = []

    def ready(url: str) -> None:
        if open_browser:
            opener.append(opener_page(url, state.socket_path.parent))  # the socket's dir: 0700, the user's
            if webbrowser.open(opener[0].as_uri()):
                echo(url.partition("?")[0], nl=True)  # first line of stdout: scripts read it
                err.print("the dashboard is open in your browser, at the URL above; Ctrl-C stops it")
                return
            err.print("warning: no browser could be started; open the URL below")
        echo(url, nl=True)  # first line of stdout: scripts read it
        err.print("the dashboard is served at the URL above (its token opens it once); Ctrl-C stops it")

    def traded() -> None:  # the opener page's token is spent: nothing to keep
        for page in opener:
            page.unlink(missing_ok=True)

    try:
        serve_ui(state.socket_path, port=port, on_ready=ready, on_traded=traded)
    except OSError as exc:
        err.print(f"error: cannot listen on 127.0.0.1:{port}: {exc.strerror or exc}")
        raise SystemExit(EXIT_USAGE) from exc
    finally:
        traded()
