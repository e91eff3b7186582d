"""The differentiable surrogate: CTA-level list scheduling with relaxed decisions.

The exact engine is a cycle-level simulation whose decisions (which SM takes a CTA, when a slot
frees, whether the closed-loop dispatcher holds) are discrete, so its makespan is piecewise
constant in the dispatch parameters. The surrogate keeps the engine's structure one level up:

- **Slots.** SM `s` has `ctas_per_sm` CTA slots. CTA `c` occupies a slot for
  `cycles_c * 1000 / f_s + ns_c` ns (`launch.measure_work`: per-CTA occupancy measured by the
  engine on a uniform chip, so the warp scheduler's staggering is inside the work model); a freed
  slot can start its next CTA `cta_launch_ns` later (the launch path's latency).
- **Dispatch in grid order.** CTA `c` is dispatched at the first time `t` a slot is usable (not
  before CTA `c - 1`), to the SM the policy prefers among SMs with a usable slot, into that SM's
  lowest usable slot: the engine's rule of docs/model.md section 9 at CTA granularity ("room"
  counts usable slots, "resident" running CTAs).
- **Policies.** `hardware` (most free slots, ties by rank), `least_loaded` (at slot level the
  same as `hardware`: a slot model does not see partly finished CTAs), `round_robin` (pointer
  kept hard: it has no parameter), `weighted` (`weight / (resident + 1)`), `closed_loop` (per
  SM, the first observed slot occupancy, then an EMA of the later ones in order of completion,
  and the same EMA of their squares, whose variance gives the deviation; censored by the oldest running CTA,
  earliest expected finish, and the tail *hold*: occupied slots, and free slots still in their
  launch latency, expected to finish a CTA clearly earlier than the candidate (by a share of
  its estimate and a multiple of its deviation) are better; each counts 1, plus `hold_queue`
  for each later CTA it would also finish first (up to `HOLD_QUEUE_CTAS` in all); where that
  score reaches `hold_left` times the CTAs left, the CTA waits for the first of them).

Relaxation at temperature `T` (dimensionless; scores are in slots, log-weights or CTA
occupancies `d`, the mean occupancy at the mean clock):
- **Decisions are soft.** The SM is `softmax(score / T)` over the SMs with a free slot. The
  closed-loop hold compares expected finishes: an occupied slot counts as "better" with weight
  `sigmoid(margin / (T d))` (each later CTA it would finish likewise), the CTA holds with
  probability `sigmoid((score + 1/512) / T)`,
  and the slot it waits for is a softmin of free times at `T d`. A CTA spread over several slots
  updates each in proportion (mean field): free times, start times and EMA estimates become
  expectations; the work placed is conserved. Choices below `DUST` (1 %) of the likeliest one are
  dropped (faded out continuously between 1 and 2 %) and the rest renormalised: a sliver of a
  CTA would make a free slot look busy. Exact ties (equal scores: slots of equal-work CTAs that
  started together) go to the first entry, as in `hard`, not split: a split leaves a mixture
  that no `T -> 0` undoes.
- **Events stay exact.** "Slot usable at `t`", "CTA still running" and "completion seen by the
  EMA" are exact 0/1 with no gradient of their own: their timing carries the gradient (the
  dispatch time `t` is an exact `min` of usable times, piecewise linear). Softening them would let a CTA start at `t` in a slot
  busy until later, an error that does not vanish as `T -> 0` (busy time and score gaps both
  scale as `1/T`). So the surrogate is piecewise smooth: smooth in the parameters between the
  instants where two events swap order; `jax.grad` is the derivative of the piece.
- **Makespan:** `T d logsumexp(end_ns / (T d))` over the slots (at most `T d log(slots)` above
  the max).
Mode `hard` is the `T -> 0` limit (exact decisions, no relaxation); `straight_through` runs the
hard forward pass with the soft pass's gradients.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from ..errors import check
from ..policies import HOLD_QUEUE_CTAS
from .launch import DispatchParams, SurrogateLaunch

MODES = ("soft", "hard", "straight_through")
# The dispatch policies the surrogate relaxes (`_scores`); the engine may know more.
RELAXED_POLICIES = ("hardware", "round_robin", "least_loaded", "weighted", "closed_loop")
DUST = 1e-2  # soft choices below this fraction of the likeliest are dropped (the rest renormalised)
_BIG_NS = 1e12
_TIE_ROOM = 1e-2  # closed loop: most room breaks near-ties of expected finish (units of d)
_TIE_RANK = 1e-2  # weighted and closed loop: the rotated hardware order breaks remaining ties


class Schedule(eqx.Module):
    """The surrogate's schedule: makespan and per-CTA expectations (mean field in soft mode)."""

    makespan_ns: Float[Array, "*b"]
    cta_start_ns: Float[Array, "*b grid"]
    cta_end_ns: Float[Array, "*b grid"]
    cta_sm: Int[Array, "*b grid"]  # the most likely SM
    slot_end_ns: Float[Array, "*b sm slot"]  # when each slot's last CTA ended


class _Learnt(NamedTuple):
    """What the closed loop has learnt of each SM (mean field in soft mode)."""

    est_ns: Float[Array, " sm"]  # a CTA's occupancy
    sq_ns2: Float[Array, " sm"]  # the same EMA of squared occupancies
    seen: Float[Array, " sm"]  # the SM's first completion has been observed (0/1)

    def deviation_ns(self) -> Float[Array, " sm"]:
        """`sqrt(max(sq - est^2, 0))`, the smoothed standard deviation (0 with no gradient at 0)."""
        var = self.sq_ns2 - self.est_ns**2
        return jnp.where(var > 0, jnp.sqrt(jnp.where(var > 0, var, 1.0)), 0.0)


class _State(NamedTuple):
    end_ns: Float[Array, "sm slot"]  # when the slot's CTA ends (0: never used)
    usable_ns: Float[Array, "sm slot"]  # when the slot can start a CTA: end + launch latency
    start_ns: Float[Array, "sm slot"]  # when its CTA started
    counted: Float[Array, "sm slot"]  # the EMA has seen that CTA's completion (1 if no CTA)
    used: Float[Array, "sm slot"]  # the slot has had a CTA
    learnt: _Learnt  # closed loop
    t_ns: Float[Array, ""]  # when the previous CTA was placed
    pointer: Int[Array, ""]  # round robin


@dataclasses.dataclass(frozen=True)
class _Relax:
    """The relaxed primitives of one mode (static) and temperature (traced)."""

    mode: str
    tau_time: Array  # ns
    tau_score: Array  # score units

    def _mix(self, hard: Array, soft_fn) -> Array:
        if self.mode == "hard":
            return hard
        soft = soft_fn()
        # `soft - stop_gradient(soft)` is exactly 0 in the forward pass, so the sum is exactly
        # `hard`; `(hard + soft) - soft` would round, and 1-ulp errors break the exact ties of the
        # hard schedule (equal free times), which changes decisions downstream
        return soft if self.mode == "soft" else hard + (soft - jax.lax.stop_gradient(soft))

    def gate(self, x: Array) -> Array:
        """Exact `x >= 0`: an event (a slot frees, a finish is earlier) is discrete in every mode;
        its timing carries the gradient (see the module docstring)."""
        return jax.lax.stop_gradient((x >= 0).astype(x.dtype))

    def step(self, x: Array, tau: Array) -> Array:
        """The decision `x >= 0`, relaxed to `sigmoid(x / tau)` (within `DUST` of 0 or 1: exact)."""

        def soft() -> Array:  # [DUST, 1 - DUST] stretched onto [0, 1]: exact near 0 and 1, continuous
            return jnp.clip((jax.nn.sigmoid(x / tau) - DUST) / (1.0 - 2.0 * DUST), 0.0, 1.0)

        return self._mix((x >= 0).astype(x.dtype), soft)

    def choose(self, score: Array, allowed: Array, tau: Array) -> Array:
        """Weights over entries with `allowed` (exact 0/1 forward): one-hot at the best `score`,
        relaxed to `allowed * exp(score / tau)`, normalised."""
        flat_s, flat_a = score.ravel(), allowed.ravel()
        best = jnp.max(jnp.where(flat_a > 0.5, flat_s, -jnp.inf))
        hard = jax.nn.one_hot(jnp.argmax(jnp.where(flat_a > 0.5, flat_s, -jnp.inf)), flat_s.size, dtype=score.dtype)

        def soft() -> Array:
            # exact ties go to the first entry, as in `hard`: splitting a CTA between two slots
            # that free at the same instant would leave a mixture that no T -> 0 undoes
            gap = jnp.minimum((flat_s - jnp.where(jnp.isfinite(best), best, 0.0)) / tau, 0.0)
            z = flat_a * _first_of_ties(flat_s, flat_a) * jnp.exp(gap)
            total = jnp.sum(z)
            some = total > 1e-20  # nothing allowed: no weight anywhere (and no 0/0 in the gradient)
            z = jnp.where(some, z / jnp.where(some, total, 1.0), 0.0)
            # dust would make a free slot look busy: fade out below 2 DUST of the likeliest, gone
            # below DUST (continuous, so the surrogate stays continuous in the parameters)
            z = z * jnp.clip(z / (DUST * jnp.max(z)) - 1.0, 0.0, 1.0)
            kept = jnp.sum(z)
            return jnp.where(kept > 0, z / jnp.where(kept > 0, kept, 1.0), 0.0)

        return self._mix(hard, soft).reshape(score.shape)

    def max(self, x: Array, mask: Array) -> Array:
        hard = jnp.max(jnp.where(mask, x, -_BIG_NS))
        return self._mix(hard, lambda: self.tau_time * jax.nn.logsumexp(jnp.where(mask, x / self.tau_time, -_BIG_NS)))


def _first_of_ties(score: Float[Array, " n"], allowed: Float[Array, " n"]) -> Float[Array, " n"]:
    """0/1 (no gradient): allowed entries with no allowed entry of exactly equal score before them."""
    key = jax.lax.stop_gradient(jnp.where(allowed > 0.5, score, jnp.inf))
    order = jnp.argsort(key, stable=True)  # equal scores stay in index order
    ranked = key[order]
    repeat = jnp.concatenate([jnp.zeros((1,), bool), (ranked[1:] == ranked[:-1]) & jnp.isfinite(ranked[1:])])
    return jnp.zeros_like(score).at[order].set(1.0 - repeat.astype(score.dtype))


def _first(free: Float[Array, "sm slot"]) -> Float[Array, "sm slot"]:
    """One-hot at each row's lowest free slot (0/1 inputs)."""
    before = jnp.cumprod(1.0 - free, axis=1)
    return free * jnp.concatenate([jnp.ones_like(before[:, :1]), before[:, :-1]], axis=1)


def _scores(policy: str, launch: SurrogateLaunch, params: DispatchParams, room: Array, resident: Array,
            pointer: Array, est: Array, t: Array, scale_ns: Array) -> Array:
    """Higher is preferred; units make T = 1 a strong smoothing (slots, log-weights, CTA times).
    `room`: usable free slots; `resident`: CTAs running (docs/model.md section 9)."""
    n_enabled = jnp.maximum(jnp.sum(launch.sm_enabled), 1)
    rank = launch.dispatch_rank / n_enabled  # in [0, 1)
    if policy in ("hardware", "least_loaded"):
        return room - rank  # the rank term (< 1) only breaks ties of room
    if policy == "round_robin":
        return -jnp.mod(launch.dispatch_rank - pointer, n_enabled)
    if policy == "weighted":
        return jnp.log(params.weight) - jnp.log(resident + 1.0) - _TIE_RANK * rank
    return -(t + est) / scale_ns + _TIE_ROOM * room - _TIE_RANK * rank  # closed_loop


def _observe(state: _State, relax: _Relax, usable: Array, t: Array, alpha: Array) -> tuple[_Learnt, Array]:
    """Learn from every completion up to `t`, per SM in order of completion (docs/model.md 9):
    an SM's first sets its estimate (`d`) and second moment (`d^2`), each later one moves them
    by the EMA. Returns what is learnt and the slots counted.

    `m` updates `e += alpha (x_i - e)` in order equal `(1 - alpha)^m e + sum_i alpha (1 -
    alpha)^(m - 1 - i) x_i`, with `i` a completion's position among the SM's new ones; on an SM
    not seen before, `e` is its first new completion's `x_0` (the first update then gives `x_0`).
    In soft mode completions are fractions (mixtures of CTAs), so `m` and positions are too.
    """
    a = state.end_ns
    done = usable * state.used * (1.0 - state.counted) * relax.gate(t - a)  # exact 0/1
    n_slot = a.shape[1]
    index = jnp.arange(n_slot)
    earlier = (a[:, None, :] < a[:, :, None]) | ((a[:, None, :] == a[:, :, None]) & (index[None, :] < index[:, None]))
    position = jnp.sum(done[:, None, :] * earlier, axis=2)  # new completions before each slot's
    m = jnp.sum(done, axis=1)
    log_keep = jnp.log1p(-jnp.minimum(alpha, 1.0 - 1e-7))
    decay = jnp.exp(m * log_keep)
    weight = jnp.where(done > 0, alpha * jnp.exp(jnp.maximum(m[:, None] - 1.0 - position, 0.0) * log_keep), 0.0)
    some, learnt, d = jnp.minimum(m, 1.0), state.learnt, a - state.start_ns
    first = jnp.where(position == 0, done, 0.0)

    def ema(old: Array, x: Array) -> Array:
        prior = old + (1.0 - learnt.seen) * some * (jnp.sum(first * x, axis=1) - old)
        return decay * prior + jnp.sum(weight * x, axis=1)

    return (_Learnt(est_ns=ema(learnt.est_ns, d), sq_ns2=ema(learnt.sq_ns2, d * d),
                    seen=learnt.seen + (1.0 - learnt.seen) * some), state.counted + done)


def _learn(learnt: _Learnt, w: Float[Array, "sm slot"], d: Float[Array, "sm slot"], alpha: Array) -> _Learnt:
    """One completion per SM, of occupancy `d`, in the slots `w` (a mean-field spread that sums
    to at most 1 per SM): as `_observe`'s."""
    a = learnt.seen * alpha + (1.0 - learnt.seen)  # an SM's first completion sets its moments
    return _Learnt(est_ns=learnt.est_ns + a * jnp.sum(w * (d - learnt.est_ns[:, None]), axis=1),
                   sq_ns2=learnt.sq_ns2 + a * jnp.sum(w * (d * d - learnt.sq_ns2[:, None]), axis=1),
                   seen=learnt.seen + (1.0 - learnt.seen) * jnp.sum(w, axis=1))


def _step(state: _State, cta, *, launch: SurrogateLaunch, params: DispatchParams, relax: _Relax, policy: str,
          scale_ns: Array):
    cycles, ns, valid, left = cta
    n_slot = state.end_ns.shape[1]
    f = launch.sm_freq_mhz
    usable = (launch.sm_enabled[:, None] & (jnp.arange(n_slot)[None, :] < launch.ctas_per_sm)).astype(f.dtype)
    duration = cycles * 1000.0 / jnp.where(f > 0, f, 1.0) + ns  # [sm]
    a = state.usable_ns
    t = jnp.maximum(state.t_ns, jnp.min(jnp.where(usable > 0, a, _BIG_NS)))
    free = usable * relax.gate(t - a)  # free and past the launch latency: can start a CTA now
    occupied = usable * state.used * (1.0 - relax.gate(t - state.end_ns))  # a CTA still running
    room = jnp.sum(free, axis=1)

    learnt, counted, est = state.learnt, state.counted, state.learnt.est_ns  # est: read by closed_loop only
    if policy == "closed_loop":
        learnt, counted = _observe(state, relax, usable, t, params.ema_alpha)
        est = jnp.maximum(learnt.est_ns, jnp.max(occupied * (t - state.start_ns), axis=1))  # censored
    score = _scores(policy, launch, params, room, jnp.sum(occupied, axis=1), state.pointer, est, t, scale_ns)
    p = relax.choose(score, jnp.minimum(room, 1.0), relax.tau_score)  # [sm]
    q = _first(free)  # [sm, slot]

    if policy == "closed_loop":
        e_cand = jnp.sum(p * est)
        margin = e_cand * params.hold_margin + jnp.sum(p * learnt.deviation_ns()) * params.hold_noise
        # slots expected to finish a CTA: occupied ones after their occupant, free ones still in
        # their launch latency (`launching`) from when they become usable (docs/model.md 9)
        launching = usable * state.used * relax.gate(t - state.end_ns) * (1.0 - relax.gate(t - a))
        free_at = jnp.where(launching > 0, a, jnp.maximum(t, state.start_ns + est[:, None]))
        # the k-th CTA a slot would finish, strictly earlier than the candidate by the margin:
        # free_at + k e + margin < t + e_cand (the 1e-3 ns keeps exact equality out)
        k = jnp.arange(1, HOLD_QUEUE_CTAS + 1, dtype=f.dtype)
        finish = free_at[:, :, None] + k * est[:, None, None]  # [sm, slot, k]
        done = (occupied + launching)[:, :, None] * relax.step(t + e_cand - margin - finish - 1e-3, relax.tau_time)
        better = done[:, :, 0]
        n_better = jnp.sum(better)
        # the hold's score (docs/model.md 9): 1 per better slot, hold_queue per later CTA it
        # finishes first, against hold_left per CTA left; >= 0 holds (the engine's integers
        # are multiples of 1/256, so half of that decides exact equality)
        score = n_better + params.hold_queue * jnp.sum(done[:, :, 1:]) - params.hold_left * left
        hold = valid * jnp.minimum(n_better, 1.0) * relax.step(score + 0.5 / 256, relax.tau_score)
        r = relax.choose(t - a, better, relax.tau_time)
    else:
        hold, r = jnp.zeros((), f.dtype), jnp.zeros_like(a)
    u = valid * (1.0 - hold) * p[:, None] * q  # placed now, at t
    v = valid * hold * r  # held for a better slot, placed when it frees
    later = jnp.maximum(t, a)
    keep = 1.0 - u - v
    if policy == "closed_loop":  # a held CTA's slot reports its occupant's completion first
        learnt = _learn(learnt, v * (1.0 - counted), state.end_ns - state.start_ns, params.ema_alpha)
    placed_at = (1.0 - hold) * t + hold * jnp.sum(r * later)
    n_enabled = jnp.maximum(jnp.sum(launch.sm_enabled), 1)
    ends = u * (t + duration[:, None]) + v * (later + duration[:, None])
    new = _State(
        end_ns=keep * state.end_ns + ends,
        usable_ns=keep * a + ends + (u + v) * launch.cta_launch_ns,
        start_ns=keep * state.start_ns + u * t + v * later,
        counted=keep * counted,
        used=keep * state.used + u + v,
        learnt=learnt,
        t_ns=jnp.where(valid > 0, placed_at, state.t_ns),
        pointer=jnp.where(valid > 0, (launch.dispatch_rank[jnp.argmax(p)].astype(jnp.int32) + 1) % n_enabled,
                          state.pointer).astype(jnp.int32),
    )
    return new, (placed_at, jnp.sum(ends), jnp.argmax(jnp.sum(u + v, axis=1)).astype(jnp.int32))


@functools.partial(jax.jit, static_argnames=("policy", "mode", "max_slots"))
def schedule(
    launch: SurrogateLaunch,
    params: DispatchParams,
    temperature: Float[Array, ""] | float,
    *,
    policy: str,
    mode: str = "soft",
    max_slots: int,
) -> Schedule:
    """Run the relaxed scheduler on one configuration (vmap over a batch axis for many).

    `policy` one of `RELAXED_POLICIES`; `mode` one of `MODES`; `max_slots` (static) at least
    `launch.ctas_per_sm`: the slot array's width.
    """
    check(policy in RELAXED_POLICIES, "policy", policy, f"one of the relaxed policies {RELAXED_POLICIES}")
    check(mode in MODES, "mode", mode, f"one of {MODES}")
    f = launch.sm_freq_mhz
    dtype = f.dtype if jnp.issubdtype(f.dtype, jnp.floating) else jnp.float32
    f = f.astype(dtype)
    work = jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, launch.work)
    enabled = launch.sm_enabled
    mean_mhz = jnp.sum(jnp.where(enabled, f, 0.0)) / jnp.maximum(jnp.sum(enabled), 1)
    n_valid = jnp.sum(work.valid)
    scale_ns = jnp.sum(jnp.where(work.valid, work.cycles * 1000.0 / mean_mhz + work.ns, 0.0)) / jnp.maximum(n_valid, 1)
    temperature = jnp.asarray(temperature, dtype)
    relax = _Relax(mode=mode, tau_time=temperature * scale_ns, tau_score=temperature)
    n_sm = f.shape[-1]
    zeros = jnp.zeros((n_sm, max_slots), dtype)
    start = _State(end_ns=zeros, usable_ns=zeros, start_ns=zeros, counted=jnp.ones_like(zeros), used=zeros,
                   learnt=_Learnt(est_ns=jnp.broadcast_to(params.ema_prior_ns, (n_sm,)).astype(dtype),
                                  sq_ns2=jnp.zeros((n_sm,), dtype), seen=jnp.zeros((n_sm,), dtype)),
                   t_ns=jnp.zeros((), dtype), pointer=jnp.zeros((), jnp.int32))
    params = jax.tree.map(lambda x: x.astype(dtype), params)
    left = (n_valid - jnp.arange(work.valid.shape[-1])).astype(dtype)
    step = jax.checkpoint(functools.partial(_step, launch=launch, params=params, relax=relax, policy=policy,
                                            scale_ns=scale_ns))
    xs = (work.cycles, work.ns, work.valid.astype(dtype), left)
    final, (starts, ends, sms) = jax.lax.scan(step, start, xs)
    usable = enabled[:, None] & (jnp.arange(max_slots)[None, :] < launch.ctas_per_sm)
    last = relax.max(final.end_ns, usable & (final.used > 0))
    launch_tick_ns = 1000.0 / jnp.max(f)  # dispatch at tick 0, first issue at tick 1 (model.md 2)
    return Schedule(makespan_ns=last + launch_tick_ns, cta_start_ns=starts, cta_end_ns=ends + launch_tick_ns,
                    cta_sm=jnp.where(work.valid, sms, -1), slot_end_ns=final.end_ns)
