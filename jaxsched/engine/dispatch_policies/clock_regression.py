"""Clock-regression dispatch (docs/model.md section 9): the closed loop's placement and tail hold,
with every SM's CTA duration predicted from the completions on all SMs and the SMs' clocks now,
not learnt per SM. Per launch it keeps each SM's sum of CTA durations and their count
(`observe`); at a placement it fits the per-SM mean durations `m_s` against the clock periods
`u_s = 2^20 // max(f_s, 64)` by least squares over the SMs with a completion (`estimates`),
with the slope kept in `[0, sum m / sum u]` (a CTA's time is a clock-scaled part plus a fixed
part, neither negative), and predicts `e_s` for every SM at its clock. Hundreds of completions
inform every estimate, so it is far less noisy than the closed loop's per-SM EMA, and a
memory-bound kernel, whose durations do not follow the clock, gets a flat fit and no holds; on
a uniform chip every estimate is the same, so it places as hardware dispatch does and holds
nothing. The hold is the closed loop's with no deviation term."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

from ...lower import Launch
from ..state import Dispatch, State
from . import closed_loop

STATIC = False  # it reads every SM's CTA durations and clocks when it holds CTAs back
score = closed_loop.score
PERIOD_SCALE = 2**20  # u_s = PERIOD_SCALE // max(f_s, MIN_FIT_MHZ): about 0.06 % steps at 1.8 GHz
MIN_FIT_MHZ = 64  # slower SMs count as this slow in the fit (keeps its int64 sums exact)


def init(launch: Launch, dispatch: Dispatch) -> Dispatch:
    """No completions yet: every SM's duration sum (`est`) and count (`sq`) 0."""
    return dataclasses.replace(dispatch, est=jnp.zeros_like(dispatch.est), sq=jnp.zeros_like(dispatch.sq))


def observe(state: State, was_occupied: Bool[Array, "cta sm"], launch: Launch) -> Dispatch:
    """Each completion of the tick adds its duration (ticks) to its launch's sum on its SM and 1
    to the count (section 13: per launch)."""
    complete = was_occupied & (state.cta_id < 0)
    d = jnp.where(complete, state.tick - state.cta_start, 0).astype(jnp.int64)
    est, sq = state.dispatch.est, state.dispatch.sq
    if est.shape[0] == 1:
        return dataclasses.replace(state.dispatch, est=est + jnp.sum(d, axis=0)[None],
                                   sq=sq + jnp.sum(complete, axis=0, dtype=jnp.int64)[None])
    sm = jnp.broadcast_to(jnp.arange(est.shape[1])[None, :], d.shape)
    launch_of = jnp.clip(state.cta_launch, 0, est.shape[0] - 1)
    return dataclasses.replace(state.dispatch, est=est.at[launch_of, sm].add(d),
                               sq=sq.at[launch_of, sm].add(complete.astype(jnp.int64)))


def fit(total_ticks: Int[Array, "launch sm"], count: Int[Array, "launch sm"], freq_mhz: Int[Array, " sm"]
        ) -> Int[Array, "launch sm"]:
    """Each SM's predicted CTA duration (ticks) per launch, from its SMs' duration sums and
    counts and the clocks now (module doc); 0 on every SM before the launch's first completion.
    Sums in int64, exact for up to 256 SMs with a completion (`|d_s| <= 2^22`, means < 2^31);
    one float64 division and one product, each rounded as IEEE says, so the reference matches."""
    seen = count > 0
    m = jnp.where(seen, total_ticks // jnp.maximum(count, 1), 0)
    period = PERIOD_SCALE // jnp.maximum(freq_mhz.astype(jnp.int64), MIN_FIT_MHZ)
    u = jnp.where(seen, period, 0)
    k = jnp.sum(seen, axis=-1, keepdims=True, dtype=jnp.int64)
    s_u, s_m = jnp.sum(u, axis=-1, keepdims=True), jnp.sum(m, axis=-1, keepdims=True)
    d = jnp.where(seen, k * u - s_u, 0)  # k (u_s - mean u), over the SMs with completions
    num, den = jnp.sum(m * d, axis=-1, keepdims=True), jnp.sum(u * d, axis=-1, keepdims=True)
    f64 = lambda x: x.astype(jnp.float64)  # noqa: E731
    slope = jnp.where(den > 0, f64(num) / f64(jnp.where(den > 0, den, 1)), 0.0)
    steepest = f64(s_m) / f64(jnp.maximum(s_u, 1))
    slope = jnp.clip(slope, 0.0, steepest)
    shift = jnp.floor(slope * f64(k * period - s_u)).astype(jnp.int64)  # k * slope * (u_s - mean u), every SM
    return jnp.where(k > 0, jnp.maximum((s_m + shift) // jnp.maximum(k, 1), 0), 0)


def estimates(state: State, tick: Int[Array, ""]) -> tuple[Int[Array, "launch sm"], Int[Array, "launch sm"]]:
    """What the placements of tick `tick` read: the fit at the clocks now, uncensored (a CTA
    running long shows its own work, not a slow SM, once the clock is known), and no deviation."""
    est = fit(state.dispatch.est, state.dispatch.sq, state.freq)
    return est, jnp.zeros_like(est)


hold = closed_loop.hold  # the closed loop's tail hold, on these estimates (no deviation term)
