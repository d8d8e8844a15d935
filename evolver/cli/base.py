"""The `evolver` command's shared parts: the group, settings, output, and errors in one place.

Each subcommand is a thin layer over one API call (or, for read-only inspection
while the daemon is down, one store query). Errors from the layers below
become one readable line and a distinct exit code in ``main``, never a traceback.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from memory import AmbiguousId, StoreError
from sandbox import SandboxError

from ..agent.scaffold import ScaffoldError
from ..config import ConfigError, load_config
from ..llm.budget import BudgetExceeded
from ..llm.client import ModelError
from ..service.sockets import SocketError
from ..storage import open_store
from ..text import visible
from .client import ApiError, Client, ClientError, DaemonNotRunning, SocketDenied

# Exit codes: 1 the task or check failed, 2 bad arguments or settings, 3 the store refused,
# 4 the engine could not work (no sandbox, the model unreachable, a bad scaffold, no budget),
# 5 the daemon is not running, 6 permission denied on the socket, 7 the daemon refused the request.
EXIT_USAGE, EXIT_STORE, EXIT_ENGINE, EXIT_NO_DAEMON, EXIT_DENIED, EXIT_REFUSED = 2, 3, 4, 5, 6, 7


class _Terminal(Console):
    """A console that shows control characters as escapes in every string it is given (``text.visible``).
    What the CLI prints is mostly stored text from outside: prompts, answers, insights, tool texts,
    history, steps; none of it may set the terminal's title, clear it or forge a line. Rich adds its
    own styling after this, so colours stay."""

    def render_str(self, text: str, **kwargs) -> Text:
        return super().render_str(visible(text), **kwargs)


out = _Terminal()
err = _Terminal(stderr=True)


def echo(message: object = "", *, err: bool = False, nl: bool = True) -> None:
    """``click.echo`` of ``message`` with its control characters shown as escapes: the plain output (ids,
    answers, one-line reports) that scripts read. The CLI prints only through this, ``out`` and ``err``."""
    click.echo(visible(str(message)), err=err, nl=nl)


class DaemonDied(click.ClickException):
    """A daemon that exited while starting: one line with its own reason, and its exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class State:
    def __init__(self, config_path: str | None, data_dir: str | None) -> None:
        self.config_path = config_path
        self.data_dir = Path(data_dir) if data_dir else None
        self.secret_variables: set[str] = set()  # named by the command (--token-env): never read as settings
        self._config = None

    @property
    def config(self):
        if self._config is None:
            self._config = load_config(self.config_path, secret_variables=self.secret_variables)
        return self._config

    def store(self, **kwargs):
        return open_store(self.config, data_dir=self.data_dir, **kwargs)

    @property
    def socket_path(self) -> Path:
        from ..service.daemon import socket_path

        return socket_path(self.config, self.data_dir)

    def client(self, **kwargs) -> Client:
        return Client(self.socket_path, **kwargs)

    def daemon_answers(self) -> bool:
        """Whether a daemon answers on the socket now."""
        from ..service.sockets import probe

        return self.socket_path.exists() and probe(self.socket_path)

    def view(self, path: str, from_store: Callable[..., dict], /, *args, post: bool = False, **params) -> dict:
        """What the daemon answers to ``path`` (a GET with ``params``, or a POST of them) when it runs
        (it owns the vector index); otherwise ``from_store(store, *args, **params)`` on the store
        opened read-only, so that inspection works while it is down."""
        if self.daemon_answers():
            with self.client() as client:
                return client.post(path, params) if post else client.get(path, **params)
        with self.store(readonly=True) as store:
            return from_store(store, *args, **params)


FULL_ID_LENGTH = 26  # "task_" + 11 hex digits of milliseconds + 10 random ones (memory.new_id)
KIND_OF = {"task_": "task", "traj_": "trajectory", "node_": "node"}


def full_id(state: State, short: str, *kinds: str) -> dict:
    """``{"kind", "id"}`` (and a trajectory's ``task_id``) for an id or a unique prefix of one, as git
    takes short commit ids; a usage error when it names another kind of thing than ``kinds``."""
    kind = KIND_OF.get(short[:5])
    if kind in kinds and kind != "trajectory" and len(short) == FULL_ID_LENGTH:
        return {"kind": kind, "id": short}  # already whole: no round trip
    from ..api import views

    found = state.view(f"/v1/ids/{short}", views.resolve_id, short)
    if found["kind"] not in kinds:
        raise click.BadParameter(f"{found['id']} is a {found['kind']} id; this command takes a {' or '.join(kinds)} id")
    return found


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Settings file (default: $EVOLVER_CONFIG or ~/.config/evolver/config.toml).",
)
@click.option(
    "--data-dir", type=click.Path(file_okay=False), default=None, help="Store location, overriding [daemon] data_dir."
)
@click.version_option(package_name="evolver")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None, data_dir: str | None) -> None:
    """evolver: a self-evolving agent daemon with experience memory. The manual: docs/ in the repository
    (docs/index.md; `mkdocs serve` there shows it as a site)."""
    ctx.obj = State(config_path, data_dir)


_CHECK_OPTIONS = (
    click.option("--check-answer", default=None, help="Success when the final answer equals this."),
    click.option("--check-numeric", type=float, default=None, help="Success when the answer is this number."),
    click.option("--check-regex", default=None, help="Success when the whole answer matches this regex."),
    click.option("--check-cmd", default=None, help="Success when this shell command exits 0 in the workspace."),
)


def check_options(command):
    """The options that say how a task's answer is checked (at most one of them), handed to ``command``
    as ``check``: the check's JSON, or None."""

    @functools.wraps(command)
    def with_check(*args, check_answer, check_numeric, check_regex, check_cmd, **kwargs):
        return command(*args, check=_check_from_options(check_answer, check_numeric, check_regex, check_cmd), **kwargs)

    for option in reversed(_CHECK_OPTIONS):  # decorators apply bottom-up: this keeps the options' order
        with_check = option(with_check)
    return with_check


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


def _call_text(call: dict) -> str:
    """A recorded call as one short line: name(arguments), or what the model sent when it could not be read."""
    if call.get("arguments") is None and call.get("raw"):
        return f"{call.get('name') or 'unreadable call'}: {call['raw'][:80]} (refused)"
    return f"{call['name']}({json.dumps(call.get('arguments'))[:80]})"


def _print_step(step, console: Console = err) -> None:
    text = step.content.strip().replace("\n", " ")
    calls = ", ".join(_call_text(c) for c in (step.tool_calls or []))
    line = calls if step.role == "assistant" and calls else text
    console.print(f"[dim]{step.seq:>3} {step.role:<10}[/dim] {escape(line[:160])}", markup=True, highlight=False)


def print_json(data) -> None:
    echo(json.dumps(data, indent=2, default=str))


def table(title: str, rows: list[dict], columns: list[str], *, width: dict[str, int] | None = None) -> Table:
    """A listing: one row per item, the named columns, long text clipped."""
    view = Table(title=title, title_justify="left")
    for column in columns:
        view.add_column(column, overflow="fold")
    for row in rows:
        cells = []
        for c in columns:
            value = row.get(c)
            text = "" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)
            limit = (width or {}).get(c, 100)
            cells.append(escape(text if len(text) <= limit else text[: limit - 1] + "…"))
        view.add_row(*cells)
    return view


# What each error the layers below raise on purpose exits with, most specific first (the daemon's
# own refusals, ApiError, are told apart by their status in _exit_code).
_EXIT_CODES: tuple[tuple[type | tuple[type, ...], int], ...] = (
    (DaemonNotRunning, EXIT_NO_DAEMON),
    (SocketDenied, EXIT_DENIED),
    (ClientError, EXIT_REFUSED),
    ((SocketError, ConfigError), EXIT_USAGE),
    (AmbiguousId, EXIT_USAGE),
    (StoreError, EXIT_STORE),
    ((SandboxError, ModelError, ScaffoldError, BudgetExceeded), EXIT_ENGINE),
)


def _exit_code(exc: Exception) -> int | None:
    """The exit code for a known error; None for anything else (a bug, whose traceback should show)."""
    if isinstance(exc, ApiError):  # the request was wrong, or the daemon would not do it
        return EXIT_USAGE if exc.status in (400, 404, 413, 422) else EXIT_REFUSED
    return next((code for kinds, code in _EXIT_CODES if isinstance(exc, kinds)), None)


def main() -> None:
    """Entry point: run the CLI, turning known errors into one line and an exit code."""
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        err.print("aborted")
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code if isinstance(exc, DaemonDied) else EXIT_USAGE)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except Exception as exc:
        code = _exit_code(exc)
        if code is None:
            raise
        echo(f"error: {exc}", err=True)
        sys.exit(code)
