"""Blocked intervals that start or change outside an issue (docs/model.md section 11).

A warp's blocked interval is counted when it starts (`status.blocked_split`). Two things other
than its own issue start or change one: a barrier release (the released warps' next instruction
starts its interval at the SM's next cycle), and a clock change (DVFS, section 12), which moves
the cycle at which a pending memory result arrives, since memory latencies run in ticks.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

from ..kernel import FIXED, MEMORY, MIO
from ..lower import Launch, Shapes
from .launches import Launches, op_and_waits
from .residency import of_cta
from .state import INF, NO_WARP, Warps
from .status import Blocked, blocked_split, interval_cycles, mem_cycle, waited


def _waited(w: Warps, launches: Launches, shapes: Shapes) -> tuple[Array, Array, Array]:
    """Each warp's (fixed, mio, memory) ready times of the results its instruction waits for."""
    waits = op_and_waits(launches, w.launch, jnp.clip(w.pc, 0, shapes.n_instr - 1))[1]
    return waited(w.ready_fixed, waits, FIXED), waited(w.ready_mio, waits, MIO), waited(w.ready_mem, waits, MEMORY)


class Clock(NamedTuple):
    """Where every SM's clock stands after a tick: its cycles executed, phase accumulator and
    frequency (docs/model.md section 2), and the tick: what the per-warp work after a tick's
    cycles reads of the clocks (`step._columns_work`, on some SMs' columns)."""

    tick: Int[Array, ""]
    cycle: Int[Array, " sm"]
    acc: Int[Array, " sm"]
    freq: Int[Array, " sm"]


def cta_warps(released: Bool[Array, "cta sm"], w: Warps, warp_cta: Int[Array, "warp sm"]) -> Bool[Array, "warp sm"]:
    """The live warps of the CTA slots `released` (at a release, all of them wait at the
    barrier); `warp_cta`: the CTA slot of each warp (`residency.warp_cta`)."""
    return of_cta(released, warp_cta) & (warp_cta >= 0) & (w.pc != NO_WARP)


def release(w: Warps, released: Bool[Array, "warp sm"], clock: Clock, launch: Launch, shapes: Shapes,
            launches: Launches) -> tuple[Int[Array, "warp sm"], Int[Array, "3 sm"]]:
    """Warps leaving a barrier after tick `clock.tick`: their interval starts at the SM's next
    cycle. Returns every warp's wake and the intervals' (long, short, wait) cycles per SM."""
    start = clock.cycle
    fixed, mio, mem = _waited(w, launches, shapes)
    m = mem_cycle(mem, clock.tick, start, clock.freq, clock.acc, launch.clocks.tick_mhz)
    b = blocked_split(fixed, mio, w.ready_fetch, m, start)
    return jnp.where(released, b.wake, w.wake), interval_cycles(b, released)


def reclock(w: Warps, clock: Clock, old_freq: Int[Array, " sm"], launch: Launch, shapes: Shapes,
            launches: Launches) -> tuple[Int[Array, "warp sm"], Int[Array, "3 sm"]]:
    """After a clock change at the end of tick `clock.tick` (from `old_freq` to `clock.freq`):
    the warps waiting on memory (past the next tick) re-split the rest of their interval, from
    the SM's next cycle, at the new clock. Returns every warp's wake and the change in the
    counts. The cycles before it ran at the old clock and stay as counted."""
    k = clock.tick
    fixed, mio, mem = _waited(w, launches, shapes)
    pending = (mem > k + 1) & (w.wake < INF)
    start = clock.cycle

    def split(freq: Int[Array, " sm"]) -> Blocked:
        m = mem_cycle(mem, k, start, freq, clock.acc, launch.clocks.tick_mhz)
        return blocked_split(fixed, mio, w.ready_fetch, m, start)

    old, new = split(old_freq), split(clock.freq)
    return jnp.where(pending, new.wake, w.wake), interval_cycles(new, pending) - interval_cycles(old, pending)
