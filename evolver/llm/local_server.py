"""A local model that evolver serves itself: llama.cpp's ``llama-server`` as a supervised child process.

``[model] local`` (and ``[meta] local``) names a GGUF file, or one of the models ``scripts/real-model-setup``
fetches (``KNOWN``). The daemon then starts ``llama-server`` with parallel slots on loopback, behind an API
key made for that start and kept in a 0600 file of its private runtime directory, so another user of the
machine can reach the port but not the model. It restarts a server that died, with backoff, and stops it
on the way down. ``served`` rewrites the settings so every model call goes to the server it started.

The binary comes from ``[model] local_server``, else ``llama-server`` on PATH, else the build that
``scripts/real-model-setup`` caches.
"""

from __future__ import annotations

import ctypes
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from ..config import Config, ModelSettings
from .client import ModelError

__all__ = ["KNOWN", "LocalModelError", "LlamaServer", "ServerSpec", "LocalModels", "model_cache", "find_binary"]

log = logging.getLogger(__name__)

# The models scripts/real-model-setup fetches (sha256-checked there), by the name [model] local takes.
KNOWN = {
    "qwen2.5-coder-0.5b": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "qwen2.5-coder-1.5b": "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
}
SETUP = "scripts/real-model-setup 1.5b"
READY_TIMEOUT_S = 180.0  # loading a GGUF takes seconds; a busy machine, more
RESTART_BACKOFF_S = (1.0, 2.0, 5.0, 15.0, 60.0)  # between tries, after the first restart (at once)
STEADY_S = 300.0  # a server up this long that dies is restarted at once again
KEY_ENV = {"model": "EVOLVER_LOCAL_MODEL_KEY", "meta": "EVOLVER_LOCAL_META_KEY"}


try:  # loaded here, not between fork and exec, where loading a library may deadlock
    _LIBC: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
except OSError:
    _LIBC = None


def _die_with_parent() -> None:
    """In the server's process before exec: end when the process that started it dies, even by SIGKILL, so a
    killed daemon leaves no model server behind (PR_SET_PDEATHSIG; it fires when the starting thread ends,
    so servers are started from threads that live as long as their owner: the main thread, in the daemon)."""
    if _LIBC is not None:
        _LIBC.prctl(1, signal.SIGTERM)


class LocalModelError(ModelError):
    """A local model cannot be served; the message says what is missing and how to get it."""


def model_cache() -> Path:
    """Where ``scripts/real-model-setup`` keeps its builds and GGUFs (it honours the same variables)."""
    if os.environ.get("REAL_MODEL_CACHE"):
        return Path(os.environ["REAL_MODEL_CACHE"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "evolver-real-model"


def find_binary(setting: str = "") -> Path:
    """The ``llama-server`` to run: the setting, else PATH, else the newest build in the setup's cache."""
    if setting:
        path = Path(setting).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise LocalModelError(f"[model] local_server {setting!r} is not an executable file")
        return path
    on_path = shutil.which("llama-server")
    if on_path:
        return Path(on_path)
    built = sorted(model_cache().glob("llama-server-*/llama-server"), key=lambda p: p.stat().st_mtime)
    if built:
        return built[-1]
    raise LocalModelError(
        f"no llama-server: not on PATH and not built in {model_cache()}; run {SETUP} (builds it, about 5 min "
        "the first time) or set [model] local_server to its path"
    )


def resolve_model(local: str, section: str = "model") -> tuple[str, Path]:
    """The alias and GGUF path of ``[section] local``: a known name or a path to a .gguf file."""
    if local in KNOWN:
        path = model_cache() / KNOWN[local]
        if not path.is_file():
            raise LocalModelError(f"[{section}] local {local!r}: {path} is not there yet; run {SETUP} to fetch it")
        return local, path
    path = Path(local).expanduser()
    if not path.is_file():
        known = ", ".join(sorted(KNOWN))
        raise LocalModelError(f"[{section}] local {local!r} is neither a GGUF file nor a known model ({known})")
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise LocalModelError(f"[{section}] local {local!r} is not a GGUF file (its first bytes are not GGUF)")
    return path.stem, path


@dataclass(frozen=True)
class ServerSpec:
    binary: Path
    model: Path
    alias: str
    slots: int
    context: int  # tokens per slot
    threads: int

    def argv(self, port: int, key_file: Path) -> list[str]:
        # One unified KV cache (-kvu) of slots x context: a slot may use more than its share while others
        # are idle. No web UI: nothing but the API is served.
        return [
            str(self.binary),
            "--model",
            str(self.model),
            "--alias",
            self.alias,
            "--ctx-size",
            str(self.context * self.slots),
            "--parallel",
            str(self.slots),
            "--kv-unified",
            "--threads",
            str(self.threads),
            "--threads-batch",
            str(self.threads),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--api-key-file",
            str(key_file),
            "--no-webui",
            "--metrics",
        ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """One ``llama-server`` child: started, watched and restarted on the same port with the same key."""

    def __init__(self, spec: ServerSpec, run_dir: Path, log_path: Path, *, name: str = "model") -> None:
        self.spec = spec
        self.name = name
        self.run_dir = run_dir
        self.log_path = log_path
        self.key = secrets.token_urlsafe(32)
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self.started_at = 0.0
        self._next_try = 0.0
        self._quick_deaths = 0  # deaths in a row of a server up less than STEADY_S: what the backoff counts

    @property
    def _key_file(self) -> Path:  # one per server: two engines may share a runtime dir
        return self.run_dir / f"llama-{self.name}-{self.port}.key"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, *, wait: bool = True) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.port = self.port or _free_port()  # a restart keeps its port: the clients' settings name it
        fd = os.open(self._key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.key + "\n")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                self.spec.argv(self.port, self._key_file),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C to the daemon's terminal is the daemon's to handle
                preexec_fn=_die_with_parent,
            )
        self.started_at = time.time()
        log.info("llama-server for [%s] %s: pid %d on %s", self.name, self.spec.alias, self.proc.pid, self.base_url)
        if wait:
            self.wait_ready()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ready(self) -> bool:
        """Whether it answers /health with 200 (it answers 503 while the model loads)."""
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.ready():
            if not self.alive():
                code = self.proc.returncode if self.proc else None
                raise LocalModelError(f"llama-server for [{self.name}] exited {code}:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise LocalModelError(
                    f"llama-server for [{self.name}] was not ready in {timeout_s:g} s:\n{self.tail()}"
                )
            time.sleep(0.2)

    def supervise(self) -> bool:
        """Restart the server if it died, with backoff between tries; True when it was restarted."""
        if self.alive() or time.monotonic() < self._next_try:
            return False
        code = self.proc.returncode if self.proc else None
        self._quick_deaths = self._quick_deaths + 1 if time.time() - self.started_at < STEADY_S else 0
        delay = RESTART_BACKOFF_S[min(max(self._quick_deaths - 1, 0), len(RESTART_BACKOFF_S) - 1)]
        self._next_try = time.monotonic() + delay
        self.restarts += 1
        log.warning(
            "llama-server for [%s] exited %s; restart %d (next try in %g s)", self.name, code, self.restarts, delay
        )
        try:
            self.start(wait=False)  # the daemon's loop goes on; requests retry until it is ready
        except OSError as exc:
            log.error("llama-server for [%s] could not start: %s", self.name, exc)
            return False
        return True

    def health(self) -> dict:
        return {
            "model": self.spec.alias,
            "pid": self.proc.pid if self.alive() and self.proc else None,
            "alive": self.alive(),
            "ready": self.alive() and self.ready(),
            "slots": self.spec.slots,
            "context_per_slot": self.spec.context,
            "restarts": self.restarts,
            "url": self.base_url,
            "log": str(self.log_path),
        }

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._key_file.unlink(missing_ok=True)


def _spec(settings: ModelSettings, local: str, slots: int, section: str) -> ServerSpec:
    alias, model = resolve_model(local, section)
    return ServerSpec(
        binary=find_binary(settings.local_server),
        model=model,
        alias=alias,
        slots=slots,
        context=settings.local_context,
        threads=settings.local_threads or (os.cpu_count() or 1),
    )


def specs(config: Config) -> dict[str, ServerSpec]:
    """The servers ``config`` asks for, by section; raises ``LocalModelError`` naming what is missing."""
    m = config.model
    wanted: dict[str, ServerSpec] = {}
    if m.local:
        wanted["model"] = _spec(m, m.local, m.local_slots, "model")
    if config.meta.local:
        wanted["meta"] = _spec(m, config.meta.local, config.meta.local_slots, "meta")
    return wanted


class LocalModels:
    """The local servers of one daemon (or one CLI command): started together, watched, stopped."""

    def __init__(self, config: Config, log_dir: Path) -> None:
        run_dir = config.runtime_dir
        self.servers = {
            name: LlamaServer(spec, run_dir, log_dir / f"llama-{name}.log", name=name)
            for name, spec in specs(config).items()
        }

    def start(self) -> None:
        try:
            for server in self.servers.values():
                server.start()
        except BaseException:
            self.stop()
            raise

    def served(self, config: Config) -> Config:
        """``config`` with each local section pointed at its server: an OpenAI-compatible model, its key in
        this process's environment (where worker processes inherit it), and llama-server's JSON schemas."""
        update: dict[str, object] = {}
        for section, server in self.servers.items():
            os.environ[KEY_ENV[section]] = server.key
            reached: dict[str, object] = {
                "name": f"openai/{server.spec.alias}",
                "api_base": server.base_url,
                "api_key_env": KEY_ENV[section],
                "local": "",  # served: what reads these settings next (a worker process) starts nothing
            }
            if section == "model":  # [meta] takes these from [model]
                reached |= {"structured_output": True, "schema_format": "json_schema"}
            update[section] = getattr(config, section).model_copy(update=reached)
        return config.model_copy(update=update) if update else config

    def supervise(self) -> None:
        for server in self.servers.values():
            server.supervise()

    def health(self) -> list[dict]:
        return [{"section": name, **s.health()} for name, s in self.servers.items()]

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()


@contextmanager
def serving(config: Config, log_dir: Path) -> Iterator[tuple[Config, LocalModels]]:
    """Start ``config``'s local servers for the duration of a block; yields the settings that reach them."""
    models = LocalModels(config, log_dir)
    models.start()
    try:
        yield models.served(config), models
    finally:
        models.stop()
