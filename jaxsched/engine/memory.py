"""The chip's L2 and DRAM queues (docs/model.md sections 7-8): each global load adds its costs to
both backlogs, in (tick, SM, scheduler) order, and waits for its latency plus the longer
backlog, so that requests beyond the bandwidth queue and their latency grows; the backlogs
drain one tick's worth per tick. Backlogs are in 1/1024 tick (`lower.QUEUE_ONE_TICK`)."""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Int

from ..lower import QUEUE_ONE_TICK
from .state import State


def prefix_sum_sm_sched(x: Int[Array, "sched sm"]) -> Int[Array, "sched sm"]:
    """Inclusive prefix sum in (SM, scheduler) order: within each SM, then across SMs (the order
    in which one tick's requests join a chip-wide queue)."""
    within = jnp.cumsum(x, axis=0, dtype=jnp.int32)
    before = jnp.cumsum(within[-1], dtype=jnp.int32) - within[-1]
    return within + before


def queue_delay(state: State, l2_cost: Int[Array, "sched sm"], dram_cost: Int[Array, "sched sm"]
                ) -> Int[Array, "sched sm"]:
    """The ticks each scheduler's load of this tick waits beyond its latency: the longer of the
    L2 and DRAM backlogs once it has joined them (0 costs for schedulers without a load)."""
    ceil_ticks = lambda q: (q + QUEUE_ONE_TICK - 1) // QUEUE_ONE_TICK  # noqa: E731
    return jnp.maximum(ceil_ticks(state.q_l2 + prefix_sum_sm_sched(l2_cost)),
                       ceil_ticks(state.q_dram + prefix_sum_sm_sched(dram_cost)))


def enqueued(state: State, l2_cost: Int[Array, "sched sm"], dram_cost: Int[Array, "sched sm"]
             ) -> tuple[Int[Array, ""], Int[Array, ""]]:
    """The L2 and DRAM backlogs after this tick's loads."""
    return (state.q_l2 + jnp.sum(l2_cost, dtype=jnp.int32), state.q_dram + jnp.sum(dram_cost, dtype=jnp.int32))


def drained(state: State, ticks: Int[Array, ""]) -> tuple[Int[Array, ""], Int[Array, ""]]:
    """The L2 and DRAM backlogs `ticks` later, with no load joining them."""
    done = jnp.minimum(ticks, 1 << 20) * QUEUE_ONE_TICK
    return jnp.maximum(state.q_l2 - done, 0), jnp.maximum(state.q_dram - done, 0)
