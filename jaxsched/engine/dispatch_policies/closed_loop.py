"""Closed-loop dispatch (docs/model.md section 9): each SM's CTA duration learnt from the CTAs it
completed, the first one's duration then an EMA, and the same EMA of squared durations (`observe`),
censored by its oldest running CTA (`estimates`); the SM with the smallest estimate, then the
most usable free slots, then the lowest rank [S1]. In the tail it holds the CTA back where the
launch's CTAs left fit in clearly better slots (`hold`), by a margin of the candidate's estimate
and deviation, each better slot counting 1 plus `hold_queue` per later CTA it is expected to
finish first, against `hold_left` times the CTAs left. Its learning and its hold are compiled in
only where a configuration dispatches by it (its twin's `READS_ESTIMATES`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import dataclasses

import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

from ...lower import Launch
from ...policies import HOLD_QUEUE_CTAS
from ..state import INF, Dispatch, State
from . import View

if TYPE_CHECKING:
    from ..dispatch import Slots

STATIC = False  # it reads every SM's CTA durations when it holds CTAs back


def score(v: View) -> Int[Array, " sm"]:
    i64 = v.rank.dtype
    return ((-v.est.astype(i64)) * 64 + v.room.astype(i64)) * 65536 - v.rank


def init(launch: Launch, dispatch: Dispatch) -> Dispatch:
    """Before an SM's first CTA of a launch completes: the estimate is the prior, on every SM,
    kept as `-1 - prior` (negative: no completion seen yet; durations and the prior are >= 0);
    the second moment 0."""
    return dataclasses.replace(dispatch, est=jnp.full_like(dispatch.est, -1 - launch.policy.ema_prior_ticks),
                               sq=jnp.zeros_like(dispatch.sq))


def _known(est: Int[Array, "..."]) -> Int[Array, "..."]:
    """The estimate a placement reads: the prior where no completion was seen (`init`)."""
    return jnp.where(est < 0, -1 - est, est)


def _ema(x: Int[Array, "..."], target: Int[Array, "..."], a: Int[Array, ""]) -> Int[Array, "..."]:
    """`x + floor(a * (target - x) / 256)`, exactly, without forming `a * (target - x)` (squared
    durations would overflow int64 beyond 2^55): `a * q + floor(a * r / 256)` with
    `target - x = 256 q + r`, `0 <= r < 256`."""
    diff = target - x
    return x + a * (diff // 256) + (a * (diff % 256)) // 256


def observe(state: State, was_occupied: Bool[Array, "cta sm"], launch: Launch) -> Dispatch:
    """The estimates and second moments after the tick's cycles (`state`; `was_occupied`: the
    slots that held a CTA before them), one completion at a time in CTA-slot order: an SM's first
    completion, of duration `d`, sets its estimate to `d` and its second moment to `d^2`, each
    later one moves them by the integer EMA. A completion updates its own launch's (section 13).
    Only completions are observed, never the clocks."""
    est, sq = state.dispatch.est, state.dispatch.sq
    complete = was_occupied & (state.cta_id < 0)
    a = launch.policy.ema_alpha_256.astype(jnp.int64)
    n_launches, sm = est.shape[0], jnp.arange(est.shape[1])
    for j in range(complete.shape[0]):
        d = (state.tick - state.cta_start[j]).astype(jnp.int64)
        l = 0 if n_launches == 1 else jnp.clip(state.cta_launch[j], 0, n_launches - 1)
        mine, square = (est[0], sq[0]) if n_launches == 1 else (est[l, sm], sq[l, sm])
        first = mine < 0
        square = jnp.where(complete[j], jnp.where(first, d * d, _ema(square, d * d, a)), square)
        mine = jnp.where(complete[j], jnp.where(first, d, _ema(mine, d, a)), mine)
        est = mine[None] if n_launches == 1 else est.at[l, sm].set(mine)
        sq = square[None] if n_launches == 1 else sq.at[l, sm].set(square)
    return dataclasses.replace(state.dispatch, est=est, sq=sq)


def _isqrt(x: Int[Array, "..."]) -> Int[Array, "..."]:
    """`floor(sqrt(x))` of int64 `x >= 0`, exactly (the float root is within 1 of it)."""
    r = jnp.floor(jnp.sqrt(x.astype(jnp.float64))).astype(x.dtype)
    r = r - (r * r > x)
    return r + ((r + 1) * (r + 1) <= x)


def estimates(state: State, tick: Int[Array, ""]) -> tuple[Int[Array, "launch sm"], Int[Array, "launch sm"]]:
    """What the placements of tick `tick` read, per launch from its own estimates and CTAs
    (section 13): the censored estimate `max(est_s, k - oldest start on s)`, since a CTA still
    running after that long shows the SM is at least that slow, whatever the estimate says; and
    the deviation `floor(sqrt(max(sq_s - est_s^2, 0)))`, the smoothed standard deviation of the
    SM's CTA durations (0 before its first completion)."""
    running = jnp.where(state.cta_id >= 0, tick - state.cta_start, 0)
    n_launches, n_sm = state.dispatch.est.shape
    if n_launches == 1:
        oldest = jnp.max(running, axis=0)[None]
    else:
        sm = jnp.broadcast_to(jnp.arange(n_sm)[None, :], running.shape)
        oldest = jnp.zeros((n_launches, n_sm), jnp.int32).at[state.cta_launch, sm].max(running)
    est = state.dispatch.est
    seen = est >= 0
    dev = jnp.where(seen, _isqrt(jnp.maximum(state.dispatch.sq - jnp.where(seen, est, 0) ** 2, 0)), 0)
    return jnp.maximum(_known(est), oldest.astype(jnp.int64)), dev


def hold(slots: Slots, launch: Launch, launching_tick: Int[Array, "cta sm"], est: Int[Array, " sm"],
         dev: Int[Array, " sm"], sm: Int[Array, ""], tick: Int[Array, ""], left: Int[Array, ""]) -> Bool[Array, ""]:
    """Keep the CTA if the `left` CTAs (the head launch's, this one included) fit in slots
    expected to finish them earlier than `sm` would, by the hold margin (a share of `sm`'s
    estimate plus a multiple of its deviation `dev`, `estimates`): occupied slots (of
    any launch), and free slots still launching (`launching_tick`, INF elsewhere) (sections 9
    and 13). A slot free from `a_j` (its occupant's expected end, or when it becomes usable) with
    estimate `e_j` finishes `n_j` CTAs with the margin to spare, the `k <= HOLD_QUEUE_CTAS` with
    `a_j + k e_j + margin < target`; it is better where `n_j >= 1`, and the CTA is held where
    one is and `256 better + hold_queue_256 sum (n_j - 1) >= hold_left_256 left`."""
    now = tick.astype(jnp.int64)
    target = now + est[sm]
    occupied = (slots.cta_id >= 0) & launch.chip.sm_enabled
    launching = (slots.cta_id < 0) & (launching_tick < INF)
    free = jnp.where(occupied, jnp.maximum(now, slots.start.astype(jnp.int64) + est), launching_tick.astype(jnp.int64))
    policy = launch.policy
    margin = (est[sm] * policy.hold_margin_256.astype(jnp.int64)  # est >= 0: floors
              + dev[sm] * policy.hold_noise_256.astype(jnp.int64)) // 256
    gap = target - margin - free - 1
    est_j = jnp.broadcast_to(est, gap.shape)
    n = jnp.where(est_j > 0, jnp.clip(gap // jnp.maximum(est_j, 1), 0, HOLD_QUEUE_CTAS),
                  jnp.where(gap >= 0, HOLD_QUEUE_CTAS, 0))
    n = jnp.where(occupied | launching, n, 0)
    better = jnp.sum(n >= 1, dtype=jnp.int64)
    later = jnp.sum(jnp.maximum(n - 1, 0), dtype=jnp.int64)
    score = 256 * better + policy.hold_queue_256.astype(jnp.int64) * later
    return (better >= 1) & (score >= policy.hold_left_256.astype(jnp.int64) * left.astype(jnp.int64))
