"""CTA traces (jaxsched.trace): built from a run, saved and loaded (netCDF, zarr), validated."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr
from helpers import small_arch

import jaxsched as js
from jaxsched import trace

ARCH = small_arch(4)
PROGRAM = "loop 6 cta_spread=2\n ldg bytes=128\n fma dep\nend"
KERNEL = js.make_kernel(PROGRAM, grid=80, threads=256, regs=32, l2_hit_rate=0.7, seed=5, name="tiny")
CLOCKS = js.clocks.from_array(ARCH, np.linspace(1200, 1980, ARCH.n_sm_slots))


@pytest.fixture(scope="module")
def run() -> tuple[js.Result, xr.Dataset]:
    result = js.simulate(ARCH, KERNEL, CLOCKS, warp_policy="gto", dispatch="hardware")
    return result, trace.from_result(result, ARCH, KERNEL, CLOCKS, program=PROGRAM, warp_policy="gto")


def test_from_result_matches_the_run(run):
    result, ds = run
    assert ds.sizes == {"cta": 80, "sm": ARCH.n_sm_slots}
    np.testing.assert_array_equal(ds["cta_sm"].values, np.asarray(result.cta_sm)[:80])
    np.testing.assert_allclose(ds["cta_end_ns"].values, result.cta_end_ns[:80])
    enabled = np.asarray(ARCH.sm_enabled)
    np.testing.assert_array_equal(ds["sm_freq_mhz"].values[enabled], np.asarray(CLOCKS.sm_freq_mhz)[enabled])
    assert np.isnan(ds["sm_freq_mhz"].values[~enabled]).all()
    assert ds.attrs["source"] == "jaxsched" and ds.attrs["ctas_per_sm"] == 8
    assert ds.attrs["warp_policy"] == "gto" and ds["cta_start_ns"].attrs["units"] == "ns"


def test_cta_work_counts_each_ctas_instructions():
    # 1 instruction before the loop, a 2-instruction body run 5 +- 2 times, EXIT: 8 warps per CTA
    kernel = js.make_kernel("alu\nloop 5 cta_spread=2\n fma dep\n alu\nend", grid=40, threads=256, pad_to=8)
    work = trace.cta_work(ARCH, kernel, CLOCKS)
    assert work.shape == (40,)
    per_warp = work / 8
    assert set(np.unique(per_warp)) <= {2 + 2 * t for t in range(3, 8)} and len(np.unique(per_warp)) >= 3
    flat = js.make_kernel("loop 5\n fma dep\nend", grid=40, threads=64)
    np.testing.assert_array_equal(trace.cta_work(ARCH, flat, CLOCKS), np.full(40, 2 * (1 + 5)))


@pytest.mark.parametrize("suffix", [".nc", ".zarr"])
def test_save_load_round_trip(run, tmp_path, suffix):
    _, ds = run
    back = trace.load(trace.save(ds, tmp_path / f"t{suffix}"))
    xr.testing.assert_identical(back, ds)
    assert isinstance(back.attrs["grid_ctas"], int)


def test_the_launch_rebuilds_and_reruns_identically(run):
    result, ds = run
    again = js.simulate(ARCH, trace.kernel(ds), CLOCKS)
    assert float(again.makespan_ns) == float(result.makespan_ns)


def test_probe_trace_with_cycle_counters(tmp_path):
    start = np.array([0.0, 0.0, 100.0])
    ds = trace.make([0, 1, 0], start, start + 50.0, [1500.0, np.nan], source="probe", arch="h200",
                    kernel="k", threads_per_cta=64, ctas_per_sm=2, program="free text",
                    cta_start_cycles=[10, 20, 160], cta_end_cycles=[85, 95, 235])
    back = trace.load(trace.save(ds, tmp_path / "p.nc"))
    assert back["cta_end_cycles"].dtype == np.int64
    with pytest.raises(js.JaxschedError, match="only jaxsched traces"):
        trace.kernel(back)


def _corrupt(ds: xr.Dataset, how: str) -> xr.Dataset:
    ds = ds.copy(deep=True)
    if how == "missing":
        return ds.drop_vars("cta_end_ns")
    if how == "sm_range":
        ds["cta_sm"].values[3] = ds.sizes["sm"]
    elif how == "order":
        ds["cta_end_ns"].values[2] = ds["cta_start_ns"].values[2] - 1.0
    elif how == "nan":
        ds["cta_start_ns"].values[0] = np.nan
    elif how == "one_cycle_var":
        ds["cta_start_cycles"] = ("cta", np.zeros(ds.sizes["cta"], np.int64))
    elif how == "source":
        ds.attrs["source"] = "guess"
    elif how == "grid":
        ds.attrs["grid_ctas"] = 7
    elif how == "work":
        ds["cta_work"].values[1] = 0.0
    elif how == "dims":
        ds = ds.assign(sm_freq_mhz=("cta", np.ones(ds.sizes["cta"])))
    return ds


@pytest.mark.parametrize("how, field", [
    ("missing", "cta_end_ns"), ("sm_range", "cta_sm"), ("order", "cta_end_ns"), ("nan", "cta_start_ns"),
    ("one_cycle_var", "cycle"), ("source", "source"), ("grid", "grid_ctas"), ("dims", "sm_freq_mhz"),
    ("work", "cta_work"),
])
def test_bad_traces_are_refused_by_name(run, tmp_path, how, field):
    _, ds = run
    bad = _corrupt(ds, how)
    with pytest.raises(js.JaxschedError, match=field):
        trace.validate(bad)
    bad.to_netcdf(tmp_path / "bad.nc", engine="h5netcdf")
    with pytest.raises(js.JaxschedError, match=field):
        trace.load(tmp_path / "bad.nc")


def test_load_names_a_missing_or_foreign_file(tmp_path):
    with pytest.raises(js.JaxschedError, match="no such file"):
        trace.load(tmp_path / "nothing.nc")
    (tmp_path / "junk.nc").write_text("not netcdf")
    with pytest.raises(js.JaxschedError, match="trace"):
        trace.load(tmp_path / "junk.nc")
    with pytest.raises(js.JaxschedError, match=".nc"):
        trace.save(xr.Dataset(), tmp_path / "t.json")
