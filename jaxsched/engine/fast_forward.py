"""Fast-forward through steady state: jump whole periods of an SM's recurring state in one step
(docs/model.md section 11, "Fast-forward").

Between the events that couple it to the rest of the chip, an SM is a deterministic system in its
own cycles: what it does next follows from its warps' pcs, their ready times relative to its
cycle, its pipes, MIO backlog, barrier counts and last-issued warps. Trip counts only decide
whether a loop's back-edge is taken (`trips_left > 1`), and launch credit only whether a free
slot may be refilled. So if that state, with ready times taken relative to the cycle, is the
same at two points P cycles apart, the SM repeats the same P cycles again and again, each time
with every warp's trip count lowered by what it lost over the first (`d_w`), and every counter
and its launch credit raised by what they gained, until a warp's trip count would end its loop
or the credit would reach a refill's need. The SM's state after `m` such periods is known without running them: the
relative state as it is, trip counts minus `m d_w`, times and counters shifted by `m P` cycles
and `m` times their gains.

It is exact only while nothing outside the SM enters those cycles, so a period qualifies only
if, over it, the SM issued no global load (the chip-wide memory queues and memory times, counted
in ticks, couple it to the other SMs), took no persistent work item, reached no grid barrier,
every memory result its warps wait for had arrived when the first snapshot was taken, and it
cannot receive a CTA now (no free slot never used, nor a free slot with the credit for a
refill). The jump ends before the chip's next event that reads
or changes the SM: a DVFS sample or clock change (it reads the SM's counters and may change its
clock), a grid-barrier release, or `max_ticks`. The SM then waits ahead of the chip's tick
(`State.resume`) until the tick catches up with it; meanwhile the rest of the chip runs on.

The search is Brent's cycle detection over the SM's *points*, the ticks at which it issues: an
SM that issues has an eligible warp, so its cycle is always an event of the loop, and the point
one period later is one too. A snapshot is taken at the first point, then at doubling numbers
of points; each point's state is compared with the snapshot, field by field (never a hash).
The search restarts at once when the SM's CTAs or its active warps change.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Int

from ..isa import Op
from ..kernel import Kernel
from ..lower import Launch, Shapes
from .cycle import Outlook
from .mechanics.exact import floor_div
from .launch_credit import can_launch
from .launches import Launches
from .mechanics.materialize import once
from .power import next_dvfs_event
from .state import INF, NO_WARP, Counters, Recurrence, State
from .status import cycles_in

if TYPE_CHECKING:
    from .step import Run

MAX_POWER = 1 << 14  # points between snapshots at most: periods up to this many issue points are found
_FAR = 1 << 30  # ticks: no event ahead


def counter_rows(c: Counters) -> Int[Array, "count sm"]:
    """The per-SM counters a period adds to, as rows (int64): cycles, busy cycles, issued,
    active lanes, warp-cycles, work items, then issued per `isa.Op` and stalls per reason."""
    head = jnp.stack([c.sm_cycles, c.sm_busy_cycles, c.sm_issued, c.sm_active_lanes, c.sm_warp_cycles,
                      c.sm_items])
    return jnp.concatenate([head, c.sm_issued_op, c.sm_stalls]).astype(jnp.int64)


_ITEMS = 5  # counter_rows: work items
_OP = 6  # counter_rows: first of the per-op rows


def _from_rows(c: Counters, rows: Int[Array, "count sm"]) -> Counters:
    n_op = c.sm_issued_op.shape[0]
    return replace(c, sm_cycles=rows[0], sm_busy_cycles=rows[1], sm_issued=rows[2], sm_active_lanes=rows[3],
                   sm_warp_cycles=rows[4], sm_items=rows[_ITEMS], sm_issued_op=rows[_OP:_OP + n_op],
                   sm_stalls=rows[_OP + n_op:])


class _View(NamedTuple):
    """An SM's state as the search compares it: times relative to its next cycle, clamped at 0."""

    pc: Int[Array, "warp sm"]
    wake: Int[Array, "warp sm"]
    fixed: Int[Array, "slot warp sm"]
    short: Int[Array, "slot warp sm"]
    fetch: Int[Array, "warp sm"]
    pipe: Int[Array, "pipe sched sm"]


def _view(state: State) -> _View:
    c, w = state.cycle, state.warps
    rel = lambda x: jnp.maximum(x - c, 0)  # noqa: E731
    return _View(pc=w.pc, wake=jnp.where(w.wake >= INF, INF, rel(w.wake)), fixed=rel(w.ready_fixed),
                 short=rel(w.ready_mio), fetch=rel(w.ready_fetch),
                 pipe=jnp.maximum(state.pipe_free64 - 64 * c.astype(jnp.int64), 0))


def _same_scalars(state: State, r: Recurrence) -> Bool[Array, " sm"]:
    """Whether each SM's pcs and scheduling state equal its snapshot's (the cheap part of the
    comparison, made at every point)."""
    return (jnp.all(state.warps.pc == r.pc, axis=0) & (state.mio == r.mio) & jnp.all(state.last == r.last, axis=0)
            & (state.launch_credit >= r.credit) & jnp.all(state.cta_arrived == r.arrived, axis=0)
            & (state.g_waiting == r.g_waiting))


def _same_times(state: State) -> Bool[Array, " sm"]:
    """Whether each SM's ready times and pipes, relative to its cycle, equal its snapshot's, and
    a warp of it lost trips since (made only in a step where some SM's cheap part matched)."""
    v, r = _view(state), state.recurrence
    slots = jnp.all((v.fixed == r.fixed) & (v.short == r.short), axis=0)  # every dependence slot
    warps = jnp.all((v.wake == r.wake) & slots & (v.fetch == r.fetch), axis=0)
    looping = jnp.any((v.pc != NO_WARP) & (state.warps.trips_left[0] < r.trips), axis=0)
    return warps & looping & jnp.all(v.pipe == r.pipe, axis=(0, 1))


def _structure_changed(state: State, r: Recurrence) -> Bool[Array, " sm"]:
    """The SM's CTAs or its set of active warps differ from the snapshot's: a new search."""
    return (jnp.any(state.cta_id != r.cta_id, axis=0)
            | jnp.any((state.warps.pc == NO_WARP) != (r.pc == NO_WARP), axis=0))


def _could_take_cta(state: State, launch: Launch, shapes: Shapes, launches: Launches) -> Bool[Array, " sm"]:
    """A free CTA slot the SM could refill while CTAs remain: one never used, or any with the
    launch credit at its need (docs/model.md section 9). Such an SM is the dispatcher's, not
    its own."""
    in_range = jnp.arange(shapes.cta_slots, dtype=jnp.int32)[:, None] < launch.program.ctas_per_sm
    free = in_range & (state.cta_id < 0)
    refill = jnp.any(free & ~state.cta_used, axis=0) | (jnp.any(free, axis=0) & can_launch(state.launch_credit, launch))
    return refill & jnp.any(state.next_cta < launches.n_ctas)


def horizon(state: State, launch: Launch, max_ticks: int) -> Int[Array, ""]:
    """The chip's next tick that reads or changes an SM from outside: a DVFS event, a grid
    barrier's release, or the tick limit. A jump ends before it."""
    return jnp.minimum(jnp.minimum(next_dvfs_event(state, launch), state.g_release), max_ticks)


class _Found(NamedTuple):
    """Per SM, what this tick's point finds (computed once per SM: `materialize.once`)."""

    point: Bool[Array, " sm"]  # the SM issued: a point of the search
    changed: Bool[Array, " sm"]  # its CTAs or active warps differ from the snapshot's
    recurs: Bool[Array, " sm"]  # its state equals the snapshot's, over a period that qualifies


class _Jump(NamedTuple):
    """Per SM, the jump of a recurring SM (zeros elsewhere)."""

    m: Int[Array, " sm"]  # whole periods jumped (0: none)
    shift: Int[Array, " sm"]  # cycles jumped, m x period
    ahead: Int[Array, " sm"]  # ticks until the last jumped cycle
    acc: Int[Array, " sm"]  # the phase accumulator after it


def _find(state: State, look: Outlook, launch: Launch, shapes: Shapes, launches: Launches) -> _Found:
    """The point's findings; `recurs` from the cheap part of the comparison only."""
    r, c = state.recurrence, state.counters
    point = look.issued & launch.chip.sm_enabled
    since = lambda now, row: now != r.counters[row]  # noqa: E731  (the counter moved since the snapshot)
    quiet = (~since(c.sm_issued_op[Op.LDG], _OP + Op.LDG) & ~since(c.sm_items, _ITEMS)
             & ~(jnp.any(launch.program.grid_sync) & since(c.sm_issued_op[Op.BAR], _OP + Op.BAR))
             & ~_could_take_cta(state, launch, shapes, launches))
    changed = _structure_changed(state, r)
    one_loop = jnp.sum(launch.program.loop_start >= 0) <= 1  # trip counts of loop 0 are all that change
    candidate = point & r.valid & ~changed & (state.cycle > r.cycle) & quiet & one_loop & _same_scalars(state, r)
    return _Found(point=point, changed=changed, recurs=candidate)


def _jump(state: State, found: _Found, launch: Launch, launches: Launches, max_ticks: int) -> _Jump:
    """How many whole periods each recurring SM jumps: as many as keep every warp in its loop
    and end before the chip's next outside event."""
    r, w = state.recurrence, state.warps
    period = state.cycle - r.cycle
    gains = r.trips - w.trips_left[0]  # per warp: trips lost over the period
    looping = (w.pc != NO_WARP) & (gains > 0)
    per_warp = floor_div(jnp.maximum(w.trips_left[0] - 1, 0), jnp.maximum(gains, 1))
    by_trips = jnp.min(jnp.where(looping, per_warp, INF), axis=0)
    # The SM's cycles in ticks k+1 .. h-1, k the tick it ran, h the horizon.
    room = jnp.clip(horizon(state, launch, max_ticks) - 1 - state.acct, 0, _FAR)
    by_time = floor_div(cycles_in(state.freq, state.acc, launch.clocks.tick_mhz, room), jnp.maximum(period, 1))
    # Launch credit that grows over the period (a free slot waits for it) stays below a refill's
    # need while CTAs remain; after the last CTA it only saturates.
    credit_gain = state.launch_credit - r.credit
    waits = (credit_gain > 0) & jnp.any(state.next_cta < launches.n_ctas)
    by_credit = jnp.where(waits, floor_div(launch.chip.launch_idle_cycles - 1 - state.launch_credit,
                                                     jnp.maximum(credit_gain, 1)), INF)
    m = jnp.where(found.recurs, jnp.maximum(jnp.minimum(jnp.minimum(by_trips, by_time), by_credit), 0), 0)
    n = (m * period).astype(jnp.int64)  # cycles jumped
    f = jnp.maximum(state.freq, 1).astype(jnp.int64)
    ahead = floor_div(n * launch.clocks.tick_mhz - state.acc + f - 1, f)  # ticks until the n-th cycle
    acc = (state.acc + ahead.astype(jnp.int64) * f - n * launch.clocks.tick_mhz).astype(jnp.int32)
    return _Jump(m=m, shift=(m * period).astype(jnp.int32), ahead=ahead, acc=acc)


def _apply(state: State, look: Outlook, j: _Jump, launch: Launch) -> tuple[State, Outlook]:
    """Move the jumped SMs `m` periods on: warps' trips and times, pipes, counters, the clock
    phase, the tick they resume at, and their snapshots with them."""
    r, w = state.recurrence, state.warps
    jump = j.m >= 1
    gains = r.trips - w.trips_left[0]
    looping = jump & (w.pc != NO_WARP) & (gains > 0)
    moved = lambda x: jnp.where(jump, x + j.shift, x)  # noqa: E731
    warps = replace(
        w,
        trips_left=w.trips_left.at[0].set(jnp.where(looping, w.trips_left[0] - j.m * gains, w.trips_left[0])),
        wake=jnp.where(jump & (w.wake < INF), w.wake + j.shift, w.wake),
        ready_fixed=moved(w.ready_fixed),
        ready_mio=moved(w.ready_mio),
        ready_fetch=moved(w.ready_fetch),
    )
    rows = counter_rows(state.counters)
    gained = jnp.where(jump, j.m.astype(jnp.int64) * (rows - r.counters), 0)
    credit = jnp.where(jump, j.m * (state.launch_credit - r.credit), 0)
    capped = lambda c: jnp.minimum(c + credit, jnp.maximum(c, launch.chip.launch_idle_cycles))  # noqa: E731
    recurrence = replace(r, cycle=moved(r.cycle), trips=jnp.where(looping, r.trips - j.m * gains, r.trips),
                         counters=r.counters + gained, credit=capped(r.credit))
    out = replace(
        state,
        cycle=moved(state.cycle),
        acc=jnp.where(jump, j.acc, state.acc),
        launch_credit=capped(state.launch_credit),
        resume=jnp.where(jump, state.acct + j.ahead + 1, state.resume),
        acct=jnp.where(jump, state.acct + j.ahead, state.acct),
        pipe_free64=jnp.where(jump, state.pipe_free64 + 64 * j.shift.astype(jnp.int64), state.pipe_free64),
        warps=warps,
        counters=_from_rows(state.counters, rows + gained),
        recurrence=recurrence,
    )
    return out, look._replace(next_wake=jnp.where(jump & (look.next_wake < INF), look.next_wake + j.shift,
                                                  look.next_wake))


def _search(state: State, found: _Found) -> tuple[State, Bool[Array, " sm"]]:
    """Count the point towards the next snapshot (Brent's doubling): a recurring point keeps its
    snapshot; a snapshot is due after `power` points, at once where the SM's structure changed.
    Returns the state and where a snapshot is due."""
    r = state.recurrence
    restart = found.point & found.changed
    count = jnp.where(found.point & ~found.recurs, r.count + 1, jnp.where(found.recurs, 0, r.count))
    take = found.point & ~found.recurs & (restart | (count >= r.power))
    recurrence = replace(r, power=jnp.where(take, jnp.where(restart, 1, jnp.minimum(2 * r.power, MAX_POWER)), r.power),
                         count=jnp.where(take, 0, count))
    return replace(state, recurrence=recurrence), take


def _snapshot(state: State, take: Bool[Array, " sm"]) -> State:
    """Record the state of the SMs where `take` as their new snapshot."""
    r, v = state.recurrence, _view(state)
    settled = jnp.all((v.pc == NO_WARP) | jnp.all(state.warps.ready_mem <= state.acct + 1, axis=0), axis=0)
    snap = lambda new, old: jnp.where(take, new, old)  # noqa: E731
    recurrence = replace(
        r,
        valid=snap(settled, r.valid),
        cycle=snap(state.cycle, r.cycle),
        pc=snap(v.pc, r.pc),
        trips=snap(state.warps.trips_left[0], r.trips),
        wake=snap(v.wake, r.wake),
        fixed=snap(v.fixed, r.fixed),
        short=snap(v.short, r.short),
        fetch=snap(v.fetch, r.fetch),
        pipe=snap(v.pipe, r.pipe),
        mio=snap(state.mio, r.mio),
        last=snap(state.last, r.last),
        credit=snap(state.launch_credit, r.credit),
        cta_id=snap(state.cta_id, r.cta_id),
        arrived=snap(state.cta_arrived, r.arrived),
        g_waiting=snap(state.g_waiting, r.g_waiting),
        counters=snap(counter_rows(state.counters), r.counters),
    )
    return replace(state, recurrence=recurrence)


def fast_forward(runs: Run, states: State, looks: Outlook, shapes: Shapes, max_ticks: int,
                 one: Int[Array, ""]) -> tuple[State, Outlook]:
    """After a tick of every configuration (its cycles, dispatch and per-warp work done, before
    the skip to the next event): record the points of the search, and jump the SMs whose state
    recurs. Returns the states and the ticks' outlooks, whose wake times move with the jumped
    SMs. The cheap findings are computed every step, once per SM (`materialize.once`, with the
    step's traced `one`); the rest of the comparison, the jump and the snapshot only in a step
    where some SM of the batch needs them."""
    v, cond = jax.vmap, jax.lax.cond
    found = v(lambda r, s, o: once(lambda: _find(s, o, r.launch, shapes, r.launches), one))(runs, states, looks)
    none = jnp.zeros_like(found.recurs)
    recurs = cond(jnp.any(found.recurs), lambda: found.recurs & v(_same_times)(states), lambda: none)
    found = found._replace(recurs=recurs)

    def jumped() -> tuple[State, Outlook]:
        jumps = v(lambda r, s, x: _jump(s, x, r.launch, r.launches, max_ticks))(runs, states, found)
        return v(lambda r, s, o, x: _apply(s, o, x, r.launch))(runs, states, looks, jumps)

    states, looks = cond(jnp.any(recurs), jumped, lambda: (states, looks))
    states, take = v(_search)(states, found)
    states = cond(jnp.any(take), lambda: v(_snapshot)(states, take), lambda: states)
    return states, looks


def may_fast_forward(kernel: Kernel) -> bool:
    """Whether fast-forward can ever jump a launch of `kernel` (concrete values): it needs a
    program of one loop, of at least three trips for some warp, whose body issues no global load
    on every pass (a load inside an if/else may be skipped). Where no kernel of a batch may,
    the engine is compiled without it (`Shapes.fast_forward`): its search would cost every step
    for nothing. Programs of several loops do not fast-forward: an inner loop's trip count
    returns to its start at every entry, which the search's linear trip counts do not follow."""
    if kernel.n_loops != 1:
        return False
    k = int(np.argmax(np.asarray(kernel.loop_start) >= 0))
    start, end = int(kernel.loop_start[k]), int(kernel.loop_end[k])
    longest = (int(np.max(kernel.trips_data[k], initial=0)) if bool(kernel.trips_from_data[k])
               else int(kernel.trips[k]) + int(kernel.trips_cta_spread[k]) + int(kernel.trips_warp_spread[k]))
    ops = np.asarray(kernel.op)
    body = np.arange(start, end + 1)
    conditional = np.zeros(len(ops), bool)
    for b0, b1 in zip(np.asarray(kernel.branch_start), np.asarray(kernel.branch_end)):
        conditional[max(int(b0), 0):max(int(b1), 0)] = True
    return longest >= 3 and not bool(np.any(ops[body[~conditional[body]]] == Op.LDG))
