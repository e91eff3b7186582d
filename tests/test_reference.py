"""`jaxsched.reference` by hand: small cases whose tick counts follow from docs/model.md.

Every expected number below is derived from the document in a comment next to it. Conventions
used throughout (model.md sections 2, 8, 9): with uniform clocks the tick is the SM clock and the
cycle executed at tick k has index k; CTAs are dispatched at tick 0, after the SM cycles of that
tick, so the first instruction issues at tick (= cycle) 1; a CTA completes in the tick of its
last EXIT and `makespan_ticks` is that tick + 1.

h200 numbers used: latency FMA = ALU = 4 cycles; issue cycles FMA = 1, ALU = 2; boost clock
1.98 GHz; 4 schedulers, 64 warp slots per SM. Tests whose hand computation needs numbers that
calibration moves (LDS latency, memory latencies and bandwidths, the CTA launch latency) run on
`HAND_ARCH`, which pins them explicitly; dispatch tests that count ticks from a completion to the
next start pin `cta_launch_ns = 0` (immediate slot reuse; tests/test_reference_cta_launch.py
covers the launch latency itself).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from jaxsched import clocks, lower, presets, reference
from jaxsched.errors import JaxschedError
from jaxsched.isa import Op
from jaxsched.kernel import make_kernel
from jaxsched.reference_dispatch import closed_loop as reference_closed_loop

from helpers import RULES_OFF

H200 = presets.get("h200")
STALL = {name: i for i, name in enumerate(reference.STALL_REASONS)}


def per_op(default: int, **by_op: int) -> np.ndarray:
    """An int32 array indexed by `isa.Op`: `by_op` (op names in lower case), else `default`."""
    out = np.full(len(Op), default, dtype=np.int32)
    for name, value in by_op.items():
        out[Op[name.upper()]] = value
    return out


def pinned(arch, **fields):
    """`arch` with `fields` set to explicit values (floats cast to float32, the presets' dtype),
    so that a hand computation does not follow the preset's calibration."""
    cast = {k: np.float32(v) if isinstance(v, float) else v for k, v in fields.items()}
    return arch.replace(**cast)


# The numbers the pipeline and memory hand computations below are written with.
HAND_ARCH = pinned(
    H200,
    latency_cycles=per_op(1, fma=4, alu=4, sfu=18, lds=29, ldg=28, shfl=24),
    issue_cycles=per_op(1, fma=1, alu=2, sfu=8),
    mio_queue_depth=np.int32(16),
    l2_hit_latency_ns=120.0,
    dram_latency_ns=360.0,
    l2_bytes_per_ns=5500.0,
    dram_bytes_per_ns=4800.0,
    boost_clock_ghz=1.98,
    cta_launch_ns=0.0,
    **RULES_OFF,
)
# a freed CTA slot takes its next CTA at once
NO_LAUNCH_LATENCY = {"cta_launch_ns": 0.0, "cta_launch_idle_cycles": np.int32(0)}


def arch_with_sms(n: int):
    """The h200 preset with only its first `n` SM slots enabled (enabled SMs come first)."""
    return H200.replace(sm_enabled=np.arange(H200.n_sm_slots) < n, **RULES_OFF)


def lowered(arch, kernel, warp_policy=1, dispatch=0, dispatch_start=0, clk=None, **dispatch_params):
    clk = clocks.uniform(arch) if clk is None else clk
    return lower.to_numpy(lower.lower(arch, kernel, clk, warp_policy, dispatch, dispatch_start,
                                      **dispatch_params))


def two_sms(slow_mhz: int = 990):
    """The first two h200 SM slots enabled: SM 0 at 1980 MHz, SM 1 at `slow_mhz`; no CTA launch
    latency (the closed-loop hand computations count from a completion to the next start)."""
    arch = pinned(arch_with_sms(2), **NO_LAUNCH_LATENCY)
    freq = np.zeros(arch.n_sm_slots)
    freq[:2] = (1980, slow_mhz)
    return arch, clocks.from_array(arch, freq)


def weights(arch, *w):
    """A `dispatch_weight` array: `w` on the first SM slots, 0 elsewhere (floorswept)."""
    out = np.zeros(arch.n_sm_slots, dtype=np.int32)
    out[: len(w)] = w
    return out


def stalls(result, sm: int) -> dict[str, int]:
    return {name: int(result["sm_stalls"][sm, i]) for name, i in STALL.items()}


# --- hashes --------------------------------------------------------------------------------------


def _lowbias32_np(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.uint32)
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x7FEB352D)
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x846CA68B)
    x ^= x >> np.uint32(16)
    return x


def test_lowbias32_wraps_like_uint32():
    rng = np.random.default_rng(0)
    xs = np.concatenate([[0, 1, 2, 0xFFFFFFFF, 0x80000000], rng.integers(0, 2**32, 500)])
    with np.errstate(over="ignore"):
        expect = _lowbias32_np(xs)
    got = [reference.lowbias32(int(x)) for x in xs]
    assert got == [int(v) for v in expect]
    assert reference.lowbias32(0) == 0


def test_hash3_matches_definition_and_negative_seed_wraps():
    with np.errstate(over="ignore"):
        def h_np(seed, stream, a, b):
            s = np.uint32(seed & 0xFFFFFFFF) ^ (np.uint32(stream) * np.uint32(0x9E3779B9))
            x = _lowbias32_np(np.asarray(s))
            x = _lowbias32_np(x ^ np.uint32(a))
            return int(_lowbias32_np(x ^ np.uint32(b)))

        for seed in (0, 7, -1, -123456, 2**31 - 1):
            for stream, a, b in ((1, 0, 0), (2, 5, 3), (3, 1000, 32 * 7 + 31)):
                assert reference.hash3(seed, stream, a, b) == h_np(seed, stream, a, b)
    assert reference.hash3(-1, 1, 2, 3) == reference.hash3(0xFFFFFFFF, 1, 2, 3)


def test_trip_and_lane_draws_stay_in_range():
    for c in range(50):
        for w in range(8):
            t = reference.warp_trips(3, 10, 4, 2, c, w)
            assert 10 - 4 <= t <= 10 + 4 + 2
        assert reference.warp_trips(3, 1, 5, 0, c, 0) >= 0
        assert reference.warp_if_lanes(3, 0, c, 0, 32) == 0  # p = 0: nobody takes the if
        assert reference.warp_if_lanes(3, 1 << 24, c, 0, 32) == 32  # p = 1: everybody
        assert 0 <= reference.warp_if_lanes(3, 1 << 23, c, 0, 20) <= 20


# --- one warp, exact tick counts -----------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 10])
def test_single_warp_dependent_fma_chain(n):
    """FMA k (1-based) issues at cycle 1 + 4(k-1); EXIT (no `dep`) the cycle after the last FMA,
    4n - 2; so makespan_ticks = 4n - 1."""
    kernel = make_kernel("\n".join(["fma dep"] * n), grid=1, threads=32)
    r = reference.simulate(H200, kernel)
    launch = lowered(H200, kernel)
    assert r["makespan_ticks"] == 4 * n - 1
    sm = int(np.argmin(launch.policy.dispatch_rank))  # hardware dispatch: the rank-0 SM
    assert r["cta_sm"].tolist() == [sm]
    assert r["cta_start_tick"].tolist() == [0]
    assert r["cta_end_tick"].tolist() == [4 * n - 2]
    enabled = np.asarray(H200.sm_enabled)
    assert np.all(r["sm_cycles"][enabled] == 4 * n - 1)  # every enabled SM cycles every tick
    assert np.all(r["sm_cycles"][~enabled] == 0)  # floorswept slots stay zero
    assert r["sm_issued"][sm] == n + 1 and r["sm_issued"].sum() == n + 1
    assert r["sm_active_lanes"][sm] == 32 * (n + 1)
    # active from cycle 1 through the EXIT cycle 4n - 2
    assert r["sm_busy_cycles"][sm] == 4 * n - 2 and r["sm_busy_cycles"].sum() == 4 * n - 2
    assert r["sm_warp_cycles"][sm] == 4 * n - 2
    expect = dict.fromkeys(STALL, 0)
    expect.update(selected=n + 1, wait=(4 * n - 2) - (n + 1))
    assert stalls(r, sm) == expect
    assert r["sm_ctas"].sum() == 1 and r["sm_ctas"][sm] == 1
    assert r["makespan_ns"] == pytest.approx((4 * n - 1) * 1000 / 1980)
    assert r["makespan_cycles"] == pytest.approx(4 * n - 1, rel=1e-6)


def test_output_keys_shapes_dtypes():
    kernel = make_kernel("fma dep\nalu", grid=3, threads=64)
    r = reference.simulate(H200, kernel)
    n_sm = H200.n_sm_slots
    for key in ("sm_cycles", "sm_busy_cycles", "sm_issued", "sm_active_lanes", "sm_warp_cycles",
                "sm_ctas"):
        assert r[key].shape == (n_sm,) and r[key].dtype == np.int64, key
    assert r["sm_stalls"].shape == (n_sm, 8) and r["sm_stalls"].dtype == np.int64
    for key in ("cta_sm", "cta_start_tick", "cta_end_tick"):
        assert r[key].shape == (3,) and r[key].dtype == np.int64, key
    assert isinstance(r["makespan_ticks"], int)
    # stall reasons partition the resident warp-cycles
    assert np.array_equal(r["sm_stalls"].sum(axis=1), r["sm_warp_cycles"])


def test_lds_short_scoreboard_and_mio_backlog():
    """LDS at cycle 1 with m = 0: ready_mio = 1 + 0 + 4 + 29 = 34. The second LDS issues at
    cycle 2 with m = 4 - 1 = 3 (one served at the end of cycle 1): ready_mio = 2 + 3 + 4 + 29 =
    38. The dependent FMA issues at 38, EXIT at 39, makespan 40."""
    kernel = make_kernel("lds ways=4\nlds ways=4\nfma dep", grid=1, threads=32)
    r = reference.simulate(HAND_ARCH, kernel)
    sm = int(r["cta_sm"][0])
    assert r["makespan_ticks"] == 40
    st = stalls(r, sm)
    assert st["short_scoreboard"] == 38 - 3  # cycles 3 .. 37
    assert st["selected"] == 4


def test_mio_throttle():
    """Five independent 8-way LDS from one warp (mio = backlog at issue, -1 per cycle):
    c1: m 0 -> 8 (7 after the cycle); c2: m 7 -> 15 (14); c3: m 14 -> 22 (21);
    c4..c9 throttled (21..16 >= 16); c10: m 15 -> 23 (22); c11..c17 throttled; c18: m 15;
    ready_mio = 18 + 15 + 8 + 29 = 70; dependent FMA at 70, EXIT 71, makespan 72."""
    kernel = make_kernel("\n".join(["lds ways=8"] * 5) + "\nfma dep", grid=1, threads=32)
    r = reference.simulate(HAND_ARCH, kernel)
    sm = int(r["cta_sm"][0])
    assert r["makespan_ticks"] == 72
    st = stalls(r, sm)
    assert st["mio_throttle"] == 6 + 7
    assert st["short_scoreboard"] == 69 - 18  # cycles 19 .. 69
    assert st["selected"] == 7


def test_math_pipe_throttle():
    """Independent ALUs (issue_cycles 2) from one warp: one issue every 2 cycles."""
    kernel = make_kernel("\n".join(["alu"] * 5), grid=1, threads=32)
    r = reference.simulate(H200, kernel)
    sm = int(r["cta_sm"][0])
    # ALUs at cycles 1, 3, 5, 7, 9; EXIT (no pipe) at 10
    assert r["makespan_ticks"] == 11
    assert stalls(r, sm)["math_pipe_throttle"] == 4
    assert stalls(r, sm)["selected"] == 6


def test_ldg_latency_and_queue_order_within_a_cycle():
    """Two warps (schedulers 0 and 1) each issue a 4 KiB LDG at cycle 1. Scheduler 0 enters the
    queues first: ready_mem = 1 + lat + max(ceil(q_l2 / 1024), ceil(q_dram / 1024)) with its own
    cost; scheduler 1 sees both costs. The dependent FMA issues at ready_mem, EXIT one later."""
    kernel = make_kernel("ldg bytes=4096\nfma dep", grid=1, threads=64, l2_hit_rate=0.5)
    launch = lowered(HAND_ARCH, kernel)
    prog = launch.program
    lat, l2, dram = (int(prog.mem_lat_ticks[0]), int(prog.l2_cost[0]), int(prog.dram_cost[0]))
    # round((120 + 0.5 * 240) ns * 1.98 GHz) = round(475.2); round(4096 * 1.98 / 5500 * 1024);
    # round(4096 * 0.5 * 1.98 / 4800 * 1024)
    assert (lat, l2, dram) == (475, 1510, 865)
    ceil = lambda a: -(-a // 1024)  # noqa: E731
    ready0 = 1 + lat + max(ceil(l2), ceil(dram))  # 478
    ready1 = 1 + lat + max(ceil(2 * l2), ceil(2 * dram))  # 479
    r = reference.simulate(HAND_ARCH, kernel)
    assert r["makespan_ticks"] == max(ready0, ready1) + 2  # FMA at ready, EXIT at ready + 1
    sm = int(r["cta_sm"][0])
    st = stalls(r, sm)
    assert st["long_scoreboard"] == (ready0 - 2) + (ready1 - 2)  # cycles 2 .. ready - 1
    assert st["selected"] == 6


def test_memory_latency_in_ticks_ignores_sm_clock():
    """A single warp's dependent LDG: the FMA waits `mem_lat_ticks` global ticks."""
    kernel = make_kernel("ldg\nfma dep", grid=1, threads=32, l2_hit_rate=1.0)
    for ghz in (1.0, 2.0):
        arch = pinned(arch_with_sms(1), l2_hit_latency_ns=120.0, l2_bytes_per_ns=5500.0,
                      cta_launch_ns=0.0)
        clk = clocks.uniform(arch, ghz)
        launch = lowered(arch, kernel, clk=clk)
        lat = int(launch.program.mem_lat_ticks[0])
        assert lat == round(120 * ghz)  # l2 hit latency 120 ns
        r = reference.simulate(arch, kernel, clk)
        # LDG at 1; ready_mem = 1 + lat + 1 (the request's own queue cost, < 1 tick)
        assert r["makespan_ticks"] == 1 + lat + 1 + 2


# --- schedulers ----------------------------------------------------------------------------------


def test_issue_bound_lrr_one_instruction_per_scheduler_per_cycle():
    """One SM, 2 CTAs x 1024 threads = 16 warps per scheduler, each `n` dependent FMAs + EXIT.
    LRR visits the 16 warps in turn, each every 16 cycles (>= the FMA latency 4), so every
    scheduler issues every cycle 1 .. 16 (n + 1); warp q exits at 16 n + 1 + q."""
    n = 6
    arch = arch_with_sms(1)
    kernel = make_kernel("\n".join(["fma dep"] * n), grid=2, threads=1024)
    r = reference.simulate(arch, kernel, warp_policy="lrr")
    assert r["makespan_ticks"] == 16 * (n + 1) + 1
    assert r["sm_issued"][0] == 4 * 16 * (n + 1) == 4 * (r["makespan_ticks"] - 1)
    # CTA 0 holds q = 0..7 of each scheduler, CTA 1 q = 8..15
    assert r["cta_end_tick"].tolist() == [16 * n + 1 + 7, 16 * n + 1 + 15]
    warp_cycles = 4 * sum(16 * n + 1 + q for q in range(16))
    assert r["sm_warp_cycles"][0] == warp_cycles
    st = stalls(r, 0)
    assert st["selected"] == 64 * (n + 1)
    assert st["wait"] == 64 * 3 * (n - 1)  # 3 cycles after each FMA but the last
    assert st["not_selected"] == warp_cycles - st["selected"] - st["wait"]
    assert r["sm_busy_cycles"][0] == r["makespan_ticks"] - 1


def test_issue_bound_gto_same_work():
    n = 6
    arch = arch_with_sms(1)
    kernel = make_kernel("\n".join(["fma dep"] * n), grid=2, threads=1024)
    r = reference.simulate(arch, kernel, warp_policy="gto")
    assert r["sm_issued"][0] == 4 * 16 * (n + 1)
    assert 16 * (n + 1) + 1 <= r["makespan_ticks"] <= 16 * (n + 1) + 8


def test_gto_staggers_ctas_lrr_keeps_them_together():
    """8 co-resident CTAs (8 warps each) of a dependent-FMA loop on one SM: GTO (and oldest)
    serve the oldest CTAs first, so CTAs finish in grid order spread over the run; LRR shares
    the schedulers, so all finish within a few cycles of each other."""
    arch = arch_with_sms(1)
    kernel = make_kernel("loop 40\n  fma dep\nend", grid=8, threads=256)
    res = {p: reference.simulate(arch, kernel, warp_policy=p) for p in ("gto", "lrr", "oldest")}
    for p, r in res.items():
        assert r["sm_issued"][0] == 8 * 8 * 41, p  # same work: 40 FMAs + EXIT per warp
        assert r["cta_start_tick"].tolist() == [0] * 8, p
    gto, lrr = res["gto"], res["lrr"]
    span = lambda r: int(r["cta_end_tick"].max() - r["cta_end_tick"].min())  # noqa: E731
    assert span(gto) > 0.6 * gto["makespan_ticks"]
    assert span(lrr) < 0.05 * lrr["makespan_ticks"]
    assert np.all(np.diff(gto["cta_end_tick"]) > 0)  # oldest first
    assert np.array_equal(res["oldest"]["cta_end_tick"], gto["cta_end_tick"])
    # 16 warps/scheduler of 4-cycle chains: issue-bound either way
    assert gto["makespan_ticks"] == lrr["makespan_ticks"] == 16 * 41 + 1


def test_barrier():
    """One CTA of 8 warps (2 per scheduler), `fma dep; bar; alu dep` with GTO. Per scheduler:
    q0 FMA at 1, BAR at 2; q1 FMA at 3, BAR at 4 (all arrive: release after issue of cycle 4);
    q0 ALU at 5 (ready 1 + 4), EXIT 6; q1 ALU at 7 (ready 3 + 4), EXIT 8. Makespan 9."""
    arch = arch_with_sms(1)
    kernel = make_kernel("fma dep\nbar\nalu dep", grid=1, threads=256)
    r = reference.simulate(arch, kernel)
    assert r["makespan_ticks"] == 9
    # per scheduler: q0 at the barrier in cycles 3, 4; q1 eligible-not-selected at 1, 2 and
    # waiting for its FMA at 5, 6
    expect = dict.fromkeys(STALL, 0)
    expect.update(selected=32, not_selected=8, wait=8, barrier=8)
    assert stalls(r, 0) == expect


# --- CTA dispatch --------------------------------------------------------------------------------


@pytest.mark.parametrize("dispatch", lower.DISPATCH_POLICIES)
@pytest.mark.parametrize("dispatch_start", [0, 2])
def test_every_cta_runs_exactly_once(dispatch, dispatch_start):
    """Uniform clocks: at tick 0 every policy fills the SMs one CTA per SM in rank order (most
    room = fewest live warps = highest 1980 * 65536 // (resident + 1) = equal estimates, then
    most room), so the first-wave check below holds for all five."""
    arch = arch_with_sms(4)
    # 36 KiB dynamic shared memory per CTA: alloc 37 KiB -> 6 CTAs per SM (228 KiB)
    kernel = make_kernel("loop 6 cta_spread=4 warp_spread=2\n  fma dep\n  alu\nend", grid=40,
                         threads=128, smem_bytes=36 * 1024, seed=5)
    launch = lowered(arch, kernel, dispatch=lower.DISPATCH_POLICIES.index(dispatch),
                     dispatch_start=dispatch_start)
    cps = int(launch.program.ctas_per_sm)
    assert cps == 6
    r = reference.simulate(arch, kernel, dispatch=dispatch, dispatch_start=dispatch_start)
    assert np.all(np.isin(r["cta_sm"], [0, 1, 2, 3]))
    assert np.array_equal(np.bincount(r["cta_sm"], minlength=arch.n_sm_slots), r["sm_ctas"])
    assert r["sm_ctas"].sum() == 40
    assert np.all(r["cta_start_tick"] < r["cta_end_tick"])
    assert np.all(np.diff(r["cta_start_tick"]) >= 0)  # grid order
    assert r["makespan_ticks"] == r["cta_end_tick"].max() + 1
    # the first wave fills all 4 x 6 slots at tick 0, one CTA per SM in rank order at a time
    rank = launch.policy.dispatch_rank[:4]
    by_rank = np.argsort(rank)
    assert np.all(r["cta_start_tick"][:24] == 0) and np.all(r["cta_start_tick"][24:] > 0)
    assert r["cta_sm"][:24].tolist() == [int(by_rank[i % 4]) for i in range(24)]
    # residency, with a CTA occupying its slot over ticks [start, end), never exceeds the limit
    for s in range(4):
        mine = r["cta_sm"] == s
        for t in np.unique(r["cta_start_tick"][mine]):
            live = (r["cta_start_tick"][mine] <= t) & (r["cta_end_tick"][mine] > t)
            assert live.sum() <= cps
    # work: (2 instructions x trips + EXIT) per warp
    expect = sum(2 * reference.warp_trips(5, 6, 4, 2, c, w) + 1 for c in range(40) for w in range(4))
    assert r["sm_issued"].sum() == expect


def test_round_robin_pointer_moves_past_last_choice():
    """Round robin places one CTA per SM per pass in rank order, starting after the last SM."""
    arch = arch_with_sms(4)
    kernel = make_kernel("fma dep", grid=10, threads=32)
    launch = lowered(arch, kernel, dispatch=1, dispatch_start=1)
    by_rank = np.argsort(launch.policy.dispatch_rank[:4])
    r = reference.simulate(arch, kernel, dispatch="round_robin", dispatch_start=1)
    assert r["cta_sm"].tolist() == [int(by_rank[c % 4]) for c in range(10)]
    assert r["cta_start_tick"].tolist() == [0] * 10


def test_slow_sm_runs_at_its_own_clock():
    """Two SMs at 1980 and 990 MHz: the tick is 1980 MHz and the slow SM cycles at odd ticks
    (its accumulator reaches F at tick 1, 3, ...: cycle n at tick 2n + 1). A 10-FMA chain:
    fast SM EXIT at tick 38; slow SM: first FMA at its cycle 0 (tick 1), EXIT at cycle
    4*10 - 3 = 37 = tick 75. sm_cycles over makespan 76: 76 and floor(76 * 990 / 1980) = 38."""
    arch = arch_with_sms(2)
    freq = np.zeros(arch.n_sm_slots)
    freq[:2] = (1980, 990)
    clk = clocks.from_array(arch, freq)
    kernel = make_kernel("\n".join(["fma dep"] * 10), grid=2, threads=32)
    launch = lowered(arch, kernel, clk=clk)
    r = reference.simulate(arch, kernel, clk)
    fast_first = int(np.argmin(launch.policy.dispatch_rank[:2])) == 0
    ends = dict(zip(r["cta_sm"].tolist(), r["cta_end_tick"].tolist()))
    assert ends == {0: 38, 1: 75}
    assert r["makespan_ticks"] == 76
    assert r["sm_cycles"][:3].tolist() == [76, 38, 0]
    assert r["cta_sm"].tolist() == ([0, 1] if fast_first else [1, 0])
    assert r["makespan_ns"] == pytest.approx(76 * 1000 / 1980)


# --- dispatch policies 2-4: least_loaded, weighted, closed_loop (model.md section 9) -------------


@pytest.mark.parametrize("dispatch_start", [0, 1])
def test_weighted_first_wave_three_to_one(dispatch_start):
    """Weights [3, 1], 1-warp CTAs (32 per SM fit), 12 CTAs all placed at tick 0. Scores
    196608 // (r0 + 1) vs 65536 // (r1 + 1):
      r0 = 0..9: 196608, 98304, 65536, 49152, 39321, 32768, 28086, 24576, 21845, 19660
      r1 = 0..3: 65536, 32768, 21845, 16384
    Ties (65536, 32768, 21845) go to the rank-0 SM. SM 0 rank 0 (dispatch_start 0):
      0 0 0(tie) 1 | 0 0 0(tie) 1 | 0 0 0(tie) 1
    SM 1 rank 0 (dispatch_start 1):
      0 0 1(tie) 0 0 0 1(tie) 0 0 0 1(tie) 0
    Either way 9 CTAs on SM 0 and 3 on SM 1."""
    arch = arch_with_sms(2)
    kernel = make_kernel("fma dep", grid=12, threads=32)
    w = weights(arch, 3, 1)
    launch = lowered(arch, kernel, dispatch=3, dispatch_start=dispatch_start, dispatch_weight=w)
    assert int(launch.program.ctas_per_sm) == 32
    assert launch.policy.dispatch_rank[:2].tolist() == ([0, 1] if dispatch_start == 0 else [1, 0])
    assert launch.policy.dispatch_weight[:3].tolist() == [3, 1, 0]
    r = reference.simulate(arch, kernel, dispatch="weighted", dispatch_start=dispatch_start,
                           dispatch_weight=w)
    expect = ([0, 0, 0, 1] * 3 if dispatch_start == 0
              else [0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0])
    assert r["cta_sm"].tolist() == expect
    assert r["cta_start_tick"].tolist() == [0] * 12
    assert r["sm_ctas"][:2].tolist() == [9, 3]


def test_weighted_default_weights_are_clocks_and_capacity_caps():
    """Default weights = clocks in MHz: 1980 vs 990 (scores 129761280 // (r0 + 1) vs
    64880640 // (r1 + 1)): c0 -> 0; c1 tie 64880640 -> 0 (rank 0); c2 43253760 < 64880640 -> 1;
    c3 43253760 > 32440320 -> 0; c4 tie 32440320 -> 0; c5 25952256 < 32440320 -> 1.
    With 6 CTAs per SM (36 KiB shared memory) and weights [3, 1] the 3:1 pattern of the previous
    test runs until SM 0 is full after c6 (0 0 0 1 0 0 0), then c7..c11 fill SM 1."""
    arch, clk = two_sms(990)
    kernel = make_kernel("fma dep", grid=6, threads=32)
    assert lowered(arch, kernel, dispatch=3, clk=clk).policy.dispatch_weight[:3].tolist() == [1980, 990, 0]
    r = reference.simulate(arch, kernel, clk, dispatch="weighted")
    assert r["cta_sm"].tolist() == [0, 0, 1, 0, 0, 1]

    arch = arch_with_sms(2)
    kernel = make_kernel("fma dep", grid=12, threads=32, smem_bytes=36 * 1024)
    assert int(lowered(arch, kernel).program.ctas_per_sm) == 6
    r = reference.simulate(arch, kernel, dispatch="weighted", dispatch_weight=weights(arch, 3, 1))
    assert r["cta_sm"].tolist() == [0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1, 1]
    assert r["cta_start_tick"].tolist() == [0] * 12


def test_equal_weights_reduce_to_hardware():
    """Equal weights: the score w * 65536 // (resident + 1) falls strictly with residency, so
    'highest score' = 'most room', ties by rank: hardware exactly, whatever the clocks."""
    arch, clk, kernel = _four_unequal_sms()
    hw = reference.simulate(arch, kernel, clk, dispatch_start=1)
    weighted = reference.simulate(arch, kernel, clk, dispatch="weighted", dispatch_start=1,
                                  dispatch_weight=weights(arch, 7, 7, 7, 7))
    for key in hw:
        assert np.array_equal(np.asarray(hw[key]), np.asarray(weighted[key])), key


def test_zero_alpha_keeps_each_sms_first_duration():
    """Closed loop with a = 0: an SM's first completion sets its estimate, and no later one moves
    it; the prior (round(123 * 1.98) = 244 ticks) is read only before it."""
    arch, clk, kernel = _four_unequal_sms()
    r = reference.simulate(arch, kernel, clk, dispatch="closed_loop", dispatch_start=1,
                           ema_alpha=0.0, ema_prior_ns=123.0, dispatch_trace=True)
    log = r["dispatch_est_log"]
    assert len(log) == 30
    first = {}
    for _, sm, _, duration, est in log:
        first.setdefault(sm, duration)
        assert est == first[sm]
    assert len(set(first.values())) == 4 and 244 not in first.values()
    assert r["dispatch_est"][:4].tolist() == [first[s] for s in range(4)]


def _four_unequal_sms():
    arch = arch_with_sms(4)
    freq = np.zeros(arch.n_sm_slots)
    freq[:4] = (1980, 1100, 1500, 700)
    kernel = make_kernel("loop 5 cta_spread=3 warp_spread=2\n  fma dep\n  ldg\nend", grid=30,
                         threads=96, smem_bytes=36 * 1024, seed=3)
    return arch, clocks.from_array(arch, freq), kernel


def test_least_loaded_sees_partly_done_ctas():
    """2 SMs at one clock (SM 0 rank 0), 2 CTAs per SM (100 KiB shared memory), CTAs of 2
    warps; warps of CTA slot 0 sit on schedulers 0, 1 and of slot 1 on 2, 3, so each warp runs
    alone: t trips of `fma dep` then EXIT issue at cycles 1 + 4 (i - 1) and 4 t - 2 after the
    start. Seed 9 draws trips (c: [w0, w1]) 0: [3, 4], 1: [4, 5], 2: [6, 5], 3: [4, 3],
    4: [4, 2]. Tick 0 (both policies): c0 -> SM 0, c1 -> SM 1, c2 -> SM 0, c3 -> SM 1.
    Tick 14: c0 (SM 0, warps exit 10 and 14) and c3 (SM 1, 14 and 10) complete, so both SMs
    have one free slot. SM 0 still holds c2 with 2 live warps (exits 22, 18); SM 1 holds c1
    whose warp 0 exited in this very tick (4 * 4 - 2 = 14), 1 live warp (exit 18).
    hardware: equal room -> rank 0 = SM 0; least_loaded: 1 < 2 live warps -> SM 1. (No CTA
    launch latency: the freed slots take c4 in the completion tick.)"""
    arch = pinned(arch_with_sms(2), **NO_LAUNCH_LATENCY)
    kernel = make_kernel("loop 2 warp_spread=6\n  fma dep\nend", grid=5, threads=64,
                         smem_bytes=100 * 1024, seed=9)
    launch = lowered(arch, kernel, dispatch=2)
    assert int(launch.program.ctas_per_sm) == 2 and int(launch.program.warps_per_cta) == 2
    assert launch.policy.dispatch_rank[:2].tolist() == [0, 1]
    trips = [[reference.warp_trips(9, 2, 0, 6, c, w) for w in range(2)] for c in range(5)]
    assert trips == [[3, 4], [4, 5], [6, 5], [4, 3], [4, 2]]
    hw = reference.simulate(arch, kernel, dispatch="hardware")
    ll = reference.simulate(arch, kernel, dispatch="least_loaded")
    for r in (hw, ll):
        assert r["cta_start_tick"].tolist() == [0, 0, 0, 0, 14]
        # c4 from tick 14: warps exit at 14 + 14 and 14 + 6
        assert r["cta_end_tick"].tolist() == [14, 18, 22, 14, 28]
    assert hw["cta_sm"].tolist() == [0, 1, 0, 1, 0]
    assert ll["cta_sm"].tolist() == [0, 1, 0, 1, 1]


def test_least_loaded_counts_ctas_placed_in_the_same_dispatch():
    """Tick 0, nothing live yet: each placement adds W = 3 live warps, so with 3 SMs the 9 CTAs
    go round in rank order (dispatch_start 2 over 3 SMs: rank 0, 1, 2 = SM 2, 0, 1). Counting
    only warps live before the dispatch loop would send all nine to the rank-0 SM."""
    arch = arch_with_sms(3)
    kernel = make_kernel("fma dep", grid=9, threads=96)
    launch = lowered(arch, kernel, dispatch=2, dispatch_start=2)
    by_rank = np.argsort(launch.policy.dispatch_rank[:3]).tolist()
    assert by_rank == [2, 0, 1]
    r = reference.simulate(arch, kernel, dispatch="least_loaded", dispatch_start=2)
    assert r["cta_sm"].tolist() == [by_rank[c % 3] for c in range(9)]


def test_closed_loop_estimates_after_known_completions():
    """SM 0 at 1980 MHz, SM 1 at 990 MHz (cycle n at tick 2n + 1), one CTA per SM (200 KiB
    shared memory), single-warp CTAs of 10 dependent FMAs (FMA i at the CTA's first cycle
    + 4 (i - 1), EXIT 37 cycles after its first cycle).
    Durations d = end - start: fast SM 38 (start t0, first cycle t0 + 1, EXIT t0 + 38);
    slow SM from an even start 2a: first cycle at 2a + 1, EXIT at 2a + 1 + 2 * 37 -> d = 75.
    Placement (equal estimates, the prior round(50 ns * 1.98) = 99 ticks, at tick 0 -> rank
    order): c0 -> SM 0, c1 -> SM 1; tick 38: c0 ends, SM 0's estimate is its first duration,
    38, and c2 -> SM 0 (ends 76). Tick 75: c1 ends, SM 1's estimate 75; the tail CTA c3 is
    held for the fast SM (c2 there is expected to end at max(75, 38 + 38) = 76, and
    76 + 38 + floor(75 * 32 / 256) = 123 < 75 + 75): c3 runs on SM 0 from tick 76, when c2 ends
    (no launch latency here), and the slow SM learns nothing more.
    Every later duration on SM 0 equals its first, so a = 0.25, 1 and 0 (the first duration,
    forever) run alike."""
    arch, clk = two_sms(990)
    kernel = make_kernel("\n".join(["fma dep"] * 10), grid=4, threads=32, smem_bytes=200 * 1024)
    launch = lowered(arch, kernel, dispatch=4, clk=clk, ema_alpha=0.25, ema_prior_ns=50.0)
    assert int(launch.program.ctas_per_sm) == 1
    assert (int(launch.policy.ema_alpha_256), int(launch.policy.ema_prior_ticks)) == (64, 99)
    runs = [reference.simulate(arch, kernel, clk, dispatch="closed_loop", ema_alpha=a, ema_prior_ns=50.0,
                               dispatch_trace=True) for a in (0.25, 1.0, 0.0)]
    for r in runs:
        assert r["cta_sm"].tolist() == [0, 1, 0, 0]
        assert r["cta_start_tick"].tolist() == [0, 0, 38, 76]
        assert r["cta_end_tick"].tolist() == [38, 75, 76, 114]
        # (tick, sm, cta, duration, estimate after)
        assert r["dispatch_est_log"] == [(38, 0, 0, 38, 38), (75, 1, 1, 75, 75), (76, 0, 2, 38, 38),
                                         (114, 0, 3, 38, 38)]
        assert r["dispatch_est"][:3].tolist() == [38, 75, 99]  # the floorswept slot keeps the prior


def test_closed_loop_sends_the_tail_to_the_fast_sm():
    """SM 0 at 1980 MHz, SM 1 at 990 MHz and rank 0 (dispatch_start 1), one CTA per SM.
    Program: t dependent FMAs in a loop, one independent FMA, EXIT: on the fast SM the EXIT
    issues 4 t - 1 ticks after the start; on the slow SM from an even start at tick
    2 (4 t - 2) + 1, from an odd start t0 at t0 + 2 + 2 (4 t - 2). Seed 21 gives the CTAs
    t = 4, 3, 3, 2, 2.
    Tick 0: equal estimates (prior 0) and room -> c0 to rank 0 = SM 1 (ends 29), c1 to SM 0
    (ends 11); then SM 0 alone frees: c2 at 11 (ends 22), c3 at 22 (ends 29).
    SM 0's estimate (a = 64): its first duration 11; 11 + 0 // 256 = 11; 11 + (-256) // 256 = 10.
    Tick 29: SM 0 (c3, in SM order first) and SM 1 (c0, first duration 29) both free.
    closed_loop: est 10 < 29 -> c4 to SM 0, ends 29 + 7 = 36, makespan 37 (SM 0's estimate
    10 + (-192) // 256 = 9: floor division, truncation would keep 10).
    hardware: equal room -> rank 0 = SM 1, odd start: ends 29 + 2 + 12 = 43, makespan 44."""
    arch, clk = two_sms(990)
    kernel = make_kernel("loop 3 cta_spread=1\n  fma dep\nend\nfma", grid=5, threads=32,
                         smem_bytes=200 * 1024, seed=21)
    assert [reference.warp_trips(21, 3, 1, 0, c, 0) for c in range(5)] == [4, 3, 3, 2, 2]
    launch = lowered(arch, kernel, dispatch=4, dispatch_start=1, clk=clk)
    assert launch.policy.dispatch_rank[:2].tolist() == [1, 0] and int(launch.program.ctas_per_sm) == 1
    cl = reference.simulate(arch, kernel, clk, dispatch="closed_loop", dispatch_start=1,
                            dispatch_trace=True)
    hw = reference.simulate(arch, kernel, clk, dispatch="hardware", dispatch_start=1)
    assert cl["cta_sm"].tolist() == [1, 0, 0, 0, 0]
    assert cl["cta_start_tick"].tolist() == [0, 0, 11, 22, 29]
    assert cl["cta_end_tick"].tolist() == [29, 11, 22, 29, 36]
    assert cl["dispatch_est_log"] == [(11, 0, 1, 11, 11), (22, 0, 2, 11, 11), (29, 0, 3, 7, 10),
                                      (29, 1, 0, 29, 29), (36, 0, 4, 7, 9)]
    assert cl["makespan_ticks"] == 37
    assert hw["cta_sm"].tolist() == [1, 0, 0, 0, 1]
    assert hw["cta_end_tick"].tolist() == [29, 11, 22, 29, 43]
    assert hw["makespan_ticks"] == 44


def test_closed_loop_same_tick_completions_update_in_slot_order():
    """One SM, two CTA slots, program: t dependent FMAs in a loop, two independent FMAs, EXIT:
    the EXIT issues 4 t ticks after the start. Seed 4: t = 5, 2, 3. c0 (slot 0) runs 0..20,
    c1 (slot 1) 0..8, c2 (slot 1 again) 8..20: c0 and c2 complete in the same cycle.
    a = round(0.75 * 256) = 192: c1, the SM's first completion: 8; tick 20 in slot order: c0
    (d = 20) 8 + 2304 // 256 = 17, then c2 (d = 12) 17 + (-960) // 256 = 13 (floor division:
    truncation would give 14). The other order would give 11, then 17.
    Second moments: 64; 64 + (192 * 336) // 256 = 316; 316 + (192 * -172) // 256 = 187; the
    deviation isqrt(187 - 13^2) = isqrt(18) = 4.
    No CTA launch latency: c2 starts in c1's completion tick."""
    arch = pinned(arch_with_sms(1), **NO_LAUNCH_LATENCY)
    kernel = make_kernel("loop 3 cta_spread=2\n  fma dep\nend\nfma\nfma", grid=3, threads=32,
                         smem_bytes=100 * 1024, seed=4)
    assert [reference.warp_trips(4, 3, 2, 0, c, 0) for c in range(3)] == [5, 2, 3]
    r = reference.simulate(arch, kernel, dispatch="closed_loop", ema_alpha=0.75, dispatch_trace=True)
    assert r["cta_start_tick"].tolist() == [0, 0, 8]
    assert r["cta_end_tick"].tolist() == [20, 8, 20]
    assert r["dispatch_est_log"] == [(8, 0, 1, 8, 8), (20, 0, 0, 20, 17), (20, 0, 2, 12, 13)]
    assert r["dispatch_est"][0] == 13 and r["dispatch_sq"][0] == 187
    assert reference_closed_loop.deviation(SimpleNamespace(est=[13], sq=[187], est_seen={0}), 0) == 4


@pytest.mark.parametrize("dispatch", lower.DISPATCH_POLICIES)
def test_every_cta_runs_once_with_mixed_clocks(dispatch):
    """Mixed clocks, uneven weights, a learning closed loop: every policy runs each CTA once,
    never exceeds the residency limit, starts CTAs only at tick 0 or `cta_launch_ticks` after a
    completion (when the freed slot becomes usable; closed loop also at a completion, where a
    hold ends because a slot it counted as better frees and is no longer occupied), and does
    the same total work."""
    arch = arch_with_sms(4)
    freq = np.zeros(arch.n_sm_slots)
    freq[:4] = (1980, 990, 1500, 1237)
    clk = clocks.from_array(arch, freq)
    kernel = make_kernel("loop 6 cta_spread=4 warp_spread=2\n  fma dep\n  alu\n  lds ways=2\nend",
                         grid=45, threads=128, smem_bytes=36 * 1024, seed=5)
    r = reference.simulate(arch, kernel, clk, dispatch=dispatch, dispatch_start=3,
                           dispatch_weight=weights(arch, 5, 2, 4, 3), ema_alpha=0.5,
                           ema_prior_ns=20.0)
    launch_ticks = int(lowered(arch, kernel, clk=clk).chip.cta_launch_ticks)
    assert launch_ticks > 0  # the preset's launch latency is on: starts lag completions
    assert np.all(np.isin(r["cta_sm"], [0, 1, 2, 3]))
    assert np.array_equal(np.bincount(r["cta_sm"], minlength=arch.n_sm_slots), r["sm_ctas"])
    assert r["sm_ctas"].sum() == 45
    assert np.all(r["cta_start_tick"] < r["cta_end_tick"])
    assert np.all(np.diff(r["cta_start_tick"]) >= 0)  # grid order
    assert r["makespan_ticks"] == r["cta_end_tick"].max() + 1
    assert np.all(r["cta_start_tick"][:24] == 0)  # 4 x 6 slots at tick 0, whatever the policy
    events = set((r["cta_end_tick"] + launch_ticks).tolist())
    if dispatch == "closed_loop":
        events |= set(r["cta_end_tick"].tolist())
    assert set(r["cta_start_tick"][24:].tolist()) <= events
    for s in range(4):
        mine = r["cta_sm"] == s
        for t in np.unique(r["cta_start_tick"][mine]):
            live = (r["cta_start_tick"][mine] <= t) & (r["cta_end_tick"][mine] > t)
            assert live.sum() <= 6
    expect = sum(3 * reference.warp_trips(5, 6, 4, 2, c, w) + 1
                 for c in range(45) for w in range(4))
    assert r["sm_issued"].sum() == expect


def test_dispatch_parameters_validated():
    arch = arch_with_sms(2)
    kernel = make_kernel("fma dep", grid=2, threads=32)
    with pytest.raises(JaxschedError):
        reference.simulate(arch, kernel, dispatch="weighted", dispatch_weight=weights(arch, 3, 0))
    with pytest.raises(JaxschedError):
        reference.simulate(arch, kernel, dispatch="weighted", dispatch_weight=[1, 2])
    with pytest.raises(JaxschedError):
        reference.simulate(arch, kernel, dispatch="closed_loop", ema_alpha=1.5)
    with pytest.raises(JaxschedError):
        reference.simulate(arch, kernel, dispatch="closed_loop", ema_prior_ns=-1.0)
    with pytest.raises(JaxschedError):
        reference.simulate(arch, kernel, dispatch="nearest")
    # floorswept slots need no weight
    r = reference.simulate(arch, kernel, dispatch="weighted", dispatch_weight=weights(arch, 3, 1))
    assert r["sm_ctas"].sum() == 2


# --- program semantics ---------------------------------------------------------------------------


def _expected_work(kernel, seed, trips, cs, ws, threshold, n_pre, n_loop_plain, n_if, n_else,
                   n_post):
    """Issued instructions and active lanes implied by a loop-with-if/else program."""
    warps = -(-int(kernel.threads_per_cta) // 32)
    last = int(kernel.threads_per_cta) - 32 * (warps - 1)
    issued = lanes_total = 0
    for c in range(int(kernel.grid_ctas)):
        for w in range(warps):
            lanes = last if w == warps - 1 else 32
            t = reference.warp_trips(seed, trips, cs, ws, c, w)
            il = reference.warp_if_lanes(seed, threshold, c, w, lanes)
            el = lanes - il
            per_trip = n_loop_plain + (n_if if il else 0) + (n_else if el else 0)
            issued += n_pre + t * per_trip + n_post
            lanes_total += lanes * (n_pre + t * n_loop_plain + n_post) + t * (n_if * il + n_else * el)
    return issued, lanes_total


def test_issued_and_lanes_match_program_with_loop_and_divergent_branch():
    program = """
        alu
        loop 1 cta_spread=3 warp_spread=1
          fma dep
          if 0.3
            sfu dep
            alu
          else
            fma dep
          end
          lds ways=2
        end
        exit
    """
    kernel = make_kernel(program, grid=12, threads=100, seed=11)
    launch = lowered(H200, kernel)
    threshold = int(launch.program.branch_threshold[0])
    assert threshold == round(0.3 * 2**24)
    trips = [reference.warp_trips(11, 1, 3, 1, c, w) for c in range(12) for w in range(4)]
    assert min(trips) == 0 and max(trips) >= 2  # covers zero-trip warps
    r = reference.simulate(H200, kernel)
    issued, lanes = _expected_work(kernel, 11, 1, 3, 1, threshold, n_pre=1, n_loop_plain=2,
                                   n_if=2, n_else=1, n_post=1)
    assert r["sm_issued"].sum() == issued
    assert r["sm_active_lanes"].sum() == lanes
    assert np.array_equal(r["sm_stalls"].sum(axis=1), r["sm_warp_cycles"])


@pytest.mark.parametrize("p, expect_issued", [(0.0, 1 + 1), (1.0, 2 + 1)])
def test_pc_resolution_branch_then_zero_trip_loop(p, expect_issued):
    """An if/else at pc 0 followed directly by a zero-trip loop: at launch (p = 0) rule 2 jumps
    to the else-path; after the last path instruction rules 3 and 1 skip the empty path and the
    zero-trip loop, landing on EXIT."""
    program = f"if {p}\n  fma\n  fma\nelse\n  alu\nend\nloop 0\n  sfu\nend\nexit"
    kernel = make_kernel(program, grid=1, threads=32)
    r = reference.simulate(H200, kernel)
    assert r["sm_issued"].sum() == expect_issued
    assert r["sm_active_lanes"].sum() == 32 * expect_issued


def test_zero_trip_loop_at_program_start():
    kernel = make_kernel("loop 0\n  fma dep\nend\nalu", grid=1, threads=32)
    r = reference.simulate(H200, kernel)
    assert r["sm_issued"].sum() == 2  # ALU, EXIT
    assert r["makespan_ticks"] == 3  # ALU at 1, EXIT at 2


def test_partial_last_warp_lanes():
    kernel = make_kernel("fma\nalu", grid=2, threads=70)  # warps of 32, 32, 6 lanes
    r = reference.simulate(H200, kernel)
    assert r["sm_issued"].sum() == 2 * 3 * 3
    assert r["sm_active_lanes"].sum() == 2 * 3 * 70


# --- clocks --------------------------------------------------------------------------------------


def test_memory_bound_ignores_sm_clock_compute_bound_scales():
    arch = arch_with_sms(4)
    slow, fast = clocks.uniform(arch, 1.0), clocks.uniform(arch, 2.0)
    mem = make_kernel("loop 20\n  ldg\n  fma dep\nend", grid=4, threads=32)
    comp = make_kernel("loop 50\n  fma dep\nend", grid=4, threads=32)
    m1 = reference.simulate(arch, mem, slow)["makespan_ns"]
    m2 = reference.simulate(arch, mem, fast)["makespan_ns"]
    c1 = reference.simulate(arch, comp, slow)
    c2 = reference.simulate(arch, comp, fast)
    assert 0.97 < m2 / m1 <= 1.0
    # the same 4 n - 1 = 199 ticks (1 + 4 x 49 + 1 + 1), at twice the tick rate
    assert c1["makespan_ticks"] == c2["makespan_ticks"] == 199
    assert c2["makespan_ns"] / c1["makespan_ns"] == pytest.approx(0.5)


def test_max_ticks_exceeded_raises():
    kernel = make_kernel("\n".join(["fma dep"] * 10), grid=1, threads=32)
    with pytest.raises(RuntimeError, match="max_ticks"):
        reference.simulate(H200, kernel, max_ticks=20)


def test_simulate_launch_equals_simulate():
    arch = arch_with_sms(3)
    kernel = make_kernel("loop 4 warp_spread=3\n  ldg\n  fma dep\n  shfl\nend\nbar", grid=7,
                         threads=96, seed=2)
    a = reference.simulate(arch, kernel, warp_policy="oldest", dispatch="round_robin")
    launch = lowered(arch, kernel, warp_policy=2, dispatch=1)
    b = reference.simulate_launch(launch, lower.shapes_for(arch, kernel))
    assert set(b) == set(a) - {"makespan_ns", "makespan_cycles"}
    for key in b:
        assert np.array_equal(a[key], b[key]), key
    assert int(Op.LDG) in launch.program.op.tolist()
