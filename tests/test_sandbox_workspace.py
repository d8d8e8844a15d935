"""The host's file helpers never leave the workspace, whatever sandboxed code planted in it."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from _helpers import without_bubblewrap

from sandbox import (
    Limits,
    SandboxError,
    SandboxUnavailable,
    WorkspaceError,
    list_dir,
    make_sandbox,
    read_text,
    write_text,
)


@pytest.fixture
def workspace(tmp_path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    (path / "notes.txt").write_text("inside\n")
    (path / "src").mkdir()
    (path / "src" / "main.py").write_text("print('hi')\n")
    return path


@pytest.fixture
def secret(tmp_path) -> Path:
    path = tmp_path / "outside" / "secret.txt"
    path.parent.mkdir()
    path.write_text("the-secret-value")
    return path


def test_files_inside_are_read_written_and_listed(workspace):
    assert read_text(workspace, "notes.txt") == "inside\n"
    assert read_text(workspace, "/workspace/src/main.py") == "print('hi')\n"  # the sandbox's own path
    assert write_text(workspace, "out/deep/result.txt", "héllo") == len("héllo".encode())
    assert (workspace / "out" / "deep" / "result.txt").read_text() == "héllo"
    entries = {entry.name: entry.kind for entry in list_dir(workspace)}
    assert entries == {"notes.txt": "file", "src": "dir", "out": "dir"}
    assert [entry.name for entry in list_dir(workspace, "src")] == ["main.py"]


@pytest.mark.parametrize(
    "path", ["../outside/secret.txt", "src/../../outside/secret.txt", "/etc/passwd", "/workspace/../etc/passwd", ".."]
)
def test_paths_that_leave_the_workspace_are_refused(workspace, secret, path):
    with pytest.raises(WorkspaceError):
        read_text(workspace, path)
    with pytest.raises(WorkspaceError):
        write_text(workspace, path, "overwritten")
    assert secret.read_text() == "the-secret-value"


def test_symlinks_pointing_outside_are_refused_not_followed(workspace, secret):
    (workspace / "link-to-secret").symlink_to(secret)
    (workspace / "link-to-dir").symlink_to(secret.parent)
    (workspace / "relative-escape").symlink_to("../outside/secret.txt")
    (workspace / "src" / "up").symlink_to("../..")
    for path in ("link-to-secret", "link-to-dir/secret.txt", "relative-escape", "src/up/outside/secret.txt"):
        with pytest.raises(WorkspaceError, match="symbolic link"):
            read_text(workspace, path)
        with pytest.raises(WorkspaceError, match="symbolic link"):
            write_text(workspace, path, "overwritten")
    with pytest.raises(WorkspaceError):
        list_dir(workspace, "link-to-dir")
    assert secret.read_text() == "the-secret-value"
    assert {e.name: e.kind for e in list_dir(workspace)}["link-to-secret"] == "symlink"


def test_symlinks_that_stay_inside_are_followed(workspace):
    (workspace / "alias.txt").symlink_to("notes.txt")
    (workspace / "code").symlink_to("/workspace/src")  # written in the sandbox's terms
    assert read_text(workspace, "alias.txt") == "inside\n"
    assert read_text(workspace, "code/main.py") == "print('hi')\n"
    write_text(workspace, "alias.txt", "changed")
    assert (workspace / "notes.txt").read_text() == "changed" and (workspace / "alias.txt").is_symlink()


def test_link_loops_fifos_and_hard_links_are_refused(workspace, secret):
    (workspace / "loop-a").symlink_to("loop-b")
    (workspace / "loop-b").symlink_to("loop-a")
    with pytest.raises(WorkspaceError, match="too many levels"):
        read_text(workspace, "loop-a")
    os.mkfifo(workspace / "pipe")
    with pytest.raises(WorkspaceError, match="not a regular file"):
        read_text(workspace, "pipe")  # and it does not hang waiting for a writer
    os.link(secret, workspace / "hard")
    with pytest.raises(WorkspaceError, match="hard links"):
        read_text(workspace, "hard")
    with pytest.raises(WorkspaceError, match="hard links"):
        write_text(workspace, "hard", "overwritten")
    assert secret.read_text() == "the-secret-value"


def test_big_files_and_missing_files_are_clear_errors(workspace):
    (workspace / "big.log").write_bytes(b"x" * 5000)
    with pytest.raises(SandboxError, match="5,000 bytes"):
        read_text(workspace, "big.log", max_bytes=1000)
    with pytest.raises(SandboxError, match="'missing.txt' in the workspace: No such file") as missing:
        read_text(workspace, "missing.txt")
    assert isinstance(missing.value.__cause__, FileNotFoundError)
    with pytest.raises(SandboxError, match="src"):
        read_text(workspace, "src")


@pytest.mark.skipif(os.geteuid() != 0, reason="only root hands files to another uid")
def test_files_written_by_root_belong_to_the_workspace_owner(workspace):
    os.chown(workspace, 65534, 65534)
    write_text(workspace, "new/dir/file.txt", "x")
    for path in (workspace / "new", workspace / "new" / "dir", workspace / "new" / "dir" / "file.txt"):
        assert (path.stat().st_uid, path.stat().st_gid) == (65534, 65534)


def test_links_planted_from_inside_a_real_sandbox_are_refused(tmp_path):
    try:
        box = make_sandbox(require_isolation=True)
    except SandboxUnavailable as exc:
        without_bubblewrap(exc)
    outside = Path(tempfile.mkdtemp(prefix="evolver-sbx-target-"))
    try:
        (outside / "secret.txt").write_text("the-secret-value")
        workspace = tmp_path / "ws"
        workspace.mkdir()
        result = box.python(
            "import os\n"
            f"os.symlink({str(outside / 'secret.txt')!r}, 'evil')\n"
            f"os.symlink({str(outside)!r}, 'evil-dir')\n"
            "os.symlink('/etc/passwd', 'passwd')\n"
            "os.symlink('..', 'parent')\n",
            workspace=workspace,
            limits=Limits(timeout_s=10),
        )
        assert result.ok, result
        for path in ("evil", "evil-dir/secret.txt", "passwd", "parent/ws/../secret.txt"):
            with pytest.raises(WorkspaceError):
                read_text(workspace, path)
        with pytest.raises(WorkspaceError):
            write_text(workspace, "evil", "overwritten")
        assert (outside / "secret.txt").read_text() == "the-secret-value"
    finally:
        shutil.rmtree(outside, ignore_errors=True)
