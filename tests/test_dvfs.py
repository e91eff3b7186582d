"""DVFS in the JAX engine (docs/model.md section 12): the controller's latency and bin steps, the
power cap, recovery when the load lifts, the thermal limit, clock lock, droop, run-to-run state
and bad parameters. The engine's exact equality with the reference is in
test_dvfs_vs_reference.py."""

from __future__ import annotations

import re

import numpy as np
import pytest

import jaxsched as js
from jaxsched import dvfs
from jaxsched.errors import JaxschedError

from helpers import simulate_pinned, small_arch

ARCH = small_arch(4)
N_SM = ARCH.sm_count
BOOST = 1980
BIN = 15
PERIOD_US = 0.1
TRACE = 200
PAD = 24
# A heavy phase (independent FMAs at full occupancy) then a light one (dependent DRAM loads).
HEAVY_THEN_LIGHT = js.make_kernel("loop 300\n fma\n fma\n fma\n fma\nend\n" + "ldg bytes=32 dep\n" * 12,
                                  grid=N_SM * 8, threads=256, regs=32, l2_hit_rate=0.0, pad_to=PAD)
COMPUTE = js.make_kernel("loop 60\n fma dep\n fma dep\nend", grid=N_SM * 2, threads=128, regs=32, pad_to=PAD)
MEMORY = js.make_kernel("loop 6\n ldg bytes=32 dep\nend", grid=N_SM * 2, threads=128, regs=32,
                        l2_hit_rate=0.0, pad_to=PAD)
# The file's single runs share one compilation (five before, one per occupancy, grid and DVFS
# on or off): every CTA slot and the largest grid of the kernels above, `TRACE` rows of the
# clock trace, the DVFS step and fast-forward's search compiled in.
STATICS = dict(cta_slots=16, max_ctas=64, dvfs_step=True, fast_forward_step=True)


def simulate(arch: js.Arch, kernel: js.Kernel, clk: js.Clocks | None = None, **config) -> js.Result:
    """`js.simulate` with the file's `STATICS` and `TRACE` rows (`helpers.simulate_pinned`)."""
    return simulate_pinned(arch, kernel, clk, statics=STATICS, trace_len=TRACE, **config)


def params(**overrides) -> dvfs.Dvfs:
    """A small chip whose cap (30 W, 5 W of it uncore) sits below the heavy phase's power."""
    base = dict(period_us=PERIOD_US, latency_us=PERIOD_US / 2, power_cap_w=30.0, uncore_w=5.0,
                leak_w=0.3, min_mhz=990.0)
    return dvfs.default(ARCH, **{**base, **overrides})


def run(kernel=HEAVY_THEN_LIGHT, **overrides) -> js.Result:
    return simulate(ARCH, kernel, dvfs=params(**overrides))


def rows(result: js.Result) -> np.ndarray:
    return np.asarray(result.trace_tick) >= 0


def test_over_the_cap_the_clock_steps_down_one_bin_per_sample_after_the_latency() -> None:
    half = run()
    mhz = np.asarray(half.trace_mhz)[rows(half), 0]
    chip_w = np.asarray(half.trace_mw)[rows(half)].sum(axis=1) / 1000 + 5.0
    # Row n holds the clock during sample n's tick. With L = P/2 sample n's decision shows in row
    # n + 1; with L = P it lands exactly on the next sample's tick, after its cycles: row n + 2.
    first_over = int(np.argmax(chip_w > 30.0))
    assert mhz[first_over] == BOOST and mhz[first_over + 1] == BOOST - BIN
    late = run(latency_us=PERIOD_US)
    late_mhz = np.asarray(late.trace_mhz)[rows(late), 0]
    assert late_mhz[first_over + 1] == BOOST and late_mhz[first_over + 2] == BOOST - BIN
    assert set(np.unique(np.diff(mhz))) <= {-BIN, 0, BIN}  # bin steps only
    assert np.all(np.asarray(half.trace_mhz)[rows(half)] == mhz[:, None])  # one chip-wide domain


def test_average_power_settles_at_the_cap_and_the_clock_climbs_back_when_the_load_lifts() -> None:
    r = run()
    mhz = np.asarray(r.trace_mhz)[rows(r), 0]
    chip_w = np.asarray(r.trace_mw)[rows(r)].sum(axis=1) / 1000 + 5.0
    heavy = np.nonzero(chip_w > 15.0)[0]
    settled = heavy[(heavy > 20) & (heavy < heavy[-1])]
    assert settled.size > 50
    assert abs(chip_w[settled].mean() - 30.0) < 0.03 * 30.0  # within 3 % of the cap
    assert mhz[settled].max() < BOOST  # throttled while heavy
    assert mhz[-1] == BOOST  # back at boost once the light phase draws less


def test_thermal_limit_throttles_below_the_power_cap() -> None:
    # Huge cap; a hot SM (40 K/W) with a short time constant crosses 60 C within a few samples.
    r = run(power_cap_w=1000.0, r_th_k_per_w=40.0, tau_us=0.5, thermal_limit_c=60.0,
            initial_temp_c=35.0, ambient_c=35.0)
    mhz = np.asarray(r.trace_mhz)[rows(r), 0]
    temp_c = np.asarray(r.trace_mk)[rows(r), 0] / 1000
    hot = int(np.argmax(temp_c >= 60.0))
    assert hot > 0 and np.all(mhz[: hot + 1] == BOOST)  # no throttling below the limit
    assert mhz[hot + 1] == BOOST - BIN  # the first sample at the limit steps down
    # It never steps up while within the hysteresis band below the limit.
    up = np.nonzero(np.diff(mhz) > 0)[0]
    assert np.all(temp_c[up] < 60.0 - 3.0)


def test_clock_lock_holds_the_clock_and_still_tracks_power() -> None:
    r = run(mode="lock", lock_mhz=1500.0)
    assert np.all(np.asarray(r.trace_mhz)[rows(r)] == 1500)
    assert np.asarray(r.trace_mw)[rows(r)].max() > 0
    static = simulate(ARCH, HEAVY_THEN_LIGHT, js.clocks.uniform(ARCH, 1.5))
    # Different time bases (1980 vs 1500 MHz ticks), the same clock: only memory latency rounding differs.
    assert float(r.makespan_ns) == pytest.approx(float(static.makespan_ns), rel=2e-3)


def test_compute_bound_time_follows_the_locked_clock_memory_bound_time_does_not() -> None:
    def ratio(kernel) -> float:
        slow = simulate(ARCH, kernel, dvfs=dvfs.locked(ARCH, 990.0))
        fast = simulate(ARCH, kernel, dvfs=dvfs.locked(ARCH, 1980.0))
        return float(slow.makespan_ns) / float(fast.makespan_ns)

    assert ratio(COMPUTE) == pytest.approx(2.0, rel=0.02)
    assert ratio(MEMORY) < 1.15


def test_droop_lowers_each_sm_clock_by_its_own_power_after_the_delay() -> None:
    r = run(mode="lock", lock_mhz=1800.0, droop_mhz_per_w=20.0, droop_delay_us=0.03, clock_domain="sm")
    mhz = np.asarray(r.trace_mhz)[rows(r)]
    mw = np.asarray(r.trace_mw)[rows(r)]
    enabled = np.asarray(ARCH.sm_enabled)
    expected = 1800 - BIN * ((mw[:-1] * 20_000 // 1_000_000) // BIN)
    np.testing.assert_array_equal(mhz[1:, enabled], expected[:, enabled])
    assert mhz[1:, enabled].min() < 1800  # the hungry SMs really lost clock


def test_run_to_run_state_spreads_short_kernels_and_lock_removes_it() -> None:
    base = params(power_cap_w=1000.0, period_us=5.0, latency_us=5.0)
    states = dvfs.run_to_run(ARCH, base, seed=3, n=4)
    assert len({float(s.initial_mhz) for s in states}) > 1
    n = len(states)
    batch = lambda ds: js.simulate_batch([ARCH] * n, [COMPUTE] * n, [js.clocks.uniform(ARCH)] * n,  # noqa: E731
                                        [1] * n, [0] * n, [0] * n, dvfs=ds)
    free = np.asarray(batch(states).makespan_ns)
    assert free.max() / free.min() > 1.05
    locked = np.asarray(batch([s.replace(mode=np.int32(2)) for s in states]).makespan_ns)
    assert np.all(locked == locked[0])


@pytest.mark.parametrize("field, value, words", [
    ("latency_us", 1.0, "period_us"),
    ("phase", 1.0, "[0, 1)"),
    ("initial_mhz", 3000.0, "boost_mhz"),
    ("period_us", 0.0, "(0,"),
    ("mode", 7, "off"),
])
def test_bad_dvfs_parameters_name_the_field(field: str, value: float, words: str) -> None:
    with pytest.raises(JaxschedError, match=rf"dvfs\.{field}.*{re.escape(words)}"):
        js.simulate(ARCH, COMPUTE, dvfs=params(**{field: value}))


def test_dvfs_off_changes_nothing() -> None:
    plain = simulate(ARCH, COMPUTE)
    off = simulate(ARCH, COMPUTE, dvfs=dvfs.off(ARCH))
    assert int(plain.makespan_ticks) == int(off.makespan_ticks)
    assert np.all(np.asarray(off.sm_energy_pj) == 0) and np.all(np.asarray(off.trace_tick) == -1)


def test_compiling_the_dvfs_step_and_the_closed_loop_out_changes_no_output() -> None:
    """With every configuration's DVFS off and none dispatching by the closed loop, the batch
    compiles the DVFS step and the closed loop's learning out (`Shapes.dvfs`, `Shapes.closed_loop`);
    a sweep that also has such configurations compiles them in for every chunk. Both must give
    the same numbers, bit for bit."""
    batch = ([ARCH] * 2, [COMPUTE, MEMORY], [js.clocks.uniform(ARCH, 1.5), js.clocks.uniform(ARCH, 1.98)],
             [1, 0], [0, 3], [0, 1])
    out = js.simulate_batch(*batch)
    kept = js.simulate_batch(*batch, dvfs_step=True, closed_loop_step=True)
    for name in ("makespan_ticks", "sm_cycles", "sm_issued", "sm_stalls", "cta_sm", "cta_start_tick",
                 "cta_end_tick", "sm_energy_pj", "trace_tick"):
        assert np.array_equal(np.asarray(getattr(out, name)), np.asarray(getattr(kept, name))), name


def test_leaving_the_dvfs_step_out_of_a_dvfs_batch_is_refused() -> None:
    with pytest.raises(JaxschedError, match=r"dvfs_step.*DVFS on"):
        js.simulate_batch([ARCH], [COMPUTE], [js.clocks.uniform(ARCH)], [1], [0], [0], dvfs=[params()],
                          dvfs_step=False)
