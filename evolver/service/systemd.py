"""A systemd user unit that runs the daemon in the foreground, as systemd expects."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

__all__ = ["unit_path", "render_unit"]


def unit_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "systemd" / "user" / "evolver.service"


def render_unit(*, config_path: str | None, data_dir: str | None, stop_timeout_s: float) -> str:
    args = [sys.executable, "-m", "evolver"]
    if config_path:
        args += ["--config", str(Path(config_path).absolute())]
    if data_dir:
        args += ["--data-dir", str(Path(data_dir).absolute())]
    args += ["up", "--foreground"]
    return f"""[Unit]
Description=evolver: a self-evolving agent daemon with experience memory
After=network.target

[Service]
Type=simple
ExecStart={shlex.join(args)}
# SIGTERM drains: running tasks stop at a step boundary and are re-queued for the next start.
KillSignal=SIGTERM
TimeoutStopSec={int(stop_timeout_s) + 15}
Restart=on-failure
RestartSec=5

[Install]
WantedBy=default.target
"""
