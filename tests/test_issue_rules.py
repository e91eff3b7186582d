"""Hand-checked cases of three issue rules of docs/model.md: fractional issue intervals
(`issue_cost64`, section 7), the taken branch's refetch (`taken_branch_cycles`) and the launch
credit (`cta_launch_idle_cycles`, sections 7 and 9), plus the neutral values of all three.

Every case on the test chip runs on one chip shape with one grid size and program length, and
with the file's static sizes (`STATICS`: every CTA slot, the closed loop and fast-forward
compiled in), so the engine compiles once for them: the rules' parameters, programs, policies
and clocks are traced. The chips run at their boost clock, so a tick is an SM cycle."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import hand_h200, simulate_pinned, small_arch

import jaxsched as js
from jaxsched import clocks, reference

GRID = 4
PAD = 8
FMA_LAT = int(js.presets.get("h200").latency_cycles[js.Op.FMA])
TWO_SMS = small_arch(1)  # one TPC: two SMs
FIRST_SM, SECOND_SM = np.flatnonzero(np.asarray(TWO_SMS.sm_enabled))
ONE_SM = TWO_SMS.replace(sm_enabled=np.arange(TWO_SMS.n_sm_slots) == FIRST_SM)
WAIT = js.Result.stall_reasons.index("wait")
PIPE_THROTTLE = js.Result.stall_reasons.index("math_pipe_throttle")
# One compilation for every case on the test chip (five before: one per occupancy and policy
# family).
STATICS = dict(cta_slots=32, max_ctas=GRID, closed_loop_step=True, fast_forward_step=True)


def simulate(arch: js.Arch, kernel: js.Kernel, clk: js.Clocks | None = None, **config) -> js.Result:
    """`js.simulate` with the file's `STATICS` (`helpers.simulate_pinned`)."""
    return simulate_pinned(arch, kernel, clk, statics=STATICS, **config)


def _arch(base: js.Arch, fma_issue: float = 1.0, taken_branch: int = 0, idle_cycles: int = 0, **kw) -> js.Arch:
    issue = np.asarray(base.issue_cycles, np.float32).copy()
    issue[js.Op.FMA] = fma_issue
    return base.replace(issue_cycles=issue, taken_branch_cycles=np.int32(taken_branch),
                        cta_launch_idle_cycles=np.int32(idle_cycles), **kw)


def _kernel(text: str, threads: int, **kw) -> js.Kernel:
    return js.make_kernel(text, grid=GRID, threads=threads, pad_to=PAD, **kw)


# --- fractional issue intervals --------------------------------------------------------------


@pytest.mark.parametrize("fma_issue, cycles_per_32", [(1.0, 32), (66 / 64, 33), (1.5, 48)])
@pytest.mark.parametrize("dep", ["", " dep"])
def test_fma_stream_issues_at_the_fractional_interval(fma_issue, cycles_per_32, dep):
    """16 warps per scheduler (two 1024-thread CTAs per SM) keep every FMA pipe fed. 64 more
    trips add 16 x 64 = 1024 FMAs per scheduler, a whole number of 32-issue phases (after which
    `pipe_free64` is a whole cycle again), so the makespan grows by exactly 1024 x interval: one
    cycle in 33 lost with 66/64, none with 64/64, one in three with 1.5."""
    arch = _arch(TWO_SMS, fma_issue=fma_issue)

    def run(trips: int) -> js.Result:
        return simulate(arch, _kernel(f"loop {trips}\n fma{dep}\nend", threads=1024), warp_policy="lrr")

    short, long = run(40), run(104)
    assert np.all(np.asarray(short.sm_ctas)[[FIRST_SM, SECOND_SM]] == 2)  # 16 warps per scheduler
    assert int(np.sum(long.sm_issued) - np.sum(short.sm_issued)) == 2 * 64 * 64
    assert int(long.makespan_ticks) - int(short.makespan_ticks) == 1024 * cycles_per_32 // 32


def test_lone_warp_issues_two_fmas_in_three_cycles_at_interval_one_and_a_half():
    """One warp of independent FMAs: the pipe takes an instruction in the cycle in which it
    frees (floor(pipe_free64 / 64)), so issues fall at cycles 1, 2, 4, 5, 7, ... and the EXIT
    follows the last FMA at once."""
    n = 30  # FMA n (0-based) issues at cycle 1 + n + n // 2
    r = simulate(_arch(TWO_SMS, fma_issue=1.5), _kernel(f"loop {n}\n fma\nend", threads=32))
    last_fma = 1 + (n - 1) + (n - 1) // 2
    assert int(r.makespan_ticks) == last_fma + 2
    assert int(np.sum(r.sm_stalls[:, PIPE_THROTTLE])) == GRID * ((n - 1) // 2)  # one cycle per pair


# --- taken branch ----------------------------------------------------------------------------


@pytest.mark.parametrize("taken_branch", [0, 1, 2, FMA_LAT, 7, 20])
@pytest.mark.parametrize("dep", [True, False])
@pytest.mark.parametrize("persistent", [False, True])
def test_taken_branch_delays_each_trip(taken_branch, dep, persistent):
    """One warp per CTA (four CTAs on two SMs, each warp on its own scheduler) runs a loop of
    one FMA. The FMA at cycle c jumps back to itself, so the next trip issues at
    c + max(latency if dep, taken_branch_cycles, 1): a refetch costs `taken_branch_cycles -
    latency` per trip beyond a dependent FMA's latency, whatever `dep` says, 0 and 1 cost
    nothing; the last trip falls through to the EXIT. A persistent kernel's take of a work item
    is a taken branch too (every warp takes `trips` items: all four take in the same ticks)."""
    trips = 12
    text = f"loop {trips}\n fma{' dep' if dep else ''}\nend"
    kernel = _kernel(text, threads=32, work_items=GRID * trips if persistent else 0)
    r = simulate(_arch(TWO_SMS, taken_branch=taken_branch), kernel)
    per_trip = max(FMA_LAT if dep else 1, taken_branch, 1)
    # first FMA at cycle 1, the EXIT one cycle after the last FMA
    assert int(r.makespan_ticks) == 1 + (trips - 1) * per_trip + 2
    # every cycle between two FMAs of a warp is a `wait` (scoreboard or refetch)
    assert int(np.sum(r.sm_stalls[:, WAIT])) == GRID * (trips - 1) * (per_trip - 1)
    if persistent:
        assert int(np.sum(r.sm_items)) == GRID * trips


@pytest.mark.parametrize("taken_branch", [0, 20])
def test_a_barrier_at_the_back_edge_releases_into_the_refetch(taken_branch):
    """The loop ends in a `bar`: its issue takes the back-edge and the warp waits at the barrier.
    One warp per CTA, so the barrier releases in the same tick; the released warp's next trip
    still waits for the refetch the branch began (its `ready_fetch` outlives the issue that set
    it). Per trip: the FMA, the BAR one cycle later, the next FMA max(1, taken_branch_cycles)
    after the BAR; the last BAR falls through to the EXIT. The engine and the reference agree."""
    trips = 12
    arch, kernel = _arch(TWO_SMS, taken_branch=taken_branch), _kernel(f"loop {trips}\n fma\n bar\nend", threads=32)
    per_trip = 1 + max(1, taken_branch)
    expected = 1 + (trips - 1) * per_trip + 3  # FMA at 1, ..., last BAR, EXIT a cycle later
    assert int(simulate(arch, kernel).makespan_ticks) == expected
    assert int(reference.simulate(arch, kernel, clocks.uniform(arch))["makespan_ticks"]) == expected


# --- launch credit ---------------------------------------------------------------------------

BUSY = "loop 200\n fma\nend"  # 8 warps per scheduler of independent FMAs: never starved


@pytest.mark.parametrize("idle_cycles", [400, 1000])
def test_busy_sm_refills_a_slot_only_after_collecting_credit(idle_cycles):
    """One SM with two CTA slots (1024 threads: 8 warps per scheduler per CTA), no launch
    latency, GTO. Tick 0: both slots are fresh, so CTAs 0 and 1 start without credit and the
    credit stays full. A scheduler runs its warps one at a time, oldest first (the greedy warp
    issues every cycle: 200 independent FMAs and the EXIT, W = 201 cycles), so CTA 0 ends at
    e0 = 8 W. Its slot is used, but the full credit refills it at once: CTA 2 starts at e0 and
    spends the credit. `last` (slot 7 of each scheduler) now holds a warp of CTA 2, the greedy
    choice for W cycles; then CTA 1's 8 warps (older than CTA 2's) end at e1 = e0 + 9 W and CTA
    2's other 7 at e2 = e1 + 7 W. Slot 1, free from e1, stays empty while CTA 2 keeps every
    scheduler issuing; from e2 + 1 all four are starved and collect the credit in
    idle_cycles / 4 cycles: CTA 3 starts at e2 + idle_cycles / 4 and runs alone for 8 W."""
    arch = _arch(ONE_SM, idle_cycles=idle_cycles, cta_launch_ns=np.float32(0.0))
    r = simulate(arch, _kernel(BUSY, threads=1024), warp_policy="gto")
    w = 201
    e0 = 8 * w
    e1 = e0 + 9 * w
    e2 = e1 + 7 * w
    start3 = e2 + idle_cycles // 4
    np.testing.assert_array_equal(np.asarray(r.cta_start_tick), [0, 0, e0, start3])
    np.testing.assert_array_equal(np.asarray(r.cta_end_tick), [e0, e1, e2, start3 + 8 * w])
    assert int(r.makespan_ticks) == start3 + 8 * w + 1


def test_without_credit_both_slots_fill_at_once():
    """The same SM with the rule off (0): two CTAs at tick 0, the third when the first ends."""
    r = simulate(_arch(ONE_SM, idle_cycles=0, cta_launch_ns=np.float32(0.0)), _kernel(BUSY, threads=1024))
    start, end = np.asarray(r.cta_start_tick), np.asarray(r.cta_end_tick)
    np.testing.assert_array_equal(start[:2], [0, 0])
    assert start[2] == min(end[0], end[1])


# 100 KiB of dynamic shared memory: (0 + 1024 reserved + 102400) bytes per CTA, two CTAs in the
# SM's 233472 bytes (docs/model.md section 1), so one-warp CTAs fill the SM's two slots.
TWO_SLOT_SMEM = 100 * 1024


@pytest.mark.parametrize("idle_cycles, wait_ticks", [(0, 0), (1, 1), (3, 1), (7, 2), (8, 3), (12, 4)])
def test_first_wave_fills_every_slot_in_tick_0_and_refills_wait_for_credit(idle_cycles, wait_ticks):
    """One SM with two CTA slots, CTAs of one warp. Tick 0: both slots are fresh, so CTAs 0 and
    1 start at once whatever the credit K = idle_cycles (their warps on schedulers 0 and 1).
    Each warp issues its dependent FMAs at cycles 1, 1 + L, ... (L = FMA latency, 4) and its
    EXIT one cycle after the 50th: both end at e = 2 + 49 L. The credit, never spent, is full:
    CTA 2 refills slot 0 at e and spends it, and slot 1, used too, needs K again. CTA 2's warp
    issues at e + 1 (3 schedulers starved) and then waits on its FMA (4 starved per cycle until
    e + 1 + L): the credit is 3, 7, 11, 15 after cycles e + 1 .. e + 4, so CTA 3 refills slot 1
    1 tick after e for K <= 3, 2 for K = 7, 3 for K = 8, 4 for K = 12, and at e with K = 0."""
    assert FMA_LAT >= 4  # CTA 2's warp issues nothing more in cycles e + 2 .. e + 4
    arch = _arch(ONE_SM, idle_cycles=idle_cycles, cta_launch_ns=np.float32(0.0))
    r = simulate(arch, _kernel("loop 50\n fma dep\nend", threads=32, smem_bytes=TWO_SLOT_SMEM))
    e = 2 + 49 * FMA_LAT
    start3 = e + wait_ticks
    np.testing.assert_array_equal(np.asarray(r.cta_start_tick), [0, 0, e, start3])
    np.testing.assert_array_equal(np.asarray(r.cta_end_tick), [e, e, 2 * e, start3 + e])
    np.testing.assert_array_equal(np.asarray(r.cta_sm), [FIRST_SM] * GRID)


# --- neutral values ----------------------------------------------------------------------------

RICH = """ldg bytes=512
loop 6 cta_spread=2 warp_spread=2
 lds ways=2
 fma dep
 if 0.5
  sfu dep
 else
  alu
 end
 bar
end
exit dep"""

# The engine before the three rules (commit 7d35c16) on RICH: two SMs at 1980 and 1200 MHz, one
# 255-register CTA slot each, so four CTAs refill freed slots after the launch latency.
BEFORE = {
    "hardware": {
        "makespan_ticks": 2304, "sm_issued": 1244, "sm_cycles": 3700,
        "cta_sm": [0, 1, 1, 0], "cta_start_tick": [0, 0, 1320, 1333], "cta_end_tick": [923, 910, 2303, 2252],
        "sm_stalls": [1244, 128, 12560, 6132, 982, 1498, 0, 109],
    },
    "closed_loop": {
        "makespan_ticks": 2304, "sm_issued": 1244, "sm_cycles": 3700,
        "cta_sm": [0, 1, 1, 0], "cta_start_tick": [0, 0, 1320, 1333], "cta_end_tick": [923, 910, 2303, 2252],
        "sm_stalls": [1244, 143, 12528, 6132, 1038, 1497, 0, 126],
    },
}


@pytest.mark.parametrize("dispatch, warp_policy", [("hardware", "gto"), ("closed_loop", "lrr")])
@pytest.mark.parametrize("neutral", ["defaults", "nudged"])
def test_neutral_parameters_reproduce_the_engine_before_the_rules(dispatch, warp_policy, neutral):
    """`taken_branch_cycles` 0 and 1 cost nothing, whole issue intervals (and ones within 1/128
    cycle of whole, which lower to the same 1/64 cost) keep `pipe_free64` on whole cycles, and
    `cta_launch_idle_cycles = 0` lets an SM take several CTAs per tick: the outputs equal the
    engine's before these rules existed. SFU (8 cycles) and ALU (2) test multi-cycle pipes."""
    arch = TWO_SMS
    if neutral == "nudged":
        issue = np.asarray(arch.issue_cycles, np.float32) + np.float32(0.3 / 64)
        arch = arch.replace(issue_cycles=issue, taken_branch_cycles=np.int32(1))
    mhz = np.full(arch.n_sm_slots, 1980.0)
    mhz[SECOND_SM] = 1200.0
    kernel = js.make_kernel(RICH, grid=GRID, threads=256, regs=255, l2_hit_rate=0.5, seed=7, pad_to=PAD)
    r = simulate(arch, kernel, clocks.from_array(arch, mhz), warp_policy=warp_policy, dispatch=dispatch,
                    ema_prior_ns=100.0)
    want = BEFORE[dispatch]
    assert int(r.makespan_ticks) == want["makespan_ticks"]
    for key in ("cta_sm", "cta_start_tick", "cta_end_tick"):
        assert np.asarray(getattr(r, key)).tolist() == want[key], key
    assert np.asarray(r.sm_stalls).sum(0).tolist() == want["sm_stalls"]
    assert int(np.sum(r.sm_issued)) == want["sm_issued"]
    assert int(np.sum(r.sm_cycles)) == want["sm_cycles"]


@pytest.mark.parametrize("idle_cycles, c3_sm, c3_end", [(0, 0, 114), (7, 1, 151)])
def test_closed_loop_does_not_hold_for_a_slot_waiting_for_credit(idle_cycles, c3_sm, c3_end):
    """The JAX engine on test_reference_issue_rules.py's hand-derived case of the same name
    (docs/model.md section 9): with K = 7 the fast SM's freed slot waits for launch credit at
    tick 76, so it is not a better slot and the last CTA starts on the slow SM at once."""
    arch = hand_h200(2, launch_idle_cycles=idle_cycles)
    freq = np.zeros(arch.n_sm_slots)
    freq[:2] = (1980, 990)
    kernel = js.make_kernel("\n".join(["fma dep"] * 10), grid=4, threads=32, smem_bytes=200 * 1024)
    r = js.simulate(arch, kernel, clocks.from_array(arch, freq), dispatch="closed_loop",
                    ema_alpha=1.0, ema_prior_ns=50.0)
    assert np.asarray(r.cta_sm).tolist() == [0, 1, 0, c3_sm]
    assert np.asarray(r.cta_start_tick).tolist() == [0, 0, 38, 76]
    assert np.asarray(r.cta_end_tick).tolist() == [38, 75, 76, c3_end]
