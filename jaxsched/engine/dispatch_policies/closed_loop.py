"""Closed-loop dispatch (docs/model.md section 9): each SM's CTA duration learnt from the CTAs it
completed, the first one's duration then an EMA (`observe`), censored by its oldest running CTA (`estimates`); the SM with the
smallest estimate, then the most usable free slots, then the lowest rank [S1]. In the tail it
holds the CTA back where the launch's CTAs left fit in clearly better slots (`hold`). Its
learning and its hold are compiled in only where a configuration dispatches by it (its twin's
`READS_ESTIMATES`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

from ...lower import Launch
from ..state import INF, State
from . import View

if TYPE_CHECKING:
    from ..dispatch import Slots

STATIC = False  # it reads every SM's CTA durations when it holds CTAs back


def score(v: View) -> Int[Array, " sm"]:
    i64 = v.rank.dtype
    return ((-v.est.astype(i64)) * 64 + v.room.astype(i64)) * 65536 - v.rank


def init(launch: Launch, est: Int[Array, "launch sm"]) -> Int[Array, "launch sm"]:
    """The estimate before an SM's first CTA of a launch completes: the prior, on every SM, kept
    as `-1 - prior` (negative: no completion seen yet; durations and the prior are >= 0)."""
    return jnp.full_like(est, -1 - launch.policy.ema_prior_ticks)


def _known(est: Int[Array, "..."]) -> Int[Array, "..."]:
    """The estimate a placement reads: the prior where no completion was seen (`init`)."""
    return jnp.where(est < 0, -1 - est, est)


def observe(state: State, was_occupied: Bool[Array, "cta sm"], launch: Launch) -> Int[Array, "launch sm"]:
    """The estimates after the tick's cycles (`state`; `was_occupied`: the slots that held a CTA
    before them), one completion at a time in CTA-slot order: an SM's first completion sets its
    estimate to that duration, each later one moves it by the integer EMA. A completion updates
    its own launch's estimate (section 13). Only completions are observed, never the clocks."""
    est = state.dispatch.est
    complete = was_occupied & (state.cta_id < 0)
    a = launch.policy.ema_alpha_256.astype(jnp.int64)
    n_launches, sm = est.shape[0], jnp.arange(est.shape[1])
    for j in range(complete.shape[0]):
        d = (state.tick - state.cta_start[j]).astype(jnp.int64)
        l = 0 if n_launches == 1 else jnp.clip(state.cta_launch[j], 0, n_launches - 1)
        mine = est[0] if n_launches == 1 else est[l, sm]
        mine = jnp.where(complete[j], jnp.where(mine < 0, d, mine + (a * (d - mine)) // 256), mine)
        est = mine[None] if n_launches == 1 else est.at[l, sm].set(mine)
    return est


def estimates(state: State, tick: Int[Array, ""]) -> Int[Array, "launch sm"]:
    """What the placements of tick `tick` read: `max(est_s, k - oldest start on s)`, since a CTA
    still running after that long shows the SM is at least that slow, whatever the estimate says.
    Per launch, from its own estimates and its own CTAs (section 13)."""
    running = jnp.where(state.cta_id >= 0, tick - state.cta_start, 0)
    n_launches, n_sm = state.dispatch.est.shape
    if n_launches == 1:
        oldest = jnp.max(running, axis=0)[None]
    else:
        sm = jnp.broadcast_to(jnp.arange(n_sm)[None, :], running.shape)
        oldest = jnp.zeros((n_launches, n_sm), jnp.int32).at[state.cta_launch, sm].max(running)
    return jnp.maximum(_known(state.dispatch.est), oldest.astype(jnp.int64))


def hold(slots: Slots, launch: Launch, launching_tick: Int[Array, "cta sm"], est: Int[Array, " sm"],
         sm: Int[Array, ""], tick: Int[Array, ""], left: Int[Array, ""]) -> Bool[Array, ""]:
    """Keep the CTA if the `left` CTAs (the head launch's, this one included) fit in slots
    expected to finish them earlier than `sm` would, by the hold margin (a share of `sm`'s
    estimate): occupied slots (of any launch), and free slots still launching
    (`launching_tick`, INF elsewhere) (sections 9 and 13)."""
    now = tick.astype(jnp.int64)
    target = now + est[sm]
    occupied_finish = jnp.maximum(now, slots.start.astype(jnp.int64) + est) + est
    launching_finish = launching_tick.astype(jnp.int64) + est
    occupied = (slots.cta_id >= 0) & launch.chip.sm_enabled
    launching = (slots.cta_id < 0) & (launching_tick < INF)
    finish = jnp.where(occupied, occupied_finish, launching_finish)
    margin = est[sm] * launch.policy.hold_margin_256.astype(jnp.int64) // 256  # est >= 0: a floor
    better = (occupied | launching) & (finish + margin < target)
    return left.astype(jnp.int64) <= jnp.sum(better, dtype=jnp.int64)
