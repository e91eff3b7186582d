"""Clock-regression dispatch (docs/model.md section 9): its least-squares fit, the same in both
engines to the tick, what it predicts, and its input check. Whole runs of the policy are in the
differential tests, which draw it among every dispatch policy."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxsched as js
from jaxsched import params, reference
from jaxsched.engine.dispatch_policies import clock_regression as engine_twin
from jaxsched.reference_dispatch import clock_regression as reference_twin

from helpers import simulate_pinned

# The whole runs below share one compilation per number of launches (four before, one per
# occupancy, grid and policy family): every CTA slot they use, the largest grid, the closed
# loop's learning and fast-forward's search compiled in.
STATICS = dict(cta_slots=8, max_ctas=96, closed_loop_step=True, fast_forward_step=True)


def simulate(arch: js.Arch, kernel, clk: js.Clocks | None = None, **config) -> js.Result:
    """`js.simulate` with the file's `STATICS` (`helpers.simulate_pinned`)."""
    return simulate_pinned(arch, kernel, clk, statics=STATICS, **config)


# Compiled, as the engine runs it: one program per number of SMs (op by op, the 300 draws below
# compiled some 380 small programs).
_jit_fit = jax.jit(engine_twin.fit)


def _engine_fit(total: list[int], count: list[int], mhz: list[int]) -> list[int]:
    with jax.enable_x64(True):  # as the engine runs
        out = _jit_fit(jnp.asarray([total], jnp.int64), jnp.asarray([count], jnp.int64), jnp.asarray(mhz, jnp.int32))
        return [int(v) for v in np.asarray(out)[0]]


@st.composite
def _sums(draw):
    """Per-SM duration sums, counts and clocks, up to the bounds the fit is exact for."""
    n = draw(st.integers(1, 12))
    mhz = draw(st.lists(st.integers(0, 3000), min_size=n, max_size=n))
    count = draw(st.lists(st.integers(0, 50), min_size=n, max_size=n))
    mean = draw(st.lists(st.integers(0, 2**31 - 1), min_size=n, max_size=n))
    total = [c * m + draw(st.integers(0, max(c - 1, 0))) for c, m in zip(count, mean)]
    return total, count, mhz


@settings(max_examples=300, deadline=None)
@given(_sums())
def test_fit_is_the_same_in_both_engines(sums):
    total, count, mhz = sums
    assert _engine_fit(total, count, mhz) == reference_twin.fit(total, count, mhz)


def test_fit_follows_the_clock_of_compute_bound_ctas():
    # Durations that scale exactly with the clock period: every SM, with or without a completion
    # (SM 3), is predicted at its own clock.
    mhz = [1980, 1800, 1500, 1200]
    period = [2**20 // f for f in mhz]
    total, count = [5 * p for p in period[:3]] + [0], [5, 5, 5, 0]
    for fit in (_engine_fit, reference_twin.fit):
        assert fit(total, count, mhz) == period


def test_fit_is_flat_where_durations_do_not_follow_the_clock():
    # Memory-bound: the same mean duration at every clock, so every SM gets it, and a launch
    # without completions gets 0 everywhere.
    mhz = [1980, 1800, 1500, 1200]
    for fit in (_engine_fit, reference_twin.fit):
        assert fit([7000, 14000, 7000, 0], [1, 2, 1, 0], mhz) == [7000] * 4
        assert fit([0] * 4, [0] * 4, mhz) == [0] * 4


def test_slope_is_kept_between_flat_and_through_the_origin():
    # Faster SMs slower (negative slope) is noise: flat at the mean. A slope steeper than the line
    # through the origin would predict negative fixed time: it is cut to that line.
    mhz = [2000, 1000]
    for fit in (_engine_fit, reference_twin.fit):
        assert fit([3000, 1000], [1, 1], mhz) == [2000, 2000]
        steep = fit([100, 10000], [1, 1], mhz)
        assert steep[1] == pytest.approx(2 * steep[0], abs=1) and sum(steep) <= 10100 + 1


def test_chips_past_the_fits_sm_limit_are_refused(monkeypatch):
    # The limit (256 enabled SMs) lowered below the H200's 132, which no preset exceeds.
    monkeypatch.setattr(params, "MAX_FIT_SMS", 100)
    arch = js.presets.get("h200")
    kernel = js.make_kernel("loop 2\n fma dep\nend", grid=264, threads=128, regs=32)
    with pytest.raises(js.JaxschedError, match="dispatch.*clock_regression.*at most 100 enabled SMs.*has 132"):
        js.make_params(arch, kernel, js.clocks.uniform(arch), dispatch="clock_regression")
    js.make_params(arch, kernel, js.clocks.uniform(arch), dispatch="closed_loop")


def test_runs_are_the_same_in_both_engines_on_unequal_sms():
    # 8 SMs at sigma 0.2, 4 waves of a few-long-CTA shape, no hold margin, so it holds in the tail
    # (on so small a chip the holds cost: 6943 ticks against hardware dispatch's 6678 and the
    # closed loop's 6922).
    arch = js.archio.load(Path(__file__).parents[1] / "sweeps" / "arches" / "h200_8sm.toml")
    kernel = js.make_kernel("loop 64 cta_spread=6\n fma dep\n fma dep\nend", grid=64, threads=512, regs=64)
    clk = js.clocks.gaussian(arch, 2, 1.8, 0.2)
    fast = simulate(arch, kernel, clk, dispatch="clock_regression", hold_margin=0.0)
    plain = reference.simulate(arch, kernel, clk, dispatch="clock_regression", hold_margin=0.0)
    assert int(fast.makespan_ticks) == int(plain["makespan_ticks"])
    for field in ("cta_sm", "cta_start_tick", "cta_end_tick"):
        np.testing.assert_array_equal(np.asarray(getattr(fast, field)), np.asarray(plain[field]))


def test_on_a_uniform_chip_it_is_hardware_dispatch():
    # Every SM gets the same estimate, so placements follow "most room" and nothing is held: the
    # memory-mix shape, whose CTA durations vary by CTA, on 8 SMs at one clock.
    arch = js.archio.load(Path(__file__).parents[1] / "sweeps" / "arches" / "h200_8sm.toml")
    kernel = js.make_kernel("loop 4 cta_spread=2\n ldg\n fma dep\nend", grid=96, threads=256, regs=32)
    runs = [simulate(arch, kernel, js.clocks.uniform(arch), dispatch=d, hold_margin=0.0)
            for d in ("hardware", "clock_regression")]
    for field in ("makespan_ticks", "cta_sm", "cta_start_tick"):
        np.testing.assert_array_equal(np.asarray(getattr(runs[0], field)), np.asarray(getattr(runs[1], field)))


def test_concurrent_launches_keep_their_own_fits_in_both_engines():
    # Two launches on two streams share the 8 unequal SMs: each launch's sums and counts, its fit
    # and its hold are its own (section 13), the same in both engines.
    arch = js.archio.load(Path(__file__).parents[1] / "sweeps" / "arches" / "h200_8sm.toml")
    long = js.make_kernel("loop 48 cta_spread=6\n fma dep\n fma dep\nend", grid=40, threads=512, regs=64)
    short = js.make_kernel("loop 12\n fma dep\n ldg\nend", grid=56, threads=256, regs=32)
    work = js.workload.make_workload([long, short], streams=[0, 1])
    clk = js.clocks.gaussian(arch, 2, 1.8, 0.2)
    fast = simulate(arch, work, clk, dispatch="clock_regression", hold_margin=0.0)
    plain = reference.simulate(arch, work, clk, dispatch="clock_regression", hold_margin=0.0)
    assert int(fast.makespan_ticks) == int(plain["makespan_ticks"])
    for field in ("cta_sm", "cta_start_tick", "cta_end_tick", "cta_kernel"):
        np.testing.assert_array_equal(np.asarray(getattr(fast, field)), np.asarray(plain[field]), err_msg=field)
