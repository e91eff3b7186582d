"""Per-SM effective clocks from CTA traces: a robust optax fit, its uncertainty, and the
closed-loop dispatcher's EMA estimate for comparison.

Observation model. CTAs that share an SM share its issue slots, so a CTA's duration says how
busy its SM was as much as how fast it is. Each CTA's *share* of its SM,
`share_c = integral over its lifetime of dt / n_s(t)` (`n_s(t)`: CTAs resident on its SM at `t`),
is the SM time it would have had under processor sharing; the shares of an SM's CTAs add up to
the SM's busy time. A CTA's share is modelled as

    share_c = cycles * 1000 / f_s + ns        (ns; f_s in MHz)

with `cycles` the SM cycles per CTA (issue work) and `ns` a part that does not scale with the
clock (memory latency). Where the trace gives each CTA's work (`cta_work`), the share is first
divided by the CTA's work over the mean, so that load imbalance is not read as speed. The warp
scheduler is not fair (GTO finishes co-resident CTAs staggered,
the first at about a quarter of the last one's time), so shares of the first and last CTAs of a
wave stray far from the rest: the loss is a Cauchy loss on log shares, whose minimiser follows
the bulk of steady-state CTAs (a robust location per SM), not their mean.

`cycles` and `ns` are a *calibration*: fitted on reference traces of the same kernel whose clocks
are known (one clock: `ns = 0`; two or more: both), e.g. uniform-clock runs of the simulator
(`reference_traces`). Without one, speeds are relative and scaled to a given mean clock. Probe
traces with `clock64()` readings observe each CTA's clock directly: its ns per cycle is the
model with `cycles = 1`, `ns = 0`, so they need no calibration.

Fit: per chip, `log f_s` by Adam on the mean Cauchy loss, started at each SM's median and moved
in units of the residuals' robust scale `sigma` (so the step suits exact and noisy data alike). The
uncertainty is the M-estimator sandwich `sigma^2 sum psi^2 g^2 / (sum psi' g^2)^2` (`psi` the
loss's influence function, `g` the model's slope in `log f_s`): the Laplace curvature corrected
for the loss not being the data's true likelihood. Everything after the trace statistics is
`jax.numpy`: `fit_log_mhz` runs one chip and `jax.vmap` of it every chip of a stack in one call.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import xarray as xr
from jaxtyping import Array, Bool, Float, Int

from .. import clocks as clocks_mod
from .. import trace as trace_mod
from ..arch import Arch
from ..errors import check
from ..kernel import Kernel
from ..policies import DEFAULT_EMA_ALPHA, DEFAULT_EMA_PRIOR_NS, DEFAULT_WARP_POLICY

STEPS = 300
LEARNING_RATE = 0.05  # per step, in units of the residuals' robust scale
MAD_TO_SIGMA = 1.4826  # median absolute deviation of a normal sample, in standard deviations
_MIN_SIGMA = 1e-4


class Observations(NamedTuple):
    """Per-CTA observations of one chip (or a stack: a leading `chip` axis), padded over CTAs."""

    sm: Int[Array, "*chip cta"]
    y: Float[Array, "*chip cta"]  # log(share in ns), or log(ns per cycle) for probe cycles
    valid: Bool[Array, "*chip cta"]


class Calibration(NamedTuple):
    """`share = cycles * 1000 / f + ns`: SM cycles and clock-independent ns per CTA share."""

    cycles: float
    ns: float


PROBE_CYCLES = Calibration(cycles=1.0, ns=0.0)  # y = log(ns per cycle) = log(1 * 1000 / f)


class SpeedFit(NamedTuple):
    """Fitted clocks of one chip (or a stack). NaN on SMs that ran no CTA."""

    sm_freq_mhz: Float[Array, "*chip sm"]
    sm_freq_sd_mhz: Float[Array, "*chip sm"]  # sandwich standard deviation
    sm_ctas: Int[Array, "*chip sm"]
    sigma: Float[Array, "*chip"]  # robust scale of the log-share residuals
    loss: Float[Array, "*chip step"]  # mean Cauchy loss per Adam step


# ----------------------------------------------------------------------------- trace statistics


def cta_shares_ns(cta_sm: np.ndarray, start_ns: np.ndarray, end_ns: np.ndarray) -> np.ndarray:
    """Each CTA's processor-sharing share of its SM: integral of dt / n_s(t) over its lifetime."""
    share = np.zeros(len(cta_sm))
    for s in np.unique(cta_sm):
        idx = np.nonzero(cta_sm == s)[0]
        st, en = start_ns[idx], end_ns[idx]
        times = np.unique(np.concatenate([st, en]))
        # residents on [times[i], times[i+1]): started at or before, not ended by times[i]
        n = np.searchsorted(np.sort(st), times[:-1], side="right") - np.searchsorted(np.sort(en), times[:-1], side="right")
        dt = np.diff(times)
        integral = np.concatenate([[0.0], np.cumsum(np.where(n > 0, dt / np.maximum(n, 1), 0.0))])
        share[idx] = integral[np.searchsorted(times, en)] - integral[np.searchsorted(times, st)]
    return share


def observations(ds: xr.Dataset, use_cycles: bool | None = None) -> Observations:
    """Per-CTA observations of a trace: log shares, or (with `clock64()` readings) log ns/cycle."""
    trace_mod.validate(ds)
    has_cycles = all(v in ds for v in trace_mod.CYCLE_VARS)
    use_cycles = has_cycles if use_cycles is None else use_cycles
    check(has_cycles or not use_cycles, "trace", "no cta_start_cycles/cta_end_cycles",
          "cycle counters are needed to fit from clock64() readings")
    sm = ds["cta_sm"].values.astype(np.int32)
    start, end = ds["cta_start_ns"].values, ds["cta_end_ns"].values
    if use_cycles:
        cycles = (ds["cta_end_cycles"].values - ds["cta_start_cycles"].values).astype(np.float64)
        y = np.log((end - start) / cycles)  # ns per cycle = 1000 / f
    else:
        y = np.log(cta_shares_ns(sm, start, end))
        if "cta_work" in ds:  # a CTA with more work takes a larger share at the same clock
            work = ds["cta_work"].values
            y = y - np.log(work / work.mean())
    return Observations(sm=sm, y=y.astype(np.float32), valid=np.ones(len(sm), bool))


def stack_observations(items: Sequence[Observations]) -> Observations:
    """Stack chips along a leading axis, padding shorter grids with invalid CTAs."""
    n = max(len(o.sm) for o in items)
    pad = lambda x, v: np.concatenate([np.asarray(x), np.full(n - len(x), v, np.asarray(x).dtype)])
    return Observations(sm=np.stack([pad(o.sm, 0) for o in items]), y=np.stack([pad(o.y, 0.0) for o in items]),
                        valid=np.stack([pad(o.valid, False) for o in items]))


# ----------------------------------------------------------------------------- the fit (jax)


def _cauchy(z: Array) -> Array:
    return jnp.log1p(z * z)


def _segment_median(sm: Array, y: Array, valid: Array, n_sm: int) -> Float[Array, " sm"]:
    """The (upper) median of `y` over each SM's valid CTAs (NaN where none)."""
    key_sm = jnp.where(valid, sm, n_sm)
    order = jnp.lexsort((y, key_sm))
    count = jax.ops.segment_sum(valid.astype(jnp.int32), sm, n_sm)
    first = jnp.cumsum(count) - count
    mid = jnp.clip(first + count // 2, 0, y.shape[0] - 1)
    return jnp.where(count > 0, y[order][mid], jnp.nan)


def _model(log_mhz: Array, cal: Calibration) -> Array:
    """log of the modelled share (ns) for SM clocks `exp(log_mhz)`."""
    return jnp.log(cal.cycles * 1000.0 * jnp.exp(-log_mhz) + cal.ns)


@functools.partial(jax.jit, static_argnames=("n_sm", "steps"))
def fit_log_mhz(
    obs: Observations, cal_cycles: Float[Array, ""], cal_ns: Float[Array, ""], *, n_sm: int,
    steps: int = STEPS, weights: Float[Array, " cta"] | None = None,
) -> SpeedFit:
    """Fit one chip's per-SM clocks (vmap over a leading chip axis for many chips at once).

    `weights` (per CTA, default 1) reweights the loss, e.g. Poisson weights for a bootstrap.
    """
    cal = Calibration(jnp.asarray(cal_cycles, jnp.float32), jnp.asarray(cal_ns, jnp.float32))
    w = obs.valid.astype(jnp.float32) * (1.0 if weights is None else weights)
    loc0 = _segment_median(obs.sm, obs.y, obs.valid, n_sm)
    # invert share = cycles * 1000 / f + ns at the median (shares below `ns` clip to 5 % of it)
    scaling = jnp.maximum(jnp.exp(loc0) - cal.ns, 0.05 * jnp.exp(loc0))
    log_f0 = jnp.nan_to_num(jnp.log(cal.cycles * 1000.0 / scaling), nan=0.0)
    resid0 = jnp.abs(obs.y - jnp.nan_to_num(loc0)[obs.sm])
    sigma = jnp.maximum(MAD_TO_SIGMA * jnp.nanmedian(jnp.where(obs.valid, resid0, jnp.nan)), _MIN_SIGMA)
    total = jnp.maximum(jnp.sum(w), 1.0)

    def loss_fn(offset: Array) -> Array:  # offset from the median start, in units of sigma
        z = (obs.y - _model(log_f0 + sigma * offset, cal)[obs.sm]) / sigma
        return jnp.sum(w * _cauchy(z)) / total

    opt = optax.adam(LEARNING_RATE)

    def step(carry, _):
        params, state = carry
        value, grad = jax.value_and_grad(loss_fn)(params)
        updates, state = opt.update(grad, state, params)
        return (optax.apply_updates(params, updates), state), value

    start = jnp.zeros_like(log_f0)
    (offset, _), losses = jax.lax.scan(step, (start, opt.init(start)), None, length=steps)
    log_f = log_f0 + sigma * offset

    # sandwich variance of each SM's log clock (the Hessian is diagonal: one SM per CTA)
    mu = _model(log_f, cal)[obs.sm]
    z = (obs.y - mu) / sigma
    psi = 2.0 * z / (1.0 + z * z)
    dpsi = 2.0 * (1.0 - z * z) / (1.0 + z * z) ** 2
    scaled = cal.cycles * 1000.0 * jnp.exp(-log_f)[obs.sm]
    g = -scaled / (scaled + cal.ns)  # d mu / d log f
    meat = jax.ops.segment_sum(w * (psi * g) ** 2, obs.sm, n_sm)
    bread = jax.ops.segment_sum(w * dpsi * g * g, obs.sm, n_sm)
    var_log = sigma**2 * meat / jnp.where(bread > 0, bread, jnp.nan) ** 2
    count = jax.ops.segment_sum(obs.valid.astype(jnp.int32), obs.sm, n_sm)
    f = jnp.where(count > 0, jnp.exp(log_f), jnp.nan)
    return SpeedFit(sm_freq_mhz=f, sm_freq_sd_mhz=f * jnp.sqrt(var_log), sm_ctas=count, sigma=sigma,
                    loss=losses)


def fit_chips(obs: Observations, cal: Calibration | Sequence[Calibration], n_sm: int,
              steps: int = STEPS) -> SpeedFit:
    """`fit_log_mhz` over a stack of chips in one `vmap` call (one calibration, or one per chip)."""
    n_chip = obs.sm.shape[0]
    cals = [cal] * n_chip if isinstance(cal, Calibration) else list(cal)
    check(len(cals) == n_chip, "calibration", len(cals), f"one per chip ({n_chip})")
    c = jnp.asarray([k.cycles for k in cals], jnp.float32)
    m = jnp.asarray([k.ns for k in cals], jnp.float32)
    fit = jax.vmap(functools.partial(fit_log_mhz, n_sm=n_sm, steps=steps))(obs, c, m)
    return jax.tree.map(np.asarray, fit)


# ----------------------------------------------------------------------------- calibration


def calibrate(stat_ns: np.ndarray, sm_freq_mhz: np.ndarray) -> Calibration:
    """Least squares of `stat = cycles * 1000 / f + ns` over SMs with a known clock and a value.

    With a single distinct clock the two parts cannot be told apart: `ns = 0`.
    """
    stat, f = np.ravel(stat_ns), np.ravel(sm_freq_mhz)
    ok = np.isfinite(stat) & np.isfinite(f) & (f > 0)
    check(ok.sum() >= 1, "reference", "no SM with both a known clock and CTAs",
          "reference traces need sm_freq_mhz on the SMs that ran CTAs")
    x, stat = 1000.0 / f[ok], stat[ok]
    if np.ptp(x) <= 1e-9 * x.mean():
        return Calibration(cycles=float(np.mean(stat / x)), ns=0.0)
    slope, intercept = np.polyfit(x, stat, 1)
    if intercept < 0:  # a negative latency is noise: refit through the origin
        return Calibration(cycles=float(np.sum(stat * x) / np.sum(x * x)), ns=0.0)
    return Calibration(cycles=float(slope), ns=float(intercept))


def calibrate_from_traces(references: Sequence[xr.Dataset], steps: int = STEPS) -> Calibration:
    """Calibration from traces of the same kernel on chips of known clocks: each SM's robust
    share (the same fit, in the share's own units) against its true clock."""
    n_sm = max(r.sizes["sm"] for r in references)
    obs = stack_observations([observations(r, use_cycles=False) for r in references])
    located = fit_chips(obs, Calibration(1.0, 0.0), n_sm, steps)  # f = 1000 / share
    share = 1000.0 / located.sm_freq_mhz
    truth = np.stack([np.pad(r["sm_freq_mhz"].values, (0, n_sm - r.sizes["sm"]), constant_values=np.nan)
                      for r in references])
    return calibrate(share, truth)


def reference_traces(arch: Arch, kernel: Kernel, program: str, mhz: Sequence[float] = (),
                     warp_policy: str = DEFAULT_WARP_POLICY) -> list[xr.Dataset]:
    """Simulator traces of `kernel` on uniform chips (default: boost and 3/4 of boost; hardware
    dispatch), in one batched engine call: the calibration a jaxsched trace needs."""
    from ..engine.run import simulate_batch
    from ..lower import WARP_POLICIES

    boost = float(arch.boost_clock_ghz) * 1000.0
    clks = [clocks_mod.uniform(arch, f / 1000.0) for f in (mhz or (boost, 0.75 * boost))]
    n = len(clks)
    batch = simulate_batch([arch] * n, [kernel] * n, clks, [WARP_POLICIES.index(warp_policy)] * n, [0] * n, [0] * n)
    return [trace_mod.from_result(jax.tree.map(lambda x, i=i: x[i], batch), arch, kernel, clk, program=program,
                                  warp_policy=warp_policy, dispatch="hardware")
            for i, clk in enumerate(clks)]


# ----------------------------------------------------------------------------- EMA comparison


def ema_duration_ns(ds: xr.Dataset, alpha: float = DEFAULT_EMA_ALPHA,
                    prior_ns: float = DEFAULT_EMA_PRIOR_NS) -> np.ndarray:
    """The closed-loop dispatcher's estimate per SM at the end of the trace (docs/model.md
    section 9, in real numbers): `est += alpha (end - start - est)` per completed CTA, in
    order of completion. NaN on SMs that ran nothing."""
    sm = ds["cta_sm"].values
    start, end = ds["cta_start_ns"].values, ds["cta_end_ns"].values
    est = np.full(ds.sizes["sm"], np.nan)
    for s in np.unique(sm):
        idx = np.nonzero(sm == s)[0]
        e = prior_ns
        for c in idx[np.argsort(end[idx], kind="stable")]:
            e += alpha * (end[c] - start[c] - e)
        est[s] = e
    return est


def ema_speeds_mhz(ds: xr.Dataset, references: Sequence[xr.Dataset] | None = None, alpha: float = DEFAULT_EMA_ALPHA,
                   mean_mhz: float | None = None) -> np.ndarray:
    """Clocks read off the EMA estimate, calibrated like the fit (references, or a mean clock)."""
    est = ema_duration_ns(ds, alpha)
    if references:
        cal = calibrate(np.stack([ema_duration_ns(r, alpha) for r in references]),
                        np.stack([r["sm_freq_mhz"].values for r in references]))
        return cal.cycles * 1000.0 / np.maximum(est - cal.ns, 0.05 * est)
    check(mean_mhz is not None, "mean_mhz", mean_mhz, "needed without reference traces")
    inv = 1.0 / est
    return inv * mean_mhz / np.nanmean(inv)


# ----------------------------------------------------------------------------- the whole fit


def rms_relative_error(estimate: np.ndarray, truth: np.ndarray) -> float:
    """RMS of `estimate / truth - 1` over SMs where both are known (NaN if none)."""
    ok = np.isfinite(estimate) & np.isfinite(truth)
    return float(np.sqrt(np.mean((estimate[ok] / truth[ok] - 1.0) ** 2))) if ok.any() else float("nan")


def fit_traces(
    traces: Sequence[xr.Dataset],
    references: Sequence[xr.Dataset] | None = None,
    *,
    mean_mhz: float | None = None,
    ema_alpha: float = DEFAULT_EMA_ALPHA,
    steps: int = STEPS,
    names: Sequence[str] | None = None,
) -> xr.Dataset:
    """Fit every trace's per-SM clocks in one vmapped call; compare with the EMA estimate.

    Attribute `clock_share`: the part of a CTA's share that scales with the clock at the mean
    fitted clock (1 without a calibrated `ns` part). Near 0 (memory-bound kernels) the timing
    hardly depends on the clocks and the fit cannot recover them.

    The scale comes from, in order: the traces' `clock64()` readings (all traces must have
    them), `references` (traces of the same kernel with known clocks), or `mean_mhz` (relative
    speeds scaled to that mean clock per chip).
    """
    check(len(traces) >= 1, "traces", 0, "at least one trace")
    n_sm = max(t.sizes["sm"] for t in traces)
    cycles = all(all(v in t for v in trace_mod.CYCLE_VARS) for t in traces)
    if cycles:
        mode, cal = "clock64", PROBE_CYCLES
    elif references:
        launches = {(str(t.attrs["kernel"]), str(t.attrs["program"]), int(t.attrs["grid_ctas"]))
                    for t in [*traces, *references]}
        check(len(launches) == 1, "traces", sorted(launches),
              "one kernel (name, program, grid) for the traces and their references")
        mode, cal = "reference", calibrate_from_traces(references, steps)
    else:
        check(mean_mhz is not None and mean_mhz > 0, "mean_mhz", mean_mhz,
              "a mean clock (MHz) to scale relative speeds, when the traces have no clock64() "
              "readings and no reference traces are given")
        mode, cal = "relative", Calibration(1.0, 0.0)
    obs = stack_observations([observations(t, use_cycles=cycles) for t in traces])
    fit = fit_chips(obs, cal, n_sm, steps)
    f, sd = fit.sm_freq_mhz, fit.sm_freq_sd_mhz
    if mode == "relative":
        scale = mean_mhz / np.nanmean(f, axis=1, keepdims=True)
        f, sd = f * scale, sd * scale
    pad = lambda x: np.pad(x, (0, n_sm - len(x)), constant_values=np.nan)
    truth = np.stack([pad(t["sm_freq_mhz"].values) for t in traces])
    ema = np.stack([pad(ema_speeds_mhz(t, references if mode == "reference" else None, ema_alpha,
                                       mean_mhz=None if mode == "reference" else float(np.nanmean(fi))))
                    for t, fi in zip(traces, f)])
    names = list(names) if names is not None else [str(i) for i in range(len(traces))]
    ds = xr.Dataset(
        {
            "sm_freq_mhz_fit": (("chip", "sm"), f, {"long_name": "fitted SM clock", "units": "MHz"}),
            "sm_freq_sd_mhz": (("chip", "sm"), sd, {"long_name": "standard deviation of the fit (sandwich)",
                                                    "units": "MHz"}),
            "sm_freq_mhz_true": (("chip", "sm"), truth, {"long_name": "true SM clock (NaN: unknown)", "units": "MHz"}),
            "sm_freq_mhz_ema": (("chip", "sm"), ema, {"long_name": f"closed-loop EMA estimate (alpha {ema_alpha})",
                                                      "units": "MHz"}),
            "sm_ctas": (("chip", "sm"), fit.sm_ctas, {"long_name": "CTAs observed", "units": "1"}),
            "sigma": ("chip", fit.sigma, {"long_name": "robust scale of log-share residuals", "units": "1"}),
            "loss": (("chip", "step"), fit.loss, {"long_name": "mean Cauchy loss", "units": "1"}),
        },
        coords={"chip": names, "sm": np.arange(n_sm), "step": np.arange(fit.loss.shape[1])},
        attrs={"title": "per-SM clocks fitted from CTA traces", "mode": mode,
               "calibration_cycles": cal.cycles, "calibration_ns": cal.ns, "ema_alpha": ema_alpha,
               "kernel": ",".join(sorted({str(t.attrs["kernel"]) for t in traces}))},
    )
    mean_mhz_fit = float(np.nanmean(f))
    scaled = cal.cycles * 1000.0 / mean_mhz_fit
    ds.attrs["clock_share"] = float(scaled / (scaled + cal.ns))
    if np.isfinite(truth).any():
        ds.attrs["rms_error_fit"] = rms_relative_error(f, truth)
        ds.attrs["rms_error_ema"] = rms_relative_error(ema, truth)
    return ds
