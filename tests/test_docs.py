"""The README is a front page and the manual behind it is whole: what a newcomer reads first stays short and
runs as CI runs it, the reference equals the code, and the manual builds with no broken link.

- `scripts/gen-reference` writes docs/reference/ from the code (settings, CLI, HTTP API): the committed pages
  must be what it writes now, so after changing a setting, a command or a route, run it and commit them.
- `mkdocs build --strict` fails on a broken link or anchor and on a page left out of mkdocs.yml's nav.
- The README's two commands come first, and the test command is `.ci/run`'s, byte for byte.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
REFERENCE = REPO / "docs" / "reference"
GENERATED = ("settings.md", "cli.md", "api.md")


def _fenced(text: str, language: str = "sh") -> list[str]:
    """The bodies of the ```language blocks of a Markdown text, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```$", text, flags=re.DOTALL | re.MULTILINE)


def _ci_test_command() -> str:
    lines = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    return lines[lines.index("# --- the README's test command ---") + 1]


def test_the_reference_pages_are_what_the_code_generates(tmp_path):
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen-reference"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    for name in GENERATED:
        committed = (REFERENCE / name).read_text(encoding="utf-8")
        generated = (tmp_path / name).read_text(encoding="utf-8")
        assert committed == generated, (
            f"docs/reference/{name} differs from the code; run "
            "`.venv/bin/python scripts/gen-reference` and commit the result"
        )


def test_the_manual_builds_strictly(tmp_path):
    if importlib.util.find_spec("mkdocs") is None:
        if os.environ.get("CI", "").strip().lower() == "true":
            pytest.fail("mkdocs is not installed on CI; the test extra brings mkdocs-material", pytrace=False)
        pytest.skip("mkdocs is not installed: pip install '.[test]'")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "reference" / "settings" / "index.html").exists()


def test_the_readme_is_a_front_page_whose_two_commands_come_first_and_run_as_ci_runs_them():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200, "the README is a front page: what is longer belongs in docs/"
    install_and_demo, install_and_test = _fenced(text)[:2]
    assert install_and_demo.rstrip("\n").endswith(".venv/bin/evolver demo")
    assert install_and_test.rstrip("\n") == _ci_test_command(), "the README's test command is .ci/run's"
    install = (REPO / "docs" / "install.md").read_text(encoding="utf-8")
    assert _fenced(install)[:2] == [install_and_demo, install_and_test], "docs/install.md gives the same commands"


def test_the_readme_links_only_to_files_that_exist():
    text = README.read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert targets, "the README links into the manual"
    missing = [t for t in targets if "://" not in t and not (REPO / t).exists()]
    assert not missing, f"the README links to files that do not exist: {missing}"
