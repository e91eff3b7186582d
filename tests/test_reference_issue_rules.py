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
# shared memory per CTA for 4 CTA slots: alloc = 50 KiB + 1 KiB reserved, floor(228 / 51) = 4
SMEM_4_SLOTS = 50 * 1024
SMEM_3_SLOTS = 70 * 1024  # floor(228 / 71) = 3
SMEM_2_SLOTS = 100 * 1024  # floor(228 / 101) = 2
SMEM_1_SLOT = 200 * 1024


@pytest.mark.parametrize("launch_idle_cycles", [1, 8])
def test_first_wave_needs_no_credit_but_a_refill_waits_for_it(launch_idle_cycles):
    """4 CTA slots, six one-warp CTAs of 3 dependent FMAs (FMAs at k + 1, 5, 9, EXIT at k + 10;
    slot j's warp is on scheduler j). Tick 0: CTAs 0-3 fill the never-used slots 0-3 and spend
    nothing, whatever K. They all end at tick 10, the credit still full (K): CTA 4 refills slot
    0 at 10 and spends K; slots 1-3 are used, so they wait for credit.
    K = 1: cycle 11, schedulers 1-3 are starved (no warps): credit 1, CTA 5 at 11.
    K = 8: cycle 11 +3 (CTA 4's warp issues on scheduler 0); cycle 12 +4 (it waits on its FMA:
    starved), 7; cycle 13 +4, capped at 8: CTA 5 at 13.
    (Were the first wave charged too, CTA 1 would start at tick 1 with K = 1, at 3 with K = 8.)"""
    kernel = make_kernel("fma dep\nfma dep\nfma dep", grid=6, threads=32, smem_bytes=SMEM_4_SLOTS)
    r = reference.simulate(hand_arch(launch_idle_cycles=launch_idle_cycles), kernel)
    c5 = {1: 11, 8: 13}[launch_idle_cycles]
    assert r["cta_start_tick"].tolist() == [0, 0, 0, 0, 10, c5]
    assert r["cta_end_tick"].tolist() == [10, 10, 10, 10, 20, c5 + 10]


@pytest.mark.parametrize("launch_idle_cycles, refills", [(0, [21, 21, 21, 21]),
                                                         (1, [21, 22, 23, 24])])
def test_an_sm_refills_at_most_one_slot_per_tick(launch_idle_cycles, refills):
    """4 CTA slots, eight one-warp CTAs of `BUSY_LOOP`. The first wave, CTAs 0-3, takes the
    never-used slots at tick 0 and ends at tick 21 (every warp issues every cycle: each has its
    own scheduler), freeing all four slots at once. Off (K = 0) CTAs 4-7 refill them at 21.
    With K = 1 the credit is full at 21 (the first wave spent none), and each refill spends it,
    so the SM has no room for a second refill in the tick; a scheduler without a warp is
    starved in the next cycle (cycle 22: schedulers 1-3, 23: 2-3, 24: 3), so the credit is back
    by the next tick's dispatch: refills at 21, 22, 23, 24, each ending 21 ticks later."""
    arch = hand_arch(launch_idle_cycles=launch_idle_cycles)
    kernel = make_kernel(BUSY_LOOP, grid=8, threads=32, smem_bytes=SMEM_4_SLOTS)
    r = reference.simulate(arch, kernel)
    assert r["cta_start_tick"].tolist() == [0] * 4 + refills
    assert r["cta_end_tick"].tolist() == [21] * 4 + [t + 21 for t in refills]
    assert r["cta_sm"].tolist() == [0] * 8


def test_busy_schedulers_collect_no_credit_until_warps_exit():
    """K = 3, 3 CTA slots, five CTAs of 4 warps (one per scheduler) of `BUSY_LOOP`, oldest
    first: on every scheduler the oldest CTA's warp issues every cycle, the younger ones are
    eligible but not selected, so no scheduler is starved while a warp is resident.
    Tick 0: CTAs 0-2 fill the never-used slots 0-2 (no credit spent). CTA 0 issues at 1..21
    (EXIT at 21), CTA 1 at 22..42, CTA 2 at 43..63. Tick 21: slot 0 frees, the credit is full:
    CTA 3 refills it (credit 0) and issues after CTA 2, at 64..84. Slot 1 frees at 42 and slot
    2 at 63, but every scheduler issues in every cycle up to 84: no credit at all while a slot
    is free. Cycle 85, no warp is left: +4, capped at 3: CTA 4 at tick 85, in the lowest free
    slot 0, ending 21 ticks later at 106. Off, CTA 4 takes slot 1 as it frees, at 42, and
    issues after CTA 3 (it is younger): 85..105."""
    kernel = make_kernel(BUSY_LOOP, grid=5, threads=128, smem_bytes=SMEM_3_SLOTS)
    r = reference.simulate(hand_arch(launch_idle_cycles=3), kernel, warp_policy="oldest")
    assert r["cta_start_tick"].tolist() == [0, 0, 0, 21, 85]
    assert r["cta_end_tick"].tolist() == [21, 42, 63, 84, 106]
    off = reference.simulate(hand_arch(launch_idle_cycles=0), kernel, warp_policy="oldest")
    assert off["cta_start_tick"].tolist() == [0, 0, 0, 21, 42]
    assert off["cta_end_tick"].tolist() == [21, 42, 63, 84, 105]


def test_throttled_warps_are_not_starved():
    """K = 4, 2 CTA slots, four CTAs of 4 warps (one per scheduler), each a loop of 10
    independent ALUs (issue 2), oldest first. Tick 0: CTAs 0 and 1 fill the never-used slots.
    On each scheduler CTA 0's warp issues ALUs at 1, 3, .., 19 and EXIT at 20 (CTA 0 ends at
    20); CTA 1's warp is eligible at odd cycles (not selected) and throttled at even ones
    (cycle 20 too: the ALU of 19 holds the pipe until 21). Tick 20: the credit is full, CTA 2
    refills slot 0 (credit 0). CTA 1 (older) issues at 21, 23, .., 39, EXIT 40; CTA 2 likewise
    waits or is throttled, then issues 41, 43, .., 59, EXIT 60. From cycle 40 slot 1 is free,
    but no scheduler is starved (a throttled warp would issue if its pipe were free) until
    cycle 61, the first without warps: +4, CTA 3 at 61 (slot 0, freed at 60), ALUs 62..80,
    EXIT 81. Were throttled warps idle, cycle 42 (CTA 2 throttled) would fill the credit and
    CTA 3 would start at tick 42."""
    kernel = make_kernel("loop 10\n alu\nend", grid=4, threads=128, smem_bytes=SMEM_2_SLOTS)
    r = reference.simulate(hand_arch(launch_idle_cycles=4), kernel, warp_policy="oldest")
    assert r["cta_start_tick"].tolist() == [0, 0, 20, 61]
    assert r["cta_end_tick"].tolist() == [20, 40, 60, 81]


@pytest.mark.parametrize("launch_idle_cycles, third_start", [(0, 20), (7, 21), (8, 22)])
def test_credit_collects_only_while_a_slot_is_free(launch_idle_cycles, third_start):
    """One CTA slot (200 KiB of shared memory), one-warp CTAs of 3 dependent FMAs (FMAs at
    k + 1, 5, 9, EXIT at k + 10). CTA 0 takes the never-used slot at 0 and spends nothing; it
    ends at 10, where the full credit lets CTA 1 refill the slot at once, spending it all.
    While CTA 1 runs (ticks 11..19) every scheduler but the issuing one is starved in every
    cycle, but no slot is free: no credit. At cycle 20 the slot frees (the EXIT's scheduler was
    not starved): +3; cycle 21: +4. K = 7: CTA 2 at tick 21; K = 8: +4 at 22, capped: at 22.
    Off: at 20, in the tick CTA 1 ends. (Collecting while no slot is free would refill at 20.)"""
    kernel = make_kernel("fma dep\nfma dep\nfma dep", grid=3, threads=32, smem_bytes=SMEM_1_SLOT)
    r = reference.simulate(hand_arch(launch_idle_cycles=launch_idle_cycles), kernel)
    assert r["cta_start_tick"].tolist() == [0, 10, third_start]
    assert r["cta_end_tick"].tolist() == [10, 20, third_start + 10]


@pytest.mark.parametrize("launch_idle_cycles, c3_sm, c3_end", [(0, 0, 114), (7, 1, 151)])
def test_closed_loop_does_not_hold_for_a_slot_waiting_for_credit(launch_idle_cycles, c3_sm,
                                                                   c3_end):
    """SM 0 at 1980 MHz, SM 1 at 990 MHz (it cycles at odd ticks), one CTA slot each, one-warp
    CTAs of 10 dependent FMAs: 38 ticks on SM 0, 75 on SM 1 from tick 0 (test_reference.py's
    closed-loop case), closed loop with a = 1 (the estimate is the last duration).
    Both K: c0 -> SM 0, c1 -> SM 1 at 0 (never-used slots: no credit spent); at 38 c0 ends and
    SM 0, its credit still full, refills with c2 (ends 76; with K = 7 the credit is now 0, and
    stays 0 while c2 runs: no free slot). At 75 c1 ends (SM 1 keeps a full credit, e_1 = 75);
    the tail CTA c3 is held for SM 0's running c2 (an occupied slot, better as before):
    max(75, 38 + 38) + 38 + 75 // 8 = 123 < 75 + 75.
    K = 0: at 76 SM 0's slot is free and usable: c3 -> SM 0 at 76 (e_0 = 38 < e_1), ends 114.
    K = 7: at 76 SM 0's slot is free but used and its credit is 3 (+3 in its completion cycle:
    the EXIT's scheduler is busy), so only SM 1 has room: candidate SM 1, target 76 + 75 = 151.
    SM 0's slot is past its launch latency (usable tick 76, not > 76) and waits for credit: not
    a better slot (model.md section 9); nothing is occupied and nothing is launching, so no
    better slot at all: c3 -> SM 1 at 76, ends 76 + 75 = 151 (the same odd-tick phase as from 0).
    (Counting the credit-waiting slot as usable at 77, the old rule, gave 77 + 38 + 9 = 124 <
    151: hold, and c3 -> SM 0 at 77.)"""
    arch = hand_arch(launch_idle_cycles=launch_idle_cycles, n_sms=2)
    freq = np.zeros(arch.n_sm_slots)
    freq[:2] = (1980, 990)
    kernel = make_kernel("\n".join(["fma dep"] * 10), grid=4, threads=32, smem_bytes=SMEM_1_SLOT)
    r = reference.simulate(arch, kernel, clocks.from_array(arch, freq), dispatch="closed_loop",
                           ema_alpha=1.0, ema_prior_ns=50.0)
    assert r["cta_sm"].tolist() == [0, 1, 0, c3_sm]
    assert r["cta_start_tick"].tolist() == [0, 0, 38, 76]
    assert r["cta_end_tick"].tolist() == [38, 75, 76, c3_end]
