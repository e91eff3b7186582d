"""Launch credit: an SM refills a CTA slot only after its schedulers have idled enough
(docs/model.md sections 7, 9 and 11).

Refilling a slot that a CTA has left takes issue cycles that the running warps leave idle, so a
busy SM refills a freed slot late [cal]; a slot's first CTA needs no credit. A scheduler is *starved* in a cycle when none of its active
warps is eligible or throttled (every one waits on a barrier, a scoreboard, a fixed latency or
a refetch; or it has none). An SM with a free CTA slot collects one credit per starved
scheduler-cycle, up to `launch_idle_cycles`; dispatch refills a slot only on an SM holding that
much, and spends it.
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

from ..lower import Launch, Shapes
from .state import State
from .status import MIO_THROTTLE, NOT_SELECTED, PIPE_THROTTLE, field_mask

# The reasons of a warp that is eligible or throttled; every other reason (or an empty slot) idles.
_BUSY = field_mask((NOT_SELECTED, MIO_THROTTLE, PIPE_THROTTLE))


def starved_schedulers(hist: Int[Array, "sm sched word"]) -> Int[Array, " sm"]:
    """Per SM, the schedulers none of whose active warps is eligible or throttled, from the
    packed start-of-cycle reason histogram (`status.reason_histogram`)."""
    idle = jnp.all((hist & jnp.int32(_BUSY)) == 0, axis=2)
    return jnp.sum(idle, axis=1, dtype=jnp.int32)


def has_free_slot(state: State, launch: Launch, shapes: Shapes) -> Bool[Array, " sm"]:
    """Some CTA slot `j < ctas_per_sm` holds no CTA (usable yet or not)."""
    in_range = jnp.arange(shapes.cta_slots, dtype=jnp.int32) < launch.ctas_per_sm
    return jnp.any(in_range[None, :] & (state.cta_id < 0), axis=1)


def collect(
    credit: Int[Array, " sm"], starved: Int[Array, " sm"], cycles: Int[Array, " sm"], free: Bool[Array, " sm"],
    launch: Launch,
) -> Int[Array, " sm"]:
    """Credit after `cycles` SM cycles with `starved` schedulers each, capped at
    `launch_idle_cycles`; only SMs with a free slot collect. `min(cycles, cap)` keeps the
    product inside int32 over long skips."""
    cap = launch.launch_idle_cycles
    gain = starved * jnp.minimum(cycles, cap).astype(jnp.int32)
    return jnp.where(free, jnp.minimum(cap, credit + gain), credit)


def cycles_to_full(
    credit: Int[Array, " sm"], starved: Int[Array, " sm"], free: Bool[Array, " sm"], launch: Launch
) -> Int[Array, " sm"]:
    """SM cycles until the credit reaches `launch_idle_cycles` at this rate (0: already full;
    -1: it does not grow)."""
    short = launch.launch_idle_cycles - credit
    grows = free & (starved > 0)
    n = (short + jnp.maximum(starved, 1) - 1) // jnp.maximum(starved, 1)
    return jnp.where(short <= 0, 0, jnp.where(grows, n, -1))


def can_launch(credit: Int[Array, " sm"], launch: Launch) -> Bool[Array, " sm"]:
    """SMs that hold the credit for one more refill (always, with the rule off)."""
    return credit >= launch.launch_idle_cycles
