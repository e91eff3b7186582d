"""The grid-wide barrier of cooperative kernels (docs/model.md section 8, step 1b).

`grid.sync()` completes when every live warp of the grid has arrived; it releases
`grid_sync_ticks` later (the atomic in L2 and the spin that observes it). Every CTA waits for
the slowest warp of the whole grid, so one slow SM stalls all the others.
"""

from __future__ import annotations

from dataclasses import replace

import jax.numpy as jnp
from jaxtyping import Array, Bool

from ..lower import Launch
from .state import INF, State


def grid_barrier(state: State, launch: Launch) -> tuple[State, Bool[Array, ""]]:
    """After the tick's SM cycles: complete the barrier if everyone arrived, release if due.
    Returns whether it released: then every live warp leaves the barrier (programs with `gsync`
    have no CTA barriers), and each still waits for `intervals.release`."""
    k = state.tick
    live = jnp.sum(state.cta_live, dtype=jnp.int32)
    complete = (state.g_arrived > 0) & (state.g_arrived == live) & (state.g_release == INF)
    release_at = jnp.where(complete, k + launch.program.grid_sync_ticks, state.g_release)
    due = release_at == k
    out = replace(
        state,
        g_arrived=jnp.where(complete, 0, state.g_arrived),
        g_release=jnp.where(due, INF, release_at),
        g_waiting=jnp.where(due, 0, state.g_waiting),
    )
    return out, due
