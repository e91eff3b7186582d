"""A sweep store that cannot lie: two processes on one store, a disk that fills up (injected at a
zarr write, and for real on a small tmpfs where the test may mount one), chunk files truncated
or overwritten, and `jaxsched check` (`--against`). Every case ends in a store equal to an
uninterrupted run, or in a one-line error that leaves the store valid for `--resume`.

One spec of 12 configurations in 6 chunks of 2 (`--chunk 2`); the in-process runs share one
compilation, the subprocesses a persistent compilation cache.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from zarr.storage import LocalStore

from helpers import tiny_sweep_spec

from jaxsched import sweep, sweep_check, sweep_integrity
from jaxsched.cli import main
from jaxsched.errors import JaxschedError
from jaxsched.sweep_lock import LOCK, Owner, StoreLock, lock_path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(sys.executable).parent / "jaxsched"
SPEC = tiny_sweep_spec("store", 7, "\"policy.warp\" = [\"lrr\", \"gto\"]\n\"clocks.sigma\" = [0.0, 0.05, 0.1]\n")
N_CHUNKS = 6


def _sweep(work: Path, out: Path, *extra: str) -> int:
    return main(["sweep", str(work / "spec.toml"), "-o", str(out), "--chunk", "2", *extra])


def _error_lines(err: str, command: str = "sweep") -> list[str]:
    assert "Traceback" not in err, err
    return [line for line in err.splitlines() if line.startswith(f"jaxsched {command}: error: ")]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("store")
    (tmp / "spec.toml").write_text(SPEC)
    return tmp


@pytest.fixture(scope="module")
def reference(work) -> Path:
    """An uninterrupted run."""
    out = work / "reference"
    assert _sweep(work, out) == 0
    return out


def _identical(out: Path, reference: Path, capsys) -> None:
    """`jaxsched check OUT --against REFERENCE` passes: every chunk intact, sweep.nc equal to the
    store, the dataset equal to the reference."""
    capsys.readouterr()
    rc = main(["check", str(out), "--against", str(reference)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "every done chunk matches its checksum" in text and "sweep.nc: equals the store" in text
    assert f"against {reference}: identical" in text


# --------------------------------------------------------------------------- two writers


def _start(work: Path, out: Path, *extra: str, throttle: float = 0.0) -> subprocess.Popen:
    """`jaxsched sweep` in a subprocess, in chunks of 4 (another chunking than the reference's)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=str(work / "jax_cache"),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", PYTHONUNBUFFERED="1")
    env[sweep.THROTTLE_ENV] = str(throttle)
    return subprocess.Popen([str(SCRIPT), "sweep", str(work / "spec.toml"), "-o", str(out), "--chunk", "4", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def _chunks_done(store: Path) -> int:
    try:
        return int(sweep.store_progress(store)[2].sum())
    except JaxschedError:  # not created yet
        return 0


@pytest.fixture(scope="module")
def concurrent(work) -> dict:
    """A sweep, and while it runs the same command again and a --resume of it. The first is
    held (SIGSTOP) after its first chunk, lock and all, while the others try, so that the
    outcome does not depend on timing."""
    out = work / "concurrent"
    first = _start(work, out, throttle=0.5)
    t0 = time.monotonic()
    while _chunks_done(out / sweep.STORE) < 1:
        assert first.poll() is None, first.communicate()
        assert time.monotonic() - t0 < 240, "no chunk recorded in time"
        time.sleep(0.05)
    first.send_signal(signal.SIGSTOP)
    try:
        log = {"out": out, "pid": first.pid, "owner": json.loads((out / LOCK).read_text()),
               "files": sorted(p.relative_to(out) for p in out.rglob("*"))}
        others = [_start(work, out), _start(work, out, "--resume")]
        log["others"] = [(other.communicate(timeout=240)[1], other.returncode) for other in others]
        log["files_after"] = sorted(p.relative_to(out) for p in out.rglob("*"))
    finally:
        first.send_signal(signal.SIGCONT)
    log["err"] = first.communicate(timeout=240)[1]
    log["rc"] = first.returncode
    return log


def test_a_second_writer_is_refused_naming_the_first(concurrent):
    """The same command started twice, and a --resume while the first run is going: both are
    refused (exit 2, one line) with the first run's pid and host, and write nothing."""
    assert concurrent["owner"]["pid"] == concurrent["pid"]
    for err, rc in concurrent["others"]:
        assert rc == 2, err
        (line,) = _error_lines(err)
        assert f"{concurrent['out']} = 'in use'" in line, line
        assert f"pid {concurrent['pid']} on host {concurrent['owner']['host']}" in line, line
    assert concurrent["files_after"] == concurrent["files"]


def test_the_first_writer_completes_a_correct_store(concurrent, reference, capsys):
    assert concurrent["rc"] == 0, concurrent["err"]
    assert not (concurrent["out"] / LOCK).exists()
    _identical(concurrent["out"], reference, capsys)


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


# --------------------------------------------------------------------------- a full disk


@pytest.mark.parametrize("key", ["stall_fraction/1.0.0.0", "integrity/sha256/3.0.0", "done/1.0.0"])
def test_disk_full_while_writing_a_chunk_then_resume(work, reference, monkeypatch, capsys, key):
    """ENOSPC at one file of chunk 3 (its data, its checksum or its done entry): one error line
    naming the chunk and the error; chunks 0-2 stay done and intact, chunk 3 is not done; after
    `--resume` the dataset equals an uninterrupted run."""
    out = work / f"full_{key.split('/')[0]}"
    store = out / sweep.STORE
    write = LocalStore.set

    def part_written() -> bool:
        return any(p.parent.name in sweep.VARIABLES for p in store.glob("*/1.0.0*"))

    # The data case fills the disk at chunk 3's second variable, whichever it is: zarr may write
    # a chunk's variables one by one or several at once, in an order a loaded machine varies, so
    # the first one written lands and every later one fails once it has.
    landed, started = [], []

    async def disk_full_at(self, k, value):
        path = Path(self.root) / k
        if key.startswith("stall_fraction/") and path.parent.name in sweep.VARIABLES and path.name.startswith("1.0.0"):
            if started:
                while not landed:
                    await asyncio.sleep(0.01)
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            started.append(k)
            out = await write(self, k, value)
            landed.append(k)
            return out
        if path.as_posix().endswith(key):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return await write(self, k, value)

    monkeypatch.setattr(LocalStore, "set", disk_full_at)
    capsys.readouterr()
    assert _sweep(work, out) == 2
    (line,) = _error_lines(capsys.readouterr().err)
    assert "chunk 3 (policy_warp[1], clocks_sigma[0], replicate[0:2]) not written" in line, line
    assert "No space left on device [errno 28]" in line and "--resume" in line, line
    monkeypatch.undo()
    _, _, chunks = sweep.store_progress(store)
    assert chunks.tolist() == [True] * 3 + [False] * 3
    assert part_written()  # the chunk was part-written when the disk filled
    ok, lines = sweep_check.check_result(out)
    assert ok and "3/6 chunks done (6/12 configurations)" in lines[0], lines
    assert not (out / LOCK).exists() and not (out / sweep.NETCDF).exists()
    assert _sweep(work, out, "--resume") == 0
    _identical(out, reference, capsys)


def _fill(disk: Path, leave_bytes: int) -> Path:
    """Fill the filesystem at `disk` with one file, then free `leave_bytes` of it."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        for block in (1 << 16, 1 << 12):
            try:
                while True:
                    os.write(fd, b"\0" * block)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    os.truncate(filler, max(0, filler.stat().st_size - leave_bytes))
    return filler


@pytest.fixture
def small_disk(tmp_path) -> Path:
    """A 4 MB tmpfs, mounted for the test and removed after; skipped where mounting is not
    allowed (the injected-ENOSPC test covers the same paths there)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root")
    yield disk
    subprocess.run(["umount", str(disk)], check=True)


def test_a_real_full_disk_while_writing_chunks_and_the_netcdf(work, reference, small_disk, capsys):
    """On a full tmpfs a sweep fails at once and leaves nothing. With room for the store and
    about a chunk and a half, it fails inside a chunk with ENOSPC and leaves a valid store; with
    space freed, `--resume` completes it. Then the netCDF alone on a full disk: an error, no
    partial file, and `--resume` writes it."""
    out = small_disk / "out"
    filler = _fill(small_disk, 0)
    capsys.readouterr()
    assert _sweep(work, out) == 2  # a full disk from the start: nothing left behind
    (line,) = _error_lines(capsys.readouterr().err)
    assert "No space left on device [errno 28]" in line, line
    assert not any(out.iterdir())
    filler.unlink()
    spec = sweep.load(work / "spec.toml")
    sweep.create_store(out / sweep.STORE, spec, sweep.make_layout(spec, 2), "test")
    filler = _fill(small_disk, 24 * 4096)  # a chunk takes about 15 pages of 4 KB
    assert _sweep(work, out, "--resume") == 2
    (line,) = _error_lines(capsys.readouterr().err)
    assert "not written': No space left on device [errno 28]" in line, line
    _, _, chunks = sweep.store_progress(out / sweep.STORE)
    assert 1 <= chunks.sum() < N_CHUNKS and not chunks[int(chunks.sum()):].any()
    assert sweep_check.check_result(out)[0]
    filler.unlink()
    assert _sweep(work, out, "--resume") == 0
    _identical(out, reference, capsys)

    (out / sweep.NETCDF).unlink()
    filler = _fill(small_disk, 4096)  # room for the lock file, not for the netCDF
    assert _sweep(work, out, "--resume") == 2
    (line,) = _error_lines(capsys.readouterr().err)
    assert f"{out / sweep.NETCDF} = 'not written': No space left on device [errno 28]" in line, line
    assert not (out / sweep.NETCDF).exists() and not list(out.glob("*.partial"))
    filler.unlink()
    assert _sweep(work, out, "--resume") == 0
    _identical(out, reference, capsys)


# --------------------------------------------------------------------------- corruption


def test_changed_chunk_files_are_reported_and_recomputed(work, reference, capsys):
    """A truncated data file, a data file overwritten with another chunk's (valid, different)
    data, and a truncated done entry: `jaxsched check` names each chunk and exits 1; `--resume`
    recomputes exactly those three and the dataset equals an uninterrupted run."""
    out = work / "damaged"
    shutil.copytree(reference, out)
    store = out / sweep.STORE
    os.truncate(store / "makespan_ns" / "0.1.0", 10)
    shutil.copy(store / "makespan_ns" / "0.0.0", store / "makespan_ns" / "0.2.0")  # sigma 0 over sigma 0.1
    with pytest.raises(JaxschedError, match="2 chunks changed on disk"):
        sweep.write_netcdf(store, out / "again.nc")
    os.truncate(store / "done" / "1.2.0", 3)
    capsys.readouterr()
    assert main(["check", str(out)]) == 1
    text = capsys.readouterr().out
    assert "chunk 1 (policy_warp[0], clocks_sigma[1], replicate[0:2]): makespan_ns unreadable" in text, text
    assert "chunk 2 (policy_warp[0], clocks_sigma[2], replicate[0:2]): makespan_ns differs from its checksum" in text
    assert "chunk 5 (policy_warp[1], clocks_sigma[2], replicate[0:2]): its done record cannot be read" in text
    assert "damaged chunks: 3" in text and "not compared with the store" in text
    assert _sweep(work, out, "--resume") == 0
    err = capsys.readouterr().err
    assert "verified 5 chunks done against their checksums: 2 changed on disk" in err, err
    for i in (1, 2, 5):
        assert f"chunk {i} (" in err and "recomputing it" in err
    assert "resuming: 6 of 12 configurations already done (3/6 chunks); computing 6" in err, err
    _identical(out, reference, capsys)


def test_a_store_from_before_checksums_is_not_trusted(work, reference, capsys):
    """A store_version 1 store (no checksums): `check` says there is nothing to verify and
    `--resume` refuses it, both in one line with exit code 2."""
    out = work / "version1"
    shutil.copytree(reference, out)
    store = out / sweep.STORE
    shutil.rmtree(store / "integrity")
    for name in (".zattrs", ".zmetadata"):
        doc = json.loads((store / name).read_text())
        attrs = doc["metadata"][".zattrs"] if name == ".zmetadata" else doc
        attrs["store_version"] = 1
        (store / name).write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["check", str(out)]) == 2
    (line,) = _error_lines(capsys.readouterr().err, "check")
    assert "made before chunk checksums" in line, line
    assert _sweep(work, out, "--resume") == 2
    (line,) = _error_lines(capsys.readouterr().err)
    assert "store_version 1" in line and "made by another jaxsched version" in line, line


# --------------------------------------------------------------------------- comparison


@pytest.fixture(scope="module")
def rechunked(concurrent) -> Path:
    """The reference's spec, run in chunks of 4 by another process."""
    assert concurrent["rc"] == 0, concurrent["err"]
    return concurrent["out"]


def test_check_against_ignores_only_what_differs_by_design(reference, rechunked, capsys, tmp_path):
    """Another chunking, run by another process (its own chunk_shape, history and device)
    compares identical; one value changed in a copy of the netCDF is found, and so is a
    netCDF that no longer equals its store."""
    _identical(rechunked, reference, capsys)
    ds = xr.open_dataset(reference / sweep.NETCDF, engine="h5netcdf").load()
    other_chunks = xr.open_dataset(rechunked / sweep.NETCDF, engine="h5netcdf").attrs["chunk_shape"]
    assert list(ds.attrs["chunk_shape"]) != list(other_chunks)
    ds["makespan_ns"][1, 2, 0] = ds["makespan_ns"][1, 2, 0] + 1.0
    ds.attrs["title"] = "changed"
    ds.to_netcdf(tmp_path / "changed.nc", engine="h5netcdf")
    assert main(["check", str(reference), "--against", str(tmp_path / "changed.nc")]) == 1
    text = capsys.readouterr().out
    assert "variable makespan_ns: 1 of 12 values differ" in text and "attribute title: 'store' against 'changed'" in text
    assert "history" not in text.split("against")[-1]
    copy = tmp_path / "copy"
    shutil.copytree(reference, copy)
    shutil.copy(tmp_path / "changed.nc", copy / sweep.NETCDF)
    assert main(["check", str(copy)]) == 1
    assert "sweep.nc: differs from the store:" in capsys.readouterr().out


def test_two_runs_of_one_spec_differ_only_in_volatile_attributes(reference, rechunked):
    """attrs aside from VOLATILE_ATTRS, two runs give identical datasets, bit for bit."""
    ours = sweep.open_result(reference / sweep.NETCDF).load()
    theirs = sweep.open_result(rechunked / sweep.NETCDF).load()
    for ds in (ours, theirs):
        ds.attrs = {k: v for k, v in ds.attrs.items() if k not in sweep_check.VOLATILE_ATTRS}
    xr.testing.assert_identical(ours, theirs)
    assert np.array_equal(ours["makespan_ns"].values, theirs["makespan_ns"].values, equal_nan=True)
    assert sweep_integrity.recorded(rechunked / sweep.STORE)[1].any(axis=(1, 2)).all()
