"""Differential test with DVFS on: the JAX engine equals the tick-by-tick reference exactly on
random chips, kernels and policies with random power, thermal and controller parameters
(short periods, so that many samples, decisions and droop changes fall inside small runs)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from jaxsched import dvfs, reference
from jaxsched.errors import JaxschedError
from jaxsched.isa import Op

from helpers import configurations, examples, simulate_padded
from test_engine_vs_reference import assert_same

TRACE_LEN = 6
DVFS_KEYS = ("sm_energy_pj", "sm_clock_end_mhz", "sm_temp_end_mk", "trace_tick", "trace_mhz",
             "trace_mw", "trace_mk")


@st.composite
def dvfs_params(draw, arch) -> dvfs.Dvfs:
    f = lambda lo, hi: draw(st.floats(lo, hi, allow_nan=False))  # noqa: E731
    period = f(0.005, 0.3)
    boost = draw(st.integers(1000, 2000))
    low = draw(st.integers(300, boost))
    return dvfs.default(
        arch,
        mode=draw(st.sampled_from(["dvfs", "dvfs", "lock"])),
        clock_domain=draw(st.sampled_from(dvfs.DOMAINS)),
        thermal_domain=draw(st.sampled_from(dvfs.DOMAINS)),
        boost_mhz=float(boost),
        min_mhz=float(low),
        bin_mhz=float(draw(st.sampled_from([1, 15, 50]))),
        initial_mhz=float(draw(st.integers(low, boost))),
        lock_mhz=float(draw(st.integers(low, boost))),
        period_us=period,
        latency_us=period * draw(st.sampled_from([0.0, 0.3, 1.0])),
        droop_delay_us=period * draw(st.sampled_from([0.0, 0.5, 1.0])),
        phase=f(0.0, 0.99),
        power_cap_w=f(0.5, 40.0),
        uncore_w=f(0.0, 5.0),
        leak_w=f(0.0, 2.0),
        leak_per_k=f(-0.01, 0.05),
        ambient_c=f(20.0, 50.0),
        initial_temp_c=f(20.0, 100.0),
        thermal_limit_c=f(40.0, 100.0),
        thermal_hysteresis_c=f(0.0, 10.0),
        r_th_k_per_w=f(0.0, 100.0),
        tau_us=f(0.01, 5.0),
        v_min_mv=f(500.0, 800.0),
        v_max_mv=f(800.0, 1200.0),
        energy_pj=[draw(st.integers(0, 1000)) for _ in Op],
        cycle_energy_pj=float(draw(st.integers(0, 300))),
        droop_mhz_per_w=f(0.0, 60.0),
        noise_w=f(0.0, 2.0),
        seed=draw(st.integers(-(2**31), 2**31 - 1)),
        trace_every=draw(st.integers(1, 3)),
    )


@st.composite
def dvfs_configurations(draw) -> dict:
    cfg = draw(configurations())
    return {**cfg, "dvfs": draw(dvfs_params(cfg["arch"])), "trace_len": TRACE_LEN}


@settings(max_examples=examples(10, fixed=6), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=dvfs_configurations())
def test_engine_equals_reference_with_dvfs(cfg: dict) -> None:
    try:
        ref = reference.simulate(**cfg)
    except JaxschedError:
        return
    result = simulate_padded(**cfg)
    assert_same(result, ref)
    np.testing.assert_array_equal(result.sm_issued_op, ref["sm_issued_op"], err_msg="sm_issued_op")
    for key in DVFS_KEYS:
        np.testing.assert_array_equal(np.asarray(getattr(result, key)), ref[key], err_msg=key)
    np.testing.assert_array_equal(np.sum(result.sm_issued_op, axis=1), result.sm_issued)
    samples = int(np.sum(np.asarray(result.trace_tick) >= 0))
    event(f"{min(samples, TRACE_LEN)} trace rows")
    event("clock moved" if np.any(np.diff(np.asarray(result.trace_mhz), axis=0)) else "clock constant")
