"""CTA dispatch, the GigaThread engine (docs/model.md section 9).

A policy is a score per SM (one module per policy in `dispatch_policies/`); the next CTA goes to
the highest-scoring SM with a usable free CTA slot, one CTA at a time, scores re-evaluated after
every placement. A slot freed at tick `e` is
usable from `e + cta_launch_ticks` (the launch path's latency); a slot that has held a CTA is
refilled only on an SM that holds the launch credit (each refill spends it), so "room" counts
usable free slots while `resident` still counts occupied ones. Policies are selected by a
traced index, so one compiled simulation serves all of them. The closed loop's own work (its
estimates, its hold, its score) is compiled in twice, with and without it (`closed_loop`): a
batch without a closed-loop configuration skips it (`step._dispatch`).

A tick's dispatch is four steps, so that a batch runs its placement loop itself
(`step._place`): `plan` (the slot table and what the placements read), `place` until no
configuration `has_work` (one CTA per call; the loop carries only the CTA-slot table),
`start_warps` (the warps of every CTA placed, on the SMs that took one, from per-CTA
variation tables computed once per run), and `commit` (CTA tables and counters). Under `vmap`
a `while_loop` selects its whole carry at every iteration; a batch-level loop over `place`,
which keeps a configuration without work as it was, does not.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

from ..lower import Launch, Shapes
from .dispatch_policies import View, estimates, pointer_after, scores
from .dispatch_policies import hold as policy_hold
from .launch_credit import can_launch
from .launches import Launches, head_launch, op_and_waits, warp_program
from .residency import first_base, free_warp_slots, new_warps, room as resource_room
from .slots import cta_slot_of, hardware_slot
from .state import INF, Dispatch, State, Warps
from .status import op_class
from .variation import resolve_pc, warp_variation



class Variation(NamedTuple):
    """Per CTA and warp-in-CTA, its trips per loop then its lanes per branch (`if | else << 6`,
    `variation.warp_variation`; docs/model.md section 4): one gather at launch."""

    packed: Int[Array, "grid 32 loop+branch"]


def variation_tables(launch: Launch, shapes: Shapes, launches: Launches | None = None) -> Variation:
    """Over the global CTA index g. With `launches`, `launch` holds the launches' lowerings
    stacked on a leading axis, and CTA g varies by its own launch's numbers at its local index
    (docs/model.md section 13); without, `launch` is the only launch."""
    cta = jnp.arange(shapes.max_ctas, dtype=jnp.int32)
    warp = jnp.arange(32, dtype=jnp.int32)
    if launches is None:
        trips, _, branch_lanes = jax.vmap(lambda c: warp_variation(launch.program, c, warp))(cta)
    else:
        l = jnp.maximum(launches.cta_launch, 0)

        def one(l: Array, c: Array) -> tuple[Array, Array, Array]:
            return warp_variation(jax.tree.map(lambda x: x[l], launch.program), c, warp)

        trips, _, branch_lanes = jax.vmap(one)(l, cta - launches.cta_base[l])
    return Variation(jnp.concatenate([trips, branch_lanes], axis=-1))


class Slots(NamedTuple):
    cta_id: Int[Array, "cta sm"]
    cta_launch: Int[Array, "cta sm"]
    resident: Int[Array, " sm"]
    live_warps: Int[Array, " sm"]
    start: Int[Array, "cta sm"]  # start tick of each slot's CTA (closed loop)
    key: Int[Array, "cta sm"]  # the score each slot's CTA was placed at (int64): its order within its tick
    next_cta: Int[Array, " launch"]
    rr_pointer: Int[Array, ""]
    credit: Int[Array, " sm"]  # launch credit (docs/model.md section 9)
    hold: Bool[Array, ""]  # closed loop chose a full SM: nothing more this tick
    # several launches only ([0, sm] with one; engine/residency.py): the free warp slots in
    # hardware order, and the first warp slot of each slot's CTA placed in this tick
    warp_free: Bool[Array, "warp sm"]
    base: Int[Array, "cta sm"]


def _cta_slots(launch: Launch, shapes: Shapes) -> Bool[Array, "cta sm"]:
    """The CTA slots that exist in this launch: `j < ctas_per_sm` on enabled SMs."""
    in_range = jnp.arange(shapes.cta_slots, dtype=jnp.int32)[:, None] < launch.program.ctas_per_sm
    return in_range & launch.chip.sm_enabled


def _usable_slots(state: State, launch: Launch, shapes: Shapes, tick: Int[Array, ""]) -> Bool[Array, "cta sm"]:
    """CTA slots that may take a CTA in this tick once free: within `ctas_per_sm` and past the
    launch latency of the CTA that last left them (docs/model.md section 9)."""
    return _cta_slots(launch, shapes) & (state.cta_usable_tick <= tick)


def next_usable_tick(state: State, launch: Launch, shapes: Shapes, launches: Launches) -> Int[Array, ""]:
    """The earliest tick after this one at which a free slot becomes usable, while CTAs remain to
    dispatch (INF otherwise): an event for event skipping (docs/model.md section 11)."""
    waiting = _cta_slots(launch, shapes) & (state.cta_id < 0) & (state.cta_usable_tick > state.tick)
    soonest = jnp.min(jnp.where(waiting, state.cta_usable_tick, INF))
    return jnp.where(jnp.any(state.next_cta < launches.n_ctas), soonest, INF)


def takes_now(state: State, launch: Launch, shapes: Shapes, tick: Int[Array, " sm"]) -> Bool[Array, "cta sm"]:
    """The free slots of each SM that could take a CTA at its tick `tick` (`_takes_now` on the
    state)."""
    return ((state.cta_id < 0) & _usable_slots(state, launch, shapes, tick)
            & (~state.cta_used | can_launch(state.launch_credit, launch)))


def _takes_now(
    slots: Slots, usable: Bool[Array, "cta sm"], fresh: Bool[Array, "cta sm"], launch: Launch
) -> Bool[Array, "cta sm"]:
    """Free slots that can take a CTA now: usable (past their launch latency, 0 on floorswept
    SMs), and never used (`fresh`) or on an SM with launch credit (a refill needs credit, a
    first fill does not: section 9). Per SM, their count is its room."""
    return (slots.cta_id < 0) & usable & (fresh | can_launch(slots.credit, launch))


def _launching_tick(
    slots: Slots, launch: Launch, shapes: Shapes, usable_tick: Int[Array, "cta sm"], tick: Int[Array, ""],
) -> Int[Array, "cta sm"]:
    """When each free slot still in its launch latency becomes usable, for the closed loop's hold
    (INF: usable now, occupied or out of range). A used slot waiting for launch credit does not
    count: when its SM collects the credit depends on when its schedulers starve (section 9)."""
    free = _cta_slots(launch, shapes) & (slots.cta_id < 0)
    return jnp.where(free & (usable_tick > tick), usable_tick, INF)


def _room(slots: Slots, takes: Bool[Array, "cta sm"], head: Int[Array, ""], launch: Launch, launches: Launches,
          shapes: Shapes) -> Int[Array, " sm"]:
    """Per SM, the room for the head launch's CTAs: its free CTA slots that can take one now,
    and with several launches no more than its registers, shared memory and free warp slots
    hold beside its residents (docs/model.md section 13)."""
    room = jnp.sum(takes, axis=0, dtype=jnp.int32)
    if shapes.n_launches == 1:  # one shape: the occupancy bounds the CTA slots, and so the room
        return room
    return jnp.minimum(room, resource_room(slots.cta_id, slots.cta_launch, slots.warp_free, head, launch,
                                           launches, shapes))


def _place_one(
    slots: Slots,
    launch: Launch,
    launches: Launches,
    ready: Int[Array, " launch"],
    shapes: Shapes,
    usable: Bool[Array, "cta sm"],
    usable_tick: Int[Array, "cta sm"],
    fresh: Bool[Array, "cta sm"],
    est_all: Int[Array, "launch sm"],
    dev_all: Int[Array, "launch sm"],
    tick: Int[Array, ""],
    start_tick: Int[Array, " sm"],
    freq_mhz: Int[Array, " sm"],
    closed_loop: bool,
) -> Slots:
    """Place the head launch's next CTA (docs/model.md sections 9 and 13); without
    `closed_loop`, as if no configuration dispatched by it (no estimate read, no hold)."""
    _, head = head_launch(ready, slots.next_cta, launches, tick)
    est = est_all[head]
    local = slots.next_cta[head]
    takes = _takes_now(slots, usable, fresh, launch)
    room = _room(slots, takes, head, launch, launches, shapes)
    view = View(room=room, rank=launch.policy.dispatch_rank.astype(jnp.int64),
                n_enabled=jnp.maximum(jnp.sum(launch.chip.sm_enabled, dtype=jnp.int64), 1), pointer=slots.rr_pointer,
                live_warps=slots.live_warps, resident=slots.resident, weight=launch.policy.dispatch_weight, est=est,
                freq_mhz=freq_mhz)
    score = jnp.where(room > 0, scores(view, launch.policy.dispatch_policy, closed_loop), jnp.iinfo(jnp.int64).min)
    sm = jnp.argmax(score).astype(jnp.int32)
    hold = jnp.bool_(False)
    if closed_loop:
        launching_tick = _launching_tick(slots, launch, shapes, usable_tick, tick)
        hold = policy_hold(slots, launch, launching_tick, est, dev_all[head], sm, tick,
                           launches.n_ctas[head] - local)
    j = jnp.argmax(takes[:, sm]).astype(jnp.int32)  # lowest free slot that can take it
    # Masks rather than `.at[j, sm]` updates: vmapped, a scalar update is a scatter, which the
    # CPU runs as a kernel of its own; a select fuses with its neighbours (docs/engine_performance.md,
    # "Scatters out of the CPU's loops, the ratio measured in rounds").
    at_s = jnp.arange(slots.resident.shape[0]) == sm
    at_js = (jnp.arange(slots.cta_id.shape[0])[:, None] == j) & at_s
    n_w = launches.warps_per_cta[head]
    warp_free, base = slots.warp_free, slots.base
    if shapes.n_launches > 1:  # its warps take the first run of free warp slots from j * n_w on
        b = first_base(slots.warp_free[:, sm], n_w, j)
        h = jnp.arange(shapes.warp_slots, dtype=jnp.int32)[:, None]
        warp_free = slots.warp_free & ~(at_s & (h >= b) & (h < b + n_w))
        base = jnp.where(at_js, b, slots.base)
    placed = Slots(
        cta_id=jnp.where(at_js, launches.cta_base[head] + local, slots.cta_id),
        cta_launch=jnp.where(at_js, head, slots.cta_launch),
        resident=slots.resident + at_s.astype(jnp.int32),
        live_warps=slots.live_warps + at_s * n_w,
        start=jnp.where(at_js, start_tick[sm], slots.start),
        key=jnp.where(at_js, score[sm], slots.key),
        next_cta=slots.next_cta + (jnp.arange(slots.next_cta.shape[0]) == head),
        rr_pointer=pointer_after(view, launch.policy.dispatch_policy, sm),
        credit=slots.credit + at_s * jnp.where(fresh[j, sm], 0, -launch.chip.launch_idle_cycles),
        hold=jnp.bool_(False),
        warp_free=warp_free,
        base=base,
    )
    return jax.tree.map(lambda h, p: jnp.where(hold, h, p), slots._replace(hold=jnp.bool_(True)), placed)


def start_warps(
    w: Warps, new: Bool[Array, "cta sm"], cta_id: Int[Array, "cta sm"], cta_launch: Int[Array, "cta sm"],
    base: Int[Array, "cta sm"], state: State, launch: Launch, shapes: Shapes, variation: Variation,
    launches: Launches,
) -> tuple[Warps, Int[Array, " sm"]]:
    """Start the warps of the CTAs placed in this tick (`new`, placed as `cta_id` of `cta_launch`),
    and count per SM the work items their warps took (persistent kernels; `state` is the state
    before the tick's placements). With one launch slot w belongs to CTA slot w // W, warp
    w mod W; with several, a CTA's warps are the run from its `base` (`residency.py`). Works on
    any subset of SMs (the columns of every argument), as `columns.for_marked_sms` gives it."""
    slot = hardware_slot(shapes)
    if shapes.n_launches > 1:
        fresh, j_of, warp = new_warps(new, base, cta_launch, launches, shapes)
        cta = jnp.clip(jnp.take_along_axis(cta_id, j_of, axis=0), 0, shapes.max_ctas - 1)
        warp_launch = jnp.take_along_axis(cta_launch, j_of, axis=0)
        warp = jnp.clip(warp, 0, 31)
        n_w, lanes_last = launches.warps_per_cta[warp_launch], launches.lanes_last_warp[warp_launch]
    else:
        n_w, lanes_last = launch.program.warps_per_cta, launch.program.lanes_last_warp
        j_of = cta_slot_of(slot, n_w, shapes)
        warp = jnp.clip(slot - j_of * n_w, 0, 31)[:, None]
        fresh = new[j_of] & (slot < shapes.cta_slots * n_w)[:, None]
        cta = jnp.clip(cta_id[j_of], 0, shapes.max_ctas - 1)
        warp_launch = cta_launch[j_of]
    n_loops = shapes.loops
    packed = jnp.moveaxis(variation.packed[cta, warp], -1, 0)  # [loop + branch, warp, sm]
    trips, branch_lanes = packed[:n_loops], packed[n_loops:]
    # Persistent kernels (a workload's only launch): each new warp takes its first work item, in
    # placement then warp order.
    persistent = launch.program.work_items > 0
    order = (cta - state.next_cta[0]) * n_w + warp
    took = fresh & persistent & (order < launch.program.work_items - state.items_taken)
    trips = jnp.where(persistent, took.astype(jnp.int32)[None], trips)
    lanes = jnp.where(warp == n_w - 1, lanes_last, 32)
    pc0 = resolve_pc(warp_program(launches, warp_launch), jnp.zeros_like(fresh, jnp.int32), trips, branch_lanes)
    op0, _ = op_and_waits(launches, warp_launch, jnp.clip(pc0, 0, shapes.n_instr - 1))
    zero = jnp.zeros_like(pc0)
    warps = replace(
        w,
        pc=jnp.where(fresh, pc0, w.pc),
        trips_left=jnp.where(fresh, trips, w.trips_left),
        trips=jnp.where(fresh, trips, w.trips) if n_loops > 1 else w.trips,
        lanes=jnp.where(fresh, lanes, w.lanes),
        branch_lanes=jnp.where(fresh, branch_lanes, w.branch_lanes),
        age=jnp.where(fresh, 32 * cta + warp, w.age),
        ready_fixed=jnp.where(fresh, zero, w.ready_fixed),
        ready_mio=jnp.where(fresh, zero, w.ready_mio),
        ready_mem=jnp.where(fresh, zero, w.ready_mem),
        ready_fetch=jnp.where(fresh, zero, w.ready_fetch),
        launch=jnp.where(fresh, warp_launch, w.launch),
        # ready from its SM's next cycle on (all its ready times are 0)
        wake=jnp.where(fresh, zero, w.wake),
        issue_class=jnp.where(fresh, op_class(op0), w.issue_class),
    )

    return warps, jnp.sum(took, axis=0, dtype=jnp.int32)


class Plan(NamedTuple):
    """What the tick's placements read and do not change (docs/model.md section 9)."""

    tick: Int[Array, ""]
    start: Int[Array, " sm"]  # the tick each SM takes its CTAs at (the chip's, or its own: `decouple.py`)
    ready: Int[Array, " launch"]
    usable: Bool[Array, "cta sm"]  # past the launch latency
    usable_tick: Int[Array, "cta sm"]
    fresh: Bool[Array, "cta sm"]  # never used: a first fill needs no credit
    est: Int[Array, "launch sm"]  # the closed loop's censored estimates (unread without `closed_loop`)
    dev: Int[Array, "launch sm"]  # the closed loop's deviations (unread without `closed_loop`)
    freq_mhz: Int[Array, " sm"]  # each SM's clock now


def plan(state: State, launch: Launch, shapes: Shapes, tick: Int[Array, ""], closed_loop: bool,
         start: Int[Array, " sm"], candidate: Bool[Array, " sm"]) -> tuple[Slots, Plan]:
    """The CTA-slot table and the fixed inputs of the placements (the closed loop's censored
    estimates only with `closed_loop`): the SMs that may take CTAs now (`candidate`), each at
    its tick `start` (the chip's `tick`, or the SM's own where SMs run on their own time)."""
    live = jnp.sum(state.cta_live, axis=0, dtype=jnp.int32)
    several = shapes.n_launches > 1
    slots = Slots(state.cta_id, state.cta_launch, state.resident, live, state.cta_start,
                  jnp.zeros_like(state.cta_start, jnp.int64), state.next_cta, state.dispatch.pointer, state.launch_credit,
                  jnp.bool_(False), free_warp_slots(state.warp_cta, shapes) if several else state.warp_cta < 0,
                  jnp.zeros_like(state.cta_id) if several else state.warp_cta)
    usable = _usable_slots(state, launch, shapes, start) & candidate
    est, dev = estimates(state, launch, tick) if closed_loop else (state.dispatch.est, state.dispatch.sq)
    # A slot placed in this tick is occupied, so `fresh` needs no update during the tick.
    return slots, Plan(tick, start, state.kernel_ready, usable, state.cta_usable_tick, ~state.cta_used, est, dev,
                       state.freq)


def has_work(slots: Slots, p: Plan, launch: Launch, launches: Launches, shapes: Shapes) -> Bool[Array, ""]:
    """A launch is ready with CTAs left, an enabled SM has room for its next CTA and the closed
    loop does not hold: the placement loop goes on."""
    some, head = head_launch(p.ready, slots.next_cta, launches, p.tick)
    room = _room(slots, _takes_now(slots, p.usable, p.fresh, launch), head, launch, launches, shapes)
    return some & jnp.any(room > 0) & ~slots.hold


def place(slots: Slots, work: Bool[Array, ""], p: Plan, launch: Launch, launches: Launches,
          shapes: Shapes, closed_loop: bool) -> tuple[Slots, Bool[Array, ""]]:
    """One placement (`_place_one`) where there is `work` (`has_work`), else the table as it
    was; and whether there is work after it. A batch's placement loop runs this until no
    configuration has work, so every configuration's placements are its own sequence, as the
    model's loop within a tick."""
    new = _place_one(slots, launch, launches, p.ready, shapes, p.usable, p.usable_tick, p.fresh, p.est, p.dev, p.tick,
                     p.start, p.freq_mhz, closed_loop)
    slots = jax.tree.map(lambda a, b: jnp.where(work, a, b), new, slots)
    return slots, work & has_work(slots, p, launch, launches, shapes)


def placed(state: State, slots: Slots) -> Bool[Array, "cta sm"]:
    """The CTA slots that took a CTA in the tick's placements."""
    return (slots.cta_id >= 0) & (slots.cta_id != state.cta_id)


def commit(state: State, slots: Slots, took: Int[Array, " sm"], launch: Launch, launches: Launches,
           shapes: Shapes) -> State:
    """The CTA tables and counters after the placements (`slots`) and the work items their
    warps took (`took`, from `start_warps`; its warps are set there)."""
    new = placed(state, slots)
    warp_cta = state.warp_cta
    if shapes.n_launches > 1:
        fresh, j_of, _ = new_warps(new, slots.base, slots.cta_launch, launches, shapes)
        warp_cta = jnp.where(fresh, j_of, state.warp_cta)
    k = state.counters
    ids = jnp.where(new, slots.cta_id, shapes.max_ctas).reshape(-1)  # out of range: dropped
    sm_of = jnp.broadcast_to(jnp.arange(shapes.n_sm, dtype=jnp.int32)[None, :], new.shape).reshape(-1)
    first = jnp.min(jnp.where(new, slots.start, INF))
    return replace(
        state,
        cta_id=slots.cta_id,
        cta_launch=slots.cta_launch,
        cta_live=jnp.where(new, launches.warps_per_cta[jnp.clip(slots.cta_launch, 0, shapes.n_launches - 1)],
                           state.cta_live),
        warp_cta=warp_cta,
        cta_arrived=jnp.where(new, 0, state.cta_arrived),
        cta_start=slots.start,
        cta_used=state.cta_used | new,
        dispatch=Dispatch(est=state.dispatch.est, sq=state.dispatch.sq, hold=slots.hold, pointer=slots.rr_pointer),
        resident=slots.resident,
        next_cta=slots.next_cta,
        kernel_start=jnp.where((state.next_cta == 0) & (slots.next_cta > 0), first, state.kernel_start),
        launch_credit=slots.credit,
        items_taken=state.items_taken + jnp.sum(took, dtype=jnp.int32),
        counters=replace(
            k,
            sm_items=k.sm_items + took,
            sm_ctas=k.sm_ctas + jnp.sum(new, axis=0, dtype=jnp.int32),
            cta_sm=k.cta_sm.at[ids].set(sm_of, mode="drop"),
            cta_start_tick=k.cta_start_tick.at[ids].set(slots.start.reshape(-1), mode="drop"),
            cta_key=k.cta_key.at[ids].set(slots.key.reshape(-1), mode="drop"),
        ),
    )
