"""Event skipping (docs/model.md section 11): jump to the next tick at which anything can change.

After a tick, every warp's blocks clear at known cycles (its SM's clock) or ticks (memory). The
next event is the earliest of those over all SMs; the ticks before it are skipped in one go,
adding to each SM's counters the cycles it executes meanwhile, with the stall reasons that hold
throughout. The result is exactly the tick-by-tick model (checked against the reference).
"""

from __future__ import annotations

from dataclasses import replace

import jax.numpy as jnp
from jaxtyping import Array, Int

from ..lower import QUEUE_ONE_TICK, Launch, Shapes
from .dispatch import next_usable_tick
from .launch_credit import collect, cycles_to_full, has_free_slot, starved_schedulers
from .launches import Launches, next_ready_tick
from .power import next_dvfs_event
from .state import State
from .status import INF, count_reasons, per_sm_counts, reason_histogram, warp_status

_MAX_AHEAD_CYCLES = 1 << 17  # x MAX_MHZ stays in int32; a farther event just comes early


def ticks_until_cycle(
    state: State, launch: Launch, cycle_index: Int[Array, " sm"]
) -> Int[Array, " sm"]:
    """Ticks from the current tick until SM s executes cycle `cycle_index` (>= its next cycle).

    The n-th future edge comes after `ceil((n F - acc) / f)` ticks (phase accumulator).
    """
    n = jnp.clip(cycle_index - state.cycle + 1, 1, _MAX_AHEAD_CYCLES)
    f = jnp.maximum(state.freq, 1)
    return (n * launch.tick_mhz - state.acc + f - 1) // f


def cycles_in_ticks(
    state: State, launch: Launch, ticks: Int[Array, ""]
) -> tuple[Int[Array, " sm"], Int[Array, " sm"]]:
    """Cycles each SM executes in the next `ticks` ticks, and its accumulator afterwards.

    Splits ticks = a F + b so that nothing overflows int32: a F f is a whole a f cycles.
    """
    a, b = ticks // launch.tick_mhz, ticks % launch.tick_mhz
    f = state.freq
    partial = state.acc + b * f
    return a * f + partial // launch.tick_mhz, partial % launch.tick_mhz


def skip_to_next_event(
    state: State, launch: Launch, shapes: Shapes, done: Array, launches: Launches
) -> State:
    """Advance from the tick just executed (state.tick) to the next event tick (nothing is
    skipped once `done`: the counters must stop at the makespan)."""
    k = state.tick
    st = warp_status(state, launch, shapes, state.cycle, k + 1, launches)
    clear_cycle = jnp.min(st.clear_cycle, axis=1)
    by_cycle = jnp.where(clear_cycle < INF, k + ticks_until_cycle(state, launch, clear_cycle), INF)
    by_tick = jnp.min(st.clear_tick, axis=1)
    per_sm = jnp.where(launch.sm_enabled, jnp.minimum(by_cycle, by_tick), INF)
    # The cycle at which an SM's launch credit fills up makes its free slots usable (section 11).
    hist = reason_histogram(st.reason, shapes)
    starved = starved_schedulers(hist)
    free = has_free_slot(state, launch, shapes)
    to_full = cycles_to_full(state.launch_credit, starved, free, launch)
    credit_full = jnp.where((to_full > 0) & launch.sm_enabled & jnp.any(state.next_cta < launches.n_ctas),
                            k + ticks_until_cycle(state, launch, state.cycle + to_full - 1), INF)
    per_sm = jnp.minimum(per_sm, credit_full)
    # Grid-barrier releases (section 8), freed CTA slots becoming usable (section 9), clock
    # changes (section 12) and launches becoming ready (section 13) are events too.
    nxt = jnp.minimum(jnp.minimum(jnp.min(per_sm), next_usable_tick(state, launch, shapes, launches)),
                      jnp.minimum(state.g_release, next_dvfs_event(state, launch)))
    nxt = jnp.minimum(nxt, next_ready_tick(state.kernel_ready, state.next_cta, launches, k))
    nxt = jnp.where((nxt < INF) & ~done, nxt, k + 1)  # nothing pending only after the last CTA
    # A held dispatch depends on the tick itself (section 9): look again at the next tick.
    nxt = jnp.where(state.dispatch_hold, k + 1, nxt)
    skipped = nxt - k - 1

    cycles, acc = cycles_in_ticks(state, launch, skipped)
    counts = per_sm_counts(hist)
    active_warps = jnp.sum(counts, axis=1)
    weight = cycles.astype(jnp.int64)
    counters = state.counters
    counters = replace(
        counters,
        sm_cycles=counters.sm_cycles + weight,
        sm_busy_cycles=counters.sm_busy_cycles + weight * (active_warps > 0),
        sm_warp_cycles=counters.sm_warp_cycles + weight * active_warps,
        sm_stalls=counters.sm_stalls + count_reasons(counts, cycles),
    )
    drained = jnp.minimum(skipped + 1, 1 << 20) * QUEUE_ONE_TICK
    return replace(
        state,
        tick=nxt,
        acc=acc,
        cycle=state.cycle + cycles,
        mio=jnp.maximum(state.mio - cycles, 0),
        launch_credit=collect(state.launch_credit, starved, cycles, free, launch),
        q_l2=jnp.maximum(state.q_l2 - drained, 0),
        q_dram=jnp.maximum(state.q_dram - drained, 0),
        counters=counters,
    )
