"""Cooperative kernels with grid-wide barriers and persistent kernels with a global work queue
(docs/model.md sections 7-9), in the JAX engine: behaviour and launch checks. Exact equality
with the reference is in test_launch_modes_vs_reference.py."""

from __future__ import annotations

import numpy as np
import pytest

import jaxsched as js
from jaxsched.errors import JaxschedError
from jaxsched.kernel import resident_grid

from helpers import simulate_pinned, small_arch

ARCH = small_arch(4)
N_SM = ARCH.sm_count
PAD = 8
COOP = js.make_kernel("loop 40\n fma dep\n fma dep\n fma dep\n fma dep\n gsync\nend", grid=2 * N_SM,
                      threads=128, cooperative=True, grid_sync_ns=0.0, pad_to=PAD)
PLAIN = js.make_kernel("loop 40\n fma dep\n fma dep\n fma dep\n fma dep\nend", grid=2 * N_SM,
                       threads=128, pad_to=PAD)
# The file's runs share one compilation (two before): every CTA slot of 128-thread CTAs, the
# persistent kernel's grid, fast-forward's search compiled in.
STATICS = dict(cta_slots=16, max_ctas=128, fast_forward_step=True)


def simulate(arch: js.Arch, kernel, clk: js.Clocks | None = None, **config) -> js.Result:
    """`js.simulate` with the file's `STATICS` (`helpers.simulate_pinned`)."""
    return simulate_pinned(arch, kernel, clk, statics=STATICS, **config)


def clocks_with_slow_sm(slow_mhz: float = 990.0) -> js.Clocks:
    mhz = np.full(ARCH.n_sm_slots, 1980.0)
    mhz[0] = slow_mhz
    return js.clocks.from_array(ARCH, mhz)


def test_cooperative_makespan_follows_the_slowest_sm() -> None:
    fast = simulate(ARCH, COOP)
    one_slow = simulate(ARCH, COOP, clocks_with_slow_sm())
    all_slow = simulate(ARCH, COOP, js.clocks.uniform(ARCH, 0.99))
    # With grid barriers every CTA waits for SM 0 at every iteration: the whole grid runs at its pace.
    assert float(one_slow.makespan_ns) == pytest.approx(float(all_slow.makespan_ns), rel=0.02)
    assert float(one_slow.makespan_ns) > 1.8 * float(fast.makespan_ns)
    ends = np.asarray(one_slow.cta_end_tick)[: 2 * N_SM]
    assert ends.max() - ends.min() < 10  # everyone leaves the last barrier together
    # Without them only SM 0's own CTAs are slow, and they are all the makespan sees.
    free = simulate(ARCH, PLAIN, clocks_with_slow_sm())
    free_ends = np.asarray(free.cta_end_ns)[: 2 * N_SM]
    on_slow = np.asarray(free.cta_sm)[: 2 * N_SM] == 0
    assert free_ends[~on_slow].max() < 0.6 * free_ends[on_slow].min()


def test_grid_barrier_counts_as_barrier_stall() -> None:
    r = simulate(ARCH, COOP, clocks_with_slow_sm())
    barrier = js.Result.stall_reasons.index("barrier")
    stalls = np.asarray(r.sm_stalls)
    assert stalls[1:, barrier].sum() > stalls[0, barrier]  # the fast SMs wait for SM 0


def test_cooperative_launch_that_does_not_fit_is_rejected() -> None:
    too_big = COOP.replace(grid_ctas=np.int32(resident_grid(ARCH, COOP) + 1))
    with pytest.raises(JaxschedError, match="cooperative launch needs every CTA co-resident"):
        js.simulate(ARCH, too_big)


def test_grid_sync_needs_a_cooperative_launch_and_no_cta_barriers() -> None:
    with pytest.raises(JaxschedError, match="cooperative launch"):
        js.make_kernel("fma\ngsync", grid=2, threads=64)
    with pytest.raises(JaxschedError, match="either CTA barriers or grid"):
        js.make_kernel("bar\ngsync", grid=2, threads=64, cooperative=True)


def test_persistent_kernel_balances_work_by_sm_speed() -> None:
    body = js.make_kernel("loop 1\n fma dep\n fma dep\n fma dep\nend", grid=1, threads=128, pad_to=PAD)
    grid = resident_grid(ARCH, body)
    persistent = body.replace(grid_ctas=np.int32(grid), work_items=np.int32(6000))
    r = simulate(ARCH, persistent, clocks_with_slow_sm())
    items = np.asarray(r.sm_items)
    enabled = np.asarray(ARCH.sm_enabled)
    assert items.sum() == 6000
    assert items[0] < 0.7 * items[enabled][1:].mean()  # the half-speed SM takes fewer items
    # Fewer items than warps: the extra warps skip the loop, nothing is lost or duplicated.
    few = simulate(ARCH, persistent.replace(work_items=np.int32(5)))
    assert int(np.sum(few.sm_items)) == 5


def test_persistent_kernel_needs_a_loop() -> None:
    with pytest.raises(JaxschedError, match="needs a loop"):
        js.make_kernel("fma", grid=2, threads=64, work_items=10)
