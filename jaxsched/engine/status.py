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
from .slots import by_scheduler, per_warp
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


_BITS = 4  # per counter of a packed histogram word


def _warps_per_word(shapes: Shapes) -> int:
    """The most warps of one scheduler a packed word counts: a divisor of its warps, at most 15,
    so that no 4-bit counter overflows."""
    return max(d for d in range(1, 16) if shapes.warps_per_scheduler % d == 0)


def reason_histogram(reason: Int[Array, "sm warp"], shapes: Shapes) -> Int[Array, "sm sched word"]:
    """Per scheduler, how many of its warps hold each stall reason, packed: one pass instead of
    one per reason and per use (the stall counters, the active-warp count and launch-credit
    starvation all read it). A warp's status is never `selected` (0), so each warp with a reason
    r >= 1 adds 1 << 4 (r - 1) to an int32 word of seven 4-bit counters; empty slots add 0. A
    word counts at most 15 warps of one scheduler (`_warps_per_word`), so a scheduler has one
    word or several. int32 rather than one int64 word per SM: GPUs emulate 64-bit shifts and
    adds. `per_sm_counts` and `launch_credit.starved_schedulers` read it."""
    bits = jnp.where(reason > 0, jnp.int32(1) << (_BITS * jnp.maximum(reason - 1, 0)), 0)
    grouped = by_scheduler(bits, shapes)
    return jnp.sum(grouped.reshape(*grouped.shape[:2], -1, _warps_per_word(shapes)), axis=3, dtype=jnp.int32)


def field_mask(reasons: tuple[int, ...]) -> int:
    """The bits of a packed histogram word that count `reasons` (each >= 1)."""
    return sum(((1 << _BITS) - 1) << (_BITS * (r - 1)) for r in reasons)


def per_sm_counts(packed: Int[Array, "sm sched word"]) -> Int[Array, "sm 8"]:
    """Per SM, the warps holding each stall reason (index 0, `selected`, is 0: the caller moves
    the issuing warps there)."""
    fields = (packed[..., None] >> (_BITS * jnp.arange(7, dtype=jnp.int32))) & ((1 << _BITS) - 1)
    counts = jnp.sum(fields, axis=(1, 2), dtype=jnp.int32)
    return jnp.concatenate([jnp.zeros_like(counts[:, :1]), counts], axis=1)


def count_reasons(counts: Int[Array, "sm 8"], weight: Int[Array, " sm"]) -> Int[Array, "sm 8"]:
    """Per-SM stall-reason counts times `weight` cycles, int64."""
    return counts.astype(jnp.int64) * weight.astype(jnp.int64)[:, None]
