"""A batch's event loop: every configuration's ticks, one event at a time (docs/model.md
sections 7-13).

A step is vmapped per configuration phase by phase, and what a phase rarely needs to do runs at
the batch level, in one loop after the tick's SM cycles: the dispatcher's placements (until no
configuration has a CTA to place), then the per-warp work of CTA launches, barrier releases and
clock changes on the few SMs that need it (`columns`). Under `vmap`, a loop or a conditional
would select every configuration's whole carry at every iteration; at the batch level a
configuration that has nothing to do keeps its values by construction.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

from ..lower import Launch, Shapes
from . import columns
from .cycle import run_tick
from .dispatch import Slots, Variation, commit, has_work, place, placed, plan, start_warps
from .events import skip_to_next_event
from .grid_barrier import grid_barrier
from .intervals import Clock, cta_warps, reclock, release
from .launches import Launches, initial_ready
from .materialize import when
from .power import Domains, dvfs_step, initial_dvfs
from .state import NO_WARP, State, Warps, initial_state
from .status import LONG_SB, WAIT


class Run(NamedTuple):
    """What a configuration's event loop reads at every step (computed once per run)."""

    launch: Launch
    launches: Launches
    variation: Variation
    doms: Domains


def start(run: Run, shapes: Shapes) -> State:
    """The state at tick 0: clocks and DVFS at their start, launches without dependencies
    ready, every SM holding a full launch credit."""
    launch = run.launch
    state = initial_state(shapes)
    freq, dv = initial_dvfs(launch, state.dvfs)
    return dataclasses.replace(state, freq=freq, dvfs=dv, kernel_ready=initial_ready(run.launches),
                               dispatch_est=jnp.full_like(state.dispatch_est, launch.ema_prior_ticks),
                               launch_credit=jnp.full_like(state.launch_credit, launch.launch_idle_cycles))


def running(run: Run, state: State, max_ticks: int) -> Array:
    """CTAs remain and the tick limit is not reached."""
    return (state.ctas_done < run.launch.n_ctas) & (state.tick < max_ticks)


_K = 8  # SMs per configuration per pass of the per-warp work after the SM cycles
_PLACEMENTS = 2  # placements per configuration per iteration of the post-tick loop


class _Touched(NamedTuple):
    """Per configuration, what the tick did to its warps after their SM cycles."""

    released: Bool[Array, "cta sm"]  # CTA barriers released in the cycles
    new: Bool[Array, "cta sm"]  # CTA slots that took a CTA in the tick's placements
    cta_id: Int[Array, "cta sm"]  # the slot table after the placements
    cta_launch: Int[Array, "cta sm"]
    grid: Bool[Array, ""]  # the grid barrier released


def _columns_work(run: Run, before: State, w: Warps, clock: Clock, freq: Array, t: _Touched, shapes: Shapes
                  ) -> tuple[Warps, Array, Array]:
    """The per-warp work on some SMs' columns after the tick's cycles, in the model's order:
    released warps start their intervals at the old clocks (`clock`), the placed CTAs' warps
    start (`before`: the state before the placements), and with DVFS the warps waiting on memory
    re-split at the new clocks (`freq`). Returns the warps, the (long, short, wait) cycles
    counted and the work items the new warps took."""
    released = cta_warps(t.released, w, run.launch, shapes) | (t.grid & (w.pc != NO_WARP))
    wake, counted = release(w, released, clock, run.launch, shapes, run.launches)
    w, took = start_warps(dataclasses.replace(w, wake=wake), t.new, t.cta_id, t.cta_launch, before, run.launch,
                          shapes, run.variation, run.launches)
    if shapes.dvfs:
        wake, delta = reclock(w, clock._replace(freq=freq), clock.freq, run.launch, shapes, run.launches)
        w, counted = dataclasses.replace(w, wake=wake), counted + delta
    return w, counted, took


class _After(NamedTuple):
    """The post-tick loop's carry (`_after_cycles`)."""

    slots: Slots  # each configuration's CTA-slot table, final once it has no work
    work: Bool[Array, " batch"]  # placements left (`has_work`)
    left: Bool[Array, "batch sm"]  # SMs whose per-warp work is still to do
    touched: Bool[Array, "batch sm"]  # every SM the per-warp work is for
    warps: Warps
    stalls: Array  # the stall counters [batch, reason, sm]
    took: Int[Array, "batch sm"]  # work items the new warps took


def _after_cycles(runs: Run, states: State, released: Bool[Array, "batch cta sm"], grid: Bool[Array, " batch"],
                  old_freq: Int[Array, "batch sm"], shapes: Shapes) -> _After:
    """Section 9's placements of the batch and then the per-warp work they and the tick leave
    (`_columns_work`), in one loop. Each iteration makes `_PLACEMENTS` placements in every
    configuration that has some left; a configuration without (from the iteration its
    placements end) does the per-warp work of up to `_K` of its SMs per iteration (`columns`).
    The loop runs until no configuration has either left: one loop, not two, so that a GPU
    waits on the host for one loop condition per step (benchmarks/RESULTS.md, session 12).
    `states` is the state before the placements' commit, with DVFS's new clocks."""
    v = jax.vmap
    slots, plans = v(lambda r, s: plan(s, r.launch, shapes, s.tick))(runs, states)
    work = v(lambda r, x, p: has_work(x, p, r.launch, r.launches))(runs, slots, plans)

    def needs(slots: Slots) -> Bool[Array, "batch sm"]:
        """The SMs with per-warp work once the placements are `slots`."""
        new = jnp.any(v(placed)(states, slots), axis=1)
        return (jnp.any(released, axis=1) | new | (grid[:, None] & runs.launch.sm_enabled)
                | (states.freq != old_freq))

    def columns_pass(c: _After) -> _After:
        cols, left = columns.next_columns(c.left, _K)
        sub = lambda x: columns.take(x, cols)  # noqa: E731
        clock = Clock(states.tick, sub(states.cycle), sub(states.acc), sub(old_freq))
        new = v(placed)(states, c.slots)
        t = _Touched(sub(released), sub(new), sub(c.slots.cta_id), sub(c.slots.cta_launch), grid)
        w, counted, tk = v(lambda *a: _columns_work(*a, shapes))(
            runs, states, jax.tree.map(sub, c.warps), clock, sub(states.freq), t)
        return c._replace(
            left=left,
            warps=jax.tree.map(lambda x, y: columns.put(x, cols, y), c.warps, w),
            stalls=columns.put(c.stalls, cols, sub(c.stalls).at[:, LONG_SB:WAIT + 1].add(counted)),
            took=columns.put(c.took, cols, tk))

    def body(c: _After) -> _After:
        slots, work = c.slots, c.work
        for _ in range(_PLACEMENTS):
            slots, work = v(lambda r, x, w, p: place(x, w, p, r.launch, r.launches, shapes))(runs, slots, work, plans)
        placed_all = (c.work & ~work)[:, None]  # their table is final: the per-warp work can start
        m = needs(slots)
        c = c._replace(slots=slots, work=work, left=jnp.where(placed_all, m, c.left),
                       touched=jnp.where(placed_all, m, c.touched))
        return when(jnp.any(c.left), columns_pass, c)  # on the CPU, skipped while all are still placing

    m = jnp.where(work[:, None], False, needs(slots))
    begin = _After(slots, work, m, m, states.warps, states.counters.sm_stalls, jnp.zeros_like(states.resident))
    return jax.lax.while_loop(lambda c: jnp.any(c.work) | jnp.any(c.left), body, begin)


def step(runs: Run, states: State, shapes: Shapes) -> State:
    """One event of every configuration: the tick's SM cycles, the grid barrier, DVFS (which
    dispatch does not read), dispatch and the per-warp work all of these leave
    (`_after_cycles`), then the skip to the next event. An SM whose warps anything after its
    cycles touched (a release, new CTAs, a clock change) has its next cycle as an event."""
    v = jax.vmap
    one = jnp.minimum(jnp.min(runs.launch.tick_mhz), 1)  # a traced 1 (`materialize.once`)
    states, looks, released = v(lambda r, s: run_tick(s, r.launch, shapes, r.launches, one))(runs, states)
    states, due = v(lambda r, s: grid_barrier(s, r.launch))(runs, states)
    old_freq = states.freq
    if shapes.dvfs:  # with DVFS off the step changes nothing (section 12)
        states = v(lambda r, s: dvfs_step(s, r.launch, shapes, r.doms))(runs, states)
    after = _after_cycles(runs, states, released, due, old_freq, shapes)
    states = dataclasses.replace(states, warps=after.warps,
                                 counters=dataclasses.replace(states.counters, sm_stalls=after.stalls))
    states = v(lambda r, s, x, t: commit(s, x, t, r.launch, shapes))(runs, states, after.slots, after.took)
    return v(lambda r, s, o: skip_to_next_event(s, r.launch, shapes, s.ctas_done >= r.launch.n_ctas, r.launches, o))(
        runs, states, looks._replace(changed=looks.changed | after.touched))


# Steps per test of the event loop's condition: a loop of known trip count inside it runs
# without the host reading a condition (on a GPU each test is a round trip to the host;
# benchmarks/RESULTS.md, session 12).
_STEPS_PER_TEST = 2


def _frozen(state: State) -> dict:
    """What results read that an ended configuration's steps would still change: its clocks keep
    ticking (cycles, DVFS), and a configuration stopped by the tick limit keeps running."""
    c = state.counters
    return dict(tick=state.tick, ctas_done=state.ctas_done, last_exit_tick=state.last_exit_tick,
                kernel_ready=state.kernel_ready, kernel_start=state.kernel_start, kernel_end=state.kernel_end,
                freq=state.freq, dvfs=state.dvfs,
                counters=dataclasses.replace(c, cta_sm=None, cta_start_tick=None, cta_end_tick=None))


def loop(runs: Run, shapes: Shapes, max_ticks: int, begin: State | None = None) -> tuple[State, Int[Array, ""]]:
    """The event loops of a batch (a leading axis on `runs`), run together until the last ends
    (from `begin`, default tick 0), and the number of steps they took (a multiple of
    `_STEPS_PER_TEST`).

    Once a configuration has ended its steps still run (until the batch's last ends); only what
    results read and a step still changes (`_frozen`) is kept from its end. The per-CTA trace,
    the warps and the CTA slots of an ended configuration change no more: its CTAs are all done.
    So the loop may test whether any configuration still runs only every `_STEPS_PER_TEST`
    steps: the extra steps after the last one ends change nothing that results read."""

    def body(carry: tuple[State, Array]) -> tuple[State, Array]:
        states, n = carry
        going = jax.vmap(lambda r, s: running(r, s, max_ticks))(runs, states)
        stepped = step(runs, states, shapes)

        def keep(new, old):
            return None if new is None else jnp.where(going.reshape(-1, *[1] * (new.ndim - 1)), new, old)

        kept = jax.tree.map(keep, _frozen(stepped), _frozen(states), is_leaf=lambda x: x is None)
        counters = dataclasses.replace(kept.pop("counters"), cta_sm=stepped.counters.cta_sm,
                                       cta_start_tick=stepped.counters.cta_start_tick,
                                       cta_end_tick=stepped.counters.cta_end_tick)
        return dataclasses.replace(stepped, counters=counters, **kept), n + 1

    def any_running(carry: tuple[State, Array]) -> Array:
        return jnp.any(jax.vmap(lambda r, s: running(r, s, max_ticks))(runs, carry[0]))

    def steps(carry: tuple[State, Array]) -> tuple[State, Array]:
        return jax.lax.fori_loop(0, _STEPS_PER_TEST, lambda _, c: body(c), carry)

    begin = jax.vmap(lambda r: start(r, shapes))(runs) if begin is None else begin
    return jax.lax.while_loop(any_running, steps, (begin, jnp.int32(0)))
