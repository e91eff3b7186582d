"""The issue-slot fluid bound (jaxsched.issue_bound, docs/bounds.md section 7) against the engine."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from helpers import small_arch

import jaxsched as js
from jaxsched import issue_bound
from jaxsched.lower import DISPATCH_POLICIES

N_RANDOM = 8
ISSUE_BOUND = "loop 64\n fma dep\nend"  # 16 warps per scheduler of dependent FMAs: issue-bound


def _random_config(rng: np.random.Generator) -> tuple[js.Arch, js.Kernel, js.Clocks, int, int]:
    """A 2-5-wave kernel on 2 or 4 SMs with launch credit (or none), unequal clocks and random
    warp and dispatch policies."""
    ops = ["fma dep", "fma", "alu", "alu dep", "sfu dep", "ldg bytes=128", "lds dep", "bar"]
    body = "\n".join(rng.choice(ops, size=int(rng.integers(1, 4))))
    program = f"loop {int(rng.integers(2, 8))} cta_spread={int(rng.integers(0, 3))}\n{body}\nend"
    arch = small_arch(int(rng.integers(1, 3)), cta_launch_idle_cycles=np.int32(rng.choice([0, 16, 96, 256])),
                      taken_branch_cycles=np.int32(rng.choice([0, 9])))
    threads = int(rng.choice([64, 128, 256, 1024]))
    slots = int(js.occupancy(arch, threads, 32, 0).blocks_per_sm)
    grid = int(rng.integers(2, 6)) * slots * int(np.sum(arch.sm_enabled)) + int(rng.integers(0, slots))
    kernel = js.make_kernel(program, grid=grid, threads=threads, l2_hit_rate=float(rng.uniform(0.3, 1.0)),
                            seed=int(rng.integers(1 << 30)), pad_to=8)
    mhz = np.clip(1800 * (1 + 0.2 * rng.standard_normal(arch.n_sm_slots)), 600, 1980)
    return (arch, kernel, js.clocks.from_array(arch, mhz), int(rng.integers(3)),
            int(rng.integers(len(DISPATCH_POLICIES))))


@pytest.fixture(scope="module")
def runs() -> list[tuple[js.Arch, js.Kernel, js.Clocks, js.Result]]:
    """Each random configuration twice (its own clocks and policies; a uniform chip, hardware
    dispatch, GTO), and the issue-bound kernel on one SM, in one `simulate_batch` call, one
    configuration at a time: a chunk steps until its longest member ends, and the issue-bound
    kernel's 12,481 ticks are 1.1-9.9 times the others' (49 s as one chunk of 17, 14 s so)."""
    rng = np.random.default_rng(11)
    configs = []
    for _ in range(N_RANDOM):
        arch, kernel, clk, warp, dispatch = _random_config(rng)
        configs += [(arch, kernel, clk, warp, dispatch), (arch, kernel, js.clocks.uniform(arch, 1.4), 1, 0)]
    one_sm = small_arch(1).replace(sm_enabled=np.arange(8) == 0)
    configs.append((one_sm, js.make_kernel(ISSUE_BOUND, grid=24, threads=1024, pad_to=8),
                    js.clocks.uniform(one_sm, 1.98), 1, 0))
    result = js.simulate_batch(*(list(x) for x in zip(*configs)), [0] * len(configs), chunk=1)
    return [(a, k, c, jax.tree.map(lambda leaf, i=i: leaf[i], result)) for i, (a, k, c, *_) in enumerate(configs)]


def test_no_run_beats_the_issue_bound(runs):
    for i, (arch, kernel, clk, result) in enumerate(runs):
        bound = float(issue_bound.issue_ns(issue_bound.issue_demand(result, arch, kernel), clk.sm_freq_mhz))
        assert 0.0 < bound <= float(result.makespan_ns), i


def test_the_demand_does_not_depend_on_clocks_or_policies(runs):
    for (arch, kernel, _, a), (_, _, _, b) in zip(runs[0:-1:2], runs[1:-1:2]):
        da, db = (issue_bound.issue_demand(r, arch, kernel) for r in (a, b))
        assert float(da.instructions) == float(db.instructions)
        np.testing.assert_array_equal(np.asarray(da.pipe_instructions), np.asarray(db.pipe_instructions))


def test_an_issue_bound_kernel_runs_close_to_the_bound(runs):
    # 24 CTAs of 32 warps, one at a time on one SM: 32 x 64 FMAs + 32 EXITs each, one issue per
    # scheduler-cycle but for each CTA's first latency and its last warps' drain.
    arch, kernel, clk, result = runs[-1]
    demand = issue_bound.issue_demand(result, arch, kernel)
    assert float(demand.instructions) == 24 * 32 * 65
    bound = float(issue_bound.issue_ns(demand, clk.sm_freq_mhz))
    assert bound == pytest.approx(24 * 32 * 65 / 4 / 1.98, rel=1e-6)
    assert float(result.makespan_ns) <= 1.05 * bound


def test_launch_credit_raises_the_bound_by_the_paid_refills():
    arch = small_arch(1)  # 2 SMs
    demand = issue_bound.IssueDemand(
        instructions=np.float32(1000.0), pipe_instructions=np.zeros(3, np.float32),
        pipe_interval_cycles=np.ones(3, np.float32), ctas=np.float32(40.0), ctas_per_sm=np.float32(8.0),
        credit_cycles=np.float32(256.0), schedulers_per_sm=4)
    mhz = np.asarray(js.clocks.uniform(arch, 2.0).sm_freq_mhz)
    # 40 CTAs, 2 x (8 first fills + 1 refill on the initial credit) free: 22 refills x 256 cycles.
    assert float(issue_bound.issue_ns(demand, mhz)) == pytest.approx((1000 + 22 * 256) / (4 * 2 * 2.0))


def test_bad_results_are_rejected(runs):
    arch, kernel, _, result = runs[0]
    batched = jax.tree.map(lambda leaf: np.stack([leaf, leaf]), result)
    with pytest.raises(js.JaxschedError, match="one configuration"):
        issue_bound.issue_demand(batched, arch, kernel)
    unfinished = dataclasses.replace(result, completed=np.asarray(False))  # a batch run out of ticks
    with pytest.raises(js.JaxschedError, match="completed"):
        issue_bound.issue_demand(unfinished, arch, kernel)
