"""Synthesized tools on disk: one directory per tool, one source and one test file per version.

``<root>/<name>/v<version>.py`` holds the function and ``v<version>_test.py``
its tests. Files are written atomically (temporary file, fsync, rename, fsync
of the directory) before the database row that points at them is committed,
so a row never names a missing file. Reading checks the content against the
hash the row recorded: a file changed or damaged on disk is never served.
"""

from __future__ import annotations

import os
from pathlib import Path

from .spec import NAME, code_hash

__all__ = ["ToolFiles", "ToolFileError"]


class ToolFileError(OSError):
    """A tool's files are missing or do not match the hash its row recorded."""


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ToolFiles:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def _paths(self, name: str, version: int) -> tuple[Path, Path]:
        if not NAME.match(name) or version < 1:  # the name becomes a path: never let it climb out
            raise ToolFileError(f"not a tool name and version: {name!r} v{version}")
        folder = self.root / name
        return folder / f"v{version}.py", folder / f"v{version}_test.py"

    def write(self, name: str, version: int, code: str, tests: str) -> str:
        """Write one version durably; returns its hash."""
        source, test = self._paths(name, version)
        source.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        _write_atomic(source, code)
        _write_atomic(test, tests)
        _fsync_dir(source.parent)
        return code_hash(code, tests)

    def read(self, name: str, version: int, expected_hash: str) -> tuple[str, str]:
        """The code and tests of one version, refused unless they match ``expected_hash``."""
        source, test = self._paths(name, version)
        try:
            code, tests = source.read_text(encoding="utf-8"), test.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ToolFileError(f"tool {name} v{version}: cannot read its files under {source.parent}: {exc}") from exc
        if code_hash(code, tests) != expected_hash:
            raise ToolFileError(
                f"tool {name} v{version}: its files under {source.parent} changed since it was "
                f"registered (hash {code_hash(code, tests)}, recorded {expected_hash})"
            )
        return code, tests
