"""The warp scheduler (docs/model.md section 7): each of an SM's schedulers picks at most one
eligible warp per cycle by the configuration's warp policy (one module per policy in
`warp_policies/`), and the issue stage reads the picked warps' fields (`of_selected`)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

from ..lower import Launch, Shapes
from . import warp_policies
from .mechanics import forms
from .slots import by_scheduler, per_warp, q_index
from .state import State


def select(
    state: State, launch: Launch, shapes: Shapes, eligible: Bool[Array, "warp sm"], edge: Bool[Array, " sm"],
    policy: Int[Array, ""] | None = None,
) -> tuple[Bool[Array, "warp sm"], Bool[Array, "sched sm"], Int[Array, "sched sm"]]:
    """Each scheduler picks at most one eligible warp by the warp policy (minimum key; one module per
    policy in `warp_policies/`). Keys are
    unique per scheduler (LRR's by q, ages by CTA and warp), so the minimum of `key << 5 | q`
    (q < 32) names the warp: one plain minimum over the scheduler's warps, in int32 where every
    age `32 g + w` fits in 26 bits (grids up to 2^21 CTAs), else int64.

    `policy`: the whole batch's warp policy where it is one (a batch of one: unbatched under
    `vmap`), so that a `switch` computes only its key; else each configuration's key is chosen
    among all (`launch.policy.warp_policy`). The switch made the CPU's whole run about 5 % faster
    (docs/engine_performance.md, "The CPU step's recomputed values, found through a profile without the
    per-kernel overhead").

    Off the CPU (`mechanics.forms.gpu_forms`) the minimum over a scheduler's warps is a chain of elementwise
    minima: the H200 ran the reduction over this middle axis as a loop kernel at a fifth of its
    memory bandwidth, and the chain made the whole run 12 % faster (docs/engine_performance.md,
    "The H200's step, kernel by kernel")."""
    n_q = shapes.warps_per_scheduler
    q = q_index(shapes)[:, None]
    wide = jnp.int64 if shapes.max_ctas > 1 << 21 else jnp.int32
    never = jnp.iinfo(wide).max

    def best_of(key: Int[Array, "warp sm"]) -> Array:
        """Per scheduler, the minimum of `key << 5 | q` over its candidate warps (`never`: none)."""
        candidate = eligible & edge
        by_q = by_scheduler(jnp.where(candidate, (key.astype(wide) << 5) | q, never), shapes)
        if forms.gpu_forms():
            return functools.reduce(jnp.minimum, [by_q[:, i] for i in range(n_q)])
        return jnp.min(by_q, axis=1)

    last = per_warp(state.last, shapes)
    keys = [lambda m=m: m.key(q, last, n_q, state.warps.age) for m in warp_policies.MODULES.values()]
    if policy is not None:
        best = jax.lax.switch(policy, [lambda k=k: best_of(k()) for k in keys])
    else:
        *first, final = keys
        best = best_of(jnp.select([launch.policy.warp_policy == p for p in range(len(first))], [k() for k in first],
                                  final()))
    has = best < never
    q_sel = (best & 31).astype(jnp.int32)
    sel = (q == per_warp(q_sel, shapes)) & per_warp(has, shapes)
    return sel, has, q_sel


def of_selected(x: Array, sel: Bool[Array, "warp sm"], q_sel: Int[Array, "sched sm"], shapes: Shapes) -> Array:
    """The selected warp's value of a per-slot array, per scheduler: [warp, sm] -> [sched, sm]
    (a scheduler without an issue reads some value; callers mask by `has`). Off the CPU
    (`mechanics.forms.gpu_forms`) a gather at `q_sel`; on the CPU the sum over the scheduler's warps masked by
    `sel`, a reduction vectorised along the SMs, where a gather runs element by element: the
    whole run about 4-5 % faster (docs/engine_performance.md,
    "The CPU step's recomputed values, found through a profile without the per-kernel overhead")."""
    if not forms.gpu_forms():
        return jnp.sum(by_scheduler(jnp.where(sel, x, 0), shapes), axis=1, dtype=x.dtype)
    q = jnp.minimum(q_sel, shapes.warps_per_scheduler - 1)[:, None, :]
    return jnp.take_along_axis(by_scheduler(x, shapes), q, axis=1)[:, 0, :]
