"""Which CTAs fit on an SM beside its residents, and which warp slots each takes (docs/model.md
section 13).

CTAs of one shape need none of this: CTA slot `j` holds warp slots `j W .. j W + W - 1`
(`slots.cta_slot_of`) and the occupancy bounds the CTA slots, so one launch reads that static
layout. A workload's launches may have different shapes; they share an SM by resource: a CTA of
launch `l` fits while the registers (in `REG_SHARE_ONE` shares per sub-partition, `lower.py`)
and the shared memory its SM's residents hold leave its own, and a run of `W_l` free warp slots
exists; it takes the first such run from warp slot `j W_l` on (then from 0), so that one shape
alone keeps the static layout. A workload of several launches therefore keeps, per SM, the CTA
slot of each warp slot (`State.warp_cta`); the dispatcher's table carries the free warp slots
and each new CTA's first warp slot (`Slots.warp_free`, `Slots.base`).
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

from ..lower import Launch, Shapes
from ..occupancy import REG_SHARE_ONE
from .mechanics.exact import floor_div
from .launches import Launches
from .slots import cta_slot_of, hardware_position, hardware_slot

_NO_LIMIT = 2**30


def warp_cta(state_warp_cta: Int[Array, "warp sm"], launch: Launch, shapes: Shapes) -> Int[Array, "warp sm"]:
    """The CTA slot of the warp at each position (-1: none, several launches only): the state's
    with several launches, the static layout with one."""
    if shapes.n_launches > 1:
        return state_warp_cta
    j = cta_slot_of(hardware_slot(shapes), launch.program.warps_per_cta, shapes)
    return jnp.broadcast_to(j[:, None], (shapes.warp_slots, launch.chip.sm_enabled.shape[-1]))


def of_cta(x: Array, cta: Int[Array, "warp sm"]) -> Array:
    """A per-CTA-slot array [cta, sm] read at each warp's CTA slot [warp, sm] (clipped: only
    warps that belong to a CTA mean anything)."""
    return jnp.take_along_axis(x, jnp.clip(cta, 0, x.shape[0] - 1), axis=0)


def free_warp_slots(state_warp_cta: Int[Array, "warp sm"], shapes: Shapes) -> Bool[Array, "warp sm"]:
    """The free warp slots of each SM in hardware order (slot `h` at row `h`)."""
    return (state_warp_cta < 0)[hardware_position(jnp.arange(shapes.warp_slots, dtype=jnp.int32), shapes)]


def _starts(free: Bool[Array, "warp sm"], n_warps: Int[Array, ""]) -> Bool[Array, "warp sm"]:
    """Per SM, the warp slots `b` (hardware order) from which `n_warps` slots are all free."""
    n = free.shape[0]
    held = jnp.concatenate([jnp.zeros_like(free[:1], jnp.int32), jnp.cumsum(~free, axis=0, dtype=jnp.int32)])
    b = jnp.arange(n, dtype=jnp.int32)
    window = held[jnp.clip(b + n_warps, 0, n)] - held[:n]
    return (b + n_warps <= n)[:, None] & (window == 0)


def room(
    cta_id: Int[Array, "cta sm"], cta_launch: Int[Array, "cta sm"], free: Bool[Array, "warp sm"],
    head: Int[Array, ""], launch: Launch, launches: Launches, shapes: Shapes,
) -> Int[Array, " sm"]:
    """How many more CTAs of launch `head` each SM's registers and shared memory hold beside its
    residents (of any launch); 0 where no run of its warps' slots is free."""
    occupied = cta_id >= 0
    lid = jnp.clip(cta_launch, 0, shapes.n_launches - 1)
    used = lambda table: jnp.sum(jnp.where(occupied, table[lid], 0), axis=0, dtype=jnp.int32)  # noqa: E731

    def fits(need: Int[Array, ""], cap: Int[Array, "..."], table: Int[Array, " launch"]) -> Int[Array, " sm"]:
        return jnp.where(need > 0, floor_div(cap - used(table), jnp.maximum(need, 1)), _NO_LIMIT)

    regs = fits(launches.cta_reg_share[head], shapes.schedulers * REG_SHARE_ONE, launches.cta_reg_share)
    smem = fits(launches.cta_smem_bytes[head], launch.program.smem_per_sm_bytes, launches.cta_smem_bytes)
    runs = jnp.any(_starts(free, launches.warps_per_cta[head]), axis=0)
    return jnp.where(runs, jnp.minimum(regs, smem), 0)


def first_base(free: Bool[Array, " warp"], n_warps: Int[Array, ""], j: Int[Array, ""]) -> Int[Array, ""]:
    """The first warp slot of a CTA of `n_warps` warps placed in CTA slot `j` of an SM whose
    free warp slots are `free` (hardware order): the first start from `j * n_warps` on whose
    slots are all free, else the first from 0."""
    ok = _starts(free[:, None], n_warps)[:, 0]
    b = jnp.arange(free.shape[0], dtype=jnp.int32)
    key = jnp.where(ok, b + jnp.where(b < j * n_warps, free.shape[0], 0), 2 * free.shape[0])
    return jnp.argmin(key).astype(jnp.int32)


def new_warps(
    new: Bool[Array, "cta sm"], base: Int[Array, "cta sm"], cta_launch: Int[Array, "cta sm"],
    launches: Launches, shapes: Shapes,
) -> tuple[Bool[Array, "warp sm"], Int[Array, "warp sm"], Int[Array, "warp sm"]]:
    """Per position, whether a CTA placed in this tick (`new`, from warp slot `base` on) takes
    it, the CTA slot, and the warp's index in its CTA (several launches)."""
    h = hardware_slot(shapes)[None, :, None]  # [1, warp, 1]
    n_w = launches.warps_per_cta[jnp.clip(cta_launch, 0, shapes.n_launches - 1)][:, None, :]
    inside = new[:, None, :] & (h >= base[:, None, :]) & (h < base[:, None, :] + n_w)  # [cta, warp, sm]
    j = jnp.argmax(inside, axis=0).astype(jnp.int32)
    return jnp.any(inside, axis=0), j, hardware_slot(shapes)[:, None] - of_cta(base, j)
