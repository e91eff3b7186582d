"""Dispatch parameters fitted through the surrogate with optax, judged in the exact engine.

A *family* maps a few learnable numbers `theta` to the engine's dispatch inputs, as a function of
what a dispatcher can know (each SM's clock, the kernel's mean CTA time), so that one `theta`
serves chips it was not fitted on:

- `weighted`: static weights `w_s = (f_s / mean f)^gamma` (`gamma = 1` is the engine's default,
  the clocks; the engine takes `round(1000 w_s)`, clipped to 1..32768);
- `closed_loop`: `ema_alpha = sigmoid(a)` and `ema_prior_ns = exp(b) d`, `d` the kernel's mean
  CTA occupancy at the chip's mean clock;
- `closed_loop_tail`: the closed loop's learning and its tail hold, `ema_alpha = sigmoid(a)` and
  `hold_margin = sigmoid(m)` (the share of its estimate by which a slot must be expected to
  finish a held CTA earlier), prior 0: nothing in it depends on the kernel's CTA time, so the
  fitted policy carries over to other kernels (`jaxsched.fitted_policy`);
- `closed_loop_noise`: `closed_loop_tail` with the hold margin's second term, `hold_noise =
  8 sigmoid(n)` times the candidate SM's deviation (the smoothed standard deviation of its CTA
  durations), so that durations that vary by CTA rather than by SM do not cause holds; portable;
- `closed_loop_score`: the closed loop with its whole hold score fitted (docs/model.md section
  9), `ema_alpha = sigmoid(a)`, `hold_margin = sigmoid(m)` (the weight of the candidate's
  estimate), `hold_queue = sigmoid(q)` (of each later CTA a better slot would finish first: the
  SMs' queues) and `hold_left = 4 sigmoid(l)` (of the CTAs left in the grid), prior 0; portable;
- `closed_loop_per_sm` (a proposal; the engine takes one prior for every SM): the prior of SM
  `s` is `exp(b) d (mean f / f_s)^gamma`, a static frequency-aware estimate that the tail hold
  can use before any CTA has completed;
- `clock_regression`: the clock-regression policy's hold margin, `hold_margin = sigmoid(m)`;
  portable. The surrogate does not model that policy, so it is fitted in the exact engine only
  (`ENGINE_ONLY_FAMILIES`).

`fit` minimises the mean of `surrogate makespan / fluid bound` (the larger of `bounds.fluid_ns`
and `issue_bound.issue_ns`, a constant per configuration) over the training configurations
(clock maps x kernels), all in one `vmap`, with Adam. With `per_chip`, every training chip gets its own `theta` and its own fit, still in one
call (the loss is a sum of per-chip losses, Adam is per parameter). `evaluate` runs the learned
and the reference policies in the exact engine on other clock maps.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, Float, Int

from ..arch import Arch
from ..clocks import per_slot
from ..errors import check
from ..policies import (DEFAULT_EMA_ALPHA, DEFAULT_EMA_PRIOR_NS, DEFAULT_HOLD_LEFT, DEFAULT_HOLD_MARGIN,
                        DEFAULT_HOLD_NOISE, DEFAULT_HOLD_QUEUE, MAX_HOLD_LEFT, MAX_HOLD_NOISE, MAX_HOLD_QUEUE)
from .launch import DispatchParams, SurrogateLaunch
from .relax import schedule

FAMILIES = ("weighted", "closed_loop", "closed_loop_tail", "closed_loop_noise", "closed_loop_score",
            "closed_loop_per_sm", "clock_regression")
# engine inputs that depend on neither the chip nor the kernel
PORTABLE_FAMILIES = ("closed_loop_tail", "closed_loop_noise", "closed_loop_score", "clock_regression")
# families of policies the surrogate does not model: `method = "engine"` only
ENGINE_ONLY_FAMILIES = ("clock_regression",)
ENGINE_POLICY = {"weighted": "weighted", "closed_loop": "closed_loop", "closed_loop_tail": "closed_loop",
                 "closed_loop_noise": "closed_loop", "closed_loop_score": "closed_loop",
                 "closed_loop_per_sm": "closed_loop",
                 "clock_regression": "clock_regression"}
WEIGHT_SCALE = 1000.0  # engine weight of an SM at the mean clock
GRADIENT_CLIP = 1.0  # per gradient entry and step (the loss is a makespan ratio: O(1))


def logit(p: float) -> float:
    return float(np.log(p / (1.0 - p)))


_INITIAL = {
    "weighted": {"gamma": 1.0},
    # the fits start from the engine's default closed loop (alpha as a logit)
    "closed_loop": {"alpha_logit": logit(DEFAULT_EMA_ALPHA), "log_prior": 0.0},
    "closed_loop_tail": {"alpha_logit": logit(DEFAULT_EMA_ALPHA), "margin_logit": logit(DEFAULT_HOLD_MARGIN)},
    # from one deviation (the default, 0, is a logit of minus infinity)
    "closed_loop_noise": {"alpha_logit": logit(DEFAULT_EMA_ALPHA), "margin_logit": logit(DEFAULT_HOLD_MARGIN),
                          "noise_logit": logit(1.0 / MAX_HOLD_NOISE)},
    # from the tail family's rule (hold_left = 1) with a quarter of each queued CTA counted
    "closed_loop_score": {"alpha_logit": logit(DEFAULT_EMA_ALPHA), "margin_logit": logit(DEFAULT_HOLD_MARGIN),
                          "queue_logit": logit(0.25 / MAX_HOLD_QUEUE), "left_logit": logit(1.0 / MAX_HOLD_LEFT)},
    "closed_loop_per_sm": {"alpha_logit": logit(DEFAULT_EMA_ALPHA), "log_prior": 0.0, "gamma": 1.0},
    "clock_regression": {"margin_logit": logit(DEFAULT_HOLD_MARGIN)},
}


class Problem(NamedTuple):
    """Training configurations, stacked: surrogate launches and their normalisers."""

    launch: SurrogateLaunch  # leading axis: configuration
    fluid_ns: Float[Array, " config"]
    group: Int[Array, " config"]  # the chip a configuration belongs to (per-chip fits)


class FitResult(NamedTuple):
    family: str
    theta: dict[str, np.ndarray]  # each [group]: the iterate of lowest loss
    loss: np.ndarray  # [step, group]: mean makespan / fluid bound of each iterate, the last one's too


def initial_theta(family: str, n_groups: int = 1) -> dict[str, Array]:
    check(family in FAMILIES, "family", family, f"one of {FAMILIES}")
    return {k: jnp.full((n_groups,), v, jnp.float32) for k, v in _INITIAL[family].items()}


def mean_occupancy_ns(launch: SurrogateLaunch) -> Float[Array, ""]:
    """`d`: the mean CTA slot occupancy at the chip's mean clock (scales the EMA prior)."""
    f, on, w = launch.sm_freq_mhz, launch.sm_enabled, launch.work
    mean_mhz = jnp.sum(jnp.where(on, f, 0.0)) / jnp.maximum(jnp.sum(on), 1)
    total = jnp.sum(jnp.where(w.valid, w.cycles * 1000.0 / mean_mhz + w.ns, 0.0))
    return total / jnp.maximum(jnp.sum(w.valid), 1)


def _log_speed(launch: SurrogateLaunch) -> Float[Array, " sm"]:
    f, on = launch.sm_freq_mhz, launch.sm_enabled
    mean_mhz = jnp.sum(jnp.where(on, f, 0.0)) / jnp.maximum(jnp.sum(on), 1)
    return jnp.where(on, jnp.log(jnp.where(on, f, 1.0) / mean_mhz), 0.0)


def params_for(family: str, theta: dict[str, Array], launch: SurrogateLaunch) -> DispatchParams:
    """The surrogate's dispatch parameters of one configuration (scalar `theta` entries)."""
    check(family not in ENGINE_ONLY_FAMILIES, "family", family, "a family the surrogate models (not "
          f"{ENGINE_ONLY_FAMILIES})")
    log_speed = _log_speed(launch)
    ones = jnp.ones_like(launch.sm_freq_mhz)
    hold = {k: jnp.asarray(v, jnp.float32) for k, v in _hold_weights(theta, jax.nn.sigmoid).items()}
    if family == "weighted":
        return DispatchParams(weight=jnp.exp(theta["gamma"] * log_speed), ema_alpha=jnp.float32(DEFAULT_EMA_ALPHA),
                              ema_prior_ns=DEFAULT_EMA_PRIOR_NS * ones, **hold)
    alpha = jax.nn.sigmoid(theta["alpha_logit"])
    if family in PORTABLE_FAMILIES:
        return DispatchParams(weight=ones, ema_alpha=alpha, ema_prior_ns=DEFAULT_EMA_PRIOR_NS * ones, **hold)
    d = mean_occupancy_ns(launch)
    tilt = theta["gamma"] * log_speed if family == "closed_loop_per_sm" else 0.0
    return DispatchParams(weight=ones, ema_alpha=alpha, ema_prior_ns=jnp.exp(theta["log_prior"] - tilt) * d * ones,
                          **hold)


# The engine inputs fitted as `top * sigmoid(logit)`, by the logit's name in `theta`.
_BOUNDED = {"alpha_logit": ("ema_alpha", 1.0), "margin_logit": ("hold_margin", 1.0),
            "noise_logit": ("hold_noise", MAX_HOLD_NOISE), "queue_logit": ("hold_queue", MAX_HOLD_QUEUE),
            "left_logit": ("hold_left", MAX_HOLD_LEFT)}


def _hold_weights(theta: dict, sigmoid) -> dict:
    """The tail hold's weights of `theta` (`sigmoid`: `jax.nn.sigmoid`, or `_sigmoid` for
    numbers): those it fits, from its logits; the engine's defaults for the others."""
    weights = {"hold_margin": DEFAULT_HOLD_MARGIN, "hold_noise": DEFAULT_HOLD_NOISE, "hold_queue": DEFAULT_HOLD_QUEUE,
               "hold_left": DEFAULT_HOLD_LEFT}
    for logit_name, (name, top) in _BOUNDED.items():
        if logit_name in theta and name in weights:
            weights[name] = top * sigmoid(theta[logit_name])
    return weights


def engine_inputs(family: str, theta: dict[str, float], arch: Arch, sm_freq_mhz: np.ndarray,
                  mean_occupancy: float) -> dict:
    """Keyword arguments of `jaxsched.simulate` for the learned policy on one chip.

    `closed_loop_per_sm` gives a per-SM `ema_prior_ns`, which the engine does not take yet
    (docs/surrogate.md, "Proposal")."""
    enabled = np.asarray(arch.sm_enabled)
    f = np.where(enabled, per_slot(arch, np.asarray(sm_freq_mhz, np.float64), "sm_freq_mhz"), np.nan)
    log_speed = np.where(enabled, np.log(f / np.nanmean(f)), 0.0)
    if family == "weighted":
        w = np.clip(np.rint(WEIGHT_SCALE * np.exp(float(theta["gamma"]) * log_speed)), 1, 2**15)
        return {"dispatch": "weighted", "dispatch_weight": np.where(enabled, w, 0).astype(np.int32)}
    if family in PORTABLE_FAMILIES:
        return portable_inputs(family, theta)
    alpha = _sigmoid(theta["alpha_logit"])
    prior = np.exp(float(theta["log_prior"])) * mean_occupancy
    if family == "closed_loop_per_sm":
        prior = np.where(enabled, prior * np.exp(-float(theta["gamma"]) * log_speed), 0.0)
    return {"dispatch": "closed_loop", "ema_alpha": alpha, "ema_prior_ns": prior}


def portable_inputs(family: str, theta: dict[str, float]) -> dict:
    """The engine inputs of a family in `PORTABLE_FAMILIES`, the same on every chip and kernel
    (what `jaxsched.fitted_policy` writes)."""
    check(family in PORTABLE_FAMILIES, "family", family, f"one of {PORTABLE_FAMILIES}")
    hold = _hold_weights(theta, _sigmoid)
    if family == "clock_regression":
        return {"dispatch": "clock_regression", "hold_margin": hold["hold_margin"]}
    return {"dispatch": "closed_loop", "ema_alpha": _sigmoid(theta["alpha_logit"]),
            "ema_prior_ns": DEFAULT_EMA_PRIOR_NS, **hold}


def theta_of(family: str, inputs: dict[str, float]) -> dict[str, float]:
    """The `theta` of a portable family whose engine inputs are `inputs` (`portable_inputs`'
    inverse, for the weights the family fits)."""
    return {k: logit(inputs[_BOUNDED[k][0]] / _BOUNDED[k][1]) for k in initial_theta(family)}


def _sigmoid(x: float) -> float:
    return float(1.0 / (1.0 + np.exp(-float(x))))


def _group_means(x: Array, group: Array, n_groups: int) -> Array:
    return jax.ops.segment_sum(x, group, n_groups) / jnp.maximum(jax.ops.segment_sum(jnp.ones_like(x), group, n_groups), 1)


@functools.partial(jax.jit, static_argnames=("family", "max_slots", "n_groups", "mode"))
def losses(theta: dict[str, Array], problem: Problem, temperature: Float[Array, ""], *, family: str,
           max_slots: int, n_groups: int, mode: str = "soft") -> Float[Array, " group"]:
    """Per group, the mean surrogate makespan over the fluid bound (`theta` entries [group])."""
    per_config = {k: v[problem.group] for k, v in theta.items()}
    run = functools.partial(schedule, policy=ENGINE_POLICY[family], mode=mode, max_slots=max_slots)

    def one(th, launch):
        return run(launch, params_for(family, th, launch), temperature).makespan_ns

    makespan = jax.vmap(one)(per_config, problem.launch)
    return _group_means(makespan / problem.fluid_ns, problem.group, n_groups)


def fit(problem: Problem, family: str, *, steps: int, learning_rate: float, temperature: float,
        max_slots: int, per_chip: bool = False, mode: str = "soft", progress=None) -> FitResult:
    """Adam on `theta` (shared, or one per chip with `per_chip`); returns the loss curve. `mode`
    "soft" descends the soft makespan; "straight_through" the hard one (the `T -> 0` limit) along
    the soft one's gradient, so that the loss curve, and the choice of the best iterate, are the
    hard model's."""
    check(steps >= 1, "fit.steps", steps, ">= 1")
    check(mode in ("soft", "straight_through"), "fit.mode", mode, "soft or straight_through")
    check(learning_rate > 0, "fit.learning_rate", learning_rate, "> 0")
    check(temperature > 0, "fit.temperature", temperature, "> 0 (the soft surrogate)")
    n_groups = int(np.max(np.asarray(problem.group))) + 1 if per_chip else 1
    if not per_chip:
        problem = problem._replace(group=jnp.zeros_like(problem.group))
    theta = initial_theta(family, n_groups)
    # Through thousands of placements the closed loop's pathwise gradient can explode (list
    # scheduling is chaotic; docs/surrogate.md): non-finite entries are dropped and each entry is
    # clipped (per parameter, so per-chip fits stay independent); Adam's normalised steps keep the
    # size of an update at the learning rate.
    opt = optax.chain(optax.clip(GRADIENT_CLIP), optax.adam(learning_rate))
    state = opt.init(theta)
    temp = jnp.float32(temperature)
    loss_fn = functools.partial(losses, problem=problem, temperature=temp, family=family,
                                max_slots=max_slots, n_groups=n_groups, mode=mode)

    def total(th):
        per_group = loss_fn(th)
        return jnp.sum(per_group), per_group

    @jax.jit
    def step(theta, state):
        (_, per_group), grad = jax.value_and_grad(total, has_aux=True)(theta)
        grad = jax.tree.map(lambda g: jnp.where(jnp.isfinite(g), g, 0.0), grad)
        updates, state = opt.update(grad, state, theta)
        return optax.apply_updates(theta, updates), state, per_group

    curve, iterates = [], []
    for i in range(steps):
        iterates.append({k: np.asarray(v) for k, v in theta.items()})
        theta, state, value = step(theta, state)
        curve.append(np.asarray(value))
        if progress is not None:
            progress(i + 1, steps, float(np.mean(curve[-1])))
    iterates.append({k: np.asarray(v) for k, v in theta.items()})
    curve.append(np.asarray(jax.jit(loss_fn)(theta)))
    # Each group keeps its iterate of lowest loss: the pathwise gradient of a soft makespan through
    # thousands of placements can lead uphill (docs/surrogate.md 4), and Adam does not know it.
    loss = np.stack(curve)
    best = np.argmin(loss, axis=0)  # [group]
    groups = np.arange(loss.shape[1])
    return FitResult(family=family, theta={k: np.stack([it[k] for it in iterates])[best, groups] for k in theta},
                     loss=loss)
