"""Oracle bounds (jaxsched/bounds.py): hand cases, invariants, the work model measured from the
engine, and the fluid bound against the exact engine on small random configurations."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxsched as js
from jaxsched import bounds
from helpers import small_arch


def _work(cycles, ns=None, slots: int = 1, grid: int | None = None) -> bounds.Work:
    """A hand-made work model, padded with invalid CTAs up to `grid` entries."""
    cycles = np.asarray(cycles, np.float32)
    n = len(cycles)
    grid = n if grid is None else grid
    pad = lambda x: jnp.asarray(np.concatenate([x, np.zeros(grid - n, np.float32)]))  # noqa: E731
    ns = np.zeros(n, np.float32) if ns is None else np.asarray(ns, np.float32)
    return bounds.Work(cycles=pad(cycles), ns=pad(ns), valid=jnp.arange(grid) < n, slots_per_sm=slots)


def _floats(b: bounds.Bounds) -> tuple[float, float, float]:
    return float(b.fluid_ns), float(b.clairvoyant_ns), float(b.clairvoyant_lpt_ns)


# ----------------------------------------------------------------------------- hand cases


@pytest.mark.parametrize("n_ctas", [1, 11, 12, 13, 25])
def test_equal_sms_and_ctas_take_ceil_waves(n_ctas):
    # 4 SMs at 1 GHz (one floorswept slot), 3 slots each, CTAs of 100 cycles = 100 ns; +1 ns launch tick.
    f = np.array([1000, 1000, 0, 1000, 1000], np.float32)
    fluid, clair, lpt = _floats(bounds.bounds(_work([100.0] * n_ctas, slots=3, grid=32), f))
    assert clair == lpt == pytest.approx(100.0 * -(-n_ctas // 12) + 1.0, rel=1e-6)
    assert fluid == pytest.approx(max(100.0 * n_ctas / 12, 100.0) + 1.0, rel=1e-6)


def test_one_slow_sm_gets_work_only_when_it_finishes_first():
    # Fast SM: 100 ns per CTA, slow SM (half clock): 200 ns; one slot each.
    f = np.array([1000, 500], np.float32)
    # 3 CTAs: fast, fast (tie at 200 ns goes to the faster SM), slow -> both done at 200 ns.
    assert _floats(bounds.bounds(_work([100.0] * 3), f)) == pytest.approx((201.0, 201.0, 201.0))
    # 4 CTAs: the 4th finishes at 300 on the fast SM; fluid is 400 cycles over 1.5 cycles/ns.
    fluid, clair, _ = _floats(bounds.bounds(_work([100.0] * 4), f))
    assert clair == pytest.approx(301.0)
    assert fluid == pytest.approx(400.0 / 1.5 + 1.0)


def test_longest_first_beats_grid_order_on_a_late_long_cta():
    # Grid order puts the long CTA last on top of a short one; longest-first starts it first.
    fluid, clair, lpt = _floats(bounds.bounds(_work([10.0, 10.0, 20.0]), np.array([1000, 1000], np.float32)))
    assert clair == pytest.approx(31.0) and lpt == pytest.approx(21.0) and fluid == pytest.approx(21.0)


def test_longest_cta_on_the_fastest_sm_bounds_the_fluid():
    fluid, clair, _ = _floats(bounds.bounds(_work([1000.0, 1.0]), np.array([2000, 100, 100, 100], np.float32)))
    assert fluid == clair == pytest.approx(500.0 + 0.5)


def test_nanoseconds_do_not_scale_with_the_clock():
    work = _work([0.0] * 6, ns=[50.0] * 6, slots=2)
    for mhz in (500.0, 2000.0):
        fluid, clair, _ = _floats(bounds.bounds(work, np.full(3, mhz, np.float32)))
        assert fluid - 1000.0 / mhz == pytest.approx(50.0)
        assert clair - 1000.0 / mhz == pytest.approx(50.0)


def test_gaps_are_relative_to_each_bound():
    ref = bounds.Bounds(fluid_ns=jnp.float32(100.0), clairvoyant_ns=jnp.float32(125.0),
                        clairvoyant_lpt_ns=jnp.float32(110.0))
    g = bounds.gaps(jnp.array([100.0, 150.0]), ref)
    np.testing.assert_allclose(g.fluid_ns, [0.0, 0.5])
    np.testing.assert_allclose(g.clairvoyant_ns, [-0.2, 0.2], rtol=1e-6)


def test_bad_clocks_are_rejected():
    with pytest.raises(js.JaxschedError, match="sm_freq_mhz"):
        bounds.bounds(_work([1.0]), np.zeros(4, np.float32))


# ----------------------------------------------------------------------------- invariants

N_SM, GRID = 6, 24


@st.composite
def instances(draw, with_ns: bool = True):
    slots = draw(st.integers(1, 3))
    n = draw(st.integers(1, GRID))
    cycles = draw(st.lists(st.integers(0, 2000), min_size=n, max_size=n))
    ns = draw(st.lists(st.integers(0, 500), min_size=n, max_size=n)) if with_ns else None
    mhz = draw(st.lists(st.sampled_from([0, 300, 990, 1000, 1500, 1980]), min_size=N_SM, max_size=N_SM)
               .filter(lambda f: max(f) > 0))
    return _work(cycles, ns, slots=slots, grid=GRID), np.asarray(mhz, np.float32)


@settings(max_examples=40, deadline=None)
@given(instances())
def test_fluid_is_below_both_clairvoyant_schedules(inst):
    fluid, clair, lpt = _floats(bounds.bounds(*inst))
    assert fluid <= clair * (1 + 1e-5) and fluid <= lpt * (1 + 1e-5)


@settings(max_examples=30, deadline=None)
@given(instances(with_ns=False), st.floats(0.25, 4.0), st.sampled_from([0.5, 2.0, 4.0]))
def test_bounds_scale_as_one_over_the_clock(inst, scale, power_of_two):
    work, f = inst
    base = _floats(bounds.bounds(work, f))
    assert float(bounds.fluid_ns(work, f * scale)) == pytest.approx(base[0] / scale, rel=1e-5)
    # a power-of-two scale is exact in floating point, so every placement decision repeats
    assert _floats(bounds.bounds(work, f * power_of_two)) == tuple(b / power_of_two for b in base)


@settings(max_examples=30, deadline=None)
@given(instances(), st.permutations(range(N_SM)))
def test_numbering_of_the_sms_changes_nothing(inst, perm):
    work, f = inst
    fluid, clair, lpt = _floats(bounds.bounds(work, f))
    fluid_p, clair_p, lpt_p = _floats(bounds.bounds(work, f[np.asarray(perm)]))
    assert fluid_p == pytest.approx(fluid, rel=1e-5)
    assert (clair_p, lpt_p) == (clair, lpt)


def _table(work: bounds.Work, mhz: tuple[float, ...]) -> bounds.WorkTable:
    """`work` tabulated at the clocks `mhz` (fastest first)."""
    period = np.asarray([1000.0 / m for m in mhz], np.float32)
    ns = np.stack([np.asarray(work.cycles) * p + np.asarray(work.ns) for p in period])
    return bounds.WorkTable(period_ns=jnp.asarray(period), ns=jnp.asarray(ns, jnp.float32), valid=work.valid,
                            slots_per_sm=work.slots_per_sm)


def test_a_table_through_two_clocks_of_an_affine_work_is_that_work():
    # Between and beyond its two clocks the table is the line through them: the model itself.
    rng = np.random.default_rng(2)
    work = _work(rng.integers(50, 500, 20), rng.integers(0, 100, 20), slots=2, grid=24)
    for f in rng.uniform(300, 2000, (5, N_SM)).astype(np.float32):
        np.testing.assert_allclose(_floats(bounds.bounds(_table(work, (1600.0, 800.0)), f)),
                                   _floats(bounds.bounds(work, f)), rtol=1e-5)


def test_a_table_is_affine_in_the_period_between_its_clocks():
    # One CTA of 100 / 200 / 250 ns at 2000 / 1000 / 500 MHz, one SM: makespan = its time + the
    # launch tick. Between clocks the segment through both, beyond them the nearest segment
    # extends (at 4000 MHz: 100 - 200 x 0.25 = 50 ns; at 250 MHz: 250 + 50 x 2 = 350 ns).
    table = bounds.WorkTable(period_ns=jnp.asarray([0.5, 1.0, 2.0]), ns=jnp.asarray([[100.0], [200.0], [250.0]]),
                             valid=jnp.asarray([True]), slots_per_sm=1)
    for mhz, ns in ((2000, 100.0), (1000, 200.0), (500, 250.0), (4000 / 3, 150.0), (4000, 50.0), (250, 350.0)):
        assert float(bounds.clairvoyant_ns(table, np.float32([mhz]))) == pytest.approx(ns + 1000 / mhz, rel=1e-6)
    steep = bounds.WorkTable(period_ns=jnp.asarray([0.5, 1.0]), ns=jnp.asarray([[100.0], [400.0]]),
                             valid=jnp.asarray([True]), slots_per_sm=1)
    assert float(bounds.clairvoyant_ns(steep, np.float32([8000]))) == pytest.approx(0.125)  # never below 0 ns


def test_vmap_over_clock_maps_equals_one_by_one():
    rng = np.random.default_rng(1)
    work = _work(rng.integers(50, 500, 20), rng.integers(0, 100, 20), slots=2, grid=24)
    maps = rng.uniform(500, 2000, (5, N_SM)).astype(np.float32)
    batched = jax.jit(jax.vmap(lambda f: bounds.bounds(work, f)))(maps)
    for i, f in enumerate(maps):
        np.testing.assert_allclose(_floats(jax.tree.map(lambda x: x[i], batched)),
                                   _floats(bounds.bounds(work, f)), rtol=1e-6)


# ----------------------------------------------------------------------------- work from the engine

# 4 enabled SMs; slots reused at once (a CTA launch latency, in ns, would enter the work as ns)
ARCH = small_arch(2, cta_launch_ns=np.float32(0.0))
COMPUTE = "loop 6 cta_spread=2\n fma dep\n sfu dep\nend"
MEMORY = "loop 4\n ldg dep bytes=128\nend"
WORK_MHZ = (1980.0, 1188.0)
N_RANDOM = 8


def _kernel(program: str) -> js.Kernel:
    """4 waves of 256-thread CTAs (8 per SM) on ARCH."""
    return js.make_kernel(program, grid=4 * 4 * 8, threads=256, l2_hit_rate=0.5, pad_to=8)


def _random_launch(rng: np.random.Generator) -> tuple[js.Arch, js.Kernel, js.Clocks, int]:
    """A small full-occupancy kernel of 2-4 waves on 2 or 4 SMs, unequal clocks, a warp policy."""
    ops = ["fma dep", "fma", "sfu dep", "alu", "ldg bytes=128", "lds dep", "ldg bytes=512"]
    body = "\n".join(rng.choice(ops, size=int(rng.integers(1, 4))))
    program = f"loop {int(rng.integers(2, 6))} cta_spread={int(rng.integers(0, 3))}\n{body}\nend\nexit dep"
    arch = small_arch(int(rng.integers(1, 3)))
    threads = int(rng.choice([128, 256]))
    slots = int(js.occupancy(arch, threads, 32, 0).blocks_per_sm)
    grid = int(rng.integers(2, 5)) * slots * int(np.sum(arch.sm_enabled))
    kernel = js.make_kernel(program, grid=grid, threads=threads, l2_hit_rate=float(rng.uniform(0.3, 1.0)),
                            seed=int(rng.integers(1 << 30)), pad_to=8)
    n = arch.n_sm_slots
    mhz = [1800 * (1 + 0.2 * rng.standard_normal(n)), rng.uniform(1000, 1980, n),
           np.where(rng.random(n) < 0.3, 990.0, 1980.0)][int(rng.integers(3))]
    return arch, kernel, js.clocks.from_array(arch, np.clip(mhz, 500, 1980)), int(rng.integers(2))


@pytest.fixture(scope="module")
def runs() -> dict[str, js.Result]:
    """Every engine run of this file in one `simulate_batch` call (one compilation), one
    configuration at a time: a chunk steps until its longest member ends (45 s as one chunk
    here, 27 s so)."""
    uneven = js.clocks.from_array(ARCH, np.where(np.arange(ARCH.n_sm_slots) % 2 == 0, 1980.0, 990.0))
    named = [(f"{name}@{m:.0f}", ARCH, _kernel(prog), js.clocks.uniform(ARCH, m / 1000), 1)
             for name, prog in (("compute", COMPUTE), ("memory", MEMORY)) for m in WORK_MHZ]
    named.append(("compute@uneven", ARCH, _kernel(COMPUTE), uneven, 1))
    named.append(("memory@1500", ARCH, _kernel(MEMORY), js.clocks.uniform(ARCH, 1.5), 1))
    rng = np.random.default_rng(5)
    for i in range(N_RANDOM):
        arch, kernel, clk, warp = _random_launch(rng)
        named += [(f"random{i}@{m:.0f}", arch, kernel, js.clocks.uniform(arch, m / 1000), warp) for m in WORK_MHZ]
        named.append((f"random{i}", arch, kernel, clk, warp))
    n = len(named)
    result = js.simulate_batch([x[1] for x in named], [x[2] for x in named], [x[3] for x in named],
                               [x[4] for x in named], [0] * n, [0] * n, chunk=1)
    out = {name: jax.tree.map(lambda leaf, i=i: leaf[i], result) for i, (name, *_) in enumerate(named)}
    return out | {name + ".mhz": clk.sm_freq_mhz for name, _, _, clk, _ in named}


def test_work_of_one_run_is_slot_occupancy_or_shared_busy_cycles(runs):
    r = runs["compute@1980"]
    valid = np.asarray(r.cta_sm) >= 0
    slot = bounds.work_from_uniform(r)
    occupied = (np.asarray(r.cta_end_tick) - np.asarray(r.cta_start_tick))[valid]
    np.testing.assert_array_equal(np.asarray(slot.cycles)[valid], occupied)
    assert slot.slots_per_sm == 8 and float(jnp.sum(slot.ns)) == 0.0
    shared = bounds.work_from_uniform(r, attribution="sm")
    assert shared.slots_per_sm == 1
    assert float(jnp.sum(shared.cycles)) == pytest.approx(float(np.sum(r.sm_busy_cycles)), rel=1e-6)


def test_two_clocks_separate_cycles_from_nanoseconds(runs):
    for split in bounds.SPLITS:
        # Everything in a compute-only kernel counts in SM cycles: identical runs in cycles, no ns.
        w = bounds.work_from_uniform(runs["compute@1980"], runs["compute@1188"], split=split)
        assert float(jnp.max(w.ns)) == pytest.approx(0.0, abs=1e-3)
        w = bounds.work_from_uniform(runs["memory@1980"], runs["memory@1188"], split=split)
        assert float(jnp.sum(w.ns)) > 5 * float(jnp.sum(w.cycles)) * 1000.0 / 1980.0  # mostly memory latency
        assert float(jnp.min(w.cycles)) >= 0.0 and float(jnp.min(w.ns)) >= 0.0


def test_work_needs_uniform_runs_at_two_different_clocks(runs):
    r = runs["compute@1980"]
    with pytest.raises(js.JaxschedError, match="tick_mhz"):
        bounds.work_from_uniform(r, r)
    with pytest.raises(js.JaxschedError, match="attribution"):
        bounds.work_from_uniform(r, attribution="cta")
    with pytest.raises(js.JaxschedError, match="split"):
        bounds.work_from_uniform(r, split="sm")
    with pytest.raises(js.JaxschedError, match="uniform chip"):
        bounds.work_from_uniform(runs["compute@uneven"])


def _occupancy_ns(r: js.Result) -> np.ndarray:
    """Each CTA's slot occupancy in ns (0 past the grid)."""
    ticks = np.asarray(r.cta_end_tick, np.float64) - np.asarray(r.cta_start_tick, np.float64)
    return np.where(np.asarray(r.cta_sm) >= 0, ticks * 1000.0 / float(r.tick_mhz), 0.0)


def test_a_table_holds_each_runs_occupancy_or_the_fastest_runs_shares(runs):
    measured = [runs[f"memory@{m}"] for m in ("1188", "1980", "1500")]
    by_clock = [_occupancy_ns(r) for r in (measured[1], measured[2], measured[0])]  # fastest first
    own = bounds.work_table_from_uniform(*measured, split="cta")
    np.testing.assert_allclose(np.asarray(own.period_ns), [1000 / 1980, 1000 / 1500, 1000 / 1188], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(own.ns), by_clock, rtol=1e-6)
    assert own.slots_per_sm == 8
    shared = bounds.work_table_from_uniform(*measured)  # split="kernel": shares of the 1980 MHz run
    totals = np.array([x.sum() for x in by_clock])
    np.testing.assert_allclose(np.asarray(shared.ns), by_clock[0] * (totals / totals[0])[:, None], rtol=1e-5)


def test_a_table_needs_uniform_runs_of_one_grid_at_distinct_clocks(runs):
    r = runs["memory@1980"]
    with pytest.raises(js.JaxschedError, match="results"):
        bounds.work_table_from_uniform(r)
    with pytest.raises(js.JaxschedError, match="tick_mhz"):
        bounds.work_table_from_uniform(r, runs["memory@1188"], r)
    with pytest.raises(js.JaxschedError, match="uniform chip"):
        bounds.work_table_from_uniform(r, runs["compute@uneven"])
    with pytest.raises(js.JaxschedError, match="split"):
        bounds.work_table_from_uniform(r, runs["memory@1188"], split="sm")
    other = next(runs[f"random{i}@1188"] for i in range(N_RANDOM)
                 if np.sum(np.asarray(runs[f"random{i}@1188"].cta_sm) >= 0) != np.sum(np.asarray(r.cta_sm) >= 0))
    with pytest.raises(js.JaxschedError, match=r"results\[1\]"):
        bounds.work_table_from_uniform(r, other)


def test_hardware_dispatch_never_beats_the_fluid_bound(runs):
    # Work: the two-part model from uniform runs at 1980 and 1188 MHz, slot attribution, per-CTA
    # split. Over 512 random configurations of this kind (docs/bounds.md) the makespan stayed
    # >= 1.004 x the fluid bound under hardware, round-robin and closed-loop dispatch, so the
    # tolerance here is 0: the bound must hold.
    for i in range(N_RANDOM):
        work = bounds.work_from_uniform(runs[f"random{i}@1980"], runs[f"random{i}@1188"])
        ref = bounds.bounds(work, runs[f"random{i}.mhz"])
        makespan = float(runs[f"random{i}"].makespan_ns)
        assert float(ref.fluid_ns) <= makespan, i
        assert float(ref.fluid_ns) <= float(ref.clairvoyant_ns)
        # These chips have the H200's 207 ns CTA launch latency: counting it keeps the bound
        # valid and makes it tighter.
        tight = bounds.bounds(work, runs[f"random{i}.mhz"], launch_ns=207.0)
        assert float(ref.fluid_ns) <= float(tight.fluid_ns) <= makespan, i
        assert float(tight.fluid_ns) <= float(tight.clairvoyant_ns)


def test_launch_latency_delays_each_slot_refill():
    # 40 CTAs, 2 slots on each of two 2 GHz SMs (1000 ns a CTA) and one 1 GHz SM (2000 ns);
    # 200 ns between a slot's CTAs. Best split: 8 per fast slot (8 x 1000 + 7 x 200 = 9400 ns),
    # 4 per slow slot (4 x 2000 + 3 x 200 = 8600 ns); fluid: 40 CTAs at 4/1200 + 2/2200 per ns,
    # less the 200 ns the first CTA of a slot does not wait. Plus the 0.5 ns launch tick.
    f = np.array([2000.0, 2000.0, 1000.0, 0.0], np.float32)
    fluid, clair, lpt = _floats(bounds.bounds(_work([2000.0] * 40, slots=2), f, launch_ns=200.0))
    assert clair == lpt == pytest.approx(9400.5, rel=1e-6)
    assert fluid == pytest.approx(40 / (4 / 1200 + 2 / 2200) - 200 + 0.5, rel=1e-5)
    assert _floats(bounds.bounds(_work([2000.0] * 40, slots=2), f))[1] == pytest.approx(8000.5, rel=1e-6)


# ----------------------------------------------------------------------------- reachable references


def test_uniform_chip_predicts_a_compute_bound_launch_at_other_clocks():
    """Two uniform runs (1.98, 1.188 GHz) give the launch's makespan at 1.5 and 1.8 GHz as the
    engine runs it, where every CTA's time scales with the clock."""
    arch = small_arch(4)
    kernel = js.make_kernel("loop 20 cta_spread=3\n fma dep\n fma dep\n sfu dep\nend", grid=40, threads=128, regs=32)
    run = lambda ghz: js.simulate(arch, kernel, js.clocks.uniform(arch, ghz))  # noqa: E731
    chip = bounds.uniform_chip(run(1.98), run(1.188))
    for ghz in (1.5, 1.8):
        assert float(chip.makespan_ns(1000 * ghz)) == pytest.approx(float(run(ghz).makespan_ns), rel=1e-5)
    with pytest.raises(js.JaxschedError, match="result_b.tick_mhz"):
        bounds.uniform_chip(run(1.5), run(1.5))


def test_recovered_share_of_the_loss():
    hw = np.array([110.0, 110.0, 110.0, 100.0])
    policy = np.array([105.0, 112.0, 100.0, 99.0])
    share = bounds.recovered(hw, policy, 100.0)
    np.testing.assert_allclose(share[:3], [0.5, -0.2, 1.0])
    assert np.isnan(share[3])  # no loss to recover
