"""The layout of the engine's arrays: the SM axis last, warp slots scheduler-major.

Every per-SM array keeps its SM axis last: `[sm]`, per scheduler `[sched, sm]`, per CTA slot
`[cta, sm]`, per warp slot `[warp, sm]`. A step's reductions run over schedulers, warps or CTA
slots, never over SMs, so with SMs last they are elementwise over rows of SMs, which a CPU
computes in SIMD lanes and a GPU in coalesced rows (docs/engine_performance.md, "A lean per-warp state, the SM
axis last, a batch-level step").

The hardware puts warp slot `w = 4q + j` on scheduler `j` (docs/model.md section 7). The
engine holds slot `w` at position `p = j * n_q + q`, so that each scheduler's warps are
contiguous: `[warp, sm]` is `[sched, q, sm]`. Only the positions move: every rule reads the slot
`w` itself where the slot number matters (which CTA slot a warp belongs to, its warp index
within the CTA).
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Int

from ..lower import Shapes
from .mechanics.exact import floor_div


def by_scheduler(x: Array, shapes: Shapes) -> Array:
    """A per-warp array [warp, sm] viewed as [sched, q, sm]."""
    return x.reshape(shapes.schedulers, shapes.warps_per_scheduler, -1)


def per_warp(x: Array, shapes: Shapes) -> Array:
    """Broadcast a per-scheduler value [sched, sm] to the warp positions [warp, sm]."""
    n_sm = x.shape[-1]
    return jnp.broadcast_to(x[:, None, :], (shapes.schedulers, shapes.warps_per_scheduler, n_sm)).reshape(
        shapes.warp_slots, n_sm)


def q_index(shapes: Shapes) -> Int[Array, " warp"]:
    """The index q of each position's warp among its scheduler's warps."""
    return jnp.arange(shapes.warp_slots, dtype=jnp.int32) % shapes.warps_per_scheduler


def hardware_slot(shapes: Shapes) -> Int[Array, " warp"]:
    """The hardware warp slot w = 4q + j held at each position p = j * n_q + q."""
    p = jnp.arange(shapes.warp_slots, dtype=jnp.int32)
    return shapes.schedulers * (p % shapes.warps_per_scheduler) + p // shapes.warps_per_scheduler


def hardware_position(slot: Int[Array, "..."], shapes: Shapes) -> Int[Array, "..."]:
    """The position `p = j * n_q + q` that holds hardware warp slot `slot = 4q + j` (clipped to
    the warp slots)."""
    slot = jnp.clip(slot, 0, shapes.warp_slots - 1)
    return (slot % shapes.schedulers) * shapes.warps_per_scheduler + slot // shapes.schedulers


def cta_slot_of(slot: Int[Array, "..."], warps_per_cta: Int[Array, ""], shapes: Shapes) -> Int[Array, "..."]:
    """The CTA slot hardware warp slot `slot` belongs to: `slot // W` (docs/model.md section
    7), clipped to the CTA slots (slots past the last CTA's warps hold no warp)."""
    return jnp.minimum(floor_div(slot, warps_per_cta), shapes.cta_slots - 1)
