"""Per-warp trip counts and branch lanes from counter-based hashes (docs/model.md section 4)."""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Int

from ..lower import Launch
from .launches import WarpProgram

_GOLDEN = 0x9E3779B9


def lowbias32(x: Array) -> Array:
    """Wellons' lowbias32 integer mixer on uint32 (wrapping)."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def hash3(seed: Array, stream: int, a: Array, b: Array) -> Array:
    """`h(stream, a, b)` of the model: a uint32 from the seed, a stream id and two counters."""
    u = lambda v: jnp.asarray(v).astype(jnp.uint32)  # noqa: E731
    x = lowbias32(u(seed) ^ (jnp.uint32(stream) * jnp.uint32(_GOLDEN)))
    return lowbias32(lowbias32(x ^ u(a)) ^ u(b))


def warp_variation(
    launch: Launch, cta: Int[Array, ""], warp: Int[Array, " n"]
) -> tuple[Int[Array, " n"], Int[Array, " n"], Int[Array, " n"]]:
    """(trip count, lanes, if-path lanes) of warps `warp` of CTA `cta`: from the hashes, or from
    the kernel's data tables where it has them."""
    cs = launch.trips_cta_spread
    ws = launch.trips_warp_spread
    cta_off = (hash3(launch.seed, 1, cta, 0) % (2 * cs + 1).astype(jnp.uint32)).astype(jnp.int32) - cs
    warp_add = (hash3(launch.seed, 2, cta, warp) % (ws + 1).astype(jnp.uint32)).astype(jnp.int32)
    row = jnp.clip(cta, 0, launch.trips_data.shape[-2] - 1)
    trips = jnp.where(launch.trips_from_data, launch.trips_data[row, warp],
                      jnp.maximum(0, launch.trips + cta_off + warp_add))
    lanes = jnp.where(warp == launch.warps_per_cta - 1, launch.lanes_last_warp, 32)
    lane = jnp.arange(32, dtype=jnp.int32)
    draws = hash3(launch.seed, 3, cta, 32 * warp[:, None] + lane[None, :]) >> 8
    mask = launch.if_data[row, warp]
    takes_if = jnp.where(launch.if_from_data, (mask[:, None] >> lane[None, :]) & 1 == 1,
                         draws.astype(jnp.int32) < launch.branch_threshold) & (lane[None, :] < lanes[:, None])
    return trips, lanes, jnp.sum(takes_if, axis=1, dtype=jnp.int32)


def resolve_pc(launch: Launch | WarpProgram, pc: Array, trips_left: Array, if_lanes: Array, lanes: Array) -> Array:
    """Apply the fetch rules 1, 2, 3, 1 (docs/model.md section 6). The structure (loop and
    branch bounds) is one program's (`Launch`) or each warp's own (`WarpProgram`)."""

    def loop_rule(p: Array) -> Array:
        return jnp.where((p == launch.loop_start) & (trips_left == 0), launch.loop_end + 1, p)

    pc = loop_rule(pc)
    pc = jnp.where((pc == launch.branch_start) & (if_lanes == 0), launch.branch_mid, pc)
    pc = jnp.where((pc == launch.branch_mid) & (lanes - if_lanes == 0), launch.branch_end, pc)
    return loop_rule(pc)
