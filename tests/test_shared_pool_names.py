"""Shared page pool names: a name that is not portable is refused before anything is created,
a long portable name works, and a failed creation leaves no lock file behind."""

from __future__ import annotations

import os
import uuid

import pytest

from kvnumba import PagePool

BAD_NAMES = [None, "", "a/b", "../x", "x\0y", ".", "..", ".hidden", "a" * 201, 5, "sp ace"]


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_shared_pool_refuses_a_bad_name_and_creates_nothing(name):
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    before = set(os.listdir(shm)) if shm else set()
    parent = set(os.listdir(os.path.dirname(shm))) if shm else set()
    with pytest.raises(ValueError, match="name"):
        PagePool.shared(name, 2)
    with pytest.raises(ValueError, match="name"):
        PagePool.attach(name)
    if shm:
        assert set(os.listdir(shm)) == before
        assert set(os.listdir(os.path.dirname(shm))) == parent


def test_shared_pool_accepts_a_long_portable_name():
    name = f"kvn-t-{uuid.uuid4().hex}".ljust(200, "x")
    pool = PagePool.shared(name, 2)
    try:
        assert pool.name == name
        pool.check()
    finally:
        pool.close()
        pool.unlink()


def test_failed_shared_creation_leaves_no_lock_file(monkeypatch):
    import kvnumba.pages.pool as pages

    def fail(*args, **kwargs):
        raise OSError("no room")

    monkeypatch.setattr(pages, "open_shm", fail)  # the name the pool module calls
    name = f"kvn-t-{uuid.uuid4().hex[:12]}"
    with pytest.raises(OSError, match="no room"):
        PagePool.shared(name, 2)
    assert not os.path.exists(pages.lock_path(name))
