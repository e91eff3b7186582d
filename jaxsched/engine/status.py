"""What every warp slot is doing at an SM cycle: the one per-warp pass of a step (docs/model.md
sections 7 and 11).

A warp slot keeps `wake`, the first SM cycle at which its scoreboard and refetch let it issue
(INF: empty, exited or at a barrier), and `issue_class`, the throttle class of the instruction at its pc.
So at cycle `c` a warp is *ready* (its stall reason is a throttle, `not_selected` or
`selected`) exactly when `wake <= c`, and eligible when also its class is not throttled. The
stall reasons of a blocked warp (`long_scoreboard`, `short_scoreboard`, `wait`) follow from its
ready times alone, which change only when it issues: they are counted once, for the whole
blocked interval, when the interval starts (`blocked_split`), instead of once per cycle. What
the pass returns per scheduler, the number of ready warps of each class, then gives the
throttle, `not_selected` and launch-credit counts of the cycle and of every skipped cycle.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

from ..isa import Op
from ..kernel import MAX_DEP_SLOTS
from .mechanics.exact import floor_div
from .slots import by_scheduler, per_warp
from .state import INF, N_PIPES

# Stall-reason codes (index into state.STALL_REASONS).
SELECTED, NOT_SELECTED, LONG_SB, SHORT_SB, WAIT, BARRIER, MIO_THROTTLE, PIPE_THROTTLE = range(8)

# Throttle classes: the pipes FMA, ALU, SFU (isa.Op 0..2), the MIO queue (LDS, LDG, SHFL), none
# (BAR, EXIT).
CLS_MIO, CLS_NONE = N_PIPES, N_PIPES + 1
N_CLASSES = N_PIPES + 2
_CLS_BITS = 6  # per class count of a packed word: up to 63 warps of one scheduler (127 slots / 4)


def op_class(op: Int[Array, "..."]) -> Int[Array, "..."]:
    """The throttle class of an instruction class (isa.Op)."""
    mio = (op == Op.LDS) | (op == Op.LDG) | (op == Op.SHFL)
    return jnp.where(op < N_PIPES, op, jnp.where(mio, CLS_MIO, CLS_NONE)).astype(jnp.int32)


def throttled(pipe_free64: Int[Array, "pipe sched sm"], mio: Int[Array, " sm"], mio_depth: Int[Array, ""],
              cycle: Int[Array, " sm"]) -> Int[Array, "sched sm"]:
    """Per scheduler, a bit per throttled class at `cycle`: a pipe busy in it (it takes an
    instruction in the cycle in which it frees: busy while `cycle < floor(pipe_free64 / 64)`),
    and the MIO class when the SM's backlog is at its depth."""
    busy = cycle < (pipe_free64 >> 6)
    bits = jnp.sum(jnp.where(busy, 1 << jnp.arange(N_PIPES)[:, None, None], 0), axis=0, dtype=jnp.int32)
    return bits | jnp.where(mio >= mio_depth, 1 << CLS_MIO, 0)


class Scan(NamedTuple):
    """The per-warp pass at each SM's cycle."""

    eligible: Bool[Array, "warp sm"]
    ready: Int[Array, "sched sm"]  # ready warps per class, packed (`class_counts`)
    next_wake: Int[Array, " sm"]  # the earliest wake of a warp not ready yet (INF: none)


def scan(wake: Int[Array, "warp sm"], cls: Int[Array, "warp sm"], throttle: Int[Array, "sched sm"],
         cycle: Int[Array, " sm"], shapes) -> Scan:
    """Ready and eligible warps at `cycle`, counted per scheduler and class."""
    ready = wake <= cycle
    held = (per_warp(throttle, shapes) >> cls) & 1
    packed = jnp.where(ready, jnp.int32(1) << (_CLS_BITS * cls), 0)
    return Scan(
        eligible=ready & (held == 0),
        ready=jnp.sum(by_scheduler(packed, shapes), axis=1, dtype=jnp.int32),
        next_wake=jnp.min(jnp.where(ready, INF, wake), axis=0),
    )


def one_of_class(cls: Int[Array, "..."]) -> Int[Array, "..."]:
    """One warp of class `cls` in a packed count."""
    return jnp.int32(1) << (_CLS_BITS * cls)


def class_bits(x: Int[Array, "..."]) -> Int[Array, "cls ..."]:
    """Bit `c` of `x` for every class `c`, on a new leading axis."""
    return (x[None] >> jnp.arange(N_CLASSES, dtype=jnp.int32).reshape(-1, *[1] * x.ndim)) & 1


def class_counts(packed: Int[Array, "sched sm"]) -> Int[Array, "cls sched sm"]:
    """Unpack per-class counts."""
    shift = _CLS_BITS * jnp.arange(N_CLASSES, dtype=jnp.int32).reshape(-1, *[1] * packed.ndim)
    return (packed[None] >> shift) & ((1 << _CLS_BITS) - 1)


class Ready(NamedTuple):
    """Per SM, how the ready warps of a cycle count (docs/model.md section 7)."""

    eligible: Int[Array, " sm"]  # not throttled: `selected` or `not_selected`
    mio_throttle: Int[Array, " sm"]
    pipe_throttle: Int[Array, " sm"]
    starved: Int[Array, " sm"]  # schedulers with no ready warp (launch credit)


def ready_counts(packed: Int[Array, "sched sm"], throttle: Int[Array, "sched sm"]) -> Ready:
    counts = class_counts(packed)
    stuck = counts * class_bits(throttle)
    return Ready(
        eligible=jnp.sum(counts - stuck, axis=(0, 1), dtype=jnp.int32),
        mio_throttle=jnp.sum(stuck[CLS_MIO], axis=0, dtype=jnp.int32),
        pipe_throttle=jnp.sum(stuck[:N_PIPES], axis=(0, 1), dtype=jnp.int32),
        starved=jnp.sum(packed == 0, axis=0, dtype=jnp.int32),
    )


def cycles_in(freq: Int[Array, "..."], acc: Int[Array, "..."], tick_mhz: Int[Array, ""],
              ticks: Int[Array, "..."]) -> Int[Array, "..."]:
    """Cycles an SM at `freq` with phase accumulator `acc` executes in the next `ticks` ticks:
    `floor((acc + ticks f) / F)` (docs/model.md section 2), exactly (`exact.floor_div`)."""
    return floor_div(acc + jnp.asarray(ticks).astype(jnp.int64) * freq, tick_mhz)


class Blocked(NamedTuple):
    """A warp's next blocked interval, from cycle `start` on (docs/model.md section 7)."""

    long: Int[Array, "..."]  # cycles of long_scoreboard
    short: Int[Array, "..."]
    wait: Int[Array, "..."]
    wake: Int[Array, "..."]  # the first cycle it is ready


def waited(ready: Int[Array, "slot ..."], waits: Int[Array, "..."], kind: int) -> Int[Array, "..."]:
    """The latest of a warp's ready times of one kind of result (`ready_fixed`, `ready_mio` or
    `ready_mem`, `kind` FIXED, MIO or MEMORY) over the dependence slots of that kind its
    instruction waits for (`waits`: bits per kind), 0 where it waits for none (docs/model.md
    section 7)."""
    bits = [jnp.where((waits >> (d + MAX_DEP_SLOTS * kind)) & 1 == 1, ready[d], 0) for d in range(ready.shape[0])]
    return functools.reduce(jnp.maximum, bits)


def blocked_split(ready_fixed: Array, ready_mio: Array, ready_fetch: Array, mem_cycle: Array, start: Array) -> Blocked:
    """The stall reasons of a warp from cycle `start` until it is ready, first match: long
    scoreboard before `mem_cycle` (the SM's first cycle at or after the tick its memory results
    arrive), then short scoreboard before `ready_mio`, then wait before `ready_fixed` and before
    `ready_fetch` (the refetch blocks whatever it waits for). The ready times are those of the
    results its instruction waits for (`waited`). They change only when the warp issues, so
    the whole interval is known when it starts."""
    after_long = jnp.maximum(start, mem_cycle)
    after_short = jnp.maximum(after_long, ready_mio)
    until = jnp.maximum(ready_fixed, ready_fetch)
    return Blocked(long=jnp.maximum(mem_cycle - start, 0), short=jnp.maximum(ready_mio - after_long, 0),
                   wait=jnp.maximum(until - after_short, 0), wake=jnp.maximum(after_short, until))


def interval_cycles(b: Blocked, mask: Bool[Array, "n sm"]) -> Int[Array, "3 sm"]:
    """Per SM, the (long, short, wait) cycles of the masked intervals (warps or schedulers)."""
    return jnp.stack([jnp.sum(jnp.where(mask, x, 0), axis=0, dtype=jnp.int64) for x in (b.long, b.short, b.wait)])


def mem_cycle(ready_mem: Array, tick: Int[Array, ""], cycle: Array, freq: Array, acc: Array,
              tick_mhz: Int[Array, ""]) -> Array:
    """The first cycle an SM executes at or after tick `ready_mem`, seen after tick `tick` (with
    `cycle` cycles executed and accumulator `acc`, at `freq` from the next tick on): the cycles
    of ticks `tick + 1 .. ready_mem - 1` follow."""
    return cycle + cycles_in(freq, acc, tick_mhz, jnp.maximum(ready_mem - tick - 1, 0))


def stall_rows(**rows: Array) -> Int[Array, "reason sm"]:
    """Per-SM stall counts in `state.STALL_REASONS` order from named rows (int64): selected,
    not_selected, long, short, wait, barrier, mio, pipe."""
    order = ("selected", "not_selected", "long", "short", "wait", "barrier", "mio", "pipe")
    return jnp.stack([jnp.asarray(rows[name]).astype(jnp.int64) for name in order])
