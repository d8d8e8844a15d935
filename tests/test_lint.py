"""Lint, format and types, over the whole tree ([tool.ruff] and [tool.mypy] in pyproject.toml say which rules
and why): a finding fails the tests as a broken contract does."""

from __future__ import annotations

import subprocess
import sys

import pytest
from _helpers import REPO


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=600)


def test_ruff_finds_nothing_to_lint():
    done = _run("ruff", "check", "--no-cache", "--output-format", "concise", ".")
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_finds_nothing_to_reformat():
    done = _run("ruff", "format", "--no-cache", "--check", ".")
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow  # a whole mypy run: most of a minute without its cache
def test_mypy_finds_no_type_errors():
    done = _run("mypy")
    assert done.returncode == 0, done.stdout + done.stderr
