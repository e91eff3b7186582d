"""Sharding: a sweep whose configuration axis is sharded over 8 (forced host) CPU devices gives
the same arrays as a 1-device run, and so does a 2-process `jax.distributed` run on one machine.

Each test runs in a subprocess: `XLA_FLAGS=--xla_force_host_platform_device_count=8` must be set
before jax is imported, and `jax.distributed` can be initialised once per process.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from helpers import tiny_sweep_spec

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(sys.executable).parent / "jaxsched"

SPEC = tiny_sweep_spec("sharding", 5, "\"policy.warp\" = [\"lrr\", \"gto\"]\n\"clocks.sigma\" = [0.0, 0.1]\n\"arch.dram_bytes_per_ns\" = [500.0, 4800.0]\n")

SHARDED = r"""
import os, sys
# before jax is imported, after the suite's flags (conftest.py): they compile faster
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
import jax
import numpy as np
from jaxsched import sweep
from jaxsched.engine import run as engine_run

assert len(jax.devices()) == 8, jax.devices()  # the flag's count, not one per core
meshes = []
real = engine_run.sharded
engine_run.sharded = lambda fn, mesh: meshes.append(mesh.size) or real(fn, mesh)
spec = sweep.load(sys.argv[1])
one = sweep.run(spec, devices=sweep.select_devices(1), chunk=8)    # batch 8 on one device
eight = sweep.run(spec, devices=sweep.select_devices(8), chunk=4)  # 4 configs padded to 8, 1 per device
assert meshes == [8], meshes                                        # the sharded path ran, traced once
assert eight.attrs["device"].startswith("8 x cpu"), eight.attrs["device"]
assert set(one.data_vars) == set(eight.data_vars)
for name in one.data_vars:
    a, b = one[name].values, eight[name].values
    assert a.dtype == b.dtype and a.shape == b.shape, name
    assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), name
assert not np.isnan(one["makespan_ns"].values).any()
one.to_netcdf(sys.argv[2], engine="h5netcdf")
print("identical", len(one.data_vars), "variables")
"""


def _env(tmp: Path) -> dict:
    env = dict(os.environ)  # with the suite's XLA flags (conftest.py): a faster compile
    env.update(JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=str(tmp / "jax_cache"),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    return env


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("sharding")
    (tmp / "spec.toml").write_text(SPEC)
    return tmp


@pytest.fixture(scope="module")
def one_device(work) -> xr.Dataset:
    """The 8-device run, checked equal to the 1-device run inside the subprocess."""
    ref = work / "one_device.nc"
    proc = subprocess.run([sys.executable, "-c", SHARDED, str(work / "spec.toml"), str(ref)],
                          capture_output=True, text=True, env=_env(work), timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "identical" in proc.stdout
    return xr.load_dataset(ref, engine="h5netcdf")


def test_eight_devices_equal_one_device(one_device):
    assert one_device.sizes["sm"] == 132
    np.testing.assert_array_equal(one_device["sm_ctas"].sum("sm").values, 40)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_with_jax_distributed(work, one_device):
    """Two `jaxsched sweep` processes joined by jax.distributed share the chunks of one store."""
    out, port = work / "multi", _free_port()
    procs = [subprocess.Popen([str(SCRIPT), "sweep", str(work / "spec.toml"), "-o", str(out), "--chunk", "8",
                               "--coordinator", f"localhost:{port}", "--num-processes", "2",
                               "--process-id", str(i)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(work), cwd=ROOT)
             for i in range(2)]
    outputs = [p.communicate(timeout=300) for p in procs]
    for p, (o, e) in zip(procs, outputs):
        assert p.returncode == 0, o + e
    assert "this process: 1 chunks" in outputs[0][1] and "this process: 1 chunks" in outputs[1][1]
    assert "wrote" in outputs[0][0]  # process 0 writes sweep.nc after the last barrier
    got = xr.load_dataset(out / "sweep.nc", engine="h5netcdf")
    for name in one_device.data_vars:
        np.testing.assert_array_equal(got[name].values, one_device[name].values, err_msg=name)
    assert textwrap.dedent(got.attrs["spec"]) == SPEC
