"""Resume: a sweep killed part-way (SIGKILL, a real process kill), resumed, interrupted with Ctrl-C
(SIGINT), and resumed again gives a store and netCDF identical to an uninterrupted run, having
computed every chunk exactly once. Plus: --resume refuses a changed spec, an unfinished store is
not overwritten silently, and `jaxsched info` reports completion.

The subprocesses share a persistent JAX compilation cache (one compile for the whole file);
`JAXSCHED_SWEEP_THROTTLE_S` holds each process after every recorded chunk, so the kills land
part-way through deterministically.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from helpers import tiny_sweep_spec

from jaxsched import sweep, sweep_check
from jaxsched.cli import main

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(sys.executable).parent / "jaxsched"

SPEC = tiny_sweep_spec("resume", 7, "\"policy.warp\" = [\"lrr\", \"gto\"]\n\"clocks.sigma\" = [0.0, 0.05, 0.1]\n")
N_CHUNKS = 6  # 12 configurations, --chunk 2: one grid point (2 replicates) per chunk


def _env(tmp: Path, throttle: float = 0.0) -> dict:
    env = dict(os.environ)  # with the suite's XLA flags (conftest.py): a faster compile
    env.update(JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=str(tmp / "jax_cache"),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", PYTHONUNBUFFERED="1")
    env[sweep.THROTTLE_ENV] = str(throttle)
    return env


def _start(tmp: Path, out: Path, *extra: str, throttle: float = 0.0) -> subprocess.Popen:
    return subprocess.Popen([str(SCRIPT), "sweep", str(tmp / "spec.toml"), "-o", str(out), "--chunk", "2", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(tmp, throttle), cwd=ROOT)


def _chunks_done(store: Path) -> int:
    try:
        return int(sweep.store_progress(store)[2].sum())
    except Exception:  # noqa: BLE001 -- not created yet
        return 0


def _wait_for_chunks(proc: subprocess.Popen, store: Path, n: int, timeout: float = 240.0) -> None:
    t0 = time.monotonic()
    while _chunks_done(store) < n:
        assert proc.poll() is None, f"sweep exited early: {proc.communicate()}"
        assert time.monotonic() - t0 < timeout, "no chunk recorded in time"
        time.sleep(0.05)


def _chunk_mtimes(store: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in (store / "makespan_ns").iterdir() if not p.name.startswith(".")}


def _comparable(ds: xr.Dataset) -> xr.Dataset:
    """Everything but the attributes that differ between runs by design (time stamp, device)."""
    ds = ds.copy()
    ds.attrs = {k: v for k, v in ds.attrs.items() if k not in sweep_check.VOLATILE_ATTRS}
    return ds


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("resume")
    (tmp / "spec.toml").write_text(SPEC)
    return tmp


@pytest.fixture(scope="module")
def interrupted(work) -> dict:
    """Run, SIGKILL after the first chunk; resume, SIGINT after one more; resume to the end."""
    out, store = work / "out", work / "out" / sweep.STORE
    log: dict = {}

    proc = _start(work, out, throttle=1.5)
    _wait_for_chunks(proc, store, 1)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    log["killed_rc"] = proc.returncode
    log["after_kill"] = _chunks_done(store)
    log["nc_after_kill"] = (out / sweep.NETCDF).exists()
    log["mtimes_after_kill"] = _chunk_mtimes(store)

    proc = _start(work, out, "--resume", throttle=1.5)
    _wait_for_chunks(proc, store, log["after_kill"] + 1)
    proc.send_signal(signal.SIGINT)
    log["sigint_out"], log["sigint_err"] = proc.communicate(timeout=120)
    log["sigint_rc"] = proc.returncode
    log["after_sigint"] = _chunks_done(store)
    log["mtimes_after_sigint"] = _chunk_mtimes(store)

    rc = main(["info", str(out)])  # in-process: no compilation
    log["info_rc"] = rc

    proc = _start(work, out, "--resume")
    log["final_out"], log["final_err"] = proc.communicate(timeout=240)
    log["final_rc"] = proc.returncode
    log["mtimes_final"] = _chunk_mtimes(store)
    return log


@pytest.fixture(scope="module")
def uninterrupted(work, interrupted) -> Path:
    out = work / "reference"
    proc = _start(work, out)
    stdout, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 0, stdout + stderr
    return out


def test_kill_leaves_a_partial_store(interrupted):
    assert interrupted["killed_rc"] == -signal.SIGKILL
    assert 1 <= interrupted["after_kill"] < N_CHUNKS
    assert not interrupted["nc_after_kill"]
    # the killed run's lock died with it: the next run takes it over and says whose it was
    assert "sweep.lock: taking over from pid" in interrupted["sigint_err"]


def test_ctrl_c_stops_cleanly_after_a_chunk(interrupted):
    log = interrupted
    assert log["sigint_rc"] == 130, log["sigint_err"]
    assert "Traceback" not in log["sigint_err"]
    assert "--resume" in log["sigint_err"] and "interrupted" in log["sigint_err"]
    assert log["after_kill"] < log["after_sigint"] < N_CHUNKS
    assert f"{2 * log['after_sigint']}/12 configurations" in log["sigint_err"]


def test_resume_computes_only_missing_chunks(interrupted):
    log = interrupted
    assert log["final_rc"] == 0, log["final_err"]
    done = log["after_sigint"]
    assert f"resuming: {2 * done} of 12 configurations already done ({done}/{N_CHUNKS} chunks); " \
           f"computing {12 - 2 * done}" in log["final_err"]
    # Chunk files written before a resume are never rewritten (no duplicates), none is lost.
    for name, mtime in log["mtimes_after_kill"].items():
        assert log["mtimes_after_sigint"][name] == mtime
    for name, mtime in log["mtimes_after_sigint"].items():
        assert log["mtimes_final"][name] == mtime
    assert len(log["mtimes_final"]) == N_CHUNKS


def test_resumed_dataset_identical_to_uninterrupted(work, interrupted, uninterrupted):
    out = work / "out"
    for opener, name in ((xr.open_zarr, sweep.STORE), (lambda p: xr.open_dataset(p, engine="h5netcdf"), sweep.NETCDF)):
        got, ref = opener(out / name).load(), opener(uninterrupted / name).load()
        xr.testing.assert_identical(_comparable(got), _comparable(ref))
    ds = sweep.open_result(out)
    assert "done" not in ds and not np.isnan(ds["makespan_ns"].values).any()
    # Plain xarray: .sel on parameter values and to_dataframe.
    plain = xr.open_zarr(out / sweep.STORE)
    assert bool(plain["done"].all())
    assert plain["makespan_ns"].sel(policy_warp="gto", clocks_sigma=0.05).shape == (2,)
    assert len(plain["makespan_ns"].to_dataframe()) == 12


def test_info_reports_completion(work, interrupted, capsys):
    assert interrupted["info_rc"] == 0
    assert main(["info", str(work / "out")]) == 0
    text = capsys.readouterr().out
    assert f"{N_CHUNKS}/{N_CHUNKS} chunks" in text and "12/12 configurations, complete" in text
    assert "clocks_sigma (clocks.sigma): 0.0, 0.05, 0.1" in text and "jaxsched" in text


def test_partial_store_is_not_overwritten_and_changed_spec_is_refused(work, interrupted, capsys):
    out = work / "partial"
    store = out / sweep.STORE
    spec = sweep.load(work / "spec.toml")
    layout = sweep.make_layout(spec, 2)
    sweep.create_store(store, spec, layout, "test")
    assert main(["info", str(out)]) == 0
    assert "0/6 chunks" in capsys.readouterr().out
    assert main(["sweep", str(work / "spec.toml"), "-o", str(out)]) == 2
    assert "unfinished sweep" in capsys.readouterr().err
    changed = work / "changed.toml"
    changed.write_text(SPEC.replace("seed = 7", "seed = 8"))
    assert main(["sweep", str(changed), "-o", str(out), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "spec changed" in err and "without --resume" in err
    with pytest.raises(Exception, match="unfinished sweep"):
        sweep.open_result(out)
