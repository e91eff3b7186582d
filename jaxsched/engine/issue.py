"""The issue stage (docs/model.md sections 7-8): what each scheduler's picked warp does in its
cycle: its instruction decoded, the fixed-latency pipes, the MIO backlog and the chip's L2 and
DRAM queues (`memory`) it joins, its barrier arrival, exit or loop back-edge, its next pc, the
ready times of the results it writes and its next blocked interval; and the warps' fields
written back. Orders that matter (schedulers within an SM for the MIO backlog, (SM, scheduler)
for the chip's queues and the work queue) are exclusive prefix sums, which is what the
sequential order defines."""

from __future__ import annotations

from dataclasses import replace

import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

from ..isa import Op
from ..kernel import FIXED, MEMORY, MIO
from ..lower import Launch, Shapes
from .launches import Launches, instruction_fields, op_and_waits, warp_program
from .mechanics import forms
from .memory import prefix_sum_sm_sched, queue_delay
from .slots import cta_slot_of, hardware_position, per_warp
from .state import INF, N_PIPES, NO_WARP, State, Warps
from .status import blocked_split, interval_cycles, mem_cycle, one_of_class, op_class, waited
from .variation import active_lanes, back_edge, resolve_pc
from .warp_scheduler import of_selected


def _cta_of(state: State, launch: Launch, shapes: Shapes, slot_s: Int[Array, "sched sm"]) -> Int[Array, "sched sm"]:
    """The CTA slot of each scheduler's selected warp (hardware slot `slot_s`): the static layout
    with one launch, the state's with several (`residency.py`)."""
    if shapes.n_launches == 1:
        return cta_slot_of(slot_s, launch.program.warps_per_cta, shapes)
    return jnp.take_along_axis(state.warp_cta, hardware_position(slot_s, shapes), axis=0)


_FIELDS = dict(pc="pc", trips="trips_left", fixed="ready_fixed", short="ready_mio", mem="ready_mem",
               fetch="ready_fetch", wake="wake", cls="issue_class")  # write-back value -> Warps field


def write_back(w: Warps, upd: dict[str, Int[Array, "sched sm"]], sel: Bool[Array, "warp sm"],
                has: Bool[Array, "sched sm"], q_sel: Int[Array, "sched sm"], shapes: Shapes) -> Warps:
    """The warps with each scheduler's issuing warp's fields set to `upd` (per scheduler: the
    values `issue` returns, of which it reads its fields' own). A
    scatter writes the 4 slots per SM that issued; a select rewrites every slot. Both give the
    same warps (`mechanics.forms.gpu_forms` picks the faster on the backend)."""
    if not forms.gpu_forms():
        spread = lambda u: jnp.stack([per_warp(x, shapes) for x in u]) if u.ndim == 3 else per_warp(u, shapes)  # noqa: E731
        return replace(w, **{f: jnp.where(sel, spread(upd[k]), getattr(w, f)) for k, f in _FIELDS.items()})
    pos = jnp.where(has, jnp.arange(shapes.schedulers, dtype=jnp.int32)[:, None] * shapes.warps_per_scheduler + q_sel,
                    shapes.warp_slots)  # out of range: dropped
    sm = jnp.broadcast_to(jnp.arange(pos.shape[1], dtype=jnp.int32), pos.shape)
    at = lambda x: x.at[:, pos, sm] if x.ndim == 3 else x.at[pos, sm]  # noqa: E731  (per dependence slot)
    return replace(w, **{f: at(getattr(w, f)).set(upd[k].astype(getattr(w, f).dtype), mode="drop",
                                                  unique_indices=True)
                         for k, f in _FIELDS.items()})


def count_ops(sel_op: Int[Array, "sched sm"], has: Bool[Array, "sched sm"]) -> Int[Array, "op sm"]:
    """Issued instructions per isa.Op class in this cycle, per SM."""
    hit = has[None] & (sel_op[None] == jnp.arange(len(Op), dtype=jnp.int32)[:, None, None])
    return jnp.sum(hit, axis=1, dtype=jnp.int64)


def _take_work_items(state: State, launch: Launch, want: Bool[Array, "sched sm"]) -> Bool[Array, "sched sm"]:
    """Which selected warps at a persistent loop's back-edge get the next work item: takes are
    ordered (SM, scheduler), each scheduler issuing at most one, until the queue is empty
    (section 7)."""
    count = want.astype(jnp.int32)
    before = prefix_sum_sm_sched(count) - count
    return want & (before < launch.program.work_items - state.items_taken)


def issue(state: State, launch: Launch, shapes: Shapes, launches: Launches, k: Int[Array, " sm"],
          ready_before: Int[Array, "sched sm"], next_wake_before: Int[Array, " sm"], sel: Bool[Array, "warp sm"],
          has: Bool[Array, "sched sm"], q_sel: Int[Array, "sched sm"], edge: Bool[Array, " sm"], acc: Int[Array, " sm"]
          ) -> dict[str, Array]:
    """What each scheduler's issuing warp does in this cycle (section 7), [sched, sm] unless
    noted: its instruction decoded, the pipes, MIO backlog and chip queues it joins, its
    barrier arrival, exit or loop back-edge, its next pc and ready times, and its next blocked
    interval; plus what the tick leaves for the event search (`cycle.Outlook`'s `ready` and
    `next_wake`). Everything the rest of the tick reads of an issue, so that `once` can
    materialise it in one go. `k`: the tick each SM runs."""
    c, w = state.cycle, state.warps
    pick = lambda x: of_selected(x, sel, q_sel, shapes)  # noqa: E731
    pc_s = jnp.clip(pick(w.pc), 0, shapes.n_instr - 1)
    launch_s = pick(w.launch) if shapes.n_launches > 1 else jnp.zeros_like(pc_s)
    trips_s, lanes_s = jnp.stack([pick(x) for x in w.trips_left]), pick(w.lanes)
    branch_s = jnp.stack([pick(x) for x in w.branch_lanes])
    fields = instruction_fields(launches, launch_s, pc_s)
    op_s, _, lat_s, issue64_s, mio_cost_s, mem_lat_s, l2_s, dram_s, writes_s = (
        jnp.where(has, fields[..., i], 0) for i in range(9))
    prog = warp_program(launches, launch_s)

    # MIO: schedulers in index order share the SM's backlog.
    mio_before = state.mio + jnp.cumsum(mio_cost_s, axis=0, dtype=jnp.int32) - mio_cost_s
    is_short = has & ((op_s == Op.LDS) | (op_s == Op.SHFL))
    mio = state.mio + jnp.sum(mio_cost_s, axis=0, dtype=jnp.int32)

    # Fixed-latency pipes; issue intervals in 1/64 cycle, so a fractional interval carries over.
    has_pipe = has & (op_s < N_PIPES)
    hits_pipe = has[None] & (op_s[None] == jnp.arange(N_PIPES, dtype=jnp.int32)[:, None, None])
    now64 = 64 * c.astype(jnp.int64)
    pipe_free64 = jnp.where(hits_pipe, jnp.maximum(state.pipe_free64, now64) + issue64_s.astype(jnp.int64)[None],
                            state.pipe_free64)

    # Chip-wide L2 and DRAM queues, in (SM, scheduler) order.
    delay = queue_delay(state, l2_s, dram_s)
    is_ldg = has & (op_s == Op.LDG)

    # Barrier arrival (CTA or grid), exit, loop back-edge (trip count or work queue), next pc.
    # Grid barriers exist only in a workload's only launch (section 13), so launch 0's program
    # says which barriers are grid-wide.
    arrive = has & (op_s == Op.BAR)
    grid_arrive = arrive & launch.program.grid_sync[pc_s]
    exits = has & (op_s == Op.EXIT)
    # A persistent kernel has one loop (loop 0): its back-edge takes the next work item.
    persistent = launch.program.work_items > 0
    take = _take_work_items(state, launch, has & (pc_s == prog.loop_end[0]) & persistent)
    full = jnp.stack([pick(x) for x in w.trips]) if shapes.loops > 1 else None
    back, target, trips_left_s = back_edge(prog, pc_s, trips_s, full, jnp.where(persistent, take[None], trips_s > 1))
    back = has & back
    trips_left_s = jnp.where(persistent | ~has[None], trips_s, trips_left_s)
    next_pc = resolve_pc(prog, target, trips_left_s, branch_s)

    # The issuing warp's ready times, and its next instruction's blocked interval, which starts
    # at the SM's next cycle; EXIT leaves, BAR waits for the release (wake INF meanwhile).
    # The result goes to the dependence slots the instruction writes (section 7).
    def result(ready: Int[Array, "slot warp sm"], kind: Bool[Array, "sched sm"], at: Array) -> Array:
        return jnp.stack([jnp.where(kind & ((writes_s >> d) & 1 == 1), jnp.maximum(pick(x), at), pick(x))
                          for d, x in enumerate(ready)])

    ready_fixed = result(w.ready_fixed, has_pipe, c + lat_s)
    ready_mio = result(w.ready_mio, is_short, c + mio_before + mio_cost_s + lat_s)
    ready_mem = result(w.ready_mem, is_ldg, k + mem_lat_s + delay)
    # A taken back-edge refetches the loop start before the warp can issue again.
    ready_fetch = jnp.where(back, c + launch.chip.taken_branch_cycles, pick(w.ready_fetch))
    op_next, waits_next = op_and_waits(launches, launch_s, jnp.clip(next_pc, 0, shapes.n_instr - 1))
    after = c + edge
    mem = mem_cycle(waited(ready_mem, waits_next, MEMORY), k, after, state.freq, acc, launch.clocks.tick_mhz)
    blocked = blocked_split(waited(ready_fixed, waits_next, FIXED), waited(ready_mio, waits_next, MIO), ready_fetch, mem,
                            after)
    stops = exits | arrive
    wake = jnp.where(stops, INF, blocked.wake)

    # Lanes active in the issued instruction (SIMT efficiency): an if/else path runs its lanes.
    active = active_lanes(prog, pc_s, lanes_s, branch_s)
    slot_s = jnp.arange(shapes.schedulers, dtype=jnp.int32)[:, None] + shapes.schedulers * q_sel
    return dict(
        pc=jnp.where(exits, NO_WARP, next_pc), trips=trips_left_s, fixed=ready_fixed, short=ready_mio,
        mem=ready_mem, fetch=ready_fetch, wake=wake, cls=op_class(op_next),
        pipe_free64=pipe_free64, mio=mio,  # [pipe, sched, sm] and [sm]
        op=op_s, arrive=arrive, grid_arrive=grid_arrive, exits=exits, take=take, l2=l2_s, dram=dram_s,
        active_lanes=jnp.where(has, active, 0), cta_of_sel=_cta_of(state, launch, shapes, slot_s),
        blocked_cycles=interval_cycles(blocked, has & ~stops),  # [3, sched, sm]
        ready=ready_before - jnp.where(has, one_of_class(pick(w.issue_class)), 0),
        next_wake=jnp.minimum(next_wake_before, jnp.min(jnp.where(has, wake, INF), axis=0)),  # [sm]
    )
