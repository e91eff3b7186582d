"""One tick: every SM whose clock edge falls in it runs one cycle (docs/model.md sections 7-8):
its schedulers pick warps (`warp_scheduler`), the picked warps issue (`issue`), CTAs and
launches complete, the counters and the launch credit move on.

All SMs are processed at once; SMs without a clock edge in this tick are masked.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

from ..lower import Launch, Shapes
from .issue import count_ops, issue, write_back
from .launch_credit import collect, has_free_slot
from .launches import Launches, per_launch_sum, update_ready
from .mechanics.materialize import once
from .memory import enqueued
from .residency import of_cta
from .state import State
from .status import ready_counts, scan, stall_rows, throttled
from .warp_scheduler import select


def clock_edges(state: State, launch: Launch, run: Bool[Array, " sm"]) -> tuple[Bool[Array, " sm"], Int[Array, " sm"]]:
    """Which SMs execute a cycle in the tick each runs (`run`: the SMs that run in this step),
    and their phase accumulators afterwards. An SM that does not run in this step (ahead of the
    chip after a fast-forward, waiting for the dispatcher, floorswept) neither executes nor
    accumulates."""
    acc = state.acc + state.freq
    edge = (acc >= launch.clocks.tick_mhz) & run
    return edge, jnp.where(edge, acc - launch.clocks.tick_mhz, jnp.where(run, acc, state.acc))


def _per_cta(x: Int[Array, "sched sm"], cta_of_sel: Int[Array, "sched sm"], shapes: Shapes) -> Int[Array, "cta sm"]:
    """Sum of a per-scheduler count over the CTA slots its selected warps belong to."""
    hit = cta_of_sel[None] == jnp.arange(shapes.cta_slots, dtype=jnp.int32)[:, None, None]
    return jnp.sum(jnp.where(hit, x[None], 0), axis=1, dtype=jnp.int32)


class Outlook(NamedTuple):
    """What a tick leaves for the event search (`events.skip_to_next_event`), per SM."""

    ready: Int[Array, "sched sm"]  # ready warps per class after the tick's issues, packed
    next_wake: Int[Array, " sm"]  # the earliest wake of a warp not ready (INF: none)
    changed: Bool[Array, " sm"]  # warps were released or started: look again at the next cycle
    issued: Bool[Array, " sm"]  # the SM issued in this tick (a point of the recurrence search)


def run_tick(state: State, launch: Launch, shapes: Shapes, launches: Launches, one: Int[Array, ""],
             tick: Int[Array, " sm"], run: Bool[Array, " sm"], policy: Int[Array, ""] | None = None
             ) -> tuple[State, Outlook, Bool[Array, "cta sm"]]:
    """Execute the cycle of each SM that runs in this step (`run`) at the tick it runs (`tick`;
    every SM at the chip's tick, or each at its own where SMs run on their own time:
    `decouple.py`) (section 7), complete CTAs and launches, and
    learn which launches became ready (section 13); no dispatch (the closed loop learns the
    completed CTAs' durations there: `dispatch_policies.observe`). `launches`: the per-launch
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
    throttle = throttled(state.pipe_free64, state.mio, launch.chip.mio_depth, c)
    sc = scan(w.wake, w.issue_class, throttle, c, shapes)
    sel, has, q_sel = select(state, launch, shapes, sc.eligible, edge, policy)
    iss = once(lambda: issue(state, launch, shapes, launches, k, sc.ready, sc.next_wake, sel, has, q_sel, edge, acc),
               one)
    warps = write_back(w, iss, sel, has, q_sel, shapes)

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
        sm_issued_op=counters.sm_issued_op + count_ops(iss["op"], has),
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
        cta_usable_tick=jnp.where(complete, k + launch.chip.cta_launch_ticks, state.cta_usable_tick),
        cta_live=cta_live,
        cta_arrived=jnp.where(release, 0, cta_arrived),
        resident=state.resident - jnp.sum(complete, axis=0, dtype=jnp.int32),
        warps=warps,
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
    q_l2, q_dram = enqueued(state, iss["l2"], iss["dram"])
    return replace(out, launch_credit=credit, q_l2=q_l2, q_dram=q_dram), look, release
