"""`jaxsched.reference` with grid barriers (cooperative kernels) and persistent kernels (a global
work queue), by hand: model.md sections 3, 5, 7, 8 (step 1b) and 9.

Chip: `small_arch(1)`, two SMs (slots 0 and 1, dispatch ranks 0 and 1 with `dispatch_start =
0`), 4 schedulers. Conventions (model.md sections 2, 8, 9): SM 0 runs at the tick rate F, so its
cycle index equals the tick; an SM at F / 2 executes its cycles at the odd ticks (cycle c at tick
2c + 1). CTAs are dispatched at tick 0, after that tick's SM cycles; a warp issues from its SM's
next cycle. Hardware dispatch puts CTA 0 on SM 0 and CTA 1 on SM 1 (most free slots, ties to
the lower rank). A grid barrier whose last warp arrives in tick a releases at tick a +
`grid_sync_ticks`, after that tick's SM cycles; released warps issue from their next cycle.
"""

from __future__ import annotations

import equinox as eqx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxsched import clocks, lower, reference
from jaxsched.errors import JaxschedError
from jaxsched.isa import Op
from jaxsched.kernel import make_kernel, resident_grid

from helpers import small_arch

STALL = {name: i for i, name in enumerate(reference.STALL_REASONS)}


def two_sm_arch(fma_latency: int = 4):
    """`small_arch(1)` (2 SMs) with the FMA latency set (issue cycles: FMA 1, as on the preset)."""
    arch = small_arch(1)
    lat = np.asarray(arch.latency_cycles).copy()
    lat[Op.FMA] = fma_latency
    return arch.replace(latency_cycles=lat.astype(np.int32))


def clocks_mhz(arch, sm0: int, sm1: int):
    freq = np.zeros(arch.n_sm_slots)
    freq[:2] = (sm0, sm1)
    return clocks.from_array(arch, freq)


def gsync_loop(n: int, grid: int, sync_ticks: int, tick_mhz: int):
    """`loop n: fma dep; gsync`, one warp per CTA, a grid barrier costing `sync_ticks` ticks."""
    return make_kernel(f"loop {n}\n fma dep\n gsync\nend", grid=grid, threads=32, cooperative=True,
                       grid_sync_ns=sync_ticks * 1000 / tick_mhz)


# --- grid barriers -------------------------------------------------------------------------------


@pytest.mark.parametrize("n, sync_ticks", [(1, 0), (3, 0), (3, 2), (5, 4)])
def test_grid_barrier_paces_every_cta_at_the_slow_sm(n, sync_ticks):
    """SM 0 at 2000 MHz (F), SM 1 at 1000 MHz, FMA latency 1 (so `dep` never waits) and an even
    barrier cost T. Slow SM: FMA at tick 1, GSYNC at 3 (SM 0 arrived at 2): the barrier releases
    at r_1 = 3 + T (odd). After a release at odd r the slow SM issues FMA at r + 2 and GSYNC at
    r + 4, so r_i = r_(i-1) + 4 + T and r_n = n (4 + T) - 1. Then SM 0 exits at r_n + 1, SM 1 at
    r_n + 2: makespan n (4 + T) + 2, i.e. the slow SM's 4n + 2 ticks alone plus n x T, and the
    same as one CTA running alone on the slow SM."""
    arch = two_sm_arch(fma_latency=1)
    clk = clocks_mhz(arch, 2000, 1000)
    r = reference.simulate(arch, gsync_loop(n, 2, sync_ticks, 2000), clk)
    r_n = n * (4 + sync_ticks) - 1
    assert r["cta_sm"].tolist() == [0, 1]
    assert r["cta_end_tick"].tolist() == [r_n + 1, r_n + 2]
    assert r["makespan_ticks"] == n * (4 + sync_ticks) + 2
    # the same CTA alone on the slow SM (rank 0 with dispatch_start = 1) takes exactly as long
    alone = reference.simulate(arch, gsync_loop(n, 1, sync_ticks, 2000), clk, dispatch_start=1)
    assert alone["cta_sm"].tolist() == [1]
    assert alone["makespan_ticks"] == r["makespan_ticks"]
    # issued: n (FMA + GSYNC) + EXIT per warp; SM 0's warp waits at every barrier
    assert r["sm_issued"][:2].tolist() == [2 * n + 1, 2 * n + 1]
    assert r["sm_issued_op"][0, Op.BAR] == n
    assert r["sm_stalls"][0, STALL["barrier"]] > r["sm_stalls"][1, STALL["barrier"]]
    assert r["sm_items"].tolist() == [0] * arch.n_sm_slots  # not persistent


def test_grid_barrier_with_fma_latency_waits_for_the_slow_sm():
    """FMA latency 4 cycles, T = 3 ticks, SM 0 at 2000 MHz, SM 1 at 1000 MHz.
    With a one-warp CTA barrier (`bar`, released in its own cycle) instead of `gsync`, each SM
    runs alone: FMA at cycles 4(i - 1) (+1 on SM 0, whose first cycle is 1), BAR the next
    cycle, EXIT at cycle 4n - 1 (SM 0: tick 4n - 1) and 4n - 2 (SM 1: tick 8n - 3).
    With `gsync`: the slow SM's GSYNC at cycle 4i - 3 (tick 8i - 5) completes the barrier, which
    releases at 8i - 2; the T ticks hide under the FMA latency (its next FMA is due at cycle 4i,
    tick 8i - 1). SM 0's warp is released at the same ticks, so after the n-th release both
    warps exit at tick 8n - 1: makespan 8n, exactly one CTA alone on the slow SM."""
    n, sync_ticks = 6, 3
    arch = two_sm_arch(fma_latency=4)
    clk = clocks_mhz(arch, 2000, 1000)
    free = reference.simulate(arch, make_kernel(f"loop {n}\n fma dep\n bar\nend", grid=2, threads=32),
                              clk)
    assert free["cta_end_tick"].tolist() == [4 * n - 1, 8 * n - 3]
    r = reference.simulate(arch, gsync_loop(n, 2, sync_ticks, 2000), clk)
    assert r["cta_end_tick"].tolist() == [8 * n - 1, 8 * n - 1]
    assert r["makespan_ticks"] == 8 * n
    alone = reference.simulate(arch, gsync_loop(n, 1, sync_ticks, 2000), clk, dispatch_start=1)
    assert alone["makespan_ticks"] == 8 * n
    # SM 1 waits one of its cycles per barrier (tick 8i - 3, before the release at 8i - 2)
    assert r["sm_stalls"][1, STALL["barrier"]] == n


@pytest.mark.parametrize("sync_ticks", [0, 1, 7])
def test_grid_barrier_cost_delays_by_exactly_its_ticks(sync_ticks):
    """One warp at 1000 MHz (1 tick = 1 ns): FMA at tick 1, GSYNC at 2 (the grid's only warp has
    arrived), release at 2 + T (T = 0: in the same tick), EXIT at 3 + T. The warp spends the T
    cycles 3 .. 2 + T at the barrier. Two GSYNCs in a row: the second issues at 3 + T, releases
    at 3 + 2T, EXIT at 4 + 2T."""
    arch = two_sm_arch()
    clk = clocks_mhz(arch, 1000, 1000)
    one = make_kernel("fma\ngsync", grid=1, threads=32, cooperative=True, grid_sync_ns=sync_ticks)
    r = reference.simulate(arch, one, clk)
    assert r["cta_end_tick"].tolist() == [3 + sync_ticks]
    assert r["sm_stalls"][0, STALL["barrier"]] == sync_ticks
    assert r["sm_stalls"][0, STALL["selected"]] == 3
    two = make_kernel("fma\ngsync\ngsync", grid=1, threads=32, cooperative=True,
                      grid_sync_ns=sync_ticks)
    assert reference.simulate(arch, two, clk)["cta_end_tick"].tolist() == [4 + 2 * sync_ticks]


def test_grid_barrier_counts_warps_of_the_whole_grid():
    """Two CTAs of 64 threads (2 warps each) on the two SMs at 1000 MHz, `fma; gsync`, T = 5:
    the four warps arrive at tick 2; one release for the grid at 7; all exit at 8. A CTA
    barrier never forms (the CTAs' own arrival counts stay 0)."""
    arch = two_sm_arch()
    kernel = make_kernel("fma\ngsync", grid=2, threads=64, cooperative=True, grid_sync_ns=5.0)
    r = reference.simulate(arch, kernel, clocks_mhz(arch, 1000, 1000))
    assert r["cta_end_tick"].tolist() == [8, 8]
    assert r["sm_stalls"][:2, STALL["barrier"]].tolist() == [2 * 5, 2 * 5]


# --- persistent kernels --------------------------------------------------------------------------

PERSISTENT = "loop 5 cta_spread=2 warp_spread=3\n fma dep\n fma dep\n fma dep\nend"  # 3 per item


@pytest.mark.parametrize("items", [40, 8])
def test_persistent_queue_hands_out_every_item_fast_sm_takes_more(items):
    """Two CTAs of 4 warps (one per scheduler) on SM 0 (2000 MHz) and SM 1 (1000 MHz). Every
    warp takes its first item at dispatch (8 <= K), the trip count and its spreads do not
    apply, and every item taken is one loop iteration (3 FMAs) issued by that SM's warps."""
    arch = two_sm_arch()
    kernel = make_kernel(PERSISTENT, grid=2, threads=128, work_items=items)
    r = reference.simulate(arch, kernel, clocks_mhz(arch, 2000, 1000))
    taken = r["sm_items"][:2].tolist()
    assert sum(taken) == items and r["sm_items"][2:].sum() == 0
    assert min(taken) >= 4  # 4 warps per SM, each with at least its first item
    assert r["sm_issued"][:2].tolist() == [3 * taken[0] + 4, 3 * taken[1] + 4]  # + 4 EXITs
    if items == 8:
        # one item each: FMA at cycles 1, 5, 9 (SM 0) / 0, 4, 8 (SM 1), the take fails, EXIT
        assert taken == [4, 4]
        assert r["cta_end_tick"].tolist() == [10, 2 * 9 + 1]
    else:
        assert taken[0] > taken[1]  # the fast SM's warps come back to the queue more often


def test_persistent_beats_static_split_on_uneven_clocks():
    """40 iterations split statically (5 per warp) leave the slow SM on the critical path; the
    queue moves iterations to the fast SM and the grid ends earlier."""
    arch = two_sm_arch()
    clk = clocks_mhz(arch, 2000, 1000)
    static = reference.simulate(arch, make_kernel("loop 5\n fma dep\n fma dep\n fma dep\nend",
                                                  grid=2, threads=128), clk)
    queue = reference.simulate(arch, make_kernel(PERSISTENT, grid=2, threads=128, work_items=40), clk)
    assert static["sm_issued"][:2].sum() == queue["sm_issued"][:2].sum() == 3 * 40 + 8
    assert queue["makespan_ticks"] < static["makespan_ticks"]


@pytest.mark.parametrize("items, taken", [(5, [4, 1]), (1, [1, 0])])
def test_persistent_extra_warps_skip_the_loop(items, taken):
    """K < 8 warps: dispatch hands the items out in placement order (CTA 0 on SM 0 first), then
    warp order; the warps left without one skip the loop (EXIT only) and nobody takes more."""
    arch = two_sm_arch()
    kernel = make_kernel(PERSISTENT, grid=2, threads=128, work_items=items)
    r = reference.simulate(arch, kernel, clocks_mhz(arch, 2000, 1000))
    assert r["sm_items"][:2].tolist() == taken
    assert r["sm_issued"][:2].tolist() == [3 * taken[0] + 4, 3 * taken[1] + 4]
    # SM 1: warps without an item exit at their first cycle (tick 1)
    if taken[1] == 0:
        assert r["cta_end_tick"][1] == 1


@pytest.mark.parametrize("dispatch_start", [0, 1])
def test_persistent_takes_in_one_cycle_go_by_sm_index_then_scheduler(dispatch_start):
    """Four one-warp CTAs, two per SM (CTA slots 0, 1 = schedulers 0, 1), equal clocks, K = 5:
    dispatch takes items 1-4; at tick 1 all four warps issue the loop's only instruction and try
    to take: SM 0's scheduler 0 gets item 5 (whichever CTA that is), runs a second iteration
    and exits at tick 3; the others exit at tick 2."""
    arch = two_sm_arch()
    kernel = make_kernel("loop 1\n fma\nend", grid=4, threads=32, work_items=5)
    r = reference.simulate(arch, kernel, clocks_mhz(arch, 1000, 1000), dispatch_start=dispatch_start)
    assert r["sm_items"][:2].tolist() == [3, 2]
    winner = [c for c in range(4) if r["cta_sm"][c] == 0][0]  # the first CTA placed on SM 0
    assert r["cta_end_tick"].tolist() == [3 if c == winner else 2 for c in range(4)]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=st.integers(1, 60), threads=st.sampled_from([32, 96, 160]), grid=st.integers(1, 4),
       mhz=st.tuples(st.integers(300, 2000), st.integers(300, 2000)),
       dispatch=st.sampled_from(["hardware", "round_robin", "least_loaded"]),
       warp_policy=st.sampled_from(["lrr", "gto", "oldest"]))
def test_persistent_every_item_is_one_iteration(items, threads, grid, mhz, dispatch, warp_policy):
    """Whatever the clocks and policies: all K items are taken, and each SM issues one loop body
    per item plus the code outside the loop (ALU before, SFU + EXIT after) once per warp."""
    arch = two_sm_arch()
    kernel = make_kernel("alu\nloop 3\n fma dep\n lds\nend\nsfu\nexit dep", grid=grid,
                         threads=threads, work_items=items)
    r = reference.simulate(arch, kernel, clocks_mhz(arch, *mhz), dispatch=dispatch,
                           warp_policy=warp_policy)
    warps = r["sm_ctas"] * -(-threads // 32)
    assert r["sm_items"].sum() == items
    np.testing.assert_array_equal(r["sm_issued"], 2 * r["sm_items"] + 3 * warps)


# --- launch checks -------------------------------------------------------------------------------


def test_cooperative_launch_too_large_is_rejected():
    """2 SMs x 32 CTAs per SM fit (64 threads, no other limit): a 65-CTA cooperative grid is
    cudaErrorCooperativeLaunchTooLarge; the resident grid itself runs."""
    arch = two_sm_arch()
    fits = make_kernel("fma\ngsync", grid=1, threads=64, cooperative=True)
    resident = resident_grid(arch, fits)
    assert resident == 2 * 32
    too_large = make_kernel("fma\ngsync", grid=resident + 1, threads=64, cooperative=True)
    with pytest.raises(JaxschedError, match=r"grid_ctas = 65: .*co-resident.*64.*"
                                            r"cudaErrorCooperativeLaunchTooLarge"):
        reference.simulate(arch, too_large)
    ok = make_kernel("fma\ngsync", grid=resident, threads=64, cooperative=True, grid_sync_ns=0.0)
    r = reference.simulate(arch, ok)
    assert r["sm_ctas"][:2].tolist() == [32, 32]


@pytest.mark.parametrize("program, options, match", [
    ("fma\ngsync", {}, r"gsync.*cooperative launch"),
    ("fma\nbar\ngsync", {"cooperative": True}, r"bar and gsync.*either"),
    ("fma\nalu", {"work_items": 4}, r"work_items = 4: .*needs a loop"),
])
def test_launch_mode_errors_name_the_field(program, options, match):
    """The kernel-level checks fire when the kernel is built (`make_kernel`), before
    `reference.simulate` is reached."""
    with pytest.raises(JaxschedError, match=match):
        reference.simulate(two_sm_arch(), make_kernel(program, grid=1, threads=32, **options))


@pytest.mark.parametrize("program, options, field, value, match", [
    ("bar\nbar\nfma", {}, "grid_sync", [False, True, False, False], "mix CTA barriers"),
    ("gsync\ngsync\nfma", {"cooperative": True}, "n_ctas", 65, "co-resident"),
    ("fma\nalu", {}, "work_items", 4, "needs a loop"),
])
def test_reference_refuses_launches_that_break_the_checks(program, options, field, value, match):
    """A `Launch` built around the checks (here: edited after lowering) is refused before it
    runs: the grid barrier's rule (release every warp at a barrier once all live warps of the
    resident CTAs arrived) is the contract's barrier only under them, and a persistent kernel
    takes its items at the loop's back-edge."""
    arch = two_sm_arch()
    kernel = make_kernel(program, grid=1, threads=64, **options)
    launch = lower.to_numpy(lower.lower(arch, kernel, clocks.uniform(arch), 1, 0, 0))
    launch = eqx.tree_at(lambda x: getattr(x.program, field), launch,
                         np.asarray(value, dtype=np.asarray(getattr(launch.program, field)).dtype))
    with pytest.raises(ValueError, match=match):
        reference.simulate_launch(launch, lower.shapes_for(arch, kernel))
