"""The uid pool: which uid a workspace's sandboxed code runs as when the daemon is root."""

from __future__ import annotations

import os

import pytest

from evolver.config import ConfigError, load_config
from sandbox.uids import UID_MAX, UidPool

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="handing a directory to another uid needs root")


def owner_of(pool: UidPool, path) -> tuple[int, int]:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return pool.claim(fd)
    finally:
        os.close(fd)


@needs_root
def test_each_new_workspace_gets_the_next_uid_and_keeps_it(tmp_path):
    pool = UidPool(base=2_000_000_000, count=3, uid=65534, gid=65534)
    dirs = [tmp_path / str(i) for i in range(4)]
    for path in dirs:
        path.mkdir()
    owners = [owner_of(pool, path) for path in dirs]
    assert all(uid == gid and uid in pool for uid, gid in owners)
    assert len({uid for uid, _ in owners[:3]}) == 3  # three workspaces, three uids
    assert owners[3] == owners[0]  # the fourth wraps around to the first
    for path, (uid, gid) in zip(dirs, owners):
        assert (path.stat().st_uid, path.stat().st_gid) == (uid, gid)  # the directory records it
        assert owner_of(pool, path) == (uid, gid)  # seen again: the same uid, however often


@needs_root
def test_a_directory_owned_outside_the_pool_is_handed_to_a_pool_uid(tmp_path):
    pool = UidPool(base=2_000_000_000, count=8, uid=65534, gid=65534)
    path = tmp_path / "ws"
    path.mkdir()
    os.chown(path, 65534, 65534)  # a workspace from before the pool, or someone else's uid
    uid, gid = owner_of(pool, path)
    assert uid in pool and (path.stat().st_uid, path.stat().st_gid) == (uid, gid)
    os.chown(path, uid, 12345)  # a pool uid with a foreign group is not taken as the record
    assert owner_of(pool, path)[0] in pool and path.stat().st_gid == path.stat().st_uid


@needs_root
def test_with_no_pool_every_workspace_gets_the_one_unprivileged_uid(tmp_path):
    pool = UidPool(base=2_000_000_000, count=0, uid=65534, gid=65533)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        assert owner_of(pool, tmp_path / name) == (65534, 65533)
        assert (tmp_path / name).stat().st_uid == 65534
    assert 2_000_000_000 not in pool


@pytest.mark.parametrize("base,count", [(0, 10), (UID_MAX - 5, 10), (1, -1)])
def test_a_range_outside_the_usable_uids_is_refused(base, count):
    with pytest.raises(ValueError, match="not a usable range of uids"):
        UidPool(base=base, count=count, uid=65534, gid=65534)


def test_the_settings_bound_the_range_to_usable_uids(tmp_path):
    path = tmp_path / "evolver.toml"
    path.write_text("[sandbox]\ntask_uid_base = 4294967295\n")
    with pytest.raises(ConfigError, match="task_uid_base"):
        load_config(path)
    path.write_text("[sandbox]\ntask_uids = 0\ntask_uid_base = 100000\n")
    settings = load_config(path).sandbox
    assert (settings.task_uids, settings.task_uid_base) == (0, 100000)
