"""CTA dispatch, the GigaThread engine (docs/model.md section 9).

A policy is a score per SM; the next CTA goes to the highest-scoring SM with a free CTA slot,
one CTA at a time, scores re-evaluated after every placement. Policies are selected by a traced
index, so one compiled simulation serves all of them.
"""

from __future__ import annotations

from dataclasses import replace

import jax
import jax.numpy as jnp
from jaxtyping import Array, Int

from ..lower import Launch, Shapes
from .state import State, Warps
from .variation import resolve_pc, warp_variation

HARDWARE, ROUND_ROBIN = 0, 1


def scores(state: State, launch: Launch, room: Int[Array, " sm"]) -> Int[Array, " sm"]:
    """Higher is preferred; only SMs with room are considered by the caller."""
    n_enabled = jnp.maximum(jnp.sum(launch.sm_enabled, dtype=jnp.int32), 1)
    # "Most room", ties to the lowest rank in the rotated fixed order [Gil21].
    most_room = room * 65536 - launch.dispatch_rank
    # Round robin: first SM at or after the pointer in rank order.
    round_robin = -((launch.dispatch_rank - state.rr_pointer) % n_enabled)
    return jnp.where(launch.dispatch_policy == HARDWARE, most_room, round_robin)


def _place(state: State, launch: Launch, shapes: Shapes, tick: Int[Array, ""]) -> State:
    room = jnp.where(launch.sm_enabled, launch.ctas_per_sm - state.resident, 0)
    score = jnp.where(room > 0, scores(state, launch, room), jnp.iinfo(jnp.int32).min)
    sm = jnp.argmax(score).astype(jnp.int32)
    slots = jnp.arange(shapes.cta_slots, dtype=jnp.int32)
    free = (state.cta_id[sm] < 0) & (slots < launch.ctas_per_sm)
    j = jnp.argmax(free).astype(jnp.int32)
    cta = state.next_cta
    n_w = launch.warps_per_cta

    slot = jnp.arange(shapes.warp_slots, dtype=jnp.int32)
    warp = jnp.clip(slot - j * n_w, 0, 31)
    mine = (slot >= j * n_w) & (slot < (j + 1) * n_w)
    trips, lanes, if_lanes = warp_variation(launch, cta, warp)
    pc0 = resolve_pc(launch, jnp.zeros_like(slot), trips, if_lanes, lanes)
    w = state.warps

    def put(field: Array, value: Array) -> Array:
        return field.at[sm].set(jnp.where(mine, value, field[sm]))

    zero = jnp.zeros_like(slot)
    warps = Warps(
        active=put(w.active, True),
        pc=put(w.pc, pc0),
        trips_left=put(w.trips_left, trips),
        lanes=put(w.lanes, lanes),
        if_lanes=put(w.if_lanes, if_lanes),
        age=put(w.age, 32 * cta + warp),
        at_barrier=put(w.at_barrier, False),
        ready_fixed=put(w.ready_fixed, zero),
        ready_mio=put(w.ready_mio, zero),
        ready_mem=put(w.ready_mem, zero),
    )
    n_enabled = jnp.maximum(jnp.sum(launch.sm_enabled, dtype=jnp.int32), 1)
    k = state.counters
    return replace(
        state,
        cta_id=state.cta_id.at[sm, j].set(cta),
        cta_live=state.cta_live.at[sm, j].set(n_w),
        cta_arrived=state.cta_arrived.at[sm, j].set(0),
        resident=state.resident.at[sm].add(1),
        warps=warps,
        next_cta=cta + 1,
        rr_pointer=jnp.where(
            launch.dispatch_policy == ROUND_ROBIN,
            (launch.dispatch_rank[sm] + 1) % n_enabled,
            state.rr_pointer,
        ),
        counters=replace(
            k,
            sm_ctas=k.sm_ctas.at[sm].add(1),
            cta_sm=k.cta_sm.at[cta].set(sm),
            cta_start_tick=k.cta_start_tick.at[cta].set(tick),
        ),
    )


def dispatch(state: State, launch: Launch, shapes: Shapes, tick: Int[Array, ""]) -> State:
    """Place CTAs until the grid is exhausted or no enabled SM has a free CTA slot."""

    def has_work(st: State) -> Array:
        room = jnp.where(launch.sm_enabled, launch.ctas_per_sm - st.resident, 0)
        return (st.next_cta < launch.n_ctas) & jnp.any(room > 0)

    return jax.lax.while_loop(has_work, lambda st: _place(st, launch, shapes, tick), state)
