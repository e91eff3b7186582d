"""SMs on their own time: between the events that couple them to the chip, every SM advances by
its own next event, not by the chip's (docs/model.md section 11, "SMs on their own time").

With one global tick, a step of the event loop happens wherever *any* SM has an event, so a chip
of SMs at many clocks steps the union of their events: a recurrence search after one SM's CTA
refill costs every other SM a step too. But an SM's cycles depend on the rest of the chip only
through what couples them: the chip-wide memory queues (global loads), the grid barrier, the
persistent work queue, the launches of a workload, the DVFS controller, and CTA dispatch. Where
a configuration has none of the first four (`Decoupling.free`), each step runs every SM at its
own next event tick, and the chip acts only where it must:

- **DVFS.** A sample reads every SM's counters at its tick and may change every clock, so no SM
  runs past the next DVFS event until every SM has reached it (`limit`); then the DVFS step runs
  at that tick, as in the model.
- **Dispatch.** A CTA placed on an SM at tick `w` changes it from `w + 1` on, so an SM that wants
  a CTA at `w` (a usable free slot while CTAs remain) takes it at its own `w`, in one of two ways:
  - *When enough CTAs are sure to remain* (`Decoupling.spec`): every SM that wants one at a tick
    up to `W` gets one if the CTAs not yet placed outnumber every placement that can still come at
    a tick up to `W` (`reach`). Which CTA it gets (its index in the grid) depends on the other
    SMs' placements before it, so this needs CTAs that do not differ (`uniform`: the same trip
    counts and branch lanes for every CTA) and a policy that orders the CTAs of one tick by a
    score of each SM's own state (`STATIC` in `dispatch_policies/`: hardware, least loaded, weighted). CTAs are numbered in the
    order they are placed; each keeps its placement tick and score, and at the end the trace is
    put in the grid order the model's dispatcher gives: by tick, then by score (`settle`). Warp
    ages only order the warps of one SM, and an SM takes its CTAs in grid order either way.
  - *Otherwise* it waits (`State.park`) until no SM that could still place a CTA at a tick up to
    `w` is behind `w`; then the SMs waiting at the earliest such tick take their CTAs there, by
    the model's dispatcher, exactly.

"Could still place a CTA at a tick up to `w`" is bounded from below by the loop: a warp with `n`
trips left issues for at least `(n - 1)` times the shortest trip's cycles (`trip_cycles`), and
a cycle takes at least a tick, so its CTA cannot end, nor its slot take another CTA, before then.
Closed-loop dispatch reads every SM's CTA durations when it holds CTAs back, so it keeps the
chip's tick, as do configurations with any of the couplings above: every SM runs at the chip's
tick, which moves to the earliest event of any SM (`events.skip_to_next_event`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

from ..isa import Op
from ..kernel import FIXED, MAX_DEP_SLOTS, MIO
from ..lower import Launch, Program, Shapes
from .dispatch import Variation, takes_now
from .dispatch_policies import ESTIMATE_POLICIES, STATIC_POLICIES, is_one_of
from .mechanics.exact import floor_div
from .launches import Launches
from .power import next_dvfs_event
from .slots import hardware_position
from .state import INF, N_PIPES, NO_WARP, State
from .status import cycles_in


class Decoupling(NamedTuple):
    """Per configuration, whether and how its SMs run on their own time (computed once per run)."""

    free: Bool[Array, ""]  # SMs run on their own time between DVFS events and dispatches
    spec: Bool[Array, ""]  # an SM may take CTAs at its own tick while enough are sure to remain
    trip_cycles: Int[Array, ""]  # int64: the fewest cycles a warp spends on one loop trip (0: no loop)
    fresh_ticks: Int[Array, ""]  # int64, >= 1: the fewest ticks any CTA runs


def trip_bounds(program: Program, taken_branch_cycles: Int[Array, ""]) -> tuple[Int[Array, ""], Int[Array, ""]]:
    """The fewest cycles one warp spends on one trip of its loop, and the fewest instructions it
    issues on one (int64; 0 unless the program has one loop, at index 0).

    A warp issues one instruction per cycle at most; an instruction that waits for the result of
    the one before it issues no earlier than that one's latency; the taken
    back-edge refetches for `taken_branch_cycles`. A trip may skip either side of an if/else
    inside the loop, not both; with one, only the instruction count bounds the cycles; with
    several, or with several loops, the bounds are 0 (nothing is assumed)."""
    n = program.op.shape[0]
    i = jnp.arange(n, dtype=jnp.int32)
    start, end = program.loop_start[0], program.loop_end[0]
    body = (i >= start) & (i <= end)
    lat = jnp.maximum(program.lat_cycles, 1).astype(jnp.int64)
    waits = (program.op < N_PIPES) | (program.op == Op.LDS) | (program.op == Op.SHFL)
    kind = jnp.where(program.op < N_PIPES, FIXED, MIO)  # of the results that bound a trip
    on = lambda w, at: (w >> (MAX_DEP_SLOTS * kind[at])) & program.writes[at]  # noqa: E731  (waits on `at`)
    follows = on(jnp.roll(program.waits, -1), i) != 0  # the next instruction waits for this one
    gap = jnp.where(waits & follows, lat, 1)
    at_end = jnp.clip(end, 0, n - 1)
    refetch = jnp.maximum(taken_branch_cycles.astype(jnp.int64), 1)
    carried = on(program.waits[jnp.clip(start, 0, n - 1)], at_end) != 0
    back = jnp.maximum(refetch, jnp.where(carried & waits[at_end], lat[at_end], 1))
    chain = jnp.sum(jnp.where(body & (i < end), gap, 0)) + back
    b0, b1, mid = program.branch_start[0], program.branch_end[0], program.branch_mid[0]
    inside = (b0 >= 0) & (b0 >= start) & (b1 <= end)
    issues = jnp.sum(body, dtype=jnp.int64) - jnp.where(inside, jnp.maximum(mid - b0, b1 - mid), 0).astype(jnp.int64)
    cycles = jnp.where(inside, jnp.maximum(issues - 1, 0) + refetch, chain)
    one = ((start >= 0) & (jnp.sum(program.loop_start >= 0) == 1) & (jnp.sum(program.branch_start >= 0) <= 1)
           & ((b0 < 0) | inside | (b1 <= start) | (b0 > end)))
    return jnp.where(one, cycles, 0), jnp.where(one, issues, 0)


def decoupling(launch: Launch, launches: Launches, variation: Variation, shapes: Shapes) -> Decoupling:
    """Whether the configuration's SMs may run on their own time, and may take CTAs at their own
    tick before the others catch up (the module's docstring)."""
    if shapes.n_launches > 1 or not shapes.free_sms:
        false, zero = jnp.bool_(False), jnp.int64(0)
        return Decoupling(false, false, zero, jnp.int64(1))
    prog = launch.program
    free = (~jnp.any(prog.op == Op.LDG) & ~jnp.any(prog.grid_sync) & (prog.work_items == 0)
            & ~is_one_of(launch.policy.dispatch_policy, ESTIMATE_POLICIES))  # a learning policy reads every SM
    real = jnp.arange(shapes.max_ctas, dtype=jnp.int32) < launch.program.n_ctas
    packed = variation.packed
    uniform = jnp.all(~real[:, None, None] | (packed == packed[0][None]))
    policy = launch.policy.dispatch_policy
    static_score = is_one_of(policy, STATIC_POLICIES)
    no_bound = (jnp.int64(0), jnp.int64(0))
    cycles, issues = trip_bounds(prog, launch.chip.taken_branch_cycles) if shapes.loops == 1 else no_bound
    # A new CTA runs at least as long as its longest warp's trips take, and as its warps' trips
    # take to issue on the schedulers at best.
    warp = jnp.arange(packed.shape[1], dtype=jnp.int32) < launch.program.warps_per_cta
    left = jnp.where(warp[None, :], jnp.maximum(packed[..., 0] - 1, 0), 0).astype(jnp.int64)
    alone = jnp.maximum(jnp.max(left, axis=1) * cycles, jnp.sum(left, axis=1) * issues // shapes.schedulers)
    fresh = jnp.min(jnp.where(real, alone, jnp.iinfo(jnp.int64).max))
    return Decoupling(free, free & uniform & static_score, cycles, jnp.maximum(fresh, 1))


def limit(state: State, launch: Launch, d: Decoupling, max_ticks: int) -> Int[Array, " sm"]:
    """The last tick each SM may run in this step: the chip's tick, or on its own time the tick
    it waits at for the dispatcher, the next DVFS event, or the tick limit."""
    own = jnp.minimum(jnp.minimum(state.park, next_dvfs_event(state, launch)), max_ticks - 1)
    return jnp.where(d.free, own, state.tick)


_NEVER = 1 << 40  # ticks: a slot that never takes a CTA (sums of a few stay inside int64)


def _thresholds(state: State, launch: Launch, shapes: Shapes, d: Decoupling) -> Int[Array, "cta sm"]:
    """Per CTA slot, the earliest tick at which it could take a CTA that is not placed yet
    (int64; `_NEVER` past `ctas_per_sm` and on floorswept SMs): a free slot from the SM's tick or
    the end of its launch latency on; an occupied one once its CTA ends, which is no earlier than
    its last warp's trips left take (`(n - 1) trip_cycles` cycles; a cycle takes a tick at least),
    plus the launch latency. An SM past a tick has placed every CTA it takes up to it."""
    slots = jnp.arange(shapes.cta_slots, dtype=jnp.int32)
    in_range = (slots[:, None] < launch.program.ctas_per_sm) & launch.chip.sm_enabled
    last = hardware_position((slots + 1) * launch.program.warps_per_cta - 1, shapes)  # each slot's last warp
    w = state.warps
    left = jnp.where(w.pc[last] != NO_WARP, jnp.maximum(w.trips_left[0][last] - 1, 0), 0).astype(jnp.int64)
    now = state.acct.astype(jnp.int64)
    first = jnp.where(state.cta_id < 0, jnp.maximum(now, state.cta_usable_tick),
                      now + left * d.trip_cycles + launch.chip.cta_launch_ticks)
    return jnp.where(in_range, jnp.minimum(first, _NEVER), _NEVER)


def reach(first: Int[Array, "cta sm"], d: Decoupling, until: Int[Array, " h"]) -> Int[Array, " h"]:
    """For each horizon `until[i]`, an upper bound of the CTAs the chip's SMs could still place
    at ticks up to it that are not placed yet: every slot from its `first` tick
    (`_thresholds`), then again after each `fresh_ticks`, the shortest a CTA runs."""
    h = jnp.asarray(until, jnp.int64)[:, None, None]
    # float64 holds these integers exactly, and its rounded quotient's floor is never below the
    # exact one: still an upper bound, without int64 division (slow on a CPU)
    again = jnp.floor((h - first).astype(jnp.float64) / d.fresh_ticks.astype(jnp.float64)).astype(jnp.int64)
    return jnp.sum(jnp.where(first <= h, 1 + again, 0), axis=(1, 2))


_HORIZONS = 8  # ticks at which `decide` weighs the CTAs that remain


def _may_place(first: Int[Array, "cta sm"], state: State, until: Int[Array, ""]) -> Bool[Array, " sm"]:
    """SMs behind `until` that could still place a CTA at a tick up to it (`first`:
    `_thresholds`)."""
    return (state.acct < until) & jnp.any(first <= until, axis=0)


class Decision(NamedTuple):
    """Which SMs take CTAs in this step and at which tick, and where SMs wait."""

    candidate: Bool[Array, " sm"]
    start: Int[Array, " sm"]
    park: Int[Array, " sm"]


def wanting(state: State, launch: Launch, launches: Launches, shapes: Shapes, d: Decoupling,
            ran: Bool[Array, " sm"], tick: Int[Array, " sm"]) -> Bool[Array, " sm"]:
    """SMs on their own time that ran at `tick` and could take a CTA there while CTAs remain."""
    room = jnp.any(takes_now(state, launch, shapes, tick), axis=0)
    ready = tick >= state.kernel_ready[0]  # one launch: ready from its submit and launch gap on
    return d.free & ran & room & ready & jnp.any(state.next_cta < launches.n_ctas)


def decide(state: State, launch: Launch, launches: Launches, shapes: Shapes, d: Decoupling,
           want: Bool[Array, " sm"], tick: Int[Array, " sm"]) -> Decision:
    """Dispatch on their own time (the module's docstring): every SM that wants a CTA (`want`,
    at `tick`, or waiting since its `park` tick) takes it at its own tick if enough are sure to
    remain up to a tick `h` (every placement that can still come at a tick up to `h` finds a
    CTA), taking the latest of `_HORIZONS` ticks spread over the SMs' ticks for which they are;
    the others wait, and the SMs
    waiting at the earliest tick take theirs when no SM that could place one before them is
    behind. `state.acct` holds the tick each SM has run to."""
    unplaced = (launches.n_ctas[0] - state.next_cta[0]).astype(jnp.int64)
    waiting = want | (state.park < INF)
    at = jnp.where(want, tick, state.park)
    first = _thresholds(state, launch, shapes, d)
    lo = jnp.min(jnp.where(waiting, at, INF)).astype(jnp.int64)
    hi = jnp.max(jnp.where(waiting, at, -1)).astype(jnp.int64)
    horizons = lo + (hi - lo) * jnp.arange(_HORIZONS, dtype=jnp.int64) // (_HORIZONS - 1)
    enough = d.spec & jnp.any(waiting) & (reach(first, d, horizons) <= unplaced)
    sure = waiting & (at <= jnp.max(jnp.where(enough, horizons, -1)))
    park = jnp.where(sure, INF, at)
    earliest = jnp.min(park)
    group = park == earliest
    fire = (earliest < INF) & ~jnp.any(_may_place(first, state, earliest)) & ~jnp.any(sure)
    return Decision(candidate=sure | (fire & group), start=jnp.where(sure, at, earliest),
                    park=jnp.where(fire & group, INF, park))


def chip_tick(state: State, launch: Launch, d: Decoupling, max_ticks: int, lockstep: Int[Array, ""]
              ) -> Int[Array, ""]:
    """The chip's next tick: on its own time the earliest of the ticks SMs wait at for the
    dispatcher, the next DVFS event and the tick limit; else `lockstep`."""
    own = jnp.minimum(jnp.minimum(jnp.min(state.park), next_dvfs_event(state, launch)), max_ticks)
    return jnp.where(d.free, own, lockstep)


def dvfs_due(state: State, launch: Launch, d: Decoupling) -> Bool[Array, ""]:
    """Whether the DVFS step runs in this step: always at the chip's tick; on their own time,
    once every SM has run to the next DVFS event."""
    return ~d.free | jnp.all(~launch.chip.sm_enabled | (state.acct >= next_dvfs_event(state, launch)))


def align(state: State, launch: Launch) -> State:
    """Every SM's cycle count at the end of the run, at the makespan's last tick. On their own
    time SMs stop at different ticks, idle (their CTAs are all done): one that stopped early adds
    the cycles of the idle ticks up to the last one; one that ran ahead idle (with no event before
    the next DVFS event or the tick limit) takes back those past it. The phase accumulator,
    `acc = acc0 + n f - c F` in `[0, F)`, gives the `c` cycles of its last `n` ticks back:
    `c = ceil((n f - acc) / F)`. Nothing else counts on an idle SM."""
    last = state.last_exit_tick
    gap = (last - state.acct).astype(jnp.int64)
    f = state.freq.astype(jnp.int64)
    forward = cycles_in(state.freq, state.acc, launch.clocks.tick_mhz, jnp.maximum(gap, 0))
    back = jnp.maximum(floor_div(-gap * f - state.acc + launch.clocks.tick_mhz - 1, launch.clocks.tick_mhz), 0)
    change = jnp.where(gap > 0, forward, jnp.where(gap < 0, -back, 0))
    sm_cycles = state.counters.sm_cycles + jnp.where(launch.chip.sm_enabled, change, 0)
    counters = replace(state.counters, sm_cycles=sm_cycles)
    return replace(state, counters=counters)


def settle(state: State, d: Decoupling, n_ctas: Int[Array, ""]) -> State:
    """The per-CTA trace in grid order (a no-op unless CTAs were placed at their SMs' own ticks):
    the model's dispatcher numbers the CTAs of one tick in the order of their SMs' scores, and
    each SM's scores fall as it takes CTAs, so the grid order is by (start tick, score), the
    order of the dispatcher's greedy choices."""
    c = state.counters
    g = jnp.arange(c.cta_sm.shape[0], dtype=jnp.int32)
    past = (g >= n_ctas).astype(jnp.int32)
    *_, order = jax.lax.sort((past, c.cta_start_tick, -c.cta_key, g), num_keys=3)
    order = jnp.where(d.spec, order, g)
    return replace(state, counters=replace(c, cta_sm=c.cta_sm[order], cta_start_tick=c.cta_start_tick[order],
                                           cta_end_tick=c.cta_end_tick[order], cta_key=c.cta_key[order]))
