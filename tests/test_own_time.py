"""SMs on their own time (engine/decouple.py, docs/model.md section 11) are exact: the engine in
which each SM runs to its own next event, and takes CTAs at its own tick while enough are sure
to remain, equals the tick-by-tick reference and itself at the chip's tick, on every integer
output and the per-CTA trace, on multi-wave grids drawn so that it engages (uniform CTAs, long
loops, unequal clocks) and so that it must wait (CTAs that differ, round robin, the tail of the
grid, DVFS). And it does engage: a multi-wave kernel steps a fraction of the ticks the chip's
tick steps."""

from __future__ import annotations

import jax
import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import jaxsched as js
from jaxsched import clocks, dvfs, reference
from jaxsched.engine import dispatch_policies
from jaxsched.engine.run import simulate_batch
from jaxsched.errors import JaxschedError
from jaxsched.kernel import make_kernel, resident_grid
from jaxsched.lower import DISPATCH_POLICIES, WARP_POLICIES

from helpers import examples, MAX_GRID, N_INSTR, simulate_padded, small_arch
from test_engine_vs_reference import CTA_KEYS, INT_KEYS, assert_same

_BODY = ["fma dep", "fma", "alu", "alu dep", "sfu dep", "lds", "lds dep ways=2", "shfl dep"]
# dispatch that may place CTAs at an SM's own tick (`STATIC` policies), and the others
_OWN_TIME = tuple(name for name, policy in dispatch_policies.MODULES.items() if policy.STATIC)
_CHIP_TIME = tuple(name for name in DISPATCH_POLICIES if name not in _OWN_TIME)


# Trace rows with or without DVFS (none are written without), so that the examples share compilations.
TRACE_LEN = 8


@st.composite
def multi_wave_configurations(draw, trips: tuple[int, int] = (12, 40), max_grid: int = MAX_GRID,
                              dvfs_periods_us: tuple[float, ...] = (0.5, 2.0), split_branches: bool = True) -> dict:
    """A grid of 2-4 waves of one loop on a chip of unequal clocks: mostly CTAs that do not differ
    (no trip spreads, branches taken by all lanes or none), so that SMs take CTAs at their own
    ticks; sometimes CTAs that differ, round robin or closed-loop dispatch, or DVFS, which make
    them wait for the others or keep the chip's tick. A controller period of a few hundred
    cycles samples many times within a short loop; a longer one lets fast-forward skip between
    samples of a long loop. A branch that splits a warp's lanes anew on each trip never recurs,
    so fast-forward cannot engage on it (`split_branches`)."""
    arch = small_arch(draw(st.integers(1, 2)), taken_branch_cycles=np.int32(draw(st.sampled_from([0, 2, 9]))),
                      cta_launch_idle_cycles=np.int32(draw(st.sampled_from([0, 0, 30, 256]))),
                      cta_launch_ns=np.float32(draw(st.sampled_from([0.0, 0.0, 50.0, 207.0]))))
    body = [draw(st.sampled_from(_BODY)) for _ in range(draw(st.integers(1, 4)))]
    uniform = draw(st.sampled_from([True, True, True, False]))
    if draw(st.booleans()):
        taken = draw(st.sampled_from([0.3, 0.5] if split_branches and not uniform else [0.0, 1.0]))
        body += [f"if {taken}", draw(st.sampled_from(_BODY)), "else", draw(st.sampled_from(_BODY)), "end", "alu"]
    spreads = "" if uniform else f" cta_spread={draw(st.integers(1, 3))} warp_spread={draw(st.integers(0, 2))}"
    program = "\n".join([f"loop {draw(st.integers(*trips))}{spreads}", *body, "end",
                         "exit dep" if draw(st.booleans()) else "exit"])
    kernel = make_kernel(program, grid=1, threads=draw(st.sampled_from([64, 128, 256, 512])), regs=32,
                         seed=draw(st.integers(0, 1000)), pad_to=N_INSTR)
    waves = draw(st.integers(2, 4))
    grid = min(max_grid, waves * resident_grid(arch, kernel) + draw(st.integers(-2, 2)))
    kernel = kernel.replace(grid_ctas=np.int32(max(grid, 1)))
    freqs = [draw(st.sampled_from([900, 1230, 1500, 1605, 1980])) for _ in range(arch.n_sm_slots)]
    dispatch = draw(st.sampled_from(_OWN_TIME * 3 + _CHIP_TIME))
    params = None
    if draw(st.integers(0, 5)) == 0:
        params = dvfs.default(arch, period_us=draw(st.sampled_from(dvfs_periods_us)), latency_us=0.25,
                              power_cap_w=draw(st.sampled_from([30.0, 700.0])))
    return dict(arch=arch, kernel=kernel, clocks=clocks.from_array(arch, np.asarray(freqs, np.float64)),
                warp_policy=draw(st.sampled_from(WARP_POLICIES)), dispatch=dispatch,
                dispatch_start=draw(st.integers(0, 3)), dvfs=params, trace_len=TRACE_LEN)


@settings(max_examples=examples(6), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=multi_wave_configurations())
def test_own_time_equals_reference(cfg: dict) -> None:
    try:
        ref = reference.simulate(**cfg)
    except JaxschedError:
        return
    result = simulate_padded(**cfg)
    event(f"dispatch {cfg['dispatch']}, CTAs {'alike' if int(cfg['kernel'].trips_cta_spread[0]) == 0 else 'differ'}")
    assert_same(result, ref)
    for key in ("sm_energy_pj", "sm_clock_end_mhz", "trace_tick", "trace_mhz", "trace_mw", "kernel_end_tick"):
        np.testing.assert_array_equal(np.asarray(getattr(result, key)), ref[key], err_msg=key)


_FIELDS = INT_KEYS + CTA_KEYS + ("makespan_ticks", "sm_energy_pj", "trace_mhz", "trace_mw", "kernel_start_tick",
                                 "kernel_end_tick")


def _batch_args(cfgs: list[dict]) -> tuple[tuple, dict]:
    args = ([c["arch"] for c in cfgs], [c["kernel"] for c in cfgs], [c["clocks"] for c in cfgs],
            [WARP_POLICIES.index(c["warp_policy"]) for c in cfgs],
            [DISPATCH_POLICIES.index(c["dispatch"]) for c in cfgs], [c["dispatch_start"] for c in cfgs])
    kw = dict(dvfs=[c["dvfs"] for c in cfgs], trace_len=TRACE_LEN, dvfs_step=True, closed_loop_step=True,
              fast_forward_step=True, cta_slots=int(cfgs[0]["arch"].max_blocks_per_sm), max_ctas=MAX_GRID,
              chunk=1)  # one at a time: a chunk steps until its longest member ends
    return args, kw


@settings(max_examples=examples(2), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfgs=st.lists(multi_wave_configurations(trips=(150, 400), dvfs_periods_us=(20.0, 50.0),
                                                               split_branches=False), min_size=3, max_size=3))
def test_own_time_equals_the_chips_tick_on_long_loops(cfgs: list[dict]) -> None:
    """Loops longer than the reference can run in the suite's time: SMs on their own time equal
    every SM at the chip's tick (both with fast-forward), on a batch of three."""
    args, kw = _batch_args(cfgs)
    kw["devices"] = jax.devices()[:1]  # one batch of three: shards would wait on the longest
    try:
        own = simulate_batch(*args, **kw)
    except JaxschedError:
        return
    chip = simulate_batch(*args, free_sms_step=False, **kw)
    for key in _FIELDS:
        np.testing.assert_array_equal(np.asarray(getattr(own, key)), np.asarray(getattr(chip, key)), err_msg=key)


def test_own_time_engages_on_many_waves():
    """Four waves of the long-kernel loop (benchmarks/long_kernel.py) on an 8-SM H200 at random
    clocks in 15 MHz bins: at the chip's tick every SM's recurrence search after each refill
    costs every other SM a step; on their own time the engine steps a fraction of that, with
    the same results. A silent fallback to the chip's tick would fail here."""
    arch = js.load_arch("sweeps/arches/h200_8sm.toml")
    body = "\n".join(["  fma dep"] * 16 + ["  alu", "  alu dep", "  alu dep"])
    kernel = make_kernel(f"loop 150\n{body}\nend", grid=4 * 8 * 8, threads=256, regs=32)
    mhz = 15 * np.random.default_rng(0).integers(107, 133, arch.n_sm_slots)
    args = ([arch], [kernel], [clocks.from_array(arch, mhz)], [WARP_POLICIES.index("lrr")], [0], [0])
    own = simulate_batch(*args)
    chip = simulate_batch(*args, free_sms_step=False)
    for key in _FIELDS:
        np.testing.assert_array_equal(np.asarray(getattr(own, key)), np.asarray(getattr(chip, key)), err_msg=key)
    assert 3 * int(own.ticks_stepped[0]) < int(chip.ticks_stepped[0]), (int(own.ticks_stepped[0]),
                                                                         int(chip.ticks_stepped[0]))
