"""What every warp slot is doing at a given SM cycle and tick (docs/model.md section 7).

One function serves both uses: deciding who may issue in the cycle being executed, and, for
event skipping, the stall reasons that hold until the next event and when each block clears.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

from ..isa import Op
from ..lower import Launch, Shapes
from .launches import Launches, op_and_dep
from .state import INF, N_PIPES, State

# Stall-reason codes (index into state.STALL_REASONS); -1 marks an empty or exited slot.
SELECTED, NOT_SELECTED, LONG_SB, SHORT_SB, WAIT, BARRIER, MIO_THROTTLE, PIPE_THROTTLE = range(8)


class WarpStatus(NamedTuple):
    """Per warp slot [sm, warp]: eligibility and blocking of the instruction at pc. What an
    issue does (latencies, costs, lanes) is decoded per scheduler for the selected warp only
    (`cycle.run_tick`), so the per-slot pass reads just the op class and the dependency bit."""

    eligible: Bool[Array, "sm warp"]
    reason: Int[Array, "sm warp"]  # stall reason if it does not issue; -1 if no warp
    clear_cycle: Int[Array, "sm warp"]  # earliest cycle a cycle-counted block clears (INF: none)
    clear_tick: Int[Array, "sm warp"]  # tick the long scoreboard clears (INF: not blocked)


def per_warp(x: Array, shapes: Shapes) -> Array:
    """Broadcast a per-scheduler value [sm, sched] to the warp slots [sm, warp] (slot 4q + j)."""
    n_sm = x.shape[0]
    return jnp.broadcast_to(x[:, None, :], (n_sm, shapes.warps_per_scheduler, shapes.schedulers)).reshape(
        n_sm, shapes.warp_slots)


def warp_status(
    state: State, launch: Launch, shapes: Shapes, cycle: Int[Array, " sm"], tick: Int[Array, ""],
    launches: Launches,
) -> WarpStatus:
    """Each warp reads its own launch's program (`launches`, docs/model.md section 13)."""
    w = state.warps
    pc = jnp.clip(w.pc, 0, shapes.n_instr - 1)
    op, dep = op_and_dep(launches, w.launch, pc)
    c = cycle[:, None]

    long_sb = dep & (tick < w.ready_mem)
    short_sb = dep & (c < w.ready_mio)
    # A warp refetching after a taken branch is blocked whatever dep says; it counts as `wait`.
    fetch = c < w.ready_fetch
    wait = (dep & (c < w.ready_fixed)) | fetch
    is_mio = (op == Op.LDS) | (op == Op.SHFL) | (op == Op.LDG)
    mio = state.mio[:, None]
    mio_throttle = is_mio & (mio >= launch.mio_depth)
    has_pipe = op < N_PIPES
    # The pipe takes an instruction in the cycle in which it frees: busy while c < its free cycle
    # floor(pipe_free64 / 64) (docs/model.md sections 7 and 11).
    free_cycle = (state.pipe_free64 >> 6).astype(jnp.int32)
    pipe_free = per_warp(free_cycle[..., 0], shapes)
    pipe_free = jnp.where(op == 1, per_warp(free_cycle[..., 1], shapes), pipe_free)
    pipe_free = jnp.where(op == 2, per_warp(free_cycle[..., 2], shapes), pipe_free)
    pipe_throttle = has_pipe & (c < pipe_free)

    live = w.active & ~w.at_barrier
    eligible = live & ~(long_sb | short_sb | wait | mio_throttle | pipe_throttle)
    reason = jnp.select(
        [~w.active, w.at_barrier, long_sb, short_sb, wait, mio_throttle, pipe_throttle],
        [-1, BARRIER, LONG_SB, SHORT_SB, WAIT, MIO_THROTTLE, PIPE_THROTTLE],
        NOT_SELECTED,
    )

    clear = jnp.minimum(
        jnp.minimum(jnp.where(short_sb, w.ready_mio, INF),
                    jnp.where(fetch, w.ready_fetch, jnp.where(wait, w.ready_fixed, INF))),
        jnp.minimum(
            jnp.where(mio_throttle, c + mio - launch.mio_depth + 1, INF),
            jnp.where(pipe_throttle, pipe_free, INF),
        ),
    )
    clear = jnp.where(eligible, c, jnp.where(live, clear, INF))
    clear_tick = jnp.where(live & long_sb, w.ready_mem, INF)
    return WarpStatus(eligible=eligible, reason=reason, clear_cycle=clear, clear_tick=clear_tick)


def reason_histogram(reason: Int[Array, "sm warp"], shapes: Shapes) -> Int[Array, "sm sched"]:
    """Per scheduler, how many of its warps hold each stall reason, packed: one pass instead of
    one per reason and per use (the stall counters and launch-credit starvation both read it).
    Each warp adds 1 << (7 * reason) to an int64 that holds eight 7-bit counters (at most 127
    warps per SM, so no field overflows); empty slots add 0. `unpack` reads it."""
    one = jnp.int64(1)
    bits = jnp.where(reason >= 0, one << (7 * jnp.maximum(reason, 0)).astype(jnp.int64), 0)
    return jnp.sum(bits.reshape(-1, shapes.warps_per_scheduler, shapes.schedulers), axis=1)


def unpack(packed: Int[Array, "*n"]) -> Int[Array, "*n 8"]:
    """The eight counters of a packed reason histogram."""
    return (packed[..., None] >> (7 * jnp.arange(8, dtype=jnp.int64))) & 127


def warps_counted(packed: Int[Array, " sm"]) -> Int[Array, " sm"]:
    """The warps a packed per-SM histogram counts: every active warp has a reason."""
    return jnp.sum(unpack(packed), axis=-1).astype(jnp.int32)


def count_reasons(packed: Int[Array, " sm"], weight: Int[Array, " sm"]) -> Int[Array, "sm 8"]:
    """Per-SM stall-reason counts of a packed per-SM histogram, times `weight` cycles."""
    return unpack(packed) * weight.astype(jnp.int64)[:, None]
