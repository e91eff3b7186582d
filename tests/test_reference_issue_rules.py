"""`jaxsched.reference`'s issue-rate rules by hand: fractional issue intervals, the taken-branch
refetch and the CTA launch credit (docs/model.md sections 3, 5, 7 and 9).

Conventions (model.md sections 2, 8, 9): one SM at the boost clock, so the tick is the SM cycle
and the cycle executed at tick k has index k; CTAs dispatched at tick k issue from cycle k + 1; a
CTA completes in the tick of its last EXIT, `makespan_ticks` is that tick + 1. The numbers the
hand computations use are pinned in `hand_arch` (FMA latency 4, FMA issue 1 cycle unless a test
says otherwise, ALU issue 2, no CTA launch latency), so that recalibrating the h200 preset does
not move them. A warp of independent FMAs (no `dep`) is eligible whenever its pipe is free.
"""

from __future__ import annotations

import numpy as np
import pytest

from jaxsched import clocks, reference
from jaxsched.isa import Op
from jaxsched.kernel import make_kernel

from helpers import hand_h200

STALL = {name: i for i, name in enumerate(reference.STALL_REASONS)}


def hand_arch(fma_issue_cycles: float = 1.0, taken_branch_cycles: int = 0,
              launch_idle_cycles: int = 0, n_sms: int = 1):
    """`hand_h200` without launch latency, with the rules under test set."""
    return hand_h200(n_sms, fma_issue_cycles=fma_issue_cycles, taken_branch_cycles=taken_branch_cycles,
                     launch_idle_cycles=launch_idle_cycles)


# --- fractional issue intervals (sections 3 and 7) ---------------------------------------------


def test_lone_warp_at_66_64_loses_one_cycle_in_33():
    """One warp, 66 independent FMAs (a loop, taken_branch_cycles 0), issue 66/64 cycle.
    issue_cost64 = round(1.03125 * 64) = 66. After n back-to-back issues from cycle c0 (pipe free
    at 64 c0) `pipe_free64 = 64 c0 + 66 n` (each issue finds it >= 64 c), and cycle c0 + n is
    throttled iff 64 c0 + 66 n >= 64 (c0 + n + 1), i.e. n >= 32. So FMAs issue at cycles 1..32,
    cycle 33 is throttled, and at 34 `max(64 c0 + 2112, 64 * 34) = 64 * 34`: the pattern restarts.
    FMAs 33..64 at 34..65, cycle 66 throttled, FMAs 65 and 66 at 67 and 68, EXIT (no pipe) at 69:
    makespan 70. With a whole 1-cycle interval (the rule rounded away) it would be 68."""
    arch = hand_arch(fma_issue_cycles=66 / 64)
    r = reference.simulate(arch, make_kernel("loop 66\n fma\nend", grid=1, threads=32))
    assert r["makespan_ticks"] == 70
    assert r["sm_stalls"][0, STALL["math_pipe_throttle"]] == 2  # cycles 33 and 66
    assert r["sm_issued_op"][0, Op.FMA] == 66
    assert r["sm_busy_cycles"][0] == 69  # cycles 1..69


@pytest.mark.parametrize("fma_issue_cycles, makespan, throttles", [(1.0, 113, 0), (66 / 64, 115, 2)])
def test_sixteen_warps_per_scheduler_issue_32_per_33_cycles(fma_issue_cycles, makespan, throttles):
    """64 warps (two CTAs of 1024 threads), 16 per scheduler, each a loop of 6 independent FMAs,
    LRR. Every scheduler has 96 FMAs; its 16 warps take turns in slot order, all at an FMA until
    the last 16 FMAs. At 66/64 the pipe takes 32 FMAs per 33 cycles (steady state, as for the
    lone warp): FMAs at 1..32, 34..65, 67..98; in cycles 33 and 66 all 16 warps are throttled
    (2 x 16 x 4 schedulers = 128 stalls). Each warp's EXIT waits for LRR to come round after the
    last FMA: EXITs at 99..114, makespan 115. With a 1-cycle interval: FMAs 1..96, EXITs 97..112,
    makespan 113, no throttle."""
    arch = hand_arch(fma_issue_cycles=fma_issue_cycles)
    kernel = make_kernel("loop 6\n fma\nend", grid=2, threads=1024, regs=32)
    r = reference.simulate(arch, kernel, warp_policy="lrr")
    assert r["cta_start_tick"].tolist() == [0, 0]
    assert r["makespan_ticks"] == makespan
    assert r["sm_stalls"][0, STALL["math_pipe_throttle"]] == 4 * 16 * throttles
    assert r["sm_issued_op"][0, Op.FMA] == 64 * 6


def test_whole_issue_cycles_keep_the_pipe_busy_exactly_n_cycles():
    """Independent ALUs (issue 2 = 128/64): an issue at c sets `pipe_free64 = 64 c + 128`, which
    throttles cycle c + 1 (128 >= 128) but not c + 2 (128 < 192): ALUs at 1, 3, 5, 7, EXIT at 8."""
    r = reference.simulate(hand_arch(), make_kernel("alu\nalu\nalu\nalu", grid=1, threads=32))
    assert r["makespan_ticks"] == 9
    assert r["sm_stalls"][0, STALL["math_pipe_throttle"]] == 3


# --- taken branch (sections 3 and 7) -----------------------------------------------------------


@pytest.mark.parametrize("taken_branch_cycles", [0, 1, 2, 20])
def test_lone_warp_loop_pays_taken_branch_minus_one_per_back_edge(taken_branch_cycles):
    """One warp, `loop 5` of two independent FMAs. Without the refetch: FMAs at 1..10, EXIT at
    11, makespan 12. Each of the 4 taken back-edges (the 5th trip falls through) issues at c
    and sets `ready_fetch = c + b`: the loop start issues at c + max(1, b) instead of c + 1, so
    each costs max(0, b - 1) extra cycles, counted as `wait` (the fetch block, whatever dep)."""
    b = taken_branch_cycles
    r = reference.simulate(hand_arch(taken_branch_cycles=b),
                           make_kernel("loop 5\n fma\n fma\nend", grid=1, threads=32))
    extra = 4 * max(0, b - 1)
    assert r["makespan_ticks"] == 12 + extra
    assert r["sm_stalls"][0, STALL["wait"]] == extra
    assert r["sm_stalls"][0, STALL["selected"]] == 11


def test_taken_branch_hides_under_a_longer_dependency():
    """`loop 3` of `fma dep` (latency 4): the back-edge FMA issues at c; the loop start waits
    for it until c + 4 anyway (`wait` by the scoreboard), so a 3-cycle refetch costs nothing
    (FMAs at 1, 5, 9, EXIT at 10: makespan 11, 6 wait stalls), a 6-cycle one costs 2 per
    back-edge (FMAs at 1, 7, 13; EXIT 14)."""
    kernel = make_kernel("loop 3\n fma dep\nend", grid=1, threads=32)
    for b, makespan, waits in [(3, 11, 6), (6, 15, 10)]:
        r = reference.simulate(hand_arch(taken_branch_cycles=b), kernel)
        assert r["makespan_ticks"] == makespan, b
        assert r["sm_stalls"][0, STALL["wait"]] == waits, b


def test_fetch_block_yields_to_earlier_stall_reasons():
    """`loop 3 { fma dep ; ldg }`: the loop start `fma dep` waits for the back-edge's LDG
    (hundreds of ticks) far longer than a 20-cycle refetch, and `long_scoreboard` comes before
    `wait` in the stall list: every output equals the run without the refetch."""
    kernel = make_kernel("loop 3\n fma dep\n ldg\nend", grid=1, threads=32, l2_hit_rate=1.0)
    with_fetch = reference.simulate(hand_arch(taken_branch_cycles=20), kernel)
    without = reference.simulate(hand_arch(taken_branch_cycles=0), kernel)
    assert with_fetch["makespan_ticks"] == without["makespan_ticks"]
    assert with_fetch["sm_stalls"].tolist() == without["sm_stalls"].tolist()
    assert without["sm_stalls"][0, STALL["long_scoreboard"]] > 2 * 20


def test_persistent_work_item_take_is_a_taken_branch():
    """A persistent kernel of one warp and 6 items: the launch takes item 1 (no branch), each of
    the 5 later takes at the back-edge jumps back (`ready_fetch = c + 7`: 6 extra cycles each),
    the 7th back-edge finds the queue empty and falls through. Without the refetch: FMAs at
    1..6, EXIT at 7, makespan 8; with it 8 + 5 * 6 = 38."""
    kernel = make_kernel("loop 1\n fma\nend", grid=1, threads=32, work_items=6)
    r = reference.simulate(hand_arch(taken_branch_cycles=7), kernel)
    assert r["sm_items"][0] == 6
    assert r["makespan_ticks"] == 38
    assert r["sm_stalls"][0, STALL["wait"]] == 30


# --- launch credit (sections 7 and 9) ----------------------------------------------------------


BUSY_LOOP = "loop 20\n fma\nend"  # one warp: FMAs at start + 1 .. start + 20, EXIT at start + 21


@pytest.mark.parametrize("launch_idle_cycles, starts", [(0, [0, 0, 0, 0]), (1, [0, 1, 2, 3])])
def test_an_sm_takes_at_most_one_cta_per_tick(launch_idle_cycles, starts):
    """One SM with 32 CTA slots, four one-warp CTAs. Off (K = 0) they all start at tick 0. With
    K = 1 each placement spends the credit, so the SM has no room for a second CTA in the tick;
    a scheduler without a warp is starved in the next cycle, so the credit is back by the next
    tick's dispatch."""
    arch = hand_arch(launch_idle_cycles=launch_idle_cycles)
    r = reference.simulate(arch, make_kernel(BUSY_LOOP, grid=4, threads=32))
    assert r["cta_start_tick"].tolist() == starts
    assert r["cta_sm"].tolist() == [0] * 4


def test_busy_schedulers_collect_no_credit_until_warps_exit():
    """K = 3, five one-warp CTAs of 20 independent FMAs (a warp eligible every cycle until its
    EXIT; CTA slot j's warp is on scheduler j mod 4). The credit starts full: CTA 0 at tick 0
    (credit 0). Cycle 1: schedulers 1-3 starved, +3: CTA 1 at tick 1 (scheduler 1). Cycles 2, 3:
    +2 each, capped at 3: CTA 2 at tick 3. Cycles 4, 5, 6: +1 each: CTA 3 at tick 6. Now every
    scheduler issues every cycle: no credit at all while a slot is free, until CTA 0's warp
    exits at cycle 21 (and CTA 1's at 22): cycle 22 +1 (scheduler 0), cycle 23 +2 (0 and 1):
    CTA 4 at tick 23, in the lowest free slot 0. Off, every CTA starts at tick 0."""
    kernel = make_kernel(BUSY_LOOP, grid=5, threads=32)
    r = reference.simulate(hand_arch(launch_idle_cycles=3), kernel)
    assert r["cta_start_tick"].tolist() == [0, 1, 3, 6, 23]
    assert r["cta_end_tick"].tolist() == [21, 22, 24, 27, 44]
    off = reference.simulate(hand_arch(launch_idle_cycles=0), kernel)
    assert off["cta_start_tick"].tolist() == [0] * 5


def test_throttled_warps_are_not_starved():
    """K = 4, CTAs of 4 warps (one per scheduler), each a loop of 10 independent ALUs (issue 2:
    each warp eligible and throttled in turn). CTA 0 at tick 0; ALUs at 1, 3, .., 19, EXITs at
    20 (the CTA completes at 20). No scheduler is starved before
    cycle 21 (a throttled warp would issue if its pipe were free): CTA 1 at tick 21. Were
    throttled warps idle, CTA 1 would start at tick 2 (cycle 1 eligible, cycle 2 throttled)."""
    kernel = make_kernel("loop 10\n alu\nend", grid=2, threads=128)
    r = reference.simulate(hand_arch(launch_idle_cycles=4), kernel)
    assert r["cta_start_tick"].tolist() == [0, 21]
    assert r["cta_end_tick"].tolist() == [20, 41]


@pytest.mark.parametrize("launch_idle_cycles, second_start", [(0, 10), (7, 11), (8, 12)])
def test_credit_collects_only_while_a_slot_is_free(launch_idle_cycles, second_start):
    """One CTA slot (200 KiB of shared memory), one-warp CTAs of 3 dependent FMAs (FMAs at
    k + 1, 5, 9, EXIT at k + 10). While CTA 0 runs every scheduler is starved (the warp waits
    on its FMAs, the others are empty) but no slot is free: no credit. At cycle 10 the slot
    frees (the EXIT's scheduler was not starved): +3; cycle 11: +4. K = 7: CTA 1 at tick 11;
    K = 8: at 12. Off: at 10, in the tick CTA 0 ends."""
    kernel = make_kernel("fma dep\nfma dep\nfma dep", grid=2, threads=32, smem_bytes=200 * 1024)
    r = reference.simulate(hand_arch(launch_idle_cycles=launch_idle_cycles), kernel)
    assert r["cta_start_tick"].tolist() == [0, second_start]
    assert r["cta_end_tick"].tolist() == [10, second_start + 10]


@pytest.mark.parametrize("launch_idle_cycles, c2_start, c3_start", [(0, 38, 76), (7, 39, 78)])
def test_closed_loop_holds_for_a_slot_waiting_for_credit(launch_idle_cycles, c2_start, c3_start):
    """SM 0 at 1980 MHz, SM 1 at 990 MHz (it cycles at odd ticks), one CTA slot each, one-warp
    CTAs of 10 dependent FMAs: 38 ticks on SM 0, 75 on SM 1 from tick 0 (test_reference.py's
    closed-loop case), closed loop with a = 1 (the estimate is the last duration).
    K = 0: c0 -> SM 0, c1 -> SM 1 at 0; c2 -> SM 0 at 38 (ends 76); at 75 c1 ends and the tail
    CTA c3 is held for SM 0, where it starts at 76.
    K = 7: c2 waits for SM 0's credit: +3 at 38 (the EXIT's scheduler is busy), +4 at 39: starts
    at 39, ends 77. SM 1 frees at 75 (+3) and has its credit at its next cycle, tick 77. At 77
    SM 0's slot is free but its credit is 3 (+3 in its completion cycle): only SM 1 has room,
    e_1 = 75, target 77 + 75 = 152. SM 0's slot counts as usable at 78: 78 + 38 + 75 // 8 = 125
    < 152, a better slot for the last CTA: hold. Tick 78: SM 0 +4 = 7, c3 -> SM 0 at 78.
    (Without the credit term in the hold, c3 would start on SM 1 at 77 and end at 153.)"""
    arch = hand_arch(launch_idle_cycles=launch_idle_cycles, n_sms=2)
    freq = np.zeros(arch.n_sm_slots)
    freq[:2] = (1980, 990)
    kernel = make_kernel("\n".join(["fma dep"] * 10), grid=4, threads=32, smem_bytes=200 * 1024)
    r = reference.simulate(arch, kernel, clocks.from_array(arch, freq), dispatch="closed_loop",
                           ema_alpha=1.0, ema_prior_ns=50.0)
    assert r["cta_sm"].tolist() == [0, 1, 0, 0]
    assert r["cta_start_tick"].tolist() == [0, 0, c2_start, c3_start]
    assert r["cta_end_tick"].tolist() == [38, 75, c2_start + 38, c3_start + 38]
