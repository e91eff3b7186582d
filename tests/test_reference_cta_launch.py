"""The CTA launch latency in `jaxsched.reference`, by hand (docs/model.md sections 3 and 9).

A slot freed by a CTA completing at tick `e` is usable again from tick `e + cta_launch_ticks`,
`cta_launch_ticks = round(cta_launch_ns * F / 1000)`; every dispatch rule counts usable free
slots only. The architecture numbers the hand computations use are pinned below (FMA latency 4
cycles, one FMA per scheduler per cycle, every SM at 1980 MHz, so the tick is the SM cycle), so
that recalibrating the h200 preset does not move them.

Timing used throughout (model.md sections 7-9): a single-warp CTA of `n` dependent FMAs (or a
loop of `t` trips of one dependent FMA) dispatched at tick `k` issues its first FMA at `k + 1`,
FMA `i` at `k + 1 + 4 (i - 1)` and its EXIT (no `dep`) one tick after the last FMA, so it
completes at `k + 4 n - 2`. With 200 KiB of dynamic shared memory one CTA fits per SM, with
100 KiB two.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxsched import clocks, lower, reference
from jaxsched.kernel import make_kernel

from helpers import hand_h200



def hand_arch(n_sms: int, cta_launch_ns: float):
    """`hand_h200` with this launch latency (the launch credit has its own tests)."""
    return hand_h200(n_sms, cta_launch_ns=cta_launch_ns)


def lowered(arch, kernel, clk=None, dispatch=0, dispatch_start=0):
    clk = clocks.uniform(arch) if clk is None else clk
    return lower.to_numpy(lower.lower(arch, kernel, clk, 1, dispatch, dispatch_start))


@pytest.mark.parametrize("dispatch", lower.DISPATCH_POLICIES)
@pytest.mark.parametrize("launch_ns, launch_ticks", [(0.0, 0), (10.0, 20), (207.0, 410)])
def test_one_slot_chain_next_start_is_previous_end_plus_launch(dispatch, launch_ns, launch_ticks):
    """One SM, one CTA slot, four CTAs of 3 dependent FMAs (duration 4 * 3 - 2 = 10 ticks).
    cta_launch_ticks = round(ns * 1.98): 0, round(19.8) = 20, round(409.86) = 410. CTA i starts
    when the slot is usable again: start_i = end_(i-1) + L, so start_i = i (10 + L); with L = 0
    it starts in the tick its predecessor ends. Every policy has only this slot to choose."""
    arch = hand_arch(1, launch_ns)
    kernel = make_kernel("fma dep\nfma dep\nfma dep", grid=4, threads=32, smem_bytes=200 * 1024)
    launch = lowered(arch, kernel, dispatch=lower.DISPATCH_POLICIES.index(dispatch))
    assert int(launch.program.ctas_per_sm) == 1
    assert int(launch.chip.cta_launch_ticks) == launch_ticks
    r = reference.simulate(arch, kernel, dispatch=dispatch)
    starts = [i * (10 + launch_ticks) for i in range(4)]
    assert r["cta_start_tick"].tolist() == starts
    assert r["cta_end_tick"].tolist() == [s + 10 for s in starts]
    assert r["cta_start_tick"][1:].tolist() == (r["cta_end_tick"][:-1] + launch_ticks).tolist()
    assert r["makespan_ticks"] == 4 * 10 + 3 * launch_ticks + 1
    assert r["cta_sm"].tolist() == [0] * 4
    # the SM idles while the slot launches: busy only in the 10 cycles of each CTA
    # (its first FMA at start + 1 through its EXIT at start + 10)
    assert r["sm_busy_cycles"][0] == 4 * 10


def test_first_wave_starts_at_tick_zero():
    """Every slot is usable from tick 0: two SMs with two slots each take the first four CTAs
    at tick 0 whatever the launch latency (410 ticks); the fifth waits for the first slot to
    free (tick 10, 3 FMAs) and launch: 10 + 410."""
    arch = hand_arch(2, 207.0)
    kernel = make_kernel("fma dep\nfma dep\nfma dep", grid=5, threads=32, smem_bytes=100 * 1024)
    launch = lowered(arch, kernel)
    assert int(launch.program.ctas_per_sm) == 2 and int(launch.chip.cta_launch_ticks) == 410
    r = reference.simulate(arch, kernel)
    assert r["cta_start_tick"].tolist() == [0, 0, 0, 0, 420]
    assert r["cta_end_tick"].tolist() == [10, 10, 10, 10, 430]
    assert sorted(r["sm_ctas"][:2].tolist()) == [2, 3]


@pytest.mark.parametrize("dispatch", ["hardware", "round_robin", "least_loaded", "weighted"])
def test_most_room_sees_a_launching_slot_as_no_room(dispatch):
    """Two SMs at one clock (SM 0 rank 0), one CTA slot each, loops of `fma dep`; seed 6 draws
    trips 6, 3, 6, 4 (c0..c3), so a CTA lasts 4 t - 2 ticks. L = 20 ticks (10 ns).
    Tick 0: c0 -> SM 0 (ends 22), c1 -> SM 1 (ends 10).
    Tick 30 = 10 + 20: SM 1's slot is usable. SM 0's slot has been free since tick 22, and SM 0
    is rank 0, but it is not usable before 42: it has no room, so c2 -> SM 1 (ends 30 + 22 =
    52). Tick 42: c3 -> SM 0 (ends 42 + 14 = 56), makespan 57. (Counting SM 0's free slot as
    room would have sent c2 to SM 0.) Every policy that counts room agrees: SM 1 is the only
    SM with a usable slot at tick 30."""
    arch = hand_arch(2, 10.0)
    kernel = make_kernel("loop 5 cta_spread=3\n  fma dep\nend", grid=4, threads=32,
                         smem_bytes=200 * 1024, seed=6)
    assert [reference.warp_trips(6, 5, 3, 0, c, 0) for c in range(4)] == [6, 3, 6, 4]
    launch = lowered(arch, kernel, dispatch=lower.DISPATCH_POLICIES.index(dispatch))
    assert launch.policy.dispatch_rank[:2].tolist() == [0, 1]
    assert int(launch.program.ctas_per_sm) == 1 and int(launch.chip.cta_launch_ticks) == 20
    r = reference.simulate(arch, kernel, dispatch=dispatch)
    assert r["cta_sm"].tolist() == [0, 1, 1, 0]
    assert r["cta_start_tick"].tolist() == [0, 0, 30, 42]
    assert r["cta_end_tick"].tolist() == [22, 10, 52, 56]
    assert r["makespan_ticks"] == 57
    # the same launch without latency: c2 takes SM 1's slot in the tick it frees (10), c3 SM 0's
    r0 = reference.simulate(hand_arch(2, 0.0), kernel, dispatch=dispatch)
    assert r0["cta_sm"].tolist() == [0, 1, 1, 0]
    assert r0["cta_start_tick"].tolist() == [0, 0, 10, 22]


def test_room_counts_usable_free_slots_not_free_slots():
    """Two SMs at one clock, two slots each, SM 1 rank 0 (dispatch_start 1), hardware dispatch;
    single-warp loops of `fma dep`, seed 37 (trips 2, 3, 8, 2, 3, 4; a CTA lasts 4 t - 2 ticks).
    L = 20 ticks.
    Tick 0 (most room, ties to rank 0 = SM 1): c0 -> SM 1 (ends 6), c1 -> SM 0 (ends 10),
    c2 -> SM 1 (ends 30), c3 -> SM 0 (ends 6).
    Tick 26 = 6 + 20: SM 1 has 1 free slot, usable (c0's). SM 0 has 2 free slots, but c1's
    (free since 10) is not usable before 30: room 1. Tie -> rank 0: c4 -> SM 1 (ends 26 + 10 =
    36); then SM 1 has no room and c5 -> SM 0 (ends 26 + 14 = 40). Makespan 41. (Counting free
    slots, SM 0's 2 > 1 would take c4.)"""
    arch = hand_arch(2, 10.0)
    kernel = make_kernel("loop 5 cta_spread=4\n  fma dep\nend", grid=6, threads=32,
                         smem_bytes=100 * 1024, seed=37)
    assert [reference.warp_trips(37, 5, 4, 0, c, 0) for c in range(6)] == [2, 3, 8, 2, 3, 4]
    launch = lowered(arch, kernel, dispatch_start=1)
    assert launch.policy.dispatch_rank[:2].tolist() == [1, 0] and int(launch.program.ctas_per_sm) == 2
    assert int(launch.chip.cta_launch_ticks) == 20
    r = reference.simulate(arch, kernel, dispatch_start=1)
    assert r["cta_sm"].tolist() == [1, 0, 1, 0, 1, 0]
    assert r["cta_start_tick"].tolist() == [0, 0, 0, 0, 26, 26]
    assert r["cta_end_tick"].tolist() == [6, 10, 30, 6, 36, 40]
    assert r["makespan_ticks"] == 41


@settings(max_examples=12, deadline=None)
@given(
    launch_ns=st.sampled_from([0.0, 3.0, 25.0, 207.0]),
    dispatch=st.sampled_from(lower.DISPATCH_POLICIES),
    mhz=st.lists(st.integers(700, 1980), min_size=3, max_size=3),
    seed=st.integers(0, 1000),
)
def test_a_slot_takes_no_cta_while_it_launches(launch_ns, dispatch, mhz, seed):
    """Any policy and clocks: a CTA holds its slot from its start until `cta_launch_ticks` after
    its end, so on every SM at most `ctas_per_sm` CTAs have `start <= t < end + L` at any tick
    `t`; the first wave (every slot) starts at tick 0; every CTA runs once."""
    arch = hand_arch(3, launch_ns)
    freq = np.zeros(arch.n_sm_slots)
    freq[:3] = mhz
    clk = clocks.from_array(arch, freq)
    kernel = make_kernel("loop 3 cta_spread=2 warp_spread=1\n  fma dep\n  alu\nend", grid=14,
                         threads=64, smem_bytes=100 * 1024, seed=seed)
    launch = lowered(arch, kernel, clk=clk)
    cps, L = int(launch.program.ctas_per_sm), int(launch.chip.cta_launch_ticks)
    assert cps == 2 and (L > 0) == (launch_ns > 0)
    r = reference.simulate(arch, kernel, clk, dispatch=dispatch, ema_alpha=0.5)
    assert r["sm_ctas"][:3].sum() == 14
    start, end, sm = r["cta_start_tick"], r["cta_end_tick"], r["cta_sm"]
    assert np.all(start[:6] == 0) and np.all(start[6:] > 0)
    for s in range(3):
        mine = sm == s
        for t in start[mine]:
            assert np.sum((start[mine] <= t) & (t < end[mine] + L)) <= cps
