"""Sweeps: spec validation before any compute, dataset layout, netCDF round trip, clock models."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from helpers import tiny_sweep_spec

import jaxsched as js
from jaxsched import sweep

SPEC = tiny_sweep_spec("test", 3, "\"policy.warp\" = [\"lrr\", \"gto\"]\n\"clocks.sigma\" = [0.0, 0.1]\n\"arch.dram_bytes_per_ns\" = [500.0, 4800.0]\n", top="chunk = 4\n")


@pytest.fixture(scope="module")
def dataset() -> xr.Dataset:
    return sweep.run(sweep.loads(SPEC))


def test_dataset_dimensions_coordinates_and_units(dataset):
    ds = dataset
    assert ds["makespan_ns"].dims == ("policy_warp", "clocks_sigma", "arch_dram_bytes_per_ns", "replicate")
    assert ds.sizes["sm"] == 132 and ds.sizes["stall_reason"] == 8
    assert list(ds["policy_warp"].values) == ["lrr", "gto"]
    assert ds["makespan_ns"].attrs["units"] == "ns"
    assert "spec" in ds.attrs and "jaxsched" in ds.attrs["source"]
    # Every CTA ran once in every configuration.
    np.testing.assert_array_equal(ds["sm_ctas"].sum("sm").values, 40)
    # .sel on parameter values and to_dataframe work.
    slow = ds["makespan_ns"].sel(arch_dram_bytes_per_ns=500.0, clocks_sigma=0.0, policy_warp="gto")
    assert slow.shape == (2,)
    assert len(ds["makespan_ns"].to_dataframe()) == 2 * 2 * 2 * 2


def test_sweep_equals_direct_simulation(dataset):
    spec = sweep.loads(SPEC)
    c = list(sweep.configurations(spec))[5]
    direct = js.simulate(c.params)
    sel = {k.replace(".", "_"): spec.grid[k][i] for k, i in zip(spec.grid, c.index)}
    got = dataset["makespan_ns"].sel(sel).isel(replicate=c.replicate)
    assert float(got) == float(direct.makespan_ns)


def test_replicates_share_clock_maps_across_policies(dataset):
    f = dataset["sm_freq_mhz"]
    np.testing.assert_array_equal(f.sel(policy_warp="lrr").values, f.sel(policy_warp="gto").values)
    assert float(f.sel(clocks_sigma=0.0).std()) == 0.0
    assert float(f.sel(clocks_sigma=0.1).std()) > 0.0


def test_netcdf_round_trip(dataset, tmp_path):
    path = tmp_path / "s.nc"
    dataset.to_netcdf(path, engine="h5netcdf")
    back = xr.open_dataset(path, engine="h5netcdf")
    xr.testing.assert_equal(back["makespan_ns"], dataset["makespan_ns"])
    assert back.attrs["title"] == "test"


def test_variation_clock_model_is_binned_and_capped():
    arch = js.presets.get("h200")
    clk = {"model": "variation", "mean_ghz": 1.9, "sigma": 0.08, "sigma_die": 0.02,
           "corr_length_mm": 5.0, "ir_drop": True}
    f = np.asarray(sweep.clock_map(arch, clk, 0).sm_freq_mhz)[np.asarray(arch.sm_enabled)]
    assert np.all(f % 15 == 0) and f.max() <= 1980 and f.std() > 20


@pytest.mark.parametrize(
    "edit, message",
    [
        (('"clocks.sigma" = [0.0, 0.1]', '"clocks.sigmaa" = [0.0]'), "clocks.sigmaa"),
        (('"clocks.sigma" = [0.0, 0.1]', '"kernel.nope" = [1]'), "kernel.nope"),
        (('"clocks.sigma" = [0.0, 0.1]', '"clocks.sigma" = []'), "non-empty"),
        (('"policy.warp" = ["lrr", "gto"]', '"policy.warp" = ["fifo"]'), "fifo"),
        (('"arch.dram_bytes_per_ns" = [500.0, 4800.0]', '"arch.dram_bytes_per_ns" = ["fast"]'), "a finite number"),
        (('"clocks.sigma" = [0.0, 0.1]', '"arch.max_threads_per_sm" = [-64]'), "positive"),
        (("threads = 64", "threads = 2048"), "threads"),
        (("replicates = 2", "replicates = 0"), "replicates"),
        (("replicates = 2", "replicates = 10000000000000000000000"), "replicates = 10000000000000000000000: an integer in 1 .. 100000000"),
        (("replicates = 2", "replicates = 20000000"), "configurations = 160000000: at most 100000000"),
        (("seed = 3", "seed = 10000000000000000000000"), "seed = 10000000000000000000000: an integer in 0 .. 2147483647"),
        (('title = "test"', 'title = "test"\nbogus = 1'), "bogus"),
        (("[grid]", "[grid"), "malformed TOML"),
        (("[kernel]", "[engine]\nfast_forward = 1\n[kernel]"), "engine.fast_forward"),
        (("[kernel]", "[engine]\nfastforward = true\n[kernel]"), "engine.fastforward"),
    ],
)
def test_bad_specs_fail_before_compute(edit, message):
    text = SPEC.replace(*edit)
    with pytest.raises(js.JaxschedError, match=message):
        spec = sweep.loads(text)
        list(sweep.configurations(spec))  # validation of every configuration, no simulation


def test_threads_fixed_work_keeps_the_grid_an_int32():
    """One thread per CTA for 2^31 threads would need a grid beyond int32: an error, not an overflow."""
    text = SPEC.replace("grid = 40\n", "grid = 40000000\n").replace('"clocks.sigma" = [0.0, 0.1]',
                                                                    '"kernel.threads_fixed_work" = [1, 64]')
    with pytest.raises(js.JaxschedError, match="threads_fixed_work = 1: .* grid of 2560000000 CTAs, beyond 2147483647"):
        sweep.loads(text)


def test_engine_fast_forward_in_the_spec():
    """`[engine] fast_forward = false` reaches the runner: the engine is compiled without the
    search; the default compiles it in where a kernel of the sweep could use it."""
    plain = SPEC.replace("[kernel]", "[engine]\nfast_forward = false\n[kernel]")
    assert sweep.loads(SPEC).fast_forward and not sweep.loads(plain).fast_forward
    assert not sweep.runner_for(sweep.loads(plain), None).fast_forward_step


# --------------------------------------------------------------------------- chunk layout


@pytest.mark.parametrize("shape, chunk, block", [
    ((2, 2, 2, 2), 4, (1, 1, 2, 2)),
    ((2, 2, 2, 2), 3, (1, 1, 1, 2)),
    ((2, 2, 2, 2), 64, (2, 2, 2, 2)),
    ((5, 4), 8, (2, 4)),
    ((3, 100), 64, (1, 64)),
    ((7,), 1, (1,)),
])
def test_block_shape(shape, chunk, block):
    assert sweep.block_shape(shape, chunk) == block


@pytest.mark.parametrize("chunk", [1, 3, 5, 8, 16])
def test_chunks_cover_every_configuration_once_in_order(chunk):
    spec = sweep.loads(SPEC)
    layout = sweep.make_layout(spec, chunk)
    assert layout.chunk_size <= chunk and layout.n_configs == spec.n_configs == 16
    seen = np.zeros(layout.shape, dtype=int)
    flat = {(c[0], c[1]): i for i, c in enumerate(sweep.configurations(spec))}
    for i in range(layout.n_chunks):
        region = layout.region(i)
        seen[region] += 1
        configs = sweep.chunk_configs(spec, layout, i)
        assert len(configs) == layout.count(i)
        order = [flat[(c[0], c[1])] for c in configs]
        assert order == sorted(order)  # C order inside the chunk
    np.testing.assert_array_equal(seen, 1)


def test_done_chunks():
    layout = sweep.Layout(("a", "replicate"), (5, 4), (2, 4))
    done = np.zeros((5, 4), dtype=bool)
    done[0:2] = True
    done[4, :3] = True  # the edge chunk is not complete
    np.testing.assert_array_equal(layout.done_chunks(done), [True, False, False])
    done[4, 3] = True
    np.testing.assert_array_equal(layout.done_chunks(done), [True, False, True])


def test_select_devices():
    import jax

    assert sweep.select_devices(None) == jax.local_devices()
    assert sweep.select_devices("1") == jax.local_devices()[:1]
    assert sweep.select_devices("0:1") == jax.local_devices()[:1]
    for bad in ("0", "99", "x", "5,5"):
        with pytest.raises(js.JaxschedError, match="--devices"):
            sweep.select_devices(bad)


def test_fingerprint_follows_resolved_inputs():
    a, b = sweep.loads(SPEC), sweep.loads(SPEC.replace("grid = 40", "grid = 41"))
    assert sweep.fingerprint(a) == sweep.fingerprint(sweep.loads(SPEC))
    assert sweep.fingerprint(a) != sweep.fingerprint(b)


WORKLOAD_SPEC = tiny_sweep_spec("chain", 2, "\"workload.mode\" = [\"stream\", \"graph\"]\n\"workload.launch_gap_ns\" = [0.0, 3000.0]\n",
                                top="chunk = 8\n").replace("[clocks]", "[workload]\nlaunches = 3\nstreams = 2\n\n[clocks]")


def test_workload_sweep_equals_direct_simulation():
    """`[workload] launches = 3`: every configuration runs the kernel three times (two streams),
    mode and overheads are swept under one compilation, and each point equals a direct run of
    the same workload."""
    spec = sweep.loads(WORKLOAD_SPEC)
    ds = sweep.run(spec)
    np.testing.assert_array_equal(ds["sm_ctas"].sum("sm").values, 3 * 40)
    configs = list(sweep.configurations(spec))
    for c in (configs[0], configs[-1]):
        assert isinstance(c.params.kernel, js.Workload) and c.params.kernel.streams == (0, 1, 0)
        direct = js.simulate(c.params)
        sel = {k.replace(".", "_"): spec.grid[k][i] for k, i in zip(spec.grid, c.index)}
        assert float(ds["makespan_ns"].sel(sel).isel(replicate=c.replicate)) == float(direct.makespan_ns)
    # The stream gap is paid by launch 2 (stream 0's second launch), so it lengthens the run.
    gap = ds["makespan_ns"].sel(workload_mode="stream")
    assert bool((gap.sel(workload_launch_gap_ns=3000.0) > gap.sel(workload_launch_gap_ns=0.0)).all())


def test_workload_structure_is_not_swept():
    bad = WORKLOAD_SPEC.replace("\"workload.launch_gap_ns\"", "\"workload.streams\"").replace("[0.0, 3000.0]", "[1, 2]")
    with pytest.raises(js.JaxschedError, match="workload.streams"):
        sweep.loads(bad)


def test_cta_trace_in_the_dataset(tmp_path):
    """`cta_trace = true` keeps every configuration's per-CTA trace (dimension `cta`), equal to a
    direct run's, through the zarr store and the netCDF."""
    spec = sweep.loads(WORKLOAD_SPEC.replace("chunk = 8", "chunk = 8\ncta_trace = true"))
    assert sweep.execute(spec, tmp_path, log=lambda _: None).complete
    ds = xr.open_dataset(tmp_path / "sweep.nc", engine="h5netcdf")
    xr.testing.assert_equal(ds["cta_sm"], sweep.open_result(tmp_path)["cta_sm"])
    assert ds["cta_sm"].dims[-1] == "cta" and ds.sizes["cta"] == 3 * 40
    c = list(sweep.configurations(spec))[-1]
    direct = js.simulate(c.params)
    sel = {k.replace(".", "_"): spec.grid[k][i] for k, i in zip(spec.grid, c.index)}
    got = ds.sel(sel).isel(replicate=c.replicate)
    np.testing.assert_array_equal(got["cta_sm"].values, np.asarray(direct.cta_sm)[:120])
    np.testing.assert_array_equal(got["cta_kernel"].values, np.repeat([0, 1, 2], 40))
    np.testing.assert_allclose(got["cta_end_ns"].values, np.asarray(direct.cta_end_ns)[:120])
    assert float(got["cta_end_ns"].max()) == float(got["makespan_ns"])


@pytest.mark.parametrize("modes, expected", [(None, False), ('["off"]', False), ('["off", "lock"]', True)])
def test_a_sweep_compiles_the_dvfs_step_in_when_any_configuration_has_dvfs(modes, expected):
    """`uses_dvfs` decides `simulate_batch(dvfs_step=...)` for every chunk, so that a sweep whose
    DVFS modes differ between chunks still compiles once."""
    grid = '"policy.warp" = ["lrr", "gto"]\n' + (f'"dvfs.mode" = {modes}\n' if modes else "")
    assert sweep.uses_dvfs(sweep.loads(tiny_sweep_spec("dvfs", 1, grid))) is expected


@pytest.mark.parametrize("dispatch, expected", [(None, False), ('["hardware", "weighted"]', False),
                                               ('["hardware", "closed_loop"]', True)])
def test_a_sweep_compiles_the_closed_loop_in_when_any_configuration_dispatches_by_it(dispatch, expected):
    """`uses_closed_loop` decides `simulate_batch(closed_loop_step=...)` for every chunk, so that
    a sweep whose dispatch policies differ between chunks still compiles once."""
    grid = '"policy.warp" = ["lrr", "gto"]\n' + (f'"policy.dispatch" = {dispatch}\n' if dispatch else "")
    assert sweep.uses_closed_loop(sweep.loads(tiny_sweep_spec("dispatch", 1, grid))) is expected


def test_grid_sweep_pads_every_chunk_to_the_sweep():
    """Chunks of different grids share the sweep's CTA-trace length and CTA slots: one compilation,
    and a chunk of small grids fits the dataset's `cta` dimension (it did not before)."""
    from jaxsched.engine import run as engine_run

    spec = sweep.loads(tiny_sweep_spec("grid", 1, "\"kernel.grid\" = [10, 40]\n", top="chunk = 2\ncta_trace = true\n"))
    before = engine_run._compiled._cache_size()
    ds = sweep.run(spec)
    assert engine_run._compiled._cache_size() - before <= 1
    assert ds.sizes["cta"] == 40
    ran = (ds["cta_sm"] >= 0).sum("cta")
    np.testing.assert_array_equal(ran.sel(kernel_grid=10), 10)
    np.testing.assert_array_equal(ran.sel(kernel_grid=40), 40)
