"""Workloads in `jaxsched.reference`, by hand (docs/model.md section 13).

Numbers pinned on a small chip (tests/helpers.py): FMA latency 4 cycles, one FMA per scheduler
per cycle, every enabled SM at 1980 MHz unless a test says otherwise, so the tick is the SM
cycle and `x` ns is `round(1.98 x)` ticks (10 ns: 20, 5 ns: 10, 50 ns: 99). A single-warp CTA
of `n` dependent FMAs dispatched at tick `k` issues its first FMA at `k + 1`, FMA `i` at
`k + 1 + 4 (i - 1)` and its EXIT one tick after the last FMA, so it completes at `k + 4 n - 2`
(duration `D(n) = 4 n - 2`: 10 for 3 FMAs, 2 for 1). With 200 KiB of dynamic shared memory
one CTA fits per SM, with 100 KiB two.

Section 13 in brief: launch `l` is submitted at `(l + 1) api` (stream mode) or `api` (graph);
it is ready at `max(submit, max over its dependencies of end + 1) + gap`; the head launch (ready,
CTAs left, smallest `(ready, l)`) places its CTAs first (the leftover policy).
"""

from __future__ import annotations

import equinox as eqx
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings

from jaxsched import clocks, lower, reference, workload
from jaxsched.errors import JaxschedError
from jaxsched.isa import Op
from jaxsched.kernel import make_kernel

from helpers import configurations, examples, small_arch

ONE_SLOT = 200 * 1024  # dynamic shared memory for one CTA per SM
TWO_SLOTS = 100 * 1024


def hand_arch(n_sms: int, cta_launch_ns: float = 0.0, **overheads_ns: float):
    """The small test chip with its first `n_sms` SM slots enabled, the numbers used here
    pinned, and the launch overheads 0 unless given."""
    base = small_arch(4)
    lat = np.asarray(base.latency_cycles).copy()
    lat[Op.FMA] = 4
    issue = np.asarray(base.issue_cycles).copy()
    issue[Op.FMA] = 1
    over = {key: np.float32(overheads_ns.get(key, 0.0)) for key in workload.OVERHEAD_FIELDS}
    return base.replace(sm_enabled=np.arange(base.n_sm_slots) < n_sms, latency_cycles=lat,
                        issue_cycles=issue, boost_clock_ghz=np.float32(1.98),
                        cta_launch_ns=np.float32(cta_launch_ns), **over)


def fmas(n: int, grid: int = 1, smem: int = ONE_SLOT):
    """A kernel of `grid` single-warp CTAs of `n` dependent FMAs (duration 4 n - 2 ticks)."""
    return make_kernel("\n".join(["fma dep"] * n), grid=grid, threads=32, smem_bytes=smem)


def ticks(r: dict, key: str) -> list[int]:
    return np.asarray(r[key]).tolist()


@pytest.mark.parametrize("first_fmas, ready_1", [
    (3, 41 + 10),  # end_0 = 30 + 10 = 40 dominates: ready_1 = end_0 + 1 + gap
    (1, 40 + 10),  # end_0 = 30 + 2 = 32 is before submit_1 = 40: ready_1 = submit_1 + gap
])
def test_chain_on_one_stream(first_fmas, ready_1):
    """Two launches on stream 0, api = 20 ticks (10 ns), gap = 10 (5 ns): submit = 20, 40;
    ready_0 = 30; the second waits for the first and starts at max(end_0 + 1, submit_1) + gap."""
    arch = hand_arch(1)
    wl = workload.make_workload([fmas(first_fmas), fmas(3)], launch_api_ns=10.0, launch_gap_ns=5.0)
    r = reference.simulate(arch, wl)
    end_0 = 30 + 4 * first_fmas - 2
    assert ticks(r, "kernel_ready_tick") == [30, ready_1]
    assert ticks(r, "kernel_start_tick") == [30, ready_1]
    assert ticks(r, "kernel_end_tick") == [end_0, ready_1 + 10]
    assert ticks(r, "cta_kernel") == [0, 1]
    assert ticks(r, "cta_start_tick") == [30, ready_1]
    assert ticks(r, "cta_end_tick") == [end_0, ready_1 + 10]
    assert r["makespan_ticks"] == ready_1 + 10 + 1  # measured from the host's first call
    # the SM executes a cycle in every tick, busy only while a CTA runs
    assert r["sm_cycles"][0] == r["makespan_ticks"]
    assert r["sm_busy_cycles"][0] == (4 * first_fmas - 2) + 10


def test_two_streams_overlap_when_room_is_left():
    """Two SMs with one slot each, a long kernel on stream 0 and a short one on stream 1:
    api = 20, gap = 10, so ready = 30 and 50. The first leaves an SM free, the second starts
    on it at its ready tick while the first still runs."""
    arch = hand_arch(2)
    wl = workload.make_workload([fmas(20), fmas(3)], streams=[0, 1],
                                launch_api_ns=10.0, launch_gap_ns=5.0)
    r = reference.simulate(arch, wl)
    assert ticks(r, "kernel_ready_tick") == [30, 50]
    assert ticks(r, "kernel_start_tick") == [30, 50]
    assert ticks(r, "kernel_end_tick") == [30 + 78, 50 + 10]
    assert ticks(r, "cta_sm") == [0, 1]  # most room: the free SM
    assert r["makespan_ticks"] == 30 + 78 + 1
    # and with no overhead both are ready at tick 0 and start together
    r0 = reference.simulate(arch, workload.make_workload([fmas(20), fmas(3)], streams=[0, 1]))
    assert ticks(r0, "kernel_ready_tick") == [0, 0]
    assert ticks(r0, "cta_start_tick") == [0, 0]
    assert ticks(r0, "cta_end_tick") == [78, 10]


def test_event_dependency_prevents_overlap():
    """The same two kernels, the second waiting for an event recorded after the first
    (`after = [0]`): it starts at end_0 + 1 + gap = 108 + 1 + 10 although an SM is free."""
    arch = hand_arch(2)
    wl = workload.make_workload([fmas(20), fmas(3)], streams=[0, 1], after=[[], [0]],
                                launch_api_ns=10.0, launch_gap_ns=5.0)
    r = reference.simulate(arch, wl)
    assert ticks(r, "kernel_ready_tick") == [30, 119]
    assert ticks(r, "kernel_start_tick") == [30, 119]
    assert ticks(r, "kernel_end_tick") == [108, 129]
    assert r["makespan_ticks"] == 130


def test_join_waits_for_every_dependency():
    """A diamond: launches 0 and 1 on streams 0 and 1, launch 2 on stream 0 also waiting for
    launch 1: ready_2 = max(submit_2, end_0 + 1, end_1 + 1) + gap, with no overhead the later
    of the two ends plus one."""
    arch = hand_arch(2)
    wl = workload.make_workload([fmas(3), fmas(20), fmas(3)], streams=[0, 1, 0], after=[[], [], [1]])
    r = reference.simulate(arch, wl)
    assert ticks(r, "kernel_end_tick")[:2] == [10, 78]
    assert ticks(r, "kernel_ready_tick") == [0, 0, 79]
    assert ticks(r, "kernel_start_tick") == [0, 0, 79]


def test_graph_mode_submits_everything_with_one_call():
    """Graph mode: every launch is submitted at `api` (one cudaGraphLaunch) and the gap is the
    graph's. The architecture's graph_api_ns = 50 ns (99 ticks) is used; the workload
    overrides graph_gap_ns = 5 ns (10 ticks). Three independent launches on three SMs all
    start at 99 + 10; a chain of three on one stream starts each at the previous end + 1 + 10.
    In stream mode with the same api the submits are 99, 198, 297 instead."""
    arch = hand_arch(3, graph_api_ns=50.0, launch_api_ns=50.0)
    kernels = [fmas(3), fmas(3), fmas(3)]
    parallel = workload.make_workload(kernels, streams=[0, 1, 2], mode="graph", graph_gap_ns=5.0)
    plan = lower.to_numpy(workload.lower_workload(parallel, arch, 1980))
    assert np.asarray(plan.submit_ticks).tolist() == [99, 99, 99]
    assert int(plan.gap_ticks) == 10
    r = reference.simulate(arch, parallel)
    assert ticks(r, "kernel_ready_tick") == [109, 109, 109]
    assert ticks(r, "cta_start_tick") == [109, 109, 109]
    assert sorted(ticks(r, "cta_sm")) == [0, 1, 2]
    assert r["makespan_ticks"] == 109 + 10 + 1

    chain = workload.make_workload(kernels, mode="graph", graph_gap_ns=5.0)
    r = reference.simulate(arch, chain)
    assert ticks(r, "kernel_ready_tick") == [109, 130, 151]
    assert ticks(r, "kernel_end_tick") == [119, 140, 161]

    stream = workload.make_workload(kernels, streams=[0, 1, 2], mode="stream", launch_gap_ns=5.0)
    r = reference.simulate(arch, stream)
    assert ticks(r, "kernel_ready_tick") == [109, 208, 307]


def test_leftover_policy_full_kernel_blocks_the_concurrent_one():
    """Two SMs with one slot each, no overhead. Launch 0 (4 CTAs of 10 ticks) fills the GPU;
    launch 1 (stream 1) is ready at tick 0 too but is not the head launch until launch 0 has
    placed its last CTA (tick 10): its CTA takes the first slot that frees after that, at
    tick 20. In the other order the small kernel starts at once beside the big one."""
    arch = hand_arch(2)
    big, small = fmas(3, grid=4), fmas(3)
    r = reference.simulate(arch, workload.make_workload([big, small], streams=[0, 1]))
    assert ticks(r, "kernel_ready_tick") == [0, 0]
    assert ticks(r, "cta_kernel") == [0, 0, 0, 0, 1]
    assert ticks(r, "cta_start_tick") == [0, 0, 10, 10, 20]
    assert ticks(r, "kernel_start_tick") == [0, 20]
    assert ticks(r, "kernel_end_tick") == [20, 30]
    r = reference.simulate(arch, workload.make_workload([small, big], streams=[0, 1]))
    assert ticks(r, "cta_start_tick") == [0, 0, 10, 10, 20]
    assert ticks(r, "kernel_end_tick") == [10, 30]


def test_head_launch_is_the_earliest_ready_not_the_lowest_index():
    """Three SMs with one slot each, CTA launch latency 20 ticks (10 ns), api = 10 (5 ns),
    gap 0; submits 10, 20, 30, 40.
    - launch 0 (stream 0): 2 CTAs of 30 FMAs (118 ticks) from tick 10 on SMs 0 and 1, end 128;
    - launch 1 (stream 1): 1 CTA of 10 FMAs (38 ticks) at 20 on SM 2, end 58, slot usable at 78;
    - launch 2 (stream 1, after launch 1): ready max(30, 59) = 59, 2 CTAs of 3 FMAs;
    - launch 3 (stream 2): ready 40, 2 CTAs of 3 FMAs.
    At tick 78 both 2 and 3 are ready and waiting; the head is launch 3 (ready 40 < 59): its
    CTA 0 at 78 (end 88, usable 108), its CTA 1 at 108 (end 118, usable 138); then launch 2's
    CTA 0 at 138 and, when launch 0's slots are usable (128 + 20), its CTA 1 at 148."""
    arch = hand_arch(3, cta_launch_ns=10.0)
    wl = workload.make_workload([fmas(30, grid=2), fmas(10), fmas(3, grid=2), fmas(3, grid=2)],
                                streams=[0, 1, 1, 2], launch_api_ns=5.0)
    r = reference.simulate(arch, wl)
    assert ticks(r, "kernel_ready_tick") == [10, 20, 59, 40]
    assert ticks(r, "kernel_start_tick") == [10, 20, 138, 78]
    assert ticks(r, "cta_kernel") == [0, 0, 1, 2, 2, 3, 3]
    assert ticks(r, "cta_start_tick") == [10, 10, 20, 138, 148, 78, 108]
    assert ticks(r, "kernel_end_tick") == [128, 58, 158, 118]
    assert ticks(r, "cta_sm") == [0, 1, 2, 2, 0, 2, 2]


def test_closed_loop_estimates_are_per_launch():
    """Closed loop, ema_alpha = 1 (the estimate is the last duration), prior 0. SM 0 (rank 0)
    runs at 990 MHz, SM 1 at 1980. Launch 0 (2 CTAs of 3 FMAs) starts on both at tick 0 (equal
    estimates: most room, then rank). SM 0 executes its cycles at the odd ticks, so its CTA
    issues at ticks 1, 9, 17 and exits at 19; SM 1's takes 10 ticks: est_0 = [19, 10]. Launch 1
    (1 CTA, same stream) becomes ready at 20 and still has its own prior estimates [0, 0]: it
    goes to the lowest rank, the slow SM 0, which launch 0 learned is slow (19 ticks again,
    from its next cycle at tick 21 to 39)."""
    arch = hand_arch(2)
    clk = clocks.from_array(arch, np.asarray([990, 1980, 0, 0, 0, 0, 0, 0], np.float64))
    wl = workload.make_workload([fmas(3, grid=2), fmas(3)])
    r = reference.simulate(arch, wl, clk, dispatch="closed_loop", ema_alpha=1.0, dispatch_trace=True)
    assert ticks(r, "cta_sm") == [0, 1, 0]
    assert ticks(r, "cta_end_tick") == [19, 10, 39]
    assert ticks(r, "kernel_ready_tick") == [0, 20]
    assert r["dispatch_est"][:, :2].tolist() == [[19, 10], [19, 0]]
    # each completion updates its own launch's estimate: (tick, sm, cta g, duration, est after)
    assert r["dispatch_est_log"] == [(10, 1, 1, 10, 10), (19, 0, 0, 19, 19), (39, 0, 2, 19, 19)]


def test_closed_loop_hold_counts_the_head_launchs_ctas_and_stops_the_tick():
    """Closed loop, ema_alpha = 1, SM 0 at 1980 MHz, SM 1 at 990 (CTAs of 3 FMAs take 10 and
    19 ticks). Launch 0 (4 CTAs) and launch 1 (3 CTAs, stream 1) are both ready at 0.
    Tick 0: launch 0's CTAs 0, 1 on SMs 0, 1. Tick 10: CTA 2 on SM 0 (est_0 = [10, 0]).
    Tick 19: SM 1 frees, est_0 = [10, 19]; launch 0's last CTA could go there (finish at
    19 + 19 = 38) but SM 0's slot (started 10, e = max(10, 19 - 10) = 10) would finish it at
    max(19, 20) + 10 + 19 // 8 = 32 < 38: one better slot for the one CTA launch 0 has left,
    so the dispatcher holds, and places nothing else in this tick either, though launch 1 has
    CTAs waiting. Tick 20: CTA 3 on SM 0, then launch 1 (own estimates, all 0) on SM 1."""
    arch = hand_arch(2)
    clk = clocks.from_array(arch, np.asarray([1980, 990, 0, 0, 0, 0, 0, 0], np.float64))
    wl = workload.make_workload([fmas(3, grid=4), fmas(3, grid=3)], streams=[0, 1])
    r = reference.simulate(arch, wl, clk, dispatch="closed_loop", ema_alpha=1.0)
    assert ticks(r, "cta_kernel") == [0, 0, 0, 0, 1, 1, 1]
    assert ticks(r, "cta_sm") == [0, 1, 0, 0, 1, 0, 0]
    assert ticks(r, "cta_start_tick") == [0, 0, 10, 20, 20, 30, 40]
    assert ticks(r, "kernel_start_tick") == [0, 20]
    assert ticks(r, "kernel_end_tick") == [30, 50]


def test_single_launch_without_overhead_is_the_kernel_run():
    """`simulate(arch, kernel)` is the workload of one launch with no overhead (section 13)."""
    arch = hand_arch(2, cta_launch_ns=10.0)
    kernel = make_kernel("loop 4 cta_spread=2 warp_spread=3\n ldg\n fma dep\nend\nbar\nexit dep",
                         grid=9, threads=100, smem_bytes=TWO_SLOTS, seed=7)
    plain = reference.simulate(arch, kernel, dispatch="closed_loop")
    for wl in (workload.single(kernel), workload.make_workload([kernel], launch_api_ns=0.0,
                                                               launch_gap_ns=0.0)):
        r = reference.simulate(arch, wl, dispatch="closed_loop")
        assert r.keys() == plain.keys()
        for key, value in plain.items():
            np.testing.assert_array_equal(r[key], value, err_msg=key)
    assert ticks(plain, "kernel_ready_tick") == [0]
    assert ticks(plain, "kernel_start_tick") == [0]
    assert ticks(plain, "kernel_end_tick") == [max(ticks(plain, "cta_end_tick"))]
    assert ticks(plain, "cta_kernel") == [0] * 9


# The plain run's tick limit: 98 % of `configurations()` end within 10^4 ticks; one draw in a
# suite run took 8.6 minutes in the reference, and the shift is checked as well on short runs.
_LONGEST_TICKS = 30_000


@settings(max_examples=examples(6), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configurations())
def test_launch_overhead_shifts_a_uniform_clock_run(cfg: dict) -> None:
    """With every SM at the tick rate, one launch ready at `R = api + gap` runs exactly as the
    plain kernel shifted by `R` ticks: every CTA tick and the makespan move by `R`, each enabled
    SM executes `R` more (idle) cycles, every other counter is unchanged."""
    arch, kernel = cfg["arch"], cfg["kernel"]
    uniform = clocks.uniform(arch)
    kw = {k: v for k, v in cfg.items() if k not in ("arch", "kernel", "clocks")}
    try:
        plain = reference.simulate(arch, kernel, uniform, max_ticks=_LONGEST_TICKS, **kw)
    except JaxschedError:
        return
    except RuntimeError:  # a rare memory-bound draw would run for minutes tick by tick
        event("longer than the test's tick limit")
        return
    event("simulated")
    wl = workload.make_workload([kernel], launch_api_ns=10.0, launch_gap_ns=5.0)  # 20 + 10 ticks
    r = reference.simulate(arch, wl, uniform, **kw)
    shift = 30
    assert r["makespan_ticks"] == plain["makespan_ticks"] + shift
    for key in ("cta_start_tick", "cta_end_tick", "kernel_start_tick", "kernel_end_tick"):
        np.testing.assert_array_equal(r[key], plain[key] + shift, err_msg=key)
    assert ticks(r, "kernel_ready_tick") == [shift]
    enabled = np.asarray(arch.sm_enabled)
    np.testing.assert_array_equal(r["sm_cycles"], plain["sm_cycles"] + shift * enabled)
    for key in ("sm_busy_cycles", "sm_issued", "sm_issued_op", "sm_active_lanes", "sm_warp_cycles",
                "sm_stalls", "sm_ctas", "cta_sm"):
        np.testing.assert_array_equal(r[key], plain[key], err_msg=key)


def test_bad_workloads_are_rejected_before_running():
    """Section 13's launch checks hold for a `Workload` built without `make_workload`: at
    construction (`Workload.__check_init__`), and, for one whose fields were set around it
    (`eqx.tree_at`), where the reference's `simulate` takes it."""
    arch = hand_arch(2)
    k = fmas(3)
    with pytest.raises(JaxschedError, match="after"):
        workload.Workload(kernels=(k, k), streams=(0, 1), after=((), (1,)))
    persistent = make_kernel("loop 1\n fma dep\nend", grid=2, threads=32, smem_bytes=ONE_SLOT, work_items=4)
    with pytest.raises(JaxschedError, match="work_items"):
        workload.Workload(kernels=(k, persistent), streams=(0, 0), after=((), ()))
    bypassed = eqx.tree_at(lambda w: w.kernels, workload.Workload(kernels=(k, k), streams=(0, 0), after=((), ())),
                           (k, persistent))
    with pytest.raises(JaxschedError, match="work_items"):
        reference.simulate(arch, bypassed)
