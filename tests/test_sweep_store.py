"""A sweep store that cannot lie: one writer per output folder (`sweep_lock`)."""

from __future__ import annotations

import errno
import fcntl
import json
import os

import pytest

from jaxsched.errors import JaxschedError
from jaxsched.sweep_lock import LOCK, Owner, StoreLock, lock_path


def test_lock_names_its_owner_and_is_one_per_process_id(tmp_path):
    """Two holders of one process id's lock (two hosts given the same --process-id): the second
    is refused with the first's record; process ids of one run lock separate files."""
    me = Owner.me(1, 2)
    first = StoreLock(lock_path(tmp_path, 1), me)
    assert first.acquire() is None
    with pytest.raises(JaxschedError, match=f"in use.*pid {os.getpid()} on host {me.host}, process 1 of 2"):
        StoreLock(lock_path(tmp_path, 1), Owner.me(1, 2)).acquire()
    process0 = StoreLock(lock_path(tmp_path, 0), Owner.me(0, 2))
    assert process0.acquire() is None and lock_path(tmp_path, 0) != lock_path(tmp_path, 1)
    first.release()
    process0.release()
    assert not any(tmp_path.iterdir())


def test_a_lock_left_by_a_killed_run_is_taken_over(tmp_path):
    """A record with no lock on it (its process was killed): taken over, and reported."""
    gone = Owner(host="elsewhere", pid=123456, process="0 of 1", started="2026-01-01T00:00:00+00:00",
                 command="jaxsched sweep spec.toml -o out")
    (tmp_path / LOCK).write_text(json.dumps(gone.__dict__))
    lock = StoreLock(tmp_path / LOCK, Owner.me(0, 1))
    assert lock.acquire() == gone
    assert json.loads((tmp_path / LOCK).read_text())["pid"] == os.getpid()
    lock.release()


def test_a_filesystem_without_locks_is_an_error(tmp_path, monkeypatch):
    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with pytest.raises(JaxschedError, match="does not support file locks"):
        StoreLock(tmp_path / LOCK, Owner.me(0, 1)).acquire()
