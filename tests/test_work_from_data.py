"""Work from data: trip counts and branch lanes per CTA or per warp from user arrays
(`loop @NAME`, `if @NAME`; docs/model.md section 4). Hand cases with exact expectations, the
engine against the reference, TOML input, and bad arrays. Random programs with data arrays are
in the differential suite (`helpers.configurations`)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse

import jaxsched as js
from jaxsched import clocks, reference
from jaxsched.kernel import MAX_TRIPS, load_kernel, make_kernel
from jaxsched import sweep
from jaxsched.sweep import load as load_spec

from helpers import hand_h200, simulate_padded, small_arch
from test_engine_vs_reference import assert_same


def _pair(arch: js.Arch, kernel: js.Kernel):
    cfg = dict(arch=arch, kernel=kernel, clocks=clocks.uniform(arch))
    return simulate_padded(**cfg), reference.simulate(**cfg)


def test_per_cta_trips_give_each_cta_its_work() -> None:
    """The issue's kernel: CTA c runs `k * (c % 7 + 1)` trips of a dependent FMA chain. Alone on
    one SM (shared memory allows one CTA at a time) each CTA's duration is affine in its trips,
    with the chain's 4-cycle step."""
    arch = hand_h200(1)
    trips = 50 * (np.arange(14) % 7 + 1)
    kernel = make_kernel("loop @work\n fma dep\nend", grid=14, threads=32, smem_bytes=150_000,
                         arrays={"work": trips})
    result, ref = _pair(arch, kernel)
    assert_same(result, ref)
    duration = np.asarray(result.cta_end_tick)[:14] - np.asarray(result.cta_start_tick)[:14]
    np.testing.assert_array_equal(duration, 4 * trips - 2)  # 4 cycles a trip; the last result is not waited for
    np.testing.assert_array_equal(result.sm_issued[0], trips.sum() + 14)  # + one EXIT per warp


def test_per_warp_trips_and_lane_masks_are_exact() -> None:
    """Per-warp trip counts, and if-lanes from lane masks: issued instructions and active lanes
    follow from the arrays alone."""
    arch = hand_h200(2)
    grid, warps = 6, 3
    rng = np.random.default_rng(5)
    trips = rng.integers(0, 9, (grid, warps))
    masks = rng.integers(-(2**31), 2**31, (grid, warps)).astype(np.int32)
    program = "loop @trips\n fma dep\n if @lanes\n  alu\n else\n  sfu\n end\n fma\nend"
    kernel = make_kernel(program, grid=grid, threads=80, arrays={"trips": trips, "lanes": masks})
    result, ref = _pair(arch, kernel)
    assert_same(result, ref)
    lanes = np.array([32, 32, 16])  # 80 threads: the last warp has 16 lanes
    if_lanes = np.array([[bin(int(m) & 0xFFFFFFFF & ((1 << n) - 1)).count("1") for m, n in zip(row, lanes)]
                         for row in masks])
    both = (if_lanes > 0).astype(int) + (if_lanes < lanes).astype(int)  # paths a warp runs per trip
    assert int(np.sum(result.sm_issued)) == int(np.sum(trips * (2 + both))) + grid * warps
    assert int(np.sum(result.sm_active_lanes)) == int(np.sum(trips * 3 * lanes)) + grid * int(lanes.sum())


def test_boolean_branch_array_sends_whole_warps() -> None:
    arch = hand_h200(1)
    taken = np.array([True, False, True, True])
    kernel = make_kernel("if @taken\n sfu\n sfu\nelse\n alu\nend", grid=4, threads=32, arrays={"taken": taken})
    result, ref = _pair(arch, kernel)
    assert_same(result, ref)
    from jaxsched.isa import Op
    assert int(result.sm_issued_op[0, Op.SFU]) == 2 * 3 and int(result.sm_issued_op[0, Op.ALU]) == 1


def test_zero_trip_guard_skips_its_set_up_where_the_trips_are_zero() -> None:
    """`if @rows>0` (what a SASS import writes for a loop's zero-trip guard): warps whose trip
    count is 0 skip the guarded set-up and the loop; the others run both."""
    arch = hand_h200(1)
    rows = np.array([[0, 3], [2, 0], [0, 0]])
    kernel = make_kernel("if @rows>0\n sfu\n alu\n loop @rows\n  fma dep\n end\nend", grid=3, threads=64,
                         arrays={"rows": rows})
    result, ref = _pair(arch, kernel)
    assert_same(result, ref)
    from jaxsched.isa import Op
    assert int(result.sm_issued_op[0, Op.SFU]) == 2 and int(result.sm_issued_op[0, Op.FMA]) == 5
    assert int(result.sm_issued[0]) == 2 * 2 + 5 + 6  # set-up in 2 warps, 5 trips, an EXIT per warp


def test_spmv_row_lengths_show_in_per_sm_busy_times() -> None:
    """An SpMV-like kernel, one CTA per row block, trips = the block's nonzeros, on a power-law
    sparse matrix: each SM issues exactly its CTAs' work, and the imbalance shows in its busy
    cycles, against the same total work spread evenly."""
    rng = np.random.default_rng(1)
    rows = 48
    lengths = np.minimum((rng.pareto(1.2, rows) * 3).astype(int) + 1, 60)
    matrix = scipy.sparse.random(rows, 64, density=0.01, random_state=2, format="csr")
    matrix = scipy.sparse.csr_matrix((np.ones(lengths.sum()), rng.integers(0, 64, lengths.sum()),
                                      np.concatenate([[0], np.cumsum(lengths)])), shape=(rows, 64))
    nnz = np.diff(matrix.indptr)
    arch = small_arch(2)
    program = "alu\nloop @nnz\n lds\n fma dep\nend\nexit dep"
    kernel = make_kernel(program, grid=rows, threads=32, arrays={"nnz": nnz})
    result, ref = _pair(arch, kernel)
    assert_same(result, ref)
    cta_sm = np.asarray(result.cta_sm)[:rows]
    per_sm = np.array([np.sum(2 * nnz[cta_sm == s] + 2) for s in range(arch.n_sm_slots)])
    np.testing.assert_array_equal(np.asarray(result.sm_issued), per_sm)
    even = make_kernel(program.replace("@nnz", str(int(nnz.mean()))), grid=rows, threads=32)
    balanced = simulate_padded(arch=arch, kernel=even, clocks=clocks.uniform(arch))  # the compilation above
    busy = np.asarray(result.sm_busy_cycles)[np.asarray(arch.sm_enabled)]
    busy_even = np.asarray(balanced.sm_busy_cycles)[np.asarray(arch.sm_enabled)]
    assert busy.max() / busy.mean() > busy_even.max() / busy_even.mean()


def test_arrays_in_toml_inline_and_npy(tmp_path) -> None:
    trips = np.array([[1, 2], [3, 4], [0, 5]])
    np.save(tmp_path / "trips.npy", trips)
    base = 'name = "k"\ngrid = 3\nthreads = 64\nprogram = "loop @t\\n fma dep\\nend"\n'
    (tmp_path / "file.toml").write_text(f'[kernel]\n{base}[kernel.arrays]\nt = "trips.npy"\n')
    (tmp_path / "inline.toml").write_text(f'[kernel]\n{base}arrays = {{t = [[1, 2], [3, 4], [0, 5]]}}\n')
    a, b = load_kernel(tmp_path / "file.toml"), load_kernel(tmp_path / "inline.toml")
    np.testing.assert_array_equal(a.trips_data[0, :, :2], trips)
    np.testing.assert_array_equal(a.trips_data, b.trips_data)
    (tmp_path / "bad.toml").write_text(f'[kernel]\n{base}arrays = {{t = "missing.npy"}}\n')
    with pytest.raises(js.JaxschedError, match=r"bad.toml: kernel.arrays.t .*readable .npy"):
        load_kernel(tmp_path / "bad.toml")


def test_a_sweep_over_a_data_kernel(tmp_path) -> None:
    np.save(tmp_path / "rows.npy", np.arange(10) % 4 + 1)
    spec = tmp_path / "spec.toml"
    spec.write_text('title = "t"\narch = "h200"\nreplicates = 1\n[kernel]\nname = "k"\ngrid = 10\nthreads = 64\n'
                    'program = "loop @rows\\n fma dep\\nend"\narrays = {rows = "rows.npy"}\n'
                    '[grid]\n"clocks.mean_ghz" = [1.5, 1.8]\n')
    ds = sweep.run(load_spec(spec))
    kernel = make_kernel("loop @rows\n fma dep\nend", grid=10, threads=64, arrays={"rows": np.arange(10) % 4 + 1})
    arch = js.presets.get("h200")
    for ghz in (1.5, 1.8):
        expect = float(js.simulate(arch, kernel, clocks.uniform(arch, ghz)).makespan_ns)
        np.testing.assert_allclose(ds["makespan_ns"].sel(clocks_mean_ghz=ghz).values, expect)
    spec.write_text(spec.read_text().replace('"clocks.mean_ghz" = [1.5, 1.8]', '"kernel.trips" = [1, 2]'))
    with pytest.raises(js.JaxschedError, match="takes its values from an array"):
        load_spec(spec)
    spec.write_text(spec.read_text().replace('"kernel.trips" = [1, 2]', '"kernel.grid" = [5, 10]'))
    with pytest.raises(js.JaxschedError, match="arrays sized for its grid"):
        load_spec(spec)


@pytest.mark.parametrize("program, arrays, match", [
    ("loop @t\n fma\nend", {"t": np.ones(3, int)}, r"arrays.t = 'shape \(3,\)': \[4\] .* or \[4, 2\]"),
    ("loop @t\n fma\nend", {"t": -np.ones(4, int)}, r"arrays.t\[0\] = -1: trip counts in 0 .."),
    ("loop @t\n fma\nend", {"t": np.full(4, MAX_TRIPS + 1)}, r"arrays.t\[0\] = 16777216"),
    ("loop @t\n fma\nend", {"t": np.ones(4) * 0.5}, r"arrays.t = 'dtype float64'"),
    ("loop @t\n fma\nend", {}, r"arrays.t = 'missing'"),
    ("loop @t\n fma\nend", {"t": np.ones(4, int), "u": np.ones(4, int)}, r"arrays.u = 'unused'"),
    ("loop @t cta_spread=2\n fma\nend", {"t": np.ones(4, int)}, r"program line 1 .*without spreads"),
    ("loop @1t\n fma\nend", {}, r"`@NAME` names an array"),
    ("if @m\n fma\nelse\n alu\nend", {"m": np.full(4, 2**33)}, r"arrays.m = .*32-bit lane masks"),
    ("if @m>0\n fma\nend", {"m": np.ones(4) * 0.5}, r"arrays.m = 'dtype float64': integers or booleans"),
    ("if @m>1\n fma\nend", {}, r"`@NAME` names an array"),
])
def test_bad_arrays_get_one_line_errors(program: str, arrays: dict, match: str) -> None:
    with pytest.raises(js.JaxschedError, match=match) as info:
        make_kernel(program, grid=4, threads=64, arrays=arrays)
    assert "\n" not in str(info.value)


def test_persistent_kernel_with_data_trips_is_refused() -> None:
    with pytest.raises(js.JaxschedError, match="work queue, not from an array"):
        make_kernel("loop @t\n fma\nend", grid=4, threads=64, work_items=10, arrays={"t": np.ones(4, int)})
