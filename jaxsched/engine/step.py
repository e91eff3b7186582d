"""A batch's event loop: every configuration's ticks, one event at a time (docs/model.md
sections 7-13).

A step is vmapped per configuration phase by phase, and what a phase rarely needs to do runs at
the batch level: the dispatcher's placement loop (until no configuration has a CTA to place),
and the per-warp work of CTA launches, barrier releases and clock changes, on the few SMs that
need it (`columns.for_marked_sms`). Under `vmap`, a loop or a conditional would select every
configuration's whole carry at every iteration; at the batch level a configuration that has
nothing to do keeps its values by construction.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Int

from ..lower import Launch, Shapes
from . import columns
from .cycle import run_tick
from .dispatch import Variation, commit, has_work, place, placed, plan, start_warps
from .events import skip_to_next_event
from .grid_barrier import grid_barrier
from .intervals import Clock, cta_warps, reclock, release
from .launches import Launches, initial_ready
from .power import Domains, dvfs_step, initial_dvfs
from .state import NO_WARP, State, initial_state
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


_K = 8  # SMs per configuration per pass of the per-warp work of launches, releases, clock changes


def _rewake(runs: Run, states: State, marked: Array, fn: Callable, *cols) -> State:
    """On the marked SMs [batch, sm]: every warp's wake and the intervals' (long, short, wait)
    cycles from `fn(run, warps, clock, *cols)` per configuration, where `warps`, the clock and
    `cols` (arrays with an SM axis last) are those SMs' columns (`columns.for_marked_sms`)."""

    def work(at: Array, carry: tuple) -> tuple:
        wake, stalls = carry
        warps = jax.tree.map(lambda x: columns.take(x, at), dataclasses.replace(states.warps, wake=wake))
        clock = Clock(states.tick, *(columns.take(x, at) for x in (states.cycle, states.acc, states.freq)))
        new_wake, cycles = jax.vmap(fn)(runs, warps, clock, *(columns.take(x, at) for x in cols))
        counted = columns.take(stalls, at).at[:, LONG_SB:WAIT + 1].add(cycles)
        return columns.put(wake, at, new_wake), columns.put(stalls, at, counted)

    wake, stalls = columns.for_marked_sms(marked, work, (states.warps.wake, states.counters.sm_stalls), _K)
    return dataclasses.replace(states, warps=dataclasses.replace(states.warps, wake=wake),
                               counters=dataclasses.replace(states.counters, sm_stalls=stalls))


def _dispatch(runs: Run, states: State, shapes: Shapes) -> State:
    """Section 9: the batch's placement loop, then the placed CTAs' warps on the SMs that took
    one, then the tables."""
    v = jax.vmap
    slots, plans = v(lambda r, s: plan(s, r.launch, shapes, s.tick))(runs, states)
    work = v(lambda r, x, p: has_work(x, p, r.launch, r.launches))(runs, slots, plans)
    slots, _ = jax.lax.while_loop(lambda c: jnp.any(c[1]), lambda c: v(
        lambda r, x, w, p: place(x, w, p, r.launch, r.launches, shapes))(runs, *c, plans), (slots, work))
    new = v(placed)(states, slots)

    def launch_at(at: Array, carry: tuple) -> tuple:
        warps, took = carry
        sub = lambda x: columns.take(x, at)  # noqa: E731
        fresh, t = v(lambda r, s, *c: start_warps(*c, s, r.launch, shapes, r.variation, r.launches))(
            runs, states, jax.tree.map(sub, warps), sub(new), sub(slots.cta_id), sub(slots.cta_launch))
        return jax.tree.map(lambda x, y: columns.put(x, at, y), warps, fresh), columns.put(took, at, t)

    warps, took = columns.for_marked_sms(jnp.any(new, axis=1), launch_at,
                                         (states.warps, jnp.zeros_like(states.resident)), _K)
    states = dataclasses.replace(states, warps=warps)
    return v(lambda r, s, x, t: commit(s, x, t, r.launch, shapes))(runs, states, slots, took)


def step(runs: Run, states: State, shapes: Shapes) -> State:
    """One event of every configuration: the tick's SM cycles, barrier releases, the grid
    barrier, dispatch, DVFS, then the skip to the next event. An SM whose warps anything after
    its cycles touched (a release, new CTAs, a clock change) has its next cycle as an event."""
    v = jax.vmap
    one = jnp.minimum(jnp.min(runs.launch.tick_mhz), 1)  # a traced 1 (`materialize.once`)
    states, looks, released = v(lambda r, s: run_tick(s, r.launch, shapes, r.launches, one))(runs, states)

    def cta_release(r, w, clock, rel):
        return release(w, cta_warps(rel, w, r.launch, shapes), clock, r.launch, shapes, r.launches)

    states = _rewake(runs, states, jnp.any(released, axis=1), cta_release, released)
    states, due = v(lambda r, s: grid_barrier(s, r.launch))(runs, states)

    def grid_release(r, w, clock):
        return release(w, w.pc != NO_WARP, clock, r.launch, shapes, r.launches)

    states = _rewake(runs, states, due[:, None] & runs.launch.sm_enabled, grid_release)
    ctas = states.counters.sm_ctas
    states = _dispatch(runs, states, shapes)
    changed = looks.changed | due[:, None] | (states.counters.sm_ctas != ctas)
    if shapes.dvfs:  # with DVFS off the step changes nothing (section 12)
        old = states.freq
        states = v(lambda r, s: dvfs_step(s, r.launch, shapes, r.doms))(runs, states)
        moved = states.freq != old

        def follow(r, w, clock, old_freq):
            return reclock(w, clock, old_freq, r.launch, shapes, r.launches)

        states = _rewake(runs, states, moved, follow, old)
        changed = changed | moved
    return v(lambda r, s, o: skip_to_next_event(s, r.launch, shapes, s.ctas_done >= r.launch.n_ctas, r.launches, o))(
        runs, states, looks._replace(changed=changed))


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
    (from `begin`, default tick 0), and the number of steps they took.

    Once a configuration has ended its steps still run (until the batch's last ends); only what
    results read and a step still changes (`_frozen`) is kept from its end. The per-CTA trace,
    the warps and the CTA slots of an ended configuration change no more: its CTAs are all done."""

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

    begin = jax.vmap(lambda r: start(r, shapes))(runs) if begin is None else begin
    return jax.lax.while_loop(any_running, body, (begin, jnp.int32(0)))
