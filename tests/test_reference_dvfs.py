"""The reference's DVFS (docs/model.md section 12) by hand: small cases whose clocks, powers,
temperatures and energies follow from the document's integer formulas, derived in comments.

Set-up shared by most tests (`quiet`): the 8-SM test chip, every SM at 1980 MHz, so the tick
rate F = 1980 MHz; sample period P = round(0.05 us * 1980) = 99 ticks, latency L = round(0.02 us
* 1980) = 40 ticks, phase 0 (samples at ticks 0, 99, 198, ...); no uncore or leakage power, no
instruction energy, 1000 pJ per SM cycle. An SM that cycles at every tick of a full window then
draws pd = 99 * 1000 * 1980 // (1000 * 99) = 1980 mW; the first window (tick 0, one cycle) gives
1000 * 1980 // 99000 = 20 mW. The kernel is one warp of 200 dependent FMAs (~800 ticks), so
every enabled SM but SM 0 idles and only cycles.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxsched import clocks, dvfs, lower, reference
from jaxsched.isa import Op
from jaxsched.kernel import make_kernel

from helpers import small_arch

ARCH = small_arch(4)
N_SM = ARCH.n_sm_slots
F_MHZ = 1980
P_TICKS = 99
L_TICKS = 40
BIN_MHZ = 15  # the h200 preset's clock step
FULL_WINDOW_MW = 1980  # power of an SM cycling at every tick of a full window (see above)
KERNEL = make_kernel("loop 200\n fma dep\nend\nexit", grid=1, threads=32)


def quiet(mode: str = "dvfs", **overrides) -> dvfs.Dvfs:
    """DVFS parameters whose power is only the cycle energy (see the module docstring)."""
    params = dict(period_us=0.05, latency_us=0.02, uncore_w=0.0, leak_w=0.0,
                  energy_pj=[0.0] * len(Op), cycle_energy_pj=1000.0)
    params.update(overrides)
    return dvfs.default(ARCH, mode=mode, **params)


def run(d: dvfs.Dvfs, *, arch=ARCH, kernel=KERNEL, clk=None, trace_len: int = 16) -> dict:
    return reference.simulate(arch, kernel, clk, dvfs=d, trace_len=trace_len, clock_trace=True)


def clock_changes(result: dict, sm: int = 0) -> list[tuple[int, int]]:
    """(first tick, new f_s) of every change of SM `sm`'s clock during the run."""
    mhz = result["sm_mhz_per_tick"][:, sm]
    return [(int(k) + 1, int(mhz[k + 1])) for k in np.flatnonzero(np.diff(mhz))]


def test_engine_units_of_the_shared_setup():
    """The premises of every hand computation below, straight from the shared lowering."""
    p = lower.to_numpy(lower.lower(ARCH, KERNEL, clocks.uniform(ARCH), 1, 0, 0, dvfs=quiet())).clocks.dvfs
    assert (int(p.period_ticks), int(p.latency_ticks), int(p.phase_ticks)) == (P_TICKS, L_TICKS, 0)
    assert (int(p.f_init_mhz), int(p.f_max_mhz), int(p.f_min_mhz), int(p.bin_mhz)) == (1980, 1980, 990, BIN_MHZ)
    assert (int(p.e_cycle_pj), int(p.uncore_mw), int(p.leak_mw)) == (1000, 0, 0)


def test_cap_far_above_power_keeps_the_clock_at_f_init():
    # 8 x 1980 mW ~ 16 W against the preset's 700 W cap; 45 C is far from the 87 C limit.
    r = run(quiet())
    assert np.all(r["sm_mhz_per_tick"] == F_MHZ)
    n_rows = int(np.sum(r["trace_tick"] >= 0))
    assert n_rows >= 8
    assert np.all(r["trace_mhz"][:n_rows] == F_MHZ)
    np.testing.assert_array_equal(r["sm_clock_end_mhz"], [F_MHZ] * N_SM)
    # the measured powers: 20 mW in the one-tick first window, then full windows
    np.testing.assert_array_equal(r["trace_mw"][0], [20] * N_SM)
    assert np.all(r["trace_mw"][1:n_rows] == FULL_WINDOW_MW)


def test_under_a_far_cap_the_clock_climbs_one_bin_per_sample_to_f_max():
    # f_init three bins under f_max: Pd (f + bin) <= Cd f holds at every sample, so each sample
    # asks for one bin more, applied L ticks later (from the tick after that), until f_max.
    r = run(quiet(initial_mhz=F_MHZ - 3 * BIN_MHZ))
    assert clock_changes(r) == [(0 + L_TICKS + 1, 1950), (99 + L_TICKS + 1, 1965), (198 + L_TICKS + 1, 1980)]


def test_power_step_over_the_cap_lowers_the_clock_after_the_latency_in_bins():
    # Cap 8 W: sample 0 (tick 0) sees 8 x 20 mW, under the cap, and f = f_max cannot rise;
    # sample 1 (tick 99) sees 8 x 1980 mW = 15.8 W > 8 W: one bin down, applied at 99 + L = 139,
    # so f_s = 1965 from tick 140. Every later sample is over the cap too: one more bin each.
    r = run(quiet(power_cap_w=8.0))
    makespan = r["makespan_ticks"]
    expected = [(99 * j + L_TICKS + 1, F_MHZ - BIN_MHZ * j) for j in range(1, 10)
                if 99 * j + L_TICKS + 1 < makespan]
    assert len(expected) >= 5
    for sm in range(N_SM):  # one chip-wide clock domain
        assert clock_changes(r, sm) == expected
    np.testing.assert_array_equal(r["trace_mw"][:2, 0], [20, FULL_WINDOW_MW])


def test_zero_latency_acts_in_the_samples_own_tick():
    # L = 0: the decision of sample 1 (tick 99) applies in tick 99's step 4, f_s from tick 100.
    # The trace records the clock in effect during the sample's tick: 1980 at tick 99.
    r = run(quiet(power_cap_w=8.0, latency_us=0.0))
    assert clock_changes(r)[:2] == [(100, 1965), (199, 1950)]
    np.testing.assert_array_equal(r["trace_mhz"][:3, 0], [1980, 1980, 1965])


def test_latency_of_one_period_applies_before_the_next_sample():
    # L = P = 99: sample 1's decision applies in step 1 of tick 198, before sample 2, which then
    # starts from fd = 1965; f_s changes from tick 199, so the trace at tick 198 still says 1980.
    r = run(quiet(power_cap_w=8.0, latency_us=0.05))
    assert clock_changes(r)[:2] == [(199, 1965), (298, 1950)]
    np.testing.assert_array_equal(r["trace_mhz"][:4, 0], [1980, 1980, 1980, 1965])


def test_lock_mode_never_changes_the_clock():
    # Over the cap and over the thermal limit from the start: dvfs mode steps down, lock does not.
    # SM 3's static map (1200 MHz) is below the lock: f_s = min(lock, cap_s).
    freq = np.full(N_SM, 1980.0)
    freq[3] = 1200.0
    clk = clocks.from_array(ARCH, freq)
    hot = dict(power_cap_w=1.0, initial_temp_c=95.0)
    locked = run(quiet("lock", lock_mhz=1500.0, **hot), clk=clk)
    expected = np.where(np.arange(N_SM) == 3, 1200, 1500)
    assert np.all(locked["sm_mhz_per_tick"] == expected)
    n_rows = int(np.sum(locked["trace_tick"] >= 0))
    assert n_rows >= 8 and np.all(locked["trace_mhz"][:n_rows] == expected)
    np.testing.assert_array_equal(locked["sm_clock_end_mhz"], expected)
    free = run(quiet("dvfs", initial_mhz=1500.0, **hot), clk=clk)
    assert clock_changes(free)[0] == (L_TICKS + 1, 1500 - BIN_MHZ)


def test_trace_rows_every_trace_every_samples():
    # phase 0.5: phase_ticks = floor(0.5 * 99) = 49, samples at 49 + 99 n; every 3rd is a row.
    r = run(quiet(phase=0.5, trace_every=3), trace_len=4)
    samples = [49 + 99 * n for n in range(20) if 49 + 99 * n < r["makespan_ticks"]]
    assert len(samples) == 8  # rows for samples 0, 3, 6; row 3 unused
    np.testing.assert_array_equal(r["trace_tick"], samples[::3] + [-1])
    # sample 0's window is ticks 0..49: 50 cycles, 50000 * 1980 // 99000 = 1000 mW
    np.testing.assert_array_equal(r["trace_mw"][:3, 0], [1000, FULL_WINDOW_MW, FULL_WINDOW_MW])
    for name in ("trace_mhz", "trace_mw", "trace_mk"):
        assert np.all(r[name][:3] > 0) and np.all(r[name][3] == 0), name
    short = run(quiet(phase=0.5, trace_every=3), trace_len=2)
    np.testing.assert_array_equal(short["trace_tick"], samples[:4:3])


def test_energy_at_v_max_is_the_activity():
    # f = f_max: V = v_max, factor 1024 // 1024 = 1, so every fold is exact whatever the samples:
    # E = 400 pJ x 200 FMA + 50 pJ x 1 EXIT + 150 pJ x cycles (the preset-sized defaults).
    r = run(dvfs.default(ARCH, period_us=0.05, latency_us=0.02))
    np.testing.assert_array_equal(r["sm_issued_op"][0], [200, 0, 0, 0, 0, 0, 0, 1])
    assert np.all(r["sm_issued_op"][1:] == 0)
    cycles = r["sm_cycles"]
    assert np.all(cycles == r["makespan_ticks"])
    np.testing.assert_array_equal(r["sm_energy_pj"], 150 * cycles + np.where(np.arange(N_SM) == 0, 80_050, 0))


@pytest.mark.parametrize("lock_mhz, expected_pj", [
    # V(990) = v_min = 700 mV: 700^2 * 1024 // 1000^2 = 501; 4050 * 501 // 1024 = 1981
    (990.0, 1981),
    # V(1485) = 700 + 300 * 495 // 990 = 850 mV: 850^2 * 1024 // 10^6 = 739; 4050 * 739 // 1024 = 2922
    (1485.0, 2922),
])
def test_energy_of_n_fmas_at_a_fixed_lower_voltage(lock_mhz, expected_pj):
    # One warp of 10 FMAs + EXIT, 400 and 50 pJ at v_max: A = 4050 pJ. No cycle energy, and the
    # only sample (tick 0, the period is 1 ms) comes before the first issue (tick 1), so the
    # final fold carries all of A in one rounding.
    kernel = make_kernel("loop 10\n fma\nend\nexit", grid=1, threads=32)
    d = dvfs.default(ARCH, mode="lock", lock_mhz=lock_mhz, cycle_energy_pj=0.0, period_us=1000.0)
    r = run(d, kernel=kernel)
    assert int(r["trace_tick"][1]) == -1
    np.testing.assert_array_equal(r["sm_energy_pj"], [expected_pj] + [0] * (N_SM - 1))


def test_energy_folds_at_the_old_voltage_when_the_clock_changes():
    # Static map 1500 MHz everywhere: F = 1500, P = 75, L = 30 ticks, and f_s = min(fd, 1500) =
    # 1500 = F, so every SM cycles at every tick while the domain clock fd (which sets V) climbs
    # from 1950 (sample 0) to 1965 at tick 30 and to 1980 at tick 105 (sample 75).
    # V(1950) = 700 + 300 * 960 // 990 = 990 mV, factor 990^2 * 1024 // 10^6 = 1003;
    # V(1965) = 700 + 300 * 975 // 990 = 995 mV, factor 1013; V(1980) = 1000 mV, factor 1024.
    # Folds at 1000 pJ per cycle: tick 0 (sample, 1 cycle at 990 mV): 1000 * 1003 // 1024 = 979;
    # tick 30 (apply, ticks 1..30 at 990 mV): 30000 * 1003 // 1024 = 29384; tick 75 (sample,
    # ticks 31..75 at 995 mV): 45000 * 1013 // 1024 = 44516; tick 105 (apply, ticks 76..105):
    # 30000 * 1013 // 1024 = 29677; then exact, 1000 pJ per cycle.
    clk = clocks.from_array(ARCH, np.full(N_SM, 1500.0))
    r = run(quiet(initial_mhz=1950.0), clk=clk)
    assert np.all(r["sm_mhz_per_tick"] == 1500)
    m = r["makespan_ticks"]
    assert np.all(r["sm_cycles"] == m)
    expected = 979 + 29384 + 44516 + 29677 + 1000 * (m - 106)
    np.testing.assert_array_equal(r["sm_energy_pj"], [expected] * N_SM)


@pytest.mark.parametrize("domain", ["sm", "chip"])
def test_thermal_rc_approaches_its_target(domain):
    # Lock at f_max (constant clock); r = 10 K/W per SM. Target after a full window: 35000 +
    # 1980 * 10000 // 1000 = 54800 mK (chip: 8 x 1980 mW through 10000 // 8 = 1250 mK/W, the
    # same). tau = 2P
    # halves the gap each sample; sample 0 aims at 35000 + 20 * 10 = 35200 from 45000:
    # 45000 + (35200 - 45000) * 99 // 198 = 40100, then 40100 + 14700 // 2 = 47450, 51125, ...
    d = quiet("lock", thermal_domain=domain, r_th_k_per_w=10.0, tau_us=0.1)
    r = run(d)
    mk = r["trace_mk"][:, 0]
    np.testing.assert_array_equal(mk[:9], [40100, 47450, 51125, 52962, 53881, 54340, 54570, 54685, 54742])
    assert np.all(r["trace_mk"][:9] == mk[:9, None])  # every SM the same here
    assert int(r["sm_temp_end_mk"][0]) == 54742
    # tau <= P: one step reaches the target exactly
    fast = run(quiet("lock", thermal_domain=domain, r_th_k_per_w=10.0, tau_us=0.01))
    np.testing.assert_array_equal(fast["trace_mk"][:4, 0], [35200, 54800, 54800, 54800])


def test_droop_lowers_the_clock_in_bins_after_its_delay():
    # 20 MHz/W: sample 0 (20 mW) gives 0; sample 1 (1980 mW) gives 1980 * 20000 // 10^6 = 39
    # MHz, 15 * (39 // 15) = 30 MHz, applied at 99 + D (D = round(0.01 * 1980) = 20): f_s = 1950
    # from tick 120. Later windows (~1940 mW) give 38 -> 30 again.
    r = run(quiet(droop_mhz_per_w=20.0, droop_delay_us=0.01))
    for sm in range(N_SM):
        assert clock_changes(r, sm) == [(120, 1950)]
    # the accumulator is 0 when the clock changes (F cycles every tick before): the SM executes
    # 120 cycles in ticks 0..119, then floor(n * 1950 / 1980) in the next n ticks
    m = r["makespan_ticks"]
    assert np.all(r["sm_cycles"] == 120 + (m - 120) * 1950 // 1980)


def test_sensor_noise_moves_the_decision_as_the_hash_says():
    # Cap 15.84 W = the chip's full-window power 8 x 1980 mW exactly. Sample 1 (n = 1, tick 99,
    # domain id 0) is over the cap iff its noise is > 0: then f_s = 1965 from tick 140, else
    # 1980 until sample 2's decision (its own noise) applies.
    seeds = {sign: next(s for s in range(100) if np.sign(reference.sensor_noise_mw(s, 1, 0, 1000)) == sign)
             for sign in (-1, 1)}
    for sign, seed in seeds.items():
        r = run(quiet(power_cap_w=15.84, noise_w=1.0, seed=seed))
        mhz = r["sm_mhz_per_tick"][:, 0]
        assert np.all(mhz[:99 + L_TICKS + 1] == 1980)
        assert np.all(mhz[99 + L_TICKS + 1:198 + L_TICKS + 1] == (1965 if sign > 0 else 1980)), (sign, seed)


@given(seed=st.integers(-(2**31), 2**31 - 1), n=st.integers(0, 2**20), domain=st.integers(0, 143),
       noise_mw=st.integers(0, 10**6))
def test_sensor_noise_is_within_plus_minus_noise(seed, n, domain, noise_mw):
    assert -noise_mw <= reference.sensor_noise_mw(seed, n, domain, noise_mw) <= noise_mw


def test_sensor_noise_spans_its_range():
    draws = [reference.sensor_noise_mw(7, n, d, 500) for n in range(500) for d in range(4)]
    assert min(draws) < -450 and max(draws) > 450 and abs(np.mean(draws)) < 25
    assert {reference.sensor_noise_mw(7, n, 0, 0) for n in range(50)} == {0}


def test_dvfs_off_leaves_results_unchanged_and_outputs_zero():
    kernel = make_kernel("loop 5\n ldg\n fma dep\n lds\nend\nexit", grid=12, threads=96)
    plain = reference.simulate(ARCH, kernel)
    off = reference.simulate(ARCH, kernel, dvfs=dvfs.off(ARCH), trace_len=3)
    for key, value in plain.items():
        if not key.startswith("trace_"):
            np.testing.assert_array_equal(off[key], value, err_msg=key)
    for key in ("sm_energy_pj", "sm_clock_end_mhz", "sm_temp_end_mk", "trace_mhz", "trace_mw", "trace_mk"):
        assert np.all(off[key] == 0), key
    np.testing.assert_array_equal(off["trace_tick"], [-1, -1, -1])
    assert off["trace_mhz"].shape == (3, N_SM)
    np.testing.assert_array_equal(off["sm_issued_op"].sum(axis=1), off["sm_issued"])
    # 12 CTAs x 3 warps x (5 x (LDG, FMA, LDS) + EXIT), wherever they ran
    np.testing.assert_array_equal(off["sm_issued_op"].sum(axis=0), [180, 0, 0, 180, 180, 0, 0, 36])


def test_floorswept_sms_are_zero_and_outside_every_domain():
    # 3 TPCs: SM slots 6 and 7 floorswept. Per-SM thermal domains would divide by n(t) = 0 for
    # them if they counted; per-GPC clock domains: GPC 1 has 2 enabled SMs (2, 3).
    arch = small_arch(3)
    d = dvfs.default(arch, clock_domain="gpc", thermal_domain="sm", period_us=0.05, latency_us=0.02)
    r = run(d, arch=arch)
    for key in ("sm_energy_pj", "sm_clock_end_mhz", "sm_temp_end_mk", "sm_cycles"):
        assert np.all(r[key][6:] == 0) and np.all(r[key][:6] > 0), key
    for key in ("trace_mhz", "trace_mw", "trace_mk"):
        assert np.all(r[key][:, 6:] == 0), key
    assert np.all(r["sm_mhz_per_tick"][:, 6:] == 0)
