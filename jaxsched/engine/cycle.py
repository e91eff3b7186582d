"""One tick: every SM whose clock edge falls in it runs one cycle (docs/model.md sections 7-8).

All SMs are processed at once; SMs without a clock edge in this tick are masked. Orders that
matter (schedulers within an SM for the MIO backlog, (SM, scheduler) for the chip's L2 and
DRAM queues) become exclusive prefix sums, which is what the sequential order defines.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

from ..isa import Op
from ..kernel import FIXED, MEMORY, MIO
from ..lower import QUEUE_ONE_TICK, Launch, Shapes
from .launch_credit import collect, has_free_slot
from .launches import Launches, instruction_fields, op_and_waits, per_launch_sum, update_ready, warp_program
from .mechanics.materialize import once
from .residency import of_cta
from .state import INF, N_PIPES, NO_WARP, State, Warps
from .slots import by_scheduler, cta_slot_of, hardware_position, per_warp, q_index
from .status import (blocked_split, interval_cycles, mem_cycle, one_of_class, op_class, ready_counts, scan, stall_rows,
                     throttled, waited)
from .variation import active_lanes, back_edge, resolve_pc
from . import warp_policies


def clock_edges(state: State, launch: Launch, run: Bool[Array, " sm"]) -> tuple[Bool[Array, " sm"], Int[Array, " sm"]]:
    """Which SMs execute a cycle in the tick each runs (`run`: the SMs that run in this step),
    and their phase accumulators afterwards. An SM that does not run in this step (ahead of the
    chip after a fast-forward, waiting for the dispatcher, floorswept) neither executes nor
    accumulates."""
    acc = state.acc + state.freq
    edge = (acc >= launch.tick_mhz) & run
    return edge, jnp.where(edge, acc - launch.tick_mhz, jnp.where(run, acc, state.acc))


def _gpu_forms() -> bool:
    """Whether the step uses the forms XLA's GPU backend runs faster, off the CPU: the issuing
    warps' fields written back by a scatter (4 slots per SM) rather than a select over every
    slot, and each scheduler's minimum key as a chain of elementwise minima rather than a
    reduction. On the CPU each scatter is a kernel of its own that costs as much as the select,
    and the chain, fused into each of its consumers, is recomputed there: the whole run took 2.3x
    as long (docs/engine_performance.md, "The H200 step waits on its loops" and "The H200's step, kernel by
    kernel"). Likewise the selected warps' fields are read by a gather off the CPU and by a masked
    sum on it (`_of_selected`; docs/engine_performance.md, "The CPU step's recomputed values, found
    through a profile without the per-kernel overhead"). Results do not depend on it."""
    return jax.default_backend() != "cpu"


def select(
    state: State, launch: Launch, shapes: Shapes, eligible: Bool[Array, "warp sm"], edge: Bool[Array, " sm"],
    policy: Int[Array, ""] | None = None,
) -> tuple[Bool[Array, "warp sm"], Bool[Array, "sched sm"], Int[Array, "sched sm"]]:
    """Each scheduler picks at most one eligible warp by the warp policy (minimum key; one module per
    policy in `warp_policies/`). Keys are
    unique per scheduler (LRR's by q, ages by CTA and warp), so the minimum of `key << 5 | q`
    (q < 32) names the warp: one plain minimum over the scheduler's warps, in int32 where every
    age `32 g + w` fits in 26 bits (grids up to 2^21 CTAs), else int64.

    `policy`: the whole batch's warp policy where it is one (a batch of one: unbatched under
    `vmap`), so that a `switch` computes only its key; else each configuration's key is chosen
    among all (`launch.warp_policy`). The switch made the CPU's whole run about 5 % faster
    (docs/engine_performance.md, "The CPU step's recomputed values, found through a profile without the
    per-kernel overhead").

    Off the CPU (`_gpu_forms`) the minimum over a scheduler's warps is a chain of elementwise
    minima: the H200 ran the reduction over this middle axis as a loop kernel at a fifth of its
    memory bandwidth, and the chain made the whole run 12 % faster (docs/engine_performance.md,
    "The H200's step, kernel by kernel")."""
    n_q = shapes.warps_per_scheduler
    q = q_index(shapes)[:, None]
    wide = jnp.int64 if shapes.max_ctas > 1 << 21 else jnp.int32
    never = jnp.iinfo(wide).max

    def best_of(key: Int[Array, "warp sm"]) -> Array:
        """Per scheduler, the minimum of `key << 5 | q` over its candidate warps (`never`: none)."""
        candidate = eligible & edge
        by_q = by_scheduler(jnp.where(candidate, (key.astype(wide) << 5) | q, never), shapes)
        if _gpu_forms():
            return functools.reduce(jnp.minimum, [by_q[:, i] for i in range(n_q)])
        return jnp.min(by_q, axis=1)

    last = per_warp(state.last, shapes)
    keys = [lambda m=m: m.key(q, last, n_q, state.warps.age) for m in warp_policies.MODULES.values()]
    if policy is not None:
        best = jax.lax.switch(policy, [lambda k=k: best_of(k()) for k in keys])
    else:
        *first, final = keys
        best = best_of(jnp.select([launch.warp_policy == p for p in range(len(first))], [k() for k in first],
                                  final()))
    has = best < never
    q_sel = (best & 31).astype(jnp.int32)
    sel = (q == per_warp(q_sel, shapes)) & per_warp(has, shapes)
    return sel, has, q_sel


def _of_selected(x: Array, sel: Bool[Array, "warp sm"], q_sel: Int[Array, "sched sm"], shapes: Shapes) -> Array:
    """The selected warp's value of a per-slot array, per scheduler: [warp, sm] -> [sched, sm]
    (a scheduler without an issue reads some value; callers mask by `has`). Off the CPU
    (`_gpu_forms`) a gather at `q_sel`; on the CPU the sum over the scheduler's warps masked by
    `sel`, a reduction vectorised along the SMs, where a gather runs element by element: the
    whole run about 4-5 % faster (docs/engine_performance.md,
    "The CPU step's recomputed values, found through a profile without the per-kernel overhead")."""
    if not _gpu_forms():
        return jnp.sum(by_scheduler(jnp.where(sel, x, 0), shapes), axis=1, dtype=x.dtype)
    q = jnp.minimum(q_sel, shapes.warps_per_scheduler - 1)[:, None, :]
    return jnp.take_along_axis(by_scheduler(x, shapes), q, axis=1)[:, 0, :]


def _cta_of(state: State, launch: Launch, shapes: Shapes, slot_s: Int[Array, "sched sm"]) -> Int[Array, "sched sm"]:
    """The CTA slot of each scheduler's selected warp (hardware slot `slot_s`): the static layout
    with one launch, the state's with several (`residency.py`)."""
    if shapes.n_launches == 1:
        return cta_slot_of(slot_s, launch.warps_per_cta, shapes)
    return jnp.take_along_axis(state.warp_cta, hardware_position(slot_s, shapes), axis=0)


def _per_cta(x: Int[Array, "sched sm"], cta_of_sel: Int[Array, "sched sm"], shapes: Shapes) -> Int[Array, "cta sm"]:
    """Sum of a per-scheduler count over the CTA slots its selected warps belong to."""
    hit = cta_of_sel[None] == jnp.arange(shapes.cta_slots, dtype=jnp.int32)[:, None, None]
    return jnp.sum(jnp.where(hit, x[None], 0), axis=1, dtype=jnp.int32)


_FIELDS = dict(pc="pc", trips="trips_left", fixed="ready_fixed", short="ready_mio", mem="ready_mem",
               fetch="ready_fetch", wake="wake", cls="issue_class")  # write-back value -> Warps field


def _write_back(w: Warps, upd: dict[str, Int[Array, "sched sm"]], sel: Bool[Array, "warp sm"],
                has: Bool[Array, "sched sm"], q_sel: Int[Array, "sched sm"], shapes: Shapes) -> Warps:
    """The warps with each scheduler's issuing warp's fields set to `upd` (per scheduler). A
    scatter writes the 4 slots per SM that issued; a select rewrites every slot. Both give the
    same warps (`_gpu_forms` picks the faster on the backend)."""
    if not _gpu_forms():
        spread = lambda u: jnp.stack([per_warp(x, shapes) for x in u]) if u.ndim == 3 else per_warp(u, shapes)  # noqa: E731
        return replace(w, **{f: jnp.where(sel, spread(upd[k]), getattr(w, f)) for k, f in _FIELDS.items()})
    pos = jnp.where(has, jnp.arange(shapes.schedulers, dtype=jnp.int32)[:, None] * shapes.warps_per_scheduler + q_sel,
                    shapes.warp_slots)  # out of range: dropped
    sm = jnp.broadcast_to(jnp.arange(pos.shape[1], dtype=jnp.int32), pos.shape)
    at = lambda x: x.at[:, pos, sm] if x.ndim == 3 else x.at[pos, sm]  # noqa: E731  (per dependence slot)
    return replace(w, **{f: at(getattr(w, f)).set(upd[k].astype(getattr(w, f).dtype), mode="drop",
                                                  unique_indices=True)
                         for k, f in _FIELDS.items()})


def _count_ops(sel_op: Int[Array, "sched sm"], has: Bool[Array, "sched sm"]) -> Int[Array, "op sm"]:
    """Issued instructions per isa.Op class in this cycle, per SM."""
    hit = has[None] & (sel_op[None] == jnp.arange(len(Op), dtype=jnp.int32)[:, None, None])
    return jnp.sum(hit, axis=1, dtype=jnp.int64)


def _take_work_items(state: State, launch: Launch, want: Bool[Array, "sched sm"]) -> Bool[Array, "sched sm"]:
    """Which selected warps at a persistent loop's back-edge get the next work item: takes are
    ordered (SM, scheduler), each scheduler issuing at most one, until the queue is empty
    (section 7)."""
    count = want.astype(jnp.int32)
    before = _prefix_sum_sm_sched(count) - count
    return want & (before < launch.work_items - state.items_taken)


def _prefix_sum_sm_sched(x: Int[Array, "sched sm"]) -> Int[Array, "sched sm"]:
    """Inclusive prefix sum in (SM, scheduler) order: within each SM, then across SMs."""
    within = jnp.cumsum(x, axis=0, dtype=jnp.int32)
    before = jnp.cumsum(within[-1], dtype=jnp.int32) - within[-1]
    return within + before


def _ceil_ticks(queue: Array) -> Array:
    return (queue + QUEUE_ONE_TICK - 1) // QUEUE_ONE_TICK


class Outlook(NamedTuple):
    """What a tick leaves for the event search (`events.skip_to_next_event`), per SM."""

    ready: Int[Array, "sched sm"]  # ready warps per class after the tick's issues, packed
    next_wake: Int[Array, " sm"]  # the earliest wake of a warp not ready (INF: none)
    changed: Bool[Array, " sm"]  # warps were released or started: look again at the next cycle
    issued: Bool[Array, " sm"]  # the SM issued in this tick (a point of the recurrence search)


def _issue(state: State, launch: Launch, shapes: Shapes, launches: Launches, k: Int[Array, " sm"],
           ready_before: Int[Array, "sched sm"], next_wake_before: Int[Array, " sm"], sel: Bool[Array, "warp sm"],
           has: Bool[Array, "sched sm"], q_sel: Int[Array, "sched sm"], edge: Bool[Array, " sm"], acc: Int[Array, " sm"]
           ) -> dict[str, Array]:
    """What each scheduler's issuing warp does in this cycle (section 7), [sched, sm] unless
    noted: its instruction decoded, the pipes, MIO backlog and chip queues it joins, its
    barrier arrival, exit or loop back-edge, its next pc and ready times, and its next blocked
    interval; plus what the tick leaves for the event search (`Outlook`'s `ready` and
    `next_wake`). Everything the rest of the tick reads of an issue, so that `once` can
    materialise it in one go. `k`: the tick each SM runs."""
    c, w = state.cycle, state.warps
    pick = lambda x: _of_selected(x, sel, q_sel, shapes)  # noqa: E731
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
    l2_after = state.q_l2 + _prefix_sum_sm_sched(l2_s)
    dram_after = state.q_dram + _prefix_sum_sm_sched(dram_s)
    delay = jnp.maximum(_ceil_ticks(l2_after), _ceil_ticks(dram_after))
    is_ldg = has & (op_s == Op.LDG)

    # Barrier arrival (CTA or grid), exit, loop back-edge (trip count or work queue), next pc.
    # Grid barriers exist only in a workload's only launch (section 13), so launch 0's program
    # says which barriers are grid-wide.
    arrive = has & (op_s == Op.BAR)
    grid_arrive = arrive & launch.grid_sync[pc_s]
    exits = has & (op_s == Op.EXIT)
    # A persistent kernel has one loop (loop 0): its back-edge takes the next work item.
    persistent = launch.work_items > 0
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
    ready_fetch = jnp.where(back, c + launch.taken_branch_cycles, pick(w.ready_fetch))
    op_next, waits_next = op_and_waits(launches, launch_s, jnp.clip(next_pc, 0, shapes.n_instr - 1))
    after = c + edge
    blocked = blocked_split(waited(ready_fixed, waits_next, FIXED), waited(ready_mio, waits_next, MIO), ready_fetch,
                            mem_cycle(waited(ready_mem, waits_next, MEMORY), k, after, state.freq, acc, launch.tick_mhz),
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


def run_tick(state: State, launch: Launch, shapes: Shapes, launches: Launches, one: Int[Array, ""],
             tick: Int[Array, " sm"], run: Bool[Array, " sm"], policy: Int[Array, ""] | None = None
             ) -> tuple[State, Outlook, Bool[Array, "cta sm"]]:
    """Execute the cycle of each SM that runs in this step (`run`) at the tick it runs (`tick`;
    every SM at the chip's tick, or each at its own where SMs run on their own time:
    `decouple.py`) (section 7), complete CTAs and launches, and
    learn which launches became ready (section 13); no dispatch (the closed loop learns the
    completed CTAs' durations there: `dispatch.learn_cta_durations`). `launches`: the per-launch
    tables (`launches.single(launch, shapes)` for one kernel); `one`: a traced 1 for `once`;
    `policy`: the batch's one warp policy, if it has one (`select`).
    Returns the CTA slots whose barrier released: their warps' intervals start after the tick's
    dispatch (`intervals.release`, from `step._columns_work`).

    One pass over the warp slots (`status.scan`) finds the eligible warps and counts the ready
    ones; what an issue does is decoded and computed per scheduler for its selected warp
    (`_issue`, materialised by `once`), then written back where `sel`. The issuing warp's next
    blocked interval is counted now, whole."""
    k = tick
    edge, acc = clock_edges(state, launch, run)
    c = state.cycle
    w = state.warps
    throttle = throttled(state.pipe_free64, state.mio, launch.mio_depth, c)
    sc = scan(w.wake, w.issue_class, throttle, c, shapes)
    sel, has, q_sel = select(state, launch, shapes, sc.eligible, edge, policy)
    iss = once(lambda: _issue(state, launch, shapes, launches, k, sc.ready, sc.next_wake, sel, has, q_sel, edge, acc),
               one)
    warps = _write_back(w, {key: iss[key] for key in _FIELDS}, sel, has, q_sel, shapes)

    cta_arrived = state.cta_arrived + _per_cta((iss["arrive"] & ~iss["grid_arrive"]).astype(jnp.int32),
                                               iss["cta_of_sel"], shapes)
    cta_live = state.cta_live - _per_cta(iss["exits"].astype(jnp.int32), iss["cta_of_sel"], shapes)
    occupied = state.cta_id >= 0
    release = occupied & (cta_arrived == cta_live) & (cta_arrived > 0)
    complete = occupied & (cta_live == 0)

    # Counters use the start-of-cycle state; 'selected' for the issuing warps.
    n_done = jnp.sum(complete, dtype=jnp.int32)
    counters = state.counters
    e = edge.astype(jnp.int64)
    ready = ready_counts(sc.ready, throttle)
    n_issued = jnp.sum(has, axis=0, dtype=jnp.int32)
    n_active = jnp.sum(state.cta_live, axis=0, dtype=jnp.int64)
    n_barrier = jnp.sum(state.cta_arrived, axis=0, dtype=jnp.int32) + state.g_waiting
    blocked_cycles = iss["blocked_cycles"]
    stalls = stall_rows(selected=n_issued, not_selected=e * ready.eligible - n_issued, long=blocked_cycles[0],
                        short=blocked_cycles[1], wait=blocked_cycles[2], barrier=e * n_barrier,
                        mio=e * ready.mio_throttle, pipe=e * ready.pipe_throttle)
    end_ids = jnp.where(complete, state.cta_id, shapes.max_ctas)  # out of range: dropped
    end_tick = jnp.max(jnp.where(complete, k, -1))  # the latest completion (ticks differ on their own time)
    counters = replace(
        counters,
        sm_cycles=counters.sm_cycles + e,
        sm_busy_cycles=counters.sm_busy_cycles + e * (n_active > 0),
        sm_issued=counters.sm_issued + n_issued,
        sm_issued_op=counters.sm_issued_op + _count_ops(iss["op"], has),
        sm_active_lanes=counters.sm_active_lanes + jnp.sum(iss["active_lanes"], axis=0, dtype=jnp.int64),
        sm_warp_cycles=counters.sm_warp_cycles + e * n_active,
        sm_stalls=counters.sm_stalls + stalls,
        cta_end_tick=counters.cta_end_tick.at[end_ids.reshape(-1)].set(
            jnp.broadcast_to(k, end_ids.shape).reshape(-1), mode="drop"),
        sm_items=counters.sm_items + jnp.sum(iss["take"], axis=0, dtype=jnp.int64),
    )
    # Launches complete with their last CTA; their successors learn when they may start.
    done_now = per_launch_sum(complete.astype(jnp.int32), state.cta_launch, shapes.n_launches)
    kernel_done = state.kernel_done + done_now
    kernel_end = jnp.where(done_now > 0, jnp.maximum(state.kernel_end, end_tick), state.kernel_end)
    out = replace(
        state,
        kernel_done=kernel_done,
        kernel_end=kernel_end,
        kernel_ready=update_ready(state.kernel_ready, kernel_done, kernel_end, launches),
        acc=acc,
        cycle=c + edge,
        mio=jnp.where(edge, jnp.maximum(iss["mio"] - 1, 0), state.mio),
        pipe_free64=iss["pipe_free64"],
        last=jnp.where(has, q_sel, state.last),
        cta_id=jnp.where(complete, -1, state.cta_id),
        # a completed CTA's warp slots free with its slot (several launches: residency.py)
        warp_cta=jnp.where((state.warp_cta >= 0) & of_cta(complete, state.warp_cta), -1, state.warp_cta),
        # The launch path needs cta_launch_ticks before a freed slot starts its next CTA.
        cta_usable_tick=jnp.where(complete, k + launch.cta_launch_ticks, state.cta_usable_tick),
        cta_live=cta_live,
        cta_arrived=jnp.where(release, 0, cta_arrived),
        resident=state.resident - jnp.sum(complete, axis=0, dtype=jnp.int32),
        warps=warps,
        q_l2=state.q_l2 + jnp.sum(iss["l2"], dtype=jnp.int32),
        q_dram=state.q_dram + jnp.sum(iss["dram"], dtype=jnp.int32),
        g_arrived=state.g_arrived + jnp.sum(iss["grid_arrive"], dtype=jnp.int32),
        g_waiting=state.g_waiting + jnp.sum(iss["grid_arrive"], axis=0, dtype=jnp.int32),
        items_taken=state.items_taken + jnp.sum(iss["take"], dtype=jnp.int32),
        ctas_done=state.ctas_done + n_done,
        last_exit_tick=jnp.maximum(state.last_exit_tick, end_tick),
        acct=jnp.where(run, k, state.acct),
        counters=counters,
    )
    # Last in the cycle: starved schedulers (start-of-cycle state) earn launch credit while the
    # SM has a free CTA slot, one freed in this cycle included (section 7).
    credit = collect(state.launch_credit, ready.starved, edge.astype(jnp.int32),
                     has_free_slot(out, launch, shapes), launch)
    look = Outlook(ready=iss["ready"], next_wake=iss["next_wake"], changed=jnp.any(release, axis=0),
                   issued=n_issued > 0)
    return replace(out, launch_credit=credit), look, release
