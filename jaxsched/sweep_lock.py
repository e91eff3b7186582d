"""One writer per sweep store: an exclusive lock on a file in the output folder, holding its
owner (host, pid, process, command, start time) so that a refused run can say who is writing.

`jaxsched sweep -o OUT` holds `OUT/sweep.lock` (process `i` > 0 of a multi-host run holds
`OUT/sweep.lock.<i>` as well; process 0 holds `OUT/sweep.lock` for the whole run) from before it
creates, checks or replaces the store until it has written `sweep.nc`. A second run on the same
store (the same command started twice, a `--resume` while the first is still going, two hosts
given the same `--process-id`) is refused with an error naming the owner; it writes nothing.

The lock is `flock(2)`: the kernel drops it when its process ends, however it ends (SIGKILL
included), and NFS drops a lost client's locks when its lease expires, so a lock whose owner is
gone is free without any timeout or guess about process ids. The owner record such a run leaves
in the file is then reported as stale and replaced. The file is removed on release; a process
that locked the file just before it was removed sees that the path now names another file (or
none) and tries again, so two processes never hold locks on two different files.

OUT must be on a filesystem whose locks are coherent between every host that writes the store
(local disks, NFS, Lustre mounted with `-o flock`, GPFS); a filesystem without locks is an error.
"""

from __future__ import annotations

import dataclasses
import datetime
import errno
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

from .errors import JaxschedError, os_error

LOCK = "sweep.lock"
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)
_READ_TRIES, _READ_WAIT_S = 20, 0.05  # a new owner writes its record right after locking


def lock_path(out: Path, process_index: int) -> Path:
    """The lock file of process `process_index` of a run writing `out`."""
    return out / (LOCK if process_index == 0 else f"{LOCK}.{process_index}")


@dataclasses.dataclass(frozen=True)
class Owner:
    """Who holds (or held) a lock."""

    host: str
    pid: int
    process: str  # "i of n" under jax.distributed, else "0 of 1"
    started: str  # UTC, ISO 8601
    command: str

    @classmethod
    def me(cls, process_index: int, process_count: int) -> "Owner":
        return cls(host=socket.gethostname(), pid=os.getpid(), process=f"{process_index} of {process_count}",
                   started=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   command=" ".join([Path(sys.argv[0]).name, *sys.argv[1:]]))

    def describe(self) -> str:
        process = "" if self.process == "0 of 1" else f", process {self.process}"
        return f"pid {self.pid} on host {self.host}{process}, since {self.started} ({self.command})"


def _record(fd: int) -> Owner | None:
    """The owner record in the lock file `fd`, or None if it holds none (yet)."""
    data = os.pread(fd, 1 << 16, 0)
    try:
        return Owner(**json.loads(data))
    except (ValueError, TypeError):
        return None


class StoreLock:
    """An exclusive, non-blocking lock on `path` with this process's owner record in it.

    `acquire()` raises `JaxschedError` naming the owner when another process holds it, and
    returns the record of a previous owner that ended without releasing it (or None)."""

    def __init__(self, path: Path, owner: Owner):
        self.path, self.owner = Path(path), owner
        self._fd: int | None = None

    def acquire(self) -> Owner | None:
        try:
            return self._acquire()
        except OSError as exc:
            if exc.errno in _NO_LOCKS:
                raise JaxschedError(str(self.path), "cannot be locked",
                                    f"this filesystem does not support file locks ({os.strerror(exc.errno)}); "
                                    "jaxsched needs them to keep two runs from writing one store") from None
            raise JaxschedError(str(self.path), "cannot be written", os_error(exc)) from None

    def _acquire(self) -> Owner | None:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = None
                for _ in range(_READ_TRIES):
                    holder = _record(fd)
                    if holder is not None:
                        break
                    time.sleep(_READ_WAIT_S)
                os.close(fd)
                who = holder.describe() if holder else "a process that has not written its record yet"
                raise JaxschedError(str(self.path.parent), "in use",
                                    f"another jaxsched sweep is writing this output: {who}; wait for it to "
                                    f"finish, or stop it and continue with --resume") from None
            except OSError:
                os.close(fd)
                raise
            try:
                current = os.stat(self.path)
                mine = os.fstat(fd)
                same = (current.st_dev, current.st_ino) == (mine.st_dev, mine.st_ino)
            except FileNotFoundError:
                same = False
            if not same:  # released and removed by its owner after we opened it: try the new file
                os.close(fd)
                continue
            try:
                stale = _record(fd)
                os.ftruncate(fd, 0)
                os.pwrite(fd, json.dumps(dataclasses.asdict(self.owner)).encode(), 0)
                os.fsync(fd)
            except OSError:  # a full disk, say: leave no lock file without an owner behind
                self.path.unlink(missing_ok=True)
                os.close(fd)
                raise
            self._fd = fd
            return stale

    def release(self) -> None:
        """Remove the file, then unlock it (the order keeps a waiting process off a removed file)."""
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        finally:
            os.close(self._fd)
            self._fd = None
