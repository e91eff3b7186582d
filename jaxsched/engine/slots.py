"""The layout of the per-warp arrays: scheduler-major.

The hardware puts warp slot `w = 4q + j` on scheduler `j` (docs/model.md section 7). The
engine's `[sm, warp]` arrays hold slot `w` at position `p = j * n_q + q`, so that each
scheduler's warps are contiguous: the per-scheduler reductions of every cycle (the warp
selection, the stall-reason histogram) run over the minor axis, which a GPU reduces in
coalesced rows rather than at a stride of 4 (benchmarks/RESULTS.md, session 10). Only the
positions move: every rule reads the slot `w` itself where the slot number matters (which CTA
slot a warp belongs to, its warp index within the CTA).
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Int

from ..lower import Shapes


def by_scheduler(x: Array, shapes: Shapes) -> Array:
    """A per-warp array [sm, warp] viewed as [sm, sched, q]."""
    return x.reshape(-1, shapes.schedulers, shapes.warps_per_scheduler)


def per_warp(x: Array, shapes: Shapes) -> Array:
    """Broadcast a per-scheduler value [sm, sched] to the warp positions [sm, warp]."""
    n_sm = x.shape[0]
    return jnp.broadcast_to(x[:, :, None], (n_sm, shapes.schedulers, shapes.warps_per_scheduler)).reshape(
        n_sm, shapes.warp_slots)


def q_index(shapes: Shapes) -> Int[Array, " warp"]:
    """The index q of each position's warp among its scheduler's warps."""
    return jnp.arange(shapes.warp_slots, dtype=jnp.int32) % shapes.warps_per_scheduler


def hardware_slot(shapes: Shapes) -> Int[Array, " warp"]:
    """The hardware warp slot w = 4q + j held at each position p = j * n_q + q."""
    p = jnp.arange(shapes.warp_slots, dtype=jnp.int32)
    return shapes.schedulers * (p % shapes.warps_per_scheduler) + p // shapes.warps_per_scheduler
