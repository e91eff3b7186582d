"""Per-warp trip counts and branch lanes from counter-based hashes (docs/model.md section 4)."""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Int

from ..lower import Program
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
    program: Program, cta: Int[Array, ""], warp: Int[Array, " n"]
) -> tuple[Int[Array, "n loop"], Int[Array, " n"], Int[Array, "n branch"]]:
    """(trip count per loop, lanes, lanes per branch path) of warps `warp` of CTA `cta`: from the
    hashes, or from the kernel's data tables where it has them (docs/model.md section 4). A
    branch's entry packs the lanes that run its if-path and its else-path, `if | else << 6`:
    the lanes of its enclosing path (`branch_parent`) that take it, and those that do not."""
    n_loops, n_branches = program.loop_start.shape[-1], program.branch_start.shape[-1]
    k = jnp.arange(n_loops, dtype=jnp.int32)
    cs, ws = program.trips_cta_spread, program.trips_warp_spread
    cta_off = (hash3(program.seed, 1, cta, k) % (2 * cs + 1).astype(jnp.uint32)).astype(jnp.int32) - cs
    warp_add = (hash3(program.seed, 2, cta, warp[:, None] + 32 * k[None, :])
                % (ws + 1).astype(jnp.uint32)).astype(jnp.int32)
    row = jnp.clip(cta, 0, program.trips_data.shape[-2] - 1)
    trips = jnp.where(program.trips_from_data, program.trips_data[:, row, warp].T,
                      jnp.maximum(0, program.trips + cta_off + warp_add))
    lanes = jnp.where(warp == program.warps_per_cta - 1, program.lanes_last_warp, 32)
    lane = jnp.arange(32, dtype=jnp.int32)
    b = jnp.arange(n_branches, dtype=jnp.int32)
    draws = hash3(program.seed, 3, cta, 1024 * b[:, None, None] + 32 * warp[None, :, None] + lane) >> 8
    masks = program.if_data[:, row, warp]  # [branch, n]
    takes_if = jnp.where(program.if_from_data[:, None, None], (masks[..., None] >> lane) & 1 == 1,
                         draws.astype(jnp.int32) < program.branch_threshold[:, None, None])
    paths = [lane[None, :] < lanes[:, None]]  # the warp's lanes, then each branch's if- and else-path
    for j in range(n_branches):
        parent = program.branch_parent[j]
        around = jnp.stack(paths)[jnp.where(parent < 0, 0, parent + 1)]
        paths += [around & takes_if[j], around & ~takes_if[j]]
    count = lambda p: jnp.sum(p, axis=-1, dtype=jnp.int32)  # noqa: E731
    per_branch = jnp.stack([count(paths[1 + 2 * j]) | (count(paths[2 + 2 * j]) << 6)
                            for j in range(n_branches)], axis=-1)
    return trips, lanes, per_branch


def resolve_pc(prog: Program | WarpProgram, pc: Array, trips_left: Array, branch_lanes: Array) -> Array:
    """Apply the fetch rules (docs/model.md section 6) until none applies: a loop whose warp has
    no trips left is skipped, an if-path or else-path without lanes too. Where several apply at
    one pc, the farthest target wins (the outermost region that is skipped). Each rule moves the
    pc forward, so `loops + 2 branches` rounds reach the fixed point. `trips_left`:
    [loop, ...]; `branch_lanes`: [branch, ...] (`warp_variation`'s packing); the structure is one
    program's (`Program`) or each warp's own (`WarpProgram`), loop and branch axes first."""
    if_lanes, else_lanes = branch_lanes & 63, branch_lanes >> 6
    for _ in range(trips_left.shape[0] + 2 * branch_lanes.shape[0]):
        at = pc[None]
        to_loop = jnp.where((at == prog.loop_start) & (trips_left == 0), prog.loop_end + 1, at)
        to_if = jnp.where((at == prog.branch_start) & (if_lanes == 0), prog.branch_mid, at)
        to_else = jnp.where((at == prog.branch_mid) & (else_lanes == 0), prog.branch_end, at)
        pc = jnp.maximum(jnp.max(to_loop, axis=0), jnp.maximum(jnp.max(to_if, axis=0), jnp.max(to_else, axis=0)))
    return pc


def active_lanes(prog: Program | WarpProgram, pc: Array, lanes: Array, branch_lanes: Array) -> Array:
    """Lanes that execute the instruction at `pc` (SIMT serialisation): those of the innermost
    if- or else-path that holds it (the highest-numbered branch: enclosing ones open first), else
    all the warp's lanes."""
    out = lanes
    for j in range(branch_lanes.shape[0]):
        start, mid, end = prog.branch_start[j], prog.branch_mid[j], prog.branch_end[j]
        out = jnp.where((pc >= start) & (pc < mid), branch_lanes[j] & 63,
                        jnp.where((pc >= mid) & (pc < end), branch_lanes[j] >> 6, out))
    return out


def back_edge(prog: Program | WarpProgram, pc: Array, trips_left: Array, trips: Array | None, take: Array
              ) -> tuple[Array, Array, Array]:
    """After the instruction at `pc` issues: (whether a loop's back-edge is taken, the next pc
    before the fetch rules, the trips left per loop). The loop that ends at `pc` (at most one)
    jumps back where `take` (per loop, [loop, ...]) and counts a trip down; one that does not
    take it is left, and its count returns to the warp's trips (`trips`, [loop, ...]) for its
    next entry. `trips` is None where no loop can be entered twice (a single loop)."""
    ends = pc[None] == prog.loop_end
    back_k = ends & take
    back = jnp.any(back_k, axis=0)
    target = jnp.where(back, jnp.max(jnp.where(back_k, prog.loop_start, 0), axis=0), pc + 1)
    left = jnp.where(back_k, trips_left - 1, trips_left)
    if trips is not None:
        left = jnp.where(ends & ~take, trips, left)
    return back, target, left
