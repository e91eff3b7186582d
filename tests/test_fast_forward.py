"""Fast-forward through steady state (docs/model.md section 11) is exact: the engine with it
equals the tick-by-tick reference, and itself without it, on every integer output, on
configurations drawn so that it engages (long loops, few events) across clocks, warp and
dispatch policies, DVFS, barriers inside loops, divergent loops, launch modes and workloads.
And it does engage: on the long-kernel shape the engine processes a small share of the ticks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import jaxsched as js
from jaxsched import clocks, dvfs, reference
from jaxsched.engine.run import simulate_batch
from jaxsched.errors import JaxschedError
from jaxsched.kernel import make_kernel, resident_grid
from jaxsched.lower import DISPATCH_POLICIES, WARP_POLICIES

from helpers import examples, MAX_GRID, N_INSTR, simulate_padded, small_arch
from test_engine_vs_reference import CTA_KEYS, INT_KEYS, assert_same

_BODY = ["fma dep", "fma", "alu", "alu dep", "sfu dep", "lds", "lds dep ways=2", "shfl dep"]


@st.composite
def steady_programs(draw, trips: tuple[int, int], barrier: str = "") -> str:
    """A program with a long loop of a few instructions (optionally an if/else or a barrier in
    it), short code around it."""
    body = [draw(st.sampled_from(_BODY)) for _ in range(draw(st.integers(1, 4)))]
    if draw(st.booleans()):
        body += [f"if {draw(st.sampled_from([0.3, 0.5, 1.0]))}", draw(st.sampled_from(_BODY)), "else",
                 draw(st.sampled_from(_BODY)), "end", "alu"]
    if barrier == "bar" and draw(st.booleans()):
        body.insert(draw(st.integers(0, len(body))) if "if" not in body else 0, "bar")
    spreads = f"cta_spread={draw(st.integers(0, 2))} warp_spread={draw(st.sampled_from([0, 0, 1, 3]))}"
    before = [draw(st.sampled_from(_BODY))] if draw(st.booleans()) else []
    after = ["gsync"] if barrier == "gsync" else ([draw(st.sampled_from(_BODY))] if draw(st.booleans()) else [])
    head = ["gsync"] if barrier == "gsync" and draw(st.booleans()) else []
    return "\n".join(head + before + [f"loop {draw(st.integers(*trips))} {spreads}", *body, "end", *after,
                                      "exit dep" if draw(st.booleans()) else "exit"])


def _chip(draw) -> js.Arch:
    return small_arch(draw(st.integers(1, 2)), taken_branch_cycles=np.int32(draw(st.sampled_from([0, 2, 9]))),
                      cta_launch_idle_cycles=np.int32(draw(st.sampled_from([0, 0, 30, 256]))),
                      mio_queue_depth=np.int32(draw(st.sampled_from([2, 16]))))


# Trace rows with or without DVFS (none are written without), so that the modes share compilations.
TRACE_LEN = 8


@st.composite
def steady_configurations(draw, trips: tuple[int, int] = (12, 40)) -> dict:
    """One configuration of a mode (plain kernel, DVFS, cooperative, persistent, two-kernel
    workload) whose loops run long enough for fast-forward to engage."""
    arch = _chip(draw)
    mode = draw(st.sampled_from(["plain", "plain", "dvfs", "cooperative", "persistent", "workload"]))
    threads = draw(st.sampled_from([32, 64, 128, 256]))
    barrier = {"cooperative": "gsync", "plain": "bar"}.get(mode, "")
    program = draw(steady_programs(trips, barrier))
    kernel = make_kernel(program, grid=draw(st.integers(1, 6)), threads=threads, regs=32, l2_hit_rate=0.5,
                         seed=draw(st.integers(0, 1000)), pad_to=N_INSTR, cooperative=mode == "cooperative")
    if mode == "cooperative":
        kernel = kernel.replace(grid_ctas=np.int32(min(int(kernel.grid_ctas), resident_grid(arch, kernel))))
    if mode == "persistent":
        kernel = kernel.replace(grid_ctas=np.int32(resident_grid(arch, kernel)),
                                work_items=np.int32(draw(st.integers(1, 60))))
    if mode == "workload":
        other = make_kernel(draw(steady_programs(trips)), grid=draw(st.integers(1, 4)), threads=threads, regs=32,
                            seed=draw(st.integers(0, 1000)), pad_to=N_INSTR)
        kernel = js.make_workload([kernel, other], streams=[0, draw(st.sampled_from([0, 1]))])
    freqs = [draw(st.sampled_from([900, 1230, 1500, 1605, 1980])) for _ in range(arch.n_sm_slots)]
    params = None
    if mode == "dvfs":
        params = dvfs.default(arch, period_us=draw(st.sampled_from([0.5, 2.0])), latency_us=0.25,
                              power_cap_w=draw(st.sampled_from([30.0, 700.0])))
    return dict(arch=arch, kernel=kernel, clocks=clocks.from_array(arch, np.asarray(freqs, np.float64)),
                warp_policy=draw(st.sampled_from(WARP_POLICIES)),
                dispatch=draw(st.sampled_from(DISPATCH_POLICIES)), dispatch_start=draw(st.integers(0, 3)),
                dvfs=params, trace_len=TRACE_LEN)


@settings(max_examples=examples(15, fixed=10), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=steady_configurations())
def test_fast_forward_equals_reference(cfg: dict) -> None:
    try:
        ref = reference.simulate(**cfg)
    except JaxschedError:
        return
    result = simulate_padded(**cfg)
    share = int(result.ticks_stepped) / int(ref["makespan_ticks"])
    event(f"ticks stepped: {'< 1/10' if share < 0.1 else '< 1/2' if share < 0.5 else '>= 1/2'} of the makespan")
    assert_same(result, ref)
    for key in ("sm_energy_pj", "sm_clock_end_mhz", "sm_temp_end_mk", "trace_tick", "trace_mhz", "trace_mw",
                "trace_mk", "sm_items"):
        np.testing.assert_array_equal(np.asarray(getattr(result, key)), ref[key], err_msg=key)
    if isinstance(cfg["kernel"], js.Workload):
        for key in ("kernel_ready_tick", "kernel_start_tick", "kernel_end_tick"):
            np.testing.assert_array_equal(np.asarray(getattr(result, key)), ref[key], err_msg=key)


_FIELDS = INT_KEYS + CTA_KEYS + ("makespan_ticks", "sm_items", "sm_energy_pj", "trace_mhz", "trace_mw",
                                 "kernel_end_tick")


def _batch_kw(cfgs: list[dict]) -> dict:
    """The long-loop batch's static choices, outside the test so that they may change without
    changing its fixed draws (hypothesis derives them from the test's source)."""
    return dict(dvfs=[c["dvfs"] for c in cfgs], trace_len=TRACE_LEN, dvfs_step=True, closed_loop_step=True,
                cta_slots=int(cfgs[0]["arch"].max_blocks_per_sm), max_ctas=MAX_GRID,
                chunk=1)  # one at a time: a chunk steps until its longest member ends


@settings(max_examples=examples(3), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfgs=st.lists(steady_configurations(trips=(150, 600)), min_size=3, max_size=3))
def test_fast_forward_equals_stepping_on_long_loops(cfgs: list[dict]) -> None:
    """Loops longer than the reference can run in the suite's time: the engine with
    fast-forward equals itself without, on a batch of three."""
    kernels = [c["kernel"] for c in cfgs]
    if len({isinstance(k, js.Workload) for k in kernels}) > 1:
        kernels = [k.kernels[0] if isinstance(k, js.Workload) else k for k in kernels]
    args = ([c["arch"] for c in cfgs], kernels, [c["clocks"] for c in cfgs],
            [WARP_POLICIES.index(c["warp_policy"]) for c in cfgs], [DISPATCH_POLICIES.index(c["dispatch"]) for c in cfgs],
            [c["dispatch_start"] for c in cfgs])
    try:
        kw = _batch_kw(cfgs)
        on = simulate_batch(*args, fast_forward=True, **kw)
    except JaxschedError:
        return
    off = simulate_batch(*args, fast_forward=False, **kw)
    for key in _FIELDS:
        np.testing.assert_array_equal(np.asarray(getattr(on, key)), np.asarray(getattr(off, key)), err_msg=key)
    assert np.all(np.asarray(on.ticks_stepped) <= np.asarray(off.ticks_stepped))


@pytest.mark.parametrize("warp_policy", ["lrr", "gto"])
def test_fast_forward_through_launch_credit(warp_policy):
    """Three waves on one SM whose refills wait for launch credit (docs/model.md section 9):
    the credit grows over recurring periods and the jumps stop before a refill's need, so the
    SM is jumped between the refills too, and every integer output equals the reference's."""
    arch = small_arch(1, cta_launch_idle_cycles=np.int32(700), taken_branch_cycles=np.int32(9))
    kernel = make_kernel("loop 60\n fma dep\n fma dep\n alu\n alu dep\nend", grid=1, threads=128, regs=32,
                         pad_to=N_INSTR)
    kernel = kernel.replace(grid_ctas=np.int32(3 * resident_grid(arch, kernel)))
    cfg = dict(arch=arch, kernel=kernel, clocks=clocks.from_array(arch, np.full(arch.n_sm_slots, 1605.0)),
               warp_policy=warp_policy, trace_len=TRACE_LEN)  # the compilation of the test above
    ref = reference.simulate(**cfg)
    result = simulate_padded(**cfg)
    assert_same(result, ref)
    assert int(result.ticks_stepped) < int(ref["makespan_ticks"]) // 2


def test_fast_forward_engages_on_the_long_kernel():
    """The long-kernel shape (benchmarks/long_kernel.py): the H200 preset, one wave of 1056
    CTAs of 256 threads, each thread a loop of 16 dependent FMAs, an IADD3, an ISETP and the
    branch, under LRR on a random per-SM clock map. Cut to 200 trips, it still takes some
    75,000 ticks; fast-forward processes few of them, and a silent fallback to stepping would
    fail here."""
    arch = js.presets.get("h200")
    body = "\n".join(["  fma dep"] * 16 + ["  alu", "  alu dep", "  alu dep"])
    kernel = make_kernel(f"loop 200\n{body}\nend", grid=1056, threads=256, regs=32)
    mhz = 15 * np.random.default_rng(0).integers(107, 133, arch.n_sm_slots)  # 15 MHz bins, 1.6-1.98 GHz
    result = js.simulate(arch, kernel, clocks.from_array(arch, mhz), warp_policy="lrr")
    assert int(result.makespan_ticks) > 50_000
    assert int(result.ticks_stepped) < int(result.makespan_ticks) // 10, (int(result.ticks_stepped),
                                                                          int(result.makespan_ticks))


def test_fast_forward_is_a_checked_flag():
    arch = small_arch(1)
    kernel = make_kernel("loop 2\n fma dep\nend", grid=1, threads=32)
    with pytest.raises(JaxschedError, match="fast_forward"):
        js.simulate(arch, kernel, fast_forward="yes")
