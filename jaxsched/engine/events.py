"""Event skipping (docs/model.md section 11): jump to the next tick at which anything can change.

After a tick, every warp that is not ready wakes at a known cycle of its SM, and a throttle
clears at a known cycle. An SM's next event is its next cycle if it has an eligible warp (or
warps were released or started on it), else the earliest wake or throttle clearing among its
ready warps' classes; the chip's next event is the earliest over SMs and the chip-wide events.
The ticks before it are skipped in one go. Over them no warp becomes ready and none issues, so
each SM adds the cycles it executes meanwhile with the counts that hold throughout (blocked
warps' reasons were counted when their intervals started). The result is exactly the
tick-by-tick model (checked against the reference).
"""

from __future__ import annotations

from dataclasses import replace

import jax.numpy as jnp
from jaxtyping import Array, Int

from ..lower import Launch, Shapes
from .mechanics.exact import floor_div
from .cycle import Outlook
from .decouple import Decoupling, chip_tick, limit
from .dispatch import next_usable_tick
from .launch_credit import collect, cycles_to_full, has_free_slot
from .launches import Launches, next_ready_tick
from .mechanics.materialize import once
from .memory import drained
from .power import next_dvfs_event
from .state import State
from .status import INF, Ready, class_bits, class_counts, cycles_in, ready_counts, stall_rows, throttled

_MAX_AHEAD_CYCLES = 1 << 17  # x MAX_MHZ stays in int32; a farther event just comes early


def last_tick(state: State) -> Int[Array, " sm"]:
    """The last tick each SM has run and counted: the tick just executed, the tick before it
    resumes for an SM a fast-forward put ahead, or its own on its own time (`decouple.py`)."""
    return state.acct


def ticks_until_cycle(
    state: State, launch: Launch, cycle_index: Int[Array, " sm"]
) -> Int[Array, " sm"]:
    """Ticks from each SM's last tick (`last_tick`) until it executes cycle `cycle_index` (>= its
    next cycle).

    The n-th future edge comes after `ceil((n F - acc) / f)` ticks (phase accumulator).
    """
    n = jnp.clip(cycle_index - state.cycle + 1, 1, _MAX_AHEAD_CYCLES)
    f = jnp.maximum(state.freq, 1)
    return floor_div(n * launch.clocks.tick_mhz - state.acc + f - 1, f)


def cycles_in_ticks(
    state: State, launch: Launch, ticks: Int[Array, ""]
) -> tuple[Int[Array, " sm"], Int[Array, " sm"]]:
    """Cycles each SM executes in the next `ticks` ticks, and its accumulator afterwards:
    `acc + ticks f = cycles F + acc'` (exactly, `exact.floor_div`)."""
    cycles = cycles_in(state.freq, state.acc, launch.clocks.tick_mhz, ticks)
    total = state.acc + jnp.asarray(ticks).astype(jnp.int64) * state.freq
    return cycles, (total - cycles.astype(jnp.int64) * launch.clocks.tick_mhz).astype(jnp.int32)


def _throttle_clears(state: State, launch: Launch, look: Outlook, throttle: Array) -> Int[Array, " sm"]:
    """Per SM, the earliest cycle at which a throttle holding one of its ready warps clears: the
    MIO backlog, which serves one instruction-cycle per cycle, falls under its depth; a pipe
    frees."""
    pipe = (state.pipe_free64 >> 6).astype(jnp.int32)
    mio = jnp.broadcast_to(state.cycle + state.mio - launch.chip.mio_depth + 1, (1,) + pipe.shape[1:])
    clear = jnp.concatenate([pipe, mio, jnp.full_like(mio, INF)])
    waiting = (class_bits(throttle) > 0) & (class_counts(look.ready) > 0)
    return jnp.min(jnp.where(waiting, clear, INF), axis=(0, 1))


def _next_cycle_event(state: State, launch: Launch, look: Outlook) -> tuple[Ready, Int[Array, " sm"]]:
    """How each SM's ready warps count at its next cycle, and the tick of its next cycle that
    is an event (INF: none): its next cycle if a warp is eligible there or `look.changed`, else
    the earliest wake or throttle clearing."""
    c = state.cycle  # each SM's next cycle
    throttle = throttled(state.pipe_free64, state.mio, launch.chip.mio_depth, c)
    ready = ready_counts(look.ready, throttle)
    clear_cycle = jnp.minimum(look.next_wake, _throttle_clears(state, launch, look, throttle))
    next_cycle = jnp.where(look.changed | (ready.eligible > 0), c, clear_cycle)
    return ready, jnp.where(next_cycle < INF, last_tick(state) + ticks_until_cycle(state, launch, next_cycle), INF)


def _usable_ticks(state: State, launch: Launch, shapes: Shapes) -> Int[Array, " sm"]:
    """Per SM, the earliest tick after the last it ran at which a free slot becomes usable (INF:
    none), for an SM on its own time (`decouple.py`)."""
    in_range = jnp.arange(shapes.cta_slots, dtype=jnp.int32)[:, None] < launch.program.ctas_per_sm
    waiting = in_range & (state.cta_id < 0) & (state.cta_usable_tick > state.acct)
    return jnp.min(jnp.where(waiting, state.cta_usable_tick, INF), axis=0)


def skip_to_next_event(
    state: State, launch: Launch, shapes: Shapes, done: Array, launches: Launches, look: Outlook,
    one: Int[Array, ""], d: Decoupling, max_ticks: int,
) -> State:
    """Advance every SM from the last tick it ran (`State.acct`) to its next event (nothing is
    skipped once `done`: the counters must stop at the makespan): at the chip's tick, the
    earliest event of any SM and of the chip; on their own time (`decouple.py`), its own, up to
    the last tick it may run. `look`: what the step's SM cycles left (`cycle.run_tick`), with
    `changed` set where anything after them (a grid-barrier release, dispatch, a clock change)
    touched an SM's warps. `one`: a traced 1 for `once`, which materialises the per-SM search
    (`_next_cycle_event`): the counters and the minimum read it, and would each recompute it in
    their fusions (docs/engine_performance.md, "The CPU step's recomputed values, found through a
    profile without the per-kernel overhead")."""
    k = state.tick
    ready, by_cycle = once(lambda: _next_cycle_event(state, launch, look), one)
    per_sm = jnp.where(launch.chip.sm_enabled, by_cycle, INF)
    # The cycle at which an SM's launch credit fills up makes its free slots usable (section 11).
    free = has_free_slot(state, launch, shapes)
    remain = jnp.any(state.next_cta < launches.n_ctas)
    to_full = cycles_to_full(state.launch_credit, ready.starved, free, launch)
    credit_full = jnp.where((to_full > 0) & launch.chip.sm_enabled & remain,
                            last_tick(state) + ticks_until_cycle(state, launch, state.cycle + to_full - 1), INF)
    per_sm = jnp.minimum(per_sm, credit_full)
    # At the chip's tick: grid-barrier releases (section 8), freed CTA slots becoming usable
    # (section 9), clock changes (section 12) and launches becoming ready (section 13) are events
    # too.
    nxt = jnp.minimum(jnp.minimum(jnp.min(per_sm), next_usable_tick(state, launch, shapes, launches)),
                      jnp.minimum(state.g_release, next_dvfs_event(state, launch)))
    nxt = jnp.minimum(nxt, next_ready_tick(state.kernel_ready, state.next_cta, launches, k))
    nxt = jnp.where((nxt < INF) & ~done, nxt, k + 1)  # nothing pending only after the last CTA
    # A held dispatch depends on the tick itself (section 9): look again at the next tick.
    nxt = jnp.where(state.dispatch.hold, k + 1, nxt)
    # Time always moves on, so that the loop ends at max_ticks whatever it is given (a last
    # guard: validated inputs never need it).
    nxt = jnp.maximum(nxt, k + 1)
    # On its own time: the SM's next cycle event, a slot becoming usable (or the launch becoming
    # ready), or the tick after the last it may run in this step (it waits there for the chip).
    start_at = state.kernel_ready[0]  # on their own time there is one launch (`decouple.py`)
    usable = jnp.where(start_at > state.acct, jnp.where(free, start_at, INF), _usable_ticks(state, launch, shapes))
    own = jnp.minimum(per_sm, jnp.where(remain, usable, INF))
    own = jnp.minimum(own, limit(state, launch, d, max_ticks) + 1)
    own = jnp.where(done, state.acct + 1, jnp.maximum(own, state.acct + 1))
    # An SM ahead of the chip's tick runs none of the skipped ticks before it resumes.
    resume = jnp.where(d.free, own, jnp.maximum(nxt, state.resume))
    mine = jnp.maximum(resume - state.acct - 1, 0)

    cycles, acc = cycles_in_ticks(state, launch, mine)
    n_active = jnp.sum(state.cta_live, axis=0, dtype=jnp.int64)
    n_barrier = jnp.sum(state.cta_arrived, axis=0, dtype=jnp.int32) + state.g_waiting
    weight = cycles.astype(jnp.int64)
    zero = jnp.zeros_like(weight)
    counters = state.counters
    counters = replace(
        counters,
        sm_cycles=counters.sm_cycles + weight,
        sm_busy_cycles=counters.sm_busy_cycles + weight * (n_active > 0),
        sm_warp_cycles=counters.sm_warp_cycles + weight * n_active,
        # No warp is eligible over the skipped cycles (else the SM's next cycle is an event).
        sm_stalls=counters.sm_stalls + stall_rows(selected=zero, not_selected=zero, long=zero, short=zero, wait=zero,
                                                  barrier=weight * n_barrier, mio=weight * ready.mio_throttle,
                                                  pipe=weight * ready.pipe_throttle),
    )
    q_l2, q_dram = drained(state, nxt - k)
    out = replace(
        state,
        acc=acc,
        cycle=state.cycle + cycles,
        mio=jnp.maximum(state.mio - cycles, 0),
        launch_credit=collect(state.launch_credit, ready.starved, cycles, free, launch),
        q_l2=q_l2,
        q_dram=q_dram,
        counters=counters,
        resume=resume,
        acct=jnp.maximum(state.acct, resume - 1),
    )
    return replace(out, tick=chip_tick(out, launch, d, max_ticks, nxt))
