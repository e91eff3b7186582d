"""One tick: every SM whose clock edge falls in it runs one cycle (docs/model.md sections 7-8).

All SMs are processed at once; SMs without a clock edge in this tick are masked. Orders that
matter (schedulers within an SM for the MIO backlog, (SM, scheduler) for the chip's L2 and
DRAM queues) become exclusive prefix sums, which is what the sequential order defines.
"""

from __future__ import annotations

from dataclasses import replace

import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

from ..isa import Op
from ..lower import QUEUE_ONE_TICK, Launch, Shapes
from .launch_credit import collect, has_free_slot, starved_schedulers
from .launches import Launches, instruction_fields, per_launch_sum, update_ready, warp_program
from .materialize import once
from .state import N_PIPES, State
from .slots import by_scheduler, hardware_slot, per_warp, q_index
from .status import (INF, NOT_SELECTED, SELECTED, WarpStatus, count_reasons, per_sm_counts, reason_histogram,
                     warp_status)
from .variation import resolve_pc

LRR, GTO, OLDEST = 0, 1, 2


def clock_edges(state: State, launch: Launch) -> tuple[Bool[Array, " sm"], Int[Array, " sm"]]:
    """Which SMs execute a cycle in this tick, and their phase accumulators afterwards."""
    acc = state.acc + state.freq
    edge = (acc >= launch.tick_mhz) & launch.sm_enabled
    return edge, jnp.where(edge, acc - launch.tick_mhz, acc)


def select(
    state: State, launch: Launch, shapes: Shapes, st: WarpStatus, edge: Bool[Array, " sm"]
) -> tuple[Bool[Array, "sm warp"], Bool[Array, "sm sched"], Int[Array, "sm sched"]]:
    """Each scheduler picks at most one eligible warp by the warp policy (minimum key)."""
    n_q = shapes.warps_per_scheduler
    q = q_index(shapes)
    last = per_warp(state.last, shapes)
    key = jnp.select(
        [launch.warp_policy == LRR, launch.warp_policy == GTO],
        [(q - last - 1) % n_q, jnp.where(q == last, -1, state.warps.age)],
        state.warps.age,
    )
    candidate = st.eligible & edge[:, None]
    q_sel = jnp.argmin(by_scheduler(jnp.where(candidate, key, INF), shapes), axis=2).astype(jnp.int32)
    has = jnp.any(by_scheduler(candidate, shapes), axis=2)
    sel = (q[None, :] == per_warp(q_sel, shapes)) & per_warp(has, shapes)
    return sel, has, q_sel


def _of_selected(x: Array, q_sel: Int[Array, "sm sched"], shapes: Shapes) -> Array:
    """The selected warp's value of a per-slot array, per scheduler: [sm, warp] -> [sm, sched]
    (a scheduler without an issue reads its slot q = 0; callers mask by `has`)."""
    return jnp.take_along_axis(by_scheduler(x, shapes), q_sel[:, :, None], axis=2)[:, :, 0]


def _per_cta(x: Int[Array, "sm sched"], cta_of_sel: Int[Array, "sm sched"], shapes: Shapes) -> Int[Array, "sm cta"]:
    """Sum of a per-scheduler count over the CTA slots its selected warps belong to."""
    hit = cta_of_sel[..., None] == jnp.arange(shapes.cta_slots, dtype=jnp.int32)
    return jnp.sum(jnp.where(hit, x[..., None], 0), axis=1, dtype=jnp.int32)


def _count_ops(sel_op: Int[Array, "sm sched"], has: Bool[Array, "sm sched"]) -> Int[Array, "sm op"]:
    """Issued instructions per isa.Op class in this cycle, per SM."""
    hit = has[..., None] & (sel_op[..., None] == jnp.arange(len(Op), dtype=jnp.int32))
    return jnp.sum(hit, axis=1, dtype=jnp.int64)


def _take_work_items(state: State, launch: Launch, want: Bool[Array, "sm sched"]) -> Bool[Array, "sm sched"]:
    """Which selected warps at a persistent loop's back-edge get the next work item: takes are
    ordered (SM, scheduler), each scheduler issuing at most one, until the queue is empty
    (section 7)."""
    count = want.astype(jnp.int32)
    before = _prefix_sum_sm_sched(count) - count
    return want & (before < launch.work_items - state.items_taken)


def _prefix_sum_sm_sched(x: Int[Array, "sm sched"]) -> Int[Array, "sm sched"]:
    """Inclusive prefix sum in (SM, scheduler) order: within each SM, then across SMs."""
    within = jnp.cumsum(x, axis=1, dtype=jnp.int32)
    before = jnp.cumsum(within[:, -1], dtype=jnp.int32) - within[:, -1]
    return within + before[:, None]


def _ceil_ticks(queue: Array) -> Array:
    return (queue + QUEUE_ONE_TICK - 1) // QUEUE_ONE_TICK


def _learn_cta_durations(
    est: Int[Array, "launch sm"], complete: Bool[Array, "sm cta"], duration: Int[Array, "sm cta"],
    slot_launch: Int[Array, "sm cta"], launch: Launch,
) -> Int[Array, "launch sm"]:
    """Closed-loop dispatch's integer EMA of CTA durations, one completion at a time in CTA-slot
    order (docs/model.md section 9); a completion updates its own launch's estimate (section
    13). Only completions are observed, never the clocks."""
    a = launch.ema_alpha_256.astype(jnp.int64)
    n_launches, sm = est.shape[0], jnp.arange(est.shape[1])
    for j in range(complete.shape[1]):
        d = duration[:, j].astype(jnp.int64)
        l = 0 if n_launches == 1 else jnp.clip(slot_launch[:, j], 0, n_launches - 1)
        mine = est[0] if n_launches == 1 else est[l, sm]
        mine = jnp.where(complete[:, j], mine + (a * (d - mine)) // 256, mine)
        est = mine[None] if n_launches == 1 else est.at[l, sm].set(mine)
    return est


def run_tick(state: State, launch: Launch, shapes: Shapes, launches: Launches) -> State:
    """Execute the SM cycles of tick `state.tick` (section 7), complete CTAs and launches, and
    learn which launches became ready (section 13); no dispatch. `launches`: the per-launch
    tables (`launches.single(launch, shapes)` for one kernel).

    Only the per-slot status and the final field updates touch every warp slot; what an issue
    does is decoded and computed per scheduler for its selected warp, then written back where
    `sel`."""
    k = state.tick
    edge, acc = clock_edges(state, launch)
    c = state.cycle
    st = warp_status(state, launch, shapes, c, k, launches)
    sel, has, q_sel = select(state, launch, shapes, st, edge)
    w = state.warps

    # The selected warp of each scheduler and its instruction, [sm, sched].
    pick = lambda x: _of_selected(x, q_sel, shapes)  # noqa: E731
    pc_s = jnp.clip(pick(w.pc), 0, shapes.n_instr - 1)
    launch_s = pick(w.launch) if shapes.n_launches > 1 else jnp.zeros_like(pc_s)
    trips_s, lanes_s, if_lanes_s = pick(w.trips_left), pick(w.lanes), pick(w.if_lanes)
    fields = instruction_fields(launches, launch_s, pc_s)
    op_s, _, lat_s, issue64_s, mio_cost_s, mem_lat_s, l2_s, dram_s = (
        jnp.where(has, fields[..., i], 0) for i in range(8))
    prog = warp_program(launches, launch_s)
    cc = c[:, None]

    # MIO: schedulers in index order share the SM's backlog.
    mio_before = state.mio[:, None] + jnp.cumsum(mio_cost_s, axis=1, dtype=jnp.int32) - mio_cost_s
    is_short = has & ((op_s == Op.LDS) | (op_s == Op.SHFL))
    mio = state.mio + jnp.sum(mio_cost_s, axis=1, dtype=jnp.int32)

    # Fixed-latency pipes; issue intervals in 1/64 cycle, so a fractional interval carries over.
    has_pipe = has & (op_s < N_PIPES)
    hits_pipe = has[..., None] & (op_s[..., None] == jnp.arange(N_PIPES, dtype=jnp.int32))
    now64 = 64 * c.astype(jnp.int64)[:, None, None]
    pipe_free64 = jnp.where(hits_pipe, jnp.maximum(state.pipe_free64, now64) + issue64_s.astype(jnp.int64)[..., None],
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
    at_end = has & (pc_s == prog.loop_end)
    persistent = launch.work_items > 0
    take = _take_work_items(state, launch, at_end & persistent)
    back = jnp.where(persistent, take, at_end & (trips_s > 1))
    trips_left_s = jnp.where(back & ~persistent, trips_s - 1, trips_s)
    next_pc = resolve_pc(prog, jnp.where(back, prog.loop_start, pc_s + 1), trips_left_s, if_lanes_s, lanes_s)

    slot_s = jnp.arange(shapes.schedulers, dtype=jnp.int32) + shapes.schedulers * q_sel
    cta_of_sel = jnp.minimum(slot_s // launch.warps_per_cta, shapes.cta_slots - 1)
    cta_arrived = state.cta_arrived + _per_cta((arrive & ~grid_arrive).astype(jnp.int32), cta_of_sel, shapes)
    cta_live = state.cta_live - _per_cta(exits.astype(jnp.int32), cta_of_sel, shapes)
    occupied = state.cta_id >= 0
    release = occupied & (cta_arrived == cta_live) & (cta_arrived > 0)
    complete = occupied & (cta_live == 0)
    cta_of_warp = jnp.minimum(hardware_slot(shapes) // launch.warps_per_cta, shapes.cta_slots - 1)

    # What the selected warps write back, per scheduler, computed once (`materialize`).
    upd = once(dict(
        exits=exits, next_pc=next_pc, trips=trips_left_s, arrive=arrive, fixed=has_pipe, fixed_at=cc + lat_s,
        short=is_short, short_at=cc + mio_before + mio_cost_s + lat_s, ldg=is_ldg, mem_at=k + mem_lat_s + delay,
        back=back, release=release, pipe_free64=pipe_free64, mio=mio), jnp.minimum(launch.tick_mhz, 1))
    pipe_free64, mio = upd.pop("pipe_free64"), upd.pop("mio")
    u = {name: per_warp(x, shapes) for name, x in upd.items() if name != "release"}
    released = upd["release"][:, cta_of_warp]
    warps = replace(
        w,
        active=w.active & ~(sel & u["exits"]),
        pc=jnp.where(sel, u["next_pc"], w.pc),
        trips_left=jnp.where(sel, u["trips"], w.trips_left),
        at_barrier=(w.at_barrier | (sel & u["arrive"])) & ~released,
        ready_fixed=jnp.where(sel & u["fixed"], jnp.maximum(w.ready_fixed, u["fixed_at"]), w.ready_fixed),
        ready_mio=jnp.where(sel & u["short"], jnp.maximum(w.ready_mio, u["short_at"]), w.ready_mio),
        ready_mem=jnp.where(sel & u["ldg"], jnp.maximum(w.ready_mem, u["mem_at"]), w.ready_mem),
        # A taken back-edge refetches the loop start before the warp can issue again.
        ready_fetch=jnp.where(sel & u["back"], cc + launch.taken_branch_cycles, w.ready_fetch),
    )

    # Counters use the start-of-cycle state; 'selected' for the issuing warps.
    in_if = (pc_s >= prog.branch_start) & (pc_s < prog.branch_mid)
    in_else = (pc_s >= prog.branch_mid) & (pc_s < prog.branch_end)
    active_lanes = jnp.where(in_if, if_lanes_s, jnp.where(in_else, lanes_s - if_lanes_s, lanes_s))
    n_done = jnp.sum(complete, dtype=jnp.int32)
    counters = state.counters
    cycles = edge.astype(jnp.int64)
    # The issuing warps were eligible (`not selected` in the status); they count as `selected`.
    hist = reason_histogram(st.reason, shapes)
    n_issued = jnp.sum(has, axis=1, dtype=jnp.int32)
    counts = per_sm_counts(hist).at[:, SELECTED].add(n_issued).at[:, NOT_SELECTED].add(-n_issued)
    active_warps = jnp.sum(counts, axis=1)
    end_ids = jnp.where(complete, state.cta_id, shapes.max_ctas)  # out of range: dropped
    counters = replace(
        counters,
        sm_cycles=counters.sm_cycles + cycles,
        sm_busy_cycles=counters.sm_busy_cycles + cycles * (active_warps > 0),
        sm_issued=counters.sm_issued + n_issued,
        sm_issued_op=counters.sm_issued_op + _count_ops(op_s, has),
        sm_active_lanes=counters.sm_active_lanes + jnp.sum(jnp.where(has, active_lanes, 0), axis=1, dtype=jnp.int64),
        sm_warp_cycles=counters.sm_warp_cycles + cycles * active_warps,
        sm_stalls=counters.sm_stalls + count_reasons(counts, edge),
        cta_end_tick=counters.cta_end_tick.at[end_ids.reshape(-1)].set(k, mode="drop"),
        sm_items=counters.sm_items + jnp.sum(take, axis=1, dtype=jnp.int64),
    )
    # Launches complete with their last CTA; their successors learn when they may start.
    done_now = per_launch_sum(complete.astype(jnp.int32), state.cta_launch, shapes.n_launches)
    kernel_done = state.kernel_done + done_now
    kernel_end = jnp.where(done_now > 0, k, state.kernel_end)
    out = replace(
        state,
        kernel_done=kernel_done,
        kernel_end=kernel_end,
        kernel_ready=update_ready(state.kernel_ready, kernel_done, kernel_end, launches),
        dispatch_est=_learn_cta_durations(state.dispatch_est, complete, k - state.cta_start, state.cta_launch,
                                          launch),
        acc=acc,
        cycle=c + edge,
        mio=jnp.where(edge, jnp.maximum(mio - 1, 0), state.mio),
        pipe_free64=pipe_free64,
        last=jnp.where(has, q_sel, state.last),
        cta_id=jnp.where(complete, -1, state.cta_id),
        # The launch path needs cta_launch_ticks before a freed slot starts its next CTA.
        cta_usable_tick=jnp.where(complete, k + launch.cta_launch_ticks, state.cta_usable_tick),
        cta_live=cta_live,
        cta_arrived=jnp.where(release, 0, cta_arrived),
        resident=state.resident - jnp.sum(complete, axis=1, dtype=jnp.int32),
        warps=warps,
        q_l2=state.q_l2 + jnp.sum(l2_s, dtype=jnp.int32),
        q_dram=state.q_dram + jnp.sum(dram_s, dtype=jnp.int32),
        g_arrived=state.g_arrived + jnp.sum(grid_arrive, dtype=jnp.int32),
        items_taken=state.items_taken + jnp.sum(take, dtype=jnp.int32),
        ctas_done=state.ctas_done + n_done,
        last_exit_tick=jnp.where(n_done > 0, k, state.last_exit_tick),
        counters=counters,
    )
    # Last in the cycle: starved schedulers (start-of-cycle state) earn launch credit while the
    # SM has a free CTA slot, one freed in this cycle included (section 7).
    starved = starved_schedulers(hist)
    credit = collect(state.launch_credit, starved, edge.astype(jnp.int32), has_free_slot(out, launch, shapes), launch)
    return replace(out, launch_credit=credit)
