"""Launch credit: an SM refills a CTA slot only after its schedulers have idled enough
(docs/model.md sections 7, 9 and 11).

Refilling a slot that a CTA has left takes issue cycles that the running warps leave idle, so a
busy SM refills a freed slot late [cal]; a slot's first CTA needs no credit. A scheduler is *starved* in a cycle when none of its active
warps is eligible or throttled (every one waits on a barrier, a scoreboard, a fixed latency or
a refetch; or it has none: no warp is ready, `status.ready_counts`). An SM with a free CTA slot collects one credit per starved
scheduler-cycle, up to `launch_idle_cycles`; dispatch refills a slot only on an SM holding that
much, and spends it.
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

from ..lower import Launch, Shapes
from .mechanics.exact import floor_div
from .state import State


def has_free_slot(state: State, launch: Launch, shapes: Shapes) -> Bool[Array, " sm"]:
    """Some CTA slot `j < ctas_per_sm` holds no CTA (usable yet or not)."""
    in_range = jnp.arange(shapes.cta_slots, dtype=jnp.int32)[:, None] < launch.program.ctas_per_sm
    return jnp.any(in_range & (state.cta_id < 0), axis=0)


def collect(
    credit: Int[Array, " sm"], starved: Int[Array, " sm"], cycles: Int[Array, " sm"], free: Bool[Array, " sm"],
    launch: Launch,
) -> Int[Array, " sm"]:
    """Credit after `cycles` SM cycles with `starved` schedulers each, capped at
    `launch_idle_cycles`; only SMs with a free slot collect. `min(cycles, cap)` keeps the
    product inside int32 over long skips."""
    cap = launch.chip.launch_idle_cycles
    gain = starved * jnp.minimum(cycles, cap).astype(jnp.int32)
    return jnp.where(free, jnp.minimum(cap, credit + gain), credit)


def cycles_to_full(
    credit: Int[Array, " sm"], starved: Int[Array, " sm"], free: Bool[Array, " sm"], launch: Launch
) -> Int[Array, " sm"]:
    """SM cycles until the credit reaches `launch_idle_cycles` at this rate (0: already full;
    -1: it does not grow)."""
    short = launch.chip.launch_idle_cycles - credit
    grows = free & (starved > 0)
    n = floor_div(short + jnp.maximum(starved, 1) - 1, jnp.maximum(starved, 1))
    return jnp.where(short <= 0, 0, jnp.where(grows, n, -1))


def can_launch(credit: Int[Array, " sm"], launch: Launch) -> Bool[Array, " sm"]:
    """SMs that hold the credit for one more refill (always, with the rule off)."""
    return credit >= launch.chip.launch_idle_cycles
