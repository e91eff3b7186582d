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
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

from ..lower import Launch, Shapes
from .mechanics import columns
from .cycle import run_tick
from .decouple import Decision, Decoupling, align, decide, dvfs_due, limit, settle, wanting
from .dispatch import Slots, Variation, commit, has_work, place, placed, plan, start_warps
from .dispatch_policies import ESTIMATE_POLICIES, init, is_one_of, observe
from .events import skip_to_next_event
from .fast_forward import fast_forward
from .grid_barrier import grid_barrier
from .intervals import Clock, cta_warps, reclock, release
from .launches import Launches, initial_ready
from .power import Domains, dvfs_step, initial_dvfs, next_dvfs_event
from .residency import warp_cta
from .state import INF, NO_WARP, STALL_REASONS, Dispatch, State, Warps, initial_state
from .status import LONG_SB, WAIT


class Run(NamedTuple):
    """What a configuration's event loop reads at every step (computed once per run)."""

    launch: Launch
    launches: Launches
    variation: Variation
    doms: Domains
    decoupling: Decoupling  # whether and how its SMs run on their own time (`decouple.py`)


def start(run: Run, shapes: Shapes) -> State:
    """The state at tick 0: clocks and DVFS at their start, launches without dependencies
    ready, every SM holding a full launch credit."""
    launch = run.launch
    state = initial_state(shapes)
    freq, dv = initial_dvfs(launch, state.dvfs)
    return dataclasses.replace(state, freq=freq, dvfs=dv, kernel_ready=initial_ready(run.launches),
                               dispatch=init(launch, state.dispatch),
                               launch_credit=jnp.full_like(state.launch_credit, launch.chip.launch_idle_cycles))


def _batch_of_one(runs: Run) -> bool:
    """Whether the batch holds one configuration (the CPU's chunk): its loop ends with it, and
    its warp policy is the batch's (`loop`, `warp_scheduler.select`)."""
    return runs.launch.policy.warp_policy.shape[0] == 1


def running(run: Run, state: State, max_ticks: int) -> Array:
    """CTAs remain and the tick limit is not reached (on their own time: by some SM)."""
    own = jnp.any(run.launch.chip.sm_enabled & (state.acct < max_ticks - 1))
    return (state.ctas_done < run.launch.program.n_ctas) & jnp.where(run.decoupling.free, own, state.tick < max_ticks)


def _columns_per_pass() -> int:
    """SMs per configuration per pass of the per-warp work after the SM cycles: 4 on the CPU,
    where a chunk is one configuration, 8 on a GPU, where a pass is a train of kernels launched
    from the host (docs/engine_performance.md, "The previous section's loop changes on the H200, and the loop
    constants" and "One CPU device per core"). Results do not depend on it."""
    return 4 if jax.default_backend() == "cpu" else 8


_PLACEMENTS = 2  # placements per configuration per iteration of the placement loop
_WEIGH_EVERY = 4  # steps between two looks at the SMs that wait for a CTA on their own time


def _place(runs: Run, states: State, shapes: Shapes, closed_loop: bool, at: Decision) -> Slots:
    """Section 9's placements of the batch on the SMs `at` names, each at its tick:
    `_PLACEMENTS` per iteration of one loop (a configuration with no work left keeps its
    table), until no configuration has work."""
    v = jax.vmap
    slots, plans = v(lambda r, s, a: plan(s, r.launch, shapes, s.tick, closed_loop, a.start, a.candidate))(
        runs, states, at)
    work = v(lambda r, x, p: has_work(x, p, r.launch, r.launches, shapes))(runs, slots, plans)

    def body(c: tuple) -> tuple:
        for _ in range(_PLACEMENTS):
            c = v(lambda r, x, w, p: place(x, w, p, r.launch, r.launches, shapes, closed_loop))(runs, *c, plans)
        return c

    return jax.lax.while_loop(lambda c: jnp.any(c[1]), body, (slots, work))[0]


def _dispatch(runs: Run, states: State, was_occupied: Bool[Array, "batch cta sm"], shapes: Shapes, at: Decision
              ) -> tuple[State, Slots]:
    """The closed loop's learning of the CTAs completed in the tick's cycles (`was_occupied`:
    the slots that held a CTA before them), then the tick's placements (`_place`). Where no
    configuration dispatches by the closed loop, its estimates decide nothing, so the learning,
    the censored estimates, the hold and the closed loop's score are left out: at compile time
    where no configuration of the call (or of the sweep it is a chunk of) needs them
    (`Shapes.closed_loop`), else by a batch-level conditional where no configuration of the
    batch does. They are 5 % of an H200 step at batch 4096, 7 % of a CPU step at 4
    configurations per chunk, about 1 % at one (docs/engine_performance.md, "The closed loop's work only
    where it decides something"). Results do not depend on either."""
    def closed(s: State) -> tuple[Dispatch, Slots]:
        learnt = jax.vmap(lambda r, x, o: observe(x, o, r.launch))(runs, s, was_occupied)
        return learnt, _place(runs, dataclasses.replace(s, dispatch=learnt), shapes, True, at)

    def open_loop(s: State) -> tuple[Dispatch, Slots]:
        return s.dispatch, _place(runs, s, shapes, False, at)

    if shapes.closed_loop:
        learns = jnp.any(is_one_of(runs.launch.policy.dispatch_policy, ESTIMATE_POLICIES))
        learnt, slots = jax.lax.cond(learns, closed, open_loop, states)
    else:
        learnt, slots = open_loop(states)
    return dataclasses.replace(states, dispatch=learnt), slots


class _Touched(NamedTuple):
    """Per configuration, what the tick did to its warps after their SM cycles."""

    released: Bool[Array, "cta sm"]  # CTA barriers released in the cycles
    new: Bool[Array, "cta sm"]  # CTA slots that took a CTA in the tick's placements
    cta_id: Int[Array, "cta sm"]  # the slot table after the placements
    cta_launch: Int[Array, "cta sm"]
    base: Int[Array, "cta sm"]  # each new CTA's first warp slot (several launches; `residency.py`)
    warp_cta: Int[Array, "warp sm"]  # the CTA slot of each warp before the placements (`residency.warp_cta`)
    grid: Bool[Array, ""]  # the grid barrier released


def _columns_work(run: Run, before: State, w: Warps, clock: Clock, freq: Array, t: _Touched, shapes: Shapes
                  ) -> tuple[Warps, Array, Array]:
    """The per-warp work on some SMs' columns after the tick's cycles, in the model's order:
    released warps start their intervals at the old clocks (`clock`), the placed CTAs' warps
    start (`before`: the state before the placements), and with DVFS the warps waiting on memory
    re-split at the new clocks (`freq`). Returns the warps, the (long, short, wait) cycles
    counted and the work items the new warps took."""
    released = cta_warps(t.released, w, t.warp_cta) | (t.grid & (w.pc != NO_WARP))
    wake, counted = release(w, released, clock, run.launch, shapes, run.launches)
    w, took = start_warps(dataclasses.replace(w, wake=wake), t.new, t.cta_id, t.cta_launch, t.base, before,
                          run.launch, shapes, run.variation, run.launches)
    if shapes.dvfs:
        wake, delta = reclock(w, clock._replace(freq=freq), clock.freq, run.launch, shapes, run.launches)
        w, counted = dataclasses.replace(w, wake=wake), counted + delta
    return w, counted, took


def _as_stall_rows(counted: Int[Array, "batch 3 k"]) -> Int[Array, "batch reason k"]:
    """(long, short, wait) cycles as rows of the stall table, zero elsewhere."""
    return jnp.pad(counted.astype(jnp.int64), ((0, 0), (LONG_SB, len(STALL_REASONS) - WAIT - 1), (0, 0)))


def _warp_work(runs: Run, states: State, t: _Touched, old_freq: Array, shapes: Shapes) -> tuple[State, Array, Array]:
    """`_columns_work` on every SM that needs it (`columns.for_marked_sms`), `states` being the
    state before the placements' commit. Returns the state, the SMs touched (their next cycle is
    an event) and the work items the new warps took."""
    marked = (jnp.any(t.released, axis=1) | jnp.any(t.new, axis=1) | (t.grid[:, None] & runs.launch.chip.sm_enabled)
              | (states.freq != old_freq))

    def work(at: Array, carry: tuple) -> tuple:
        warps, stalls, took = carry
        sub = lambda x: columns.take(x, at)  # noqa: E731
        clock = Clock(sub(states.acct), sub(states.cycle), sub(states.acc), sub(old_freq))
        cols = _Touched(sub(t.released), sub(t.new), sub(t.cta_id), sub(t.cta_launch), sub(t.base), sub(t.warp_cta),
                        t.grid)
        w, counted, tk = jax.vmap(lambda *a: _columns_work(*a, shapes))(
            runs, states, jax.tree.map(sub, warps), clock, sub(states.freq), cols)
        return (jax.tree.map(lambda x, y: columns.put(x, at, y), warps, w),
                columns.put(stalls, at, sub(stalls) + _as_stall_rows(counted)), columns.put(took, at, tk))

    warps, stalls, took = columns.for_marked_sms(
        marked, work, (states.warps, states.counters.sm_stalls, jnp.zeros_like(states.resident)), _columns_per_pass())
    states = dataclasses.replace(states, warps=warps, counters=dataclasses.replace(states.counters, sm_stalls=stalls))
    return states, marked, took


def _decide(runs: Run, states: State, shapes: Shapes, ran: Bool[Array, "batch sm"], tick: Int[Array, "batch sm"]
            ) -> tuple[State, Decision]:
    """Which SMs take CTAs in this step, at which tick: every enabled SM at the chip's tick, or
    on their own time the decision of `decouple.decide`, made where some SM of the batch wants
    a CTA or waits for one (a batch-level conditional: `decide` reads every warp)."""
    v = jax.vmap
    chip = Decision(candidate=runs.launch.chip.sm_enabled, start=jnp.broadcast_to(states.tick[:, None], tick.shape),
                    park=states.park)
    if not shapes.free_sms:
        return states, chip
    want = v(lambda r, s, x, t: wanting(s, r.launch, r.launches, shapes, r.decoupling, x, t))(runs, states, ran, tick)
    none = Decision(candidate=jnp.zeros_like(ran), start=chip.start, park=states.park)
    # SMs that wait are weighed again every `_WEIGH_EVERY` steps of their configuration (its own
    # count: an ended one's stays put), as the others' progress frees them
    weigh = jnp.any(want) | jnp.any((states.park < INF) & (states.steps % _WEIGH_EVERY == 0)[:, None])
    own = jax.lax.cond(weigh,
                       lambda: v(lambda r, s, w, t: decide(s, r.launch, r.launches, shapes, r.decoupling, w, t))(
                           runs, states, want, tick),
                       lambda: none)
    free = runs.decoupling.free[:, None]
    at = Decision(*(jnp.where(free, o, c) for o, c in zip(own, chip)))
    return dataclasses.replace(states, park=at.park), at


def step(runs: Run, states: State, shapes: Shapes, max_ticks: int) -> State:
    """One event of every configuration: the SM cycles (every SM at the chip's tick, or each at
    its own: `decouple.py`), the grid barrier, dispatch, DVFS, the per-warp work all of these
    leave (`_warp_work`), fast-forward, then the skip to the next event. An SM whose warps
    anything after its cycles touched (a release, new CTAs, a clock change) has its next cycle
    as an event."""
    v = jax.vmap
    one = jnp.minimum(jnp.min(runs.launch.clocks.tick_mhz), 1)  # a traced 1 (`materialize.once`)
    was_occupied = states.cta_id >= 0
    policy = runs.launch.policy.warp_policy[0] if _batch_of_one(runs) else None  # `warp_scheduler.select`
    last = v(lambda r, s: limit(s, r.launch, r.decoupling, max_ticks))(runs, states)
    tick = jnp.where(runs.decoupling.free[:, None], states.resume, states.tick[:, None])
    ran = runs.launch.chip.sm_enabled & (states.resume <= last)
    states, looks, released = v(lambda r, s, t, x: run_tick(s, r.launch, shapes, r.launches, one, t, x, policy))(
        runs, states, tick, ran)
    states, due = v(lambda r, s: grid_barrier(s, r.launch))(runs, states)
    states, at = _decide(runs, states, shapes, ran, tick)
    states, slots = _dispatch(runs, states, was_occupied, shapes, at)
    old_freq = states.freq
    if shapes.dvfs:  # with DVFS off the step changes nothing (section 12)
        states = v(lambda r, s: dvfs_step(s, r.launch, shapes, r.doms, jnp.where(r.decoupling.free,
                                                                                 next_dvfs_event(s, r.launch), s.tick),
                                          dvfs_due(s, r.launch, r.decoupling)))(runs, states)
    touched = _Touched(released, v(placed)(states, slots), slots.cta_id, slots.cta_launch, slots.base,
                       v(lambda r, s: warp_cta(s.warp_cta, r.launch, shapes))(runs, states), due)
    states, marked, took = _warp_work(runs, states, touched, old_freq, shapes)
    states = v(lambda r, s, x, t: commit(s, x, t, r.launch, r.launches, shapes))(runs, states, slots, took)
    looks = looks._replace(changed=looks.changed | marked)
    if shapes.fast_forward:
        states, looks = fast_forward(runs, states, looks, shapes, max_ticks, one)
    states = dataclasses.replace(states, steps=states.steps + 1)
    return v(lambda r, s, o: skip_to_next_event(s, r.launch, shapes, s.ctas_done >= r.launch.program.n_ctas,
                                                r.launches, o, one, r.decoupling, max_ticks))(runs, states, looks)


def _frozen(state: State) -> dict:
    """What results read that an ended configuration's steps would still change: its clocks keep
    ticking (cycles, DVFS), and a configuration stopped by the tick limit keeps running."""
    c = state.counters
    return dict(tick=state.tick, acct=state.acct, acc=state.acc, steps=state.steps, ctas_done=state.ctas_done,
                last_exit_tick=state.last_exit_tick,
                kernel_ready=state.kernel_ready, kernel_start=state.kernel_start, kernel_end=state.kernel_end,
                freq=state.freq, dvfs=state.dvfs,
                counters=dataclasses.replace(c, cta_sm=None, cta_start_tick=None, cta_end_tick=None, cta_key=None))


def loop(runs: Run, shapes: Shapes, max_ticks: int, begin: State | None = None) -> tuple[State, Int[Array, ""]]:
    """The event loops of a batch (a leading axis on `runs`), run together until the last ends
    (from `begin`, default tick 0), and the number of steps they took.

    Once a configuration has ended its steps still run (until the batch's last ends); only what
    results read and a step still changes (`_frozen`) is kept from its end. The per-CTA trace,
    the warps and the CTA slots of an ended configuration change no more: its CTAs are all done.
    A batch of one (the CPU's chunk) needs no keeping: its loop ends with it. Skipping the
    selects, and the copies that keeping both values costs, made the CPU's whole loop about 2 %
    faster and its compile about 1 s shorter (docs/engine_performance.md,
    "The CPU step's recomputed values, found through a profile without the per-kernel overhead")."""

    one_config = _batch_of_one(runs)

    def body(carry: tuple[State, Array]) -> tuple[State, Array]:
        states, n = carry
        stepped = step(runs, states, shapes, max_ticks)
        if one_config:  # its loop stops with it: no step runs past its end
            return stepped, n + 1
        going = jax.vmap(lambda r, s: running(r, s, max_ticks))(runs, states)

        def keep(new, old):
            return None if new is None else jnp.where(going.reshape(-1, *[1] * (new.ndim - 1)), new, old)

        kept = jax.tree.map(keep, _frozen(stepped), _frozen(states), is_leaf=lambda x: x is None)
        counters = dataclasses.replace(kept.pop("counters"), cta_sm=stepped.counters.cta_sm,
                                       cta_start_tick=stepped.counters.cta_start_tick,
                                       cta_end_tick=stepped.counters.cta_end_tick,
                                       cta_key=stepped.counters.cta_key)
        return dataclasses.replace(stepped, counters=counters, **kept), n + 1

    def any_running(carry: tuple[State, Array]) -> Array:
        return jnp.any(jax.vmap(lambda r, s: running(r, s, max_ticks))(runs, carry[0]))

    begin = jax.vmap(lambda r: start(r, shapes))(runs) if begin is None else begin
    final, n = jax.lax.while_loop(any_running, body, (begin, jnp.int32(0)))
    return jax.vmap(lambda r, s: settle(align(s, r.launch), r.decoupling, r.launch.program.n_ctas))(runs, final), n
