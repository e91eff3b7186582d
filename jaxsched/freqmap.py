"""Static per-SM frequency maps: uniform, from arrays or files, process variation, IR drop,
binning and caps.

A frequency map is a float32 array of MHz, one entry per SM slot, 0 on floorswept slots
(`~arch.sm_enabled`); given maps may instead hold one entry per enabled SM, in `%smid` order
(`clocks.lengths_hint`). Every generator is a pure `jax.numpy` function: keys, numeric parameters
and the `Arch` leaves may be traced, only array shapes are static, so `jax.vmap` over PRNG keys
(many chips) or over parameters (a sweep) and `jax.jit` work without recompiling per value.
`to_clocks` turns a map into the engine's integer-MHz `Clocks`.

Composition (each factor is a multiplier on the SM's clock):

    f = combine(arch, process_variation(key, arch), ir_factor(arch))   # binned, capped, masked
    clocks = to_clocks(arch, f)

Physics and sources (facts from `../shared/DOMAIN.md`, "Frequency, power and variation"):
- Process variation. Cores of one die reach different maximum clocks: running each core at its
  own maximum gives up to 32% more throughput than running all at the slowest (Lee et al.,
  ISPASS'11, 32 nm). Identical GPUs differ by 8% on average, up to 22% (Sinha et al., "Not All
  GPUs Are Created Equal", SC22). The model is the usual within-die + die-to-die split,
      f_i = mean * (1 + sigma_die z_die + sigma_within z(x_i)),
  z_die ~ N(0, 1) one per chip, z a zero-mean unit-variance Gaussian random field over the SM
  centres with squared-exponential covariance exp(-d^2 / (2 L^2)), sampled through the Cholesky
  factor of the [sm, sm] covariance (plus a 1e-4 nugget that keeps float32 Cholesky finite for
  any L; L -> 0 gives independent SMs).
- IR drop. Supply voltage falls with the distance to the nearest supply bump and with the
  current drawn nearby: V_i = vdd - r d_i I_i, d_i the distance to the nearest bump (mm), r the
  effective grid resistance (ohm per mm of path), I_i the local current (A): the SM currents
  averaged with a Gaussian weight of radius `current_radius_mm` (the grid around an SM also
  carries its neighbours' current; radius 0 means the SM's own current). This is the first-order
  "resistance of the feed path times the current it carries" picture (the linear term of the
  resistive-sheet solution); it is monotone in d_i for uniform load, which keeps maps readable.
- Voltage to frequency: the alpha-power law f ~ (V - Vth)^alpha / V (Sakurai & Newton, IEEE JSSC
  1990; alpha about 1.3 for short-channel devices, DOMAIN.md), normalised so f(vdd) = f_nominal.
- Binning and caps: clocks move in bins of ~15 MHz (DOMAIN.md; `arch.clock_step_mhz`); maps are
  floored to a bin and clipped to per-SM caps.

Default numbers are leads to calibrate, not measurements; each is explained where it is defined.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from . import tomldoc
from .arch import Arch
from .clocks import Clocks, gaussian, lengths_hint
from .clocks import from_array as _clocks_from_array
from .errors import JaxschedError, check

# --- process-variation defaults (leads; calibrate) ---
# Within-die sigma: 4% puts the slowest of 132 SMs about 2.6 sigma (~10%) below the mean, so
# per-SM clocks would gain ~11% over the slowest-SM clock: a modern-node reading of Lee et al.'s
# "up to 32%" at 32 nm.
SIGMA_WITHIN = 0.04
# Die-to-die sigma: 3% spreads a cluster of ~1000 chips over about +-3.3 sigma (~20%), of the order
# of Sinha et al.'s 8% average / 22% maximum variation (which also includes power management).
SIGMA_DIE = 0.03
# Correlation length as a fraction of the die's longer side: exp(-d^2/2L^2) falls to ~1% at 3L,
# i.e. at half the die, where measured within-die correlation fades (Friedberg et al., ISQED'05;
# lead).
CORR_LENGTH_DIE_FRACTION = 1.0 / 6.0
# Nugget added to the covariance's diagonal: float32 Cholesky of a squared-exponential kernel on
# 144 points fails (NaN) for L >~ 10 mm with 1e-6 and works for all L with 1e-4.
JITTER = 1e-4

# --- IR-drop defaults (leads; calibrate) ---
VDD_V = 0.9  # core supply at boost (typical of 7-4 nm GPUs under load)
V_TH_V = 0.35  # threshold voltage
ALPHA = 1.3  # alpha-power exponent (DOMAIN.md)
BUMP_GRID = (4, 3)  # supply-bump sites (x, y): ~8 mm pitch on an 800 mm^2 die
SM_POWER_SHARE = 0.6  # fraction of the power limit drawn by the SMs (rest: HBM, L2, I/O, losses)
IR_BUDGET = 0.05  # worst SM's static IR drop at full load, fraction of vdd (usual sign-off budget)
CURRENT_RADIUS_MM = 2.0  # averaging radius of "current drawn nearby" (about 1.5 TPC heights)

_TINY = 1e-12


# ----------------------------------------------------------------------------- helpers


def _concrete(x: Any) -> np.ndarray | None:
    """`x` as a NumPy array, or None if it is (or holds) a tracer."""
    if x is None or isinstance(x, jax.core.Tracer):
        return None
    try:
        return np.asarray(x, dtype=np.float64)
    except (TypeError, jax.errors.TracerArrayConversionError):
        return None


def _check_value(x: Any, field: str, ok, limit: str) -> None:
    """Raise `JaxschedError` if concrete `x` breaks `ok` (an elementwise predicate)."""
    arr = _concrete(x)
    if arr is None:
        return
    good = np.isfinite(arr) & ok(arr)
    if not np.all(good):
        bad = arr[~good] if arr.ndim else arr
        check(False, f"freqmap.{field}", float(np.ravel(bad)[0]), limit)


def _per_sm(x: Any, arch: Arch, field: str) -> Any:
    """`x` as a scalar or one value per SM slot: given so, or per enabled SM (floorswept slots 0)."""
    shape = np.shape(x)
    if shape in ((), (arch.n_sm_slots,)):
        return x
    check(shape == (arch.sm_count,), f"freqmap.{field}", f"shape {shape}",
          f"a scalar or one value per SM: {lengths_hint(arch)}")
    return jnp.concatenate([_f32(x), jnp.zeros(arch.n_sm_slots - arch.sm_count, jnp.float32)])


def _mask(arch: Arch, mhz: Array) -> Float[Array, " sm"]:
    return jnp.where(arch.sm_enabled, mhz, 0.0).astype(jnp.float32)


def _f32(x: ArrayLike) -> Array:
    return jnp.asarray(x, dtype=jnp.float32)


def _boost_mhz(arch: Arch) -> Array:
    return _f32(arch.boost_clock_ghz) * 1000.0


# ----------------------------------------------------------------------------- simple maps


def uniform(arch: Arch, mhz: ArrayLike | None = None) -> Float[Array, " sm"]:
    """Every enabled SM at `mhz` (default: the boost clock)."""
    if mhz is not None:
        _check_value(mhz, "mhz", lambda v: v > 0, "a positive frequency")
    mhz = _boost_mhz(arch) if mhz is None else _f32(mhz)
    return _mask(arch, jnp.broadcast_to(mhz, (arch.n_sm_slots,)))


def from_array(arch: Arch, mhz: ArrayLike) -> Float[Array, " sm"]:
    """A user-given map: one MHz value per SM slot (floorswept slots are zeroed) or one per
    enabled SM, in `%smid` order."""
    shape, n = np.shape(mhz), arch.n_sm_slots
    if shape != (n,):
        k = arch.sm_count
        check(shape == (k,), "freqmap.mhz", f"{shape[0]} entries" if len(shape) == 1 else f"shape {shape}",
              f"needs {lengths_hint(arch)}")
        mhz = jnp.concatenate([_f32(mhz), jnp.zeros(n - k, jnp.float32)])  # the enabled SMs come first
    arr, enabled = _concrete(mhz), _concrete(arch.sm_enabled)
    if arr is not None and enabled is not None:
        bad = (enabled > 0) & ~(np.isfinite(arr) & (arr > 0))
        check(not np.any(bad), "freqmap.mhz",
              f"{arr[bad][0] if np.any(bad) else ''} (SM {int(np.argmax(bad))})",
              "every enabled SM needs a positive finite frequency")
    return _mask(arch, _f32(mhz))


FILE_KINDS = (".npy", ".csv", ".toml")


def from_file(arch: Arch, path: str | os.PathLike) -> Float[Array, " sm"]:
    """A map read from a file of MHz values, one per enabled SM in `%smid` order or one per SM
    slot of the die (`clocks.lengths_hint`): `.npy` (numpy array), `.csv` (numbers separated
    by commas or line breaks, `#` comments) or `.toml` (`sm_freq_mhz = [...]`)."""
    path = os.fspath(path)
    ext = os.path.splitext(path)[1].lower()
    check(ext in FILE_KINDS, "clock map", path, f"a {', '.join(FILE_KINDS)} file")
    check(os.path.isfile(path), "clock map", path, "no such file")
    try:
        if ext == ".npy":
            values = np.load(path, allow_pickle=False)
        elif ext == ".csv":
            values = np.loadtxt(path, delimiter=",", comments="#", ndmin=1)
        else:
            doc = tomldoc.read(path, "clock map")
            check("sm_freq_mhz" in doc, "clock map", path, "a TOML file with sm_freq_mhz = [one MHz value per SM]")
            values = doc["sm_freq_mhz"]
        values = np.ravel(np.asarray(values, dtype=np.float64))
    except JaxschedError:
        raise
    except (ValueError, TypeError, UnicodeDecodeError) as err:
        raise JaxschedError("clock map", path, f"MHz numbers only ({str(err).splitlines()[0]})") from None
    except OSError as err:
        raise JaxschedError("clock map", path, f"cannot be read ({err.strerror or err})") from None
    n, k = arch.n_sm_slots, arch.sm_count
    check(len(values) in (n, k), f"clock map {path}", f"{len(values)} values", f"needs {lengths_hint(arch)}")
    finite = values[np.isfinite(values)]
    check(finite.size == 0 or finite.max() >= 10, f"clock map {path}", f"largest value {finite.max() if finite.size else 0:g}",
          "clocks in MHz (1980 for 1.98 GHz), not GHz")
    return from_array(arch, values)


def to_clocks(arch: Arch, mhz: ArrayLike) -> Clocks:
    """The engine's `Clocks` (int32 MHz, rounded; validated) from a map. Needs concrete values."""
    return _clocks_from_array(arch, np.asarray(mhz, dtype=np.float64))


MODELS = ("gaussian", "variation")


def random_clocks(arch: Arch, model: str, seed: int, mean_ghz: float, sigma: float, *, sigma_die: float = 0.0,
                  corr_length_mm: float | None = None, ir_drop: bool = False) -> Clocks:
    """The per-SM clocks of one random chip, as a sweep's `[clocks]` table draws them.

    `gaussian`: independent per-SM clocks `mean (1 + sigma z)`, capped at the boost clock
    (`clocks.gaussian`). `variation`: `process_variation` (spatially correlated within-die part
    `sigma`, die-to-die part `sigma_die`, correlation length `corr_length_mm`), times the
    IR-drop factor if `ir_drop`, floored to the arch's clock bins and capped at the boost clock.
    """
    check(model in MODELS, "clocks.model", model, f"one of {MODELS}")
    check(isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) and 0 <= seed <= 2**31 - 1,
          "clocks.seed", seed, "an integer in 0 .. 2^31 - 1")
    check(np.isfinite(mean_ghz) and mean_ghz > 0, "clocks.mean_ghz", mean_ghz, "a positive frequency")
    if model == "gaussian":
        return gaussian(arch, seed, mean_ghz, sigma)
    mhz = process_variation(jax.random.key(seed), arch, mean_mhz=mean_ghz * 1000.0, sigma_within=sigma,
                            sigma_die=sigma_die, corr_length_mm=corr_length_mm)
    factors = (ir_factor(arch),) if ir_drop else ()
    return to_clocks(arch, combine(arch, mhz, *factors, cap_mhz=float(arch.boost_clock_ghz) * 1000.0))


# ----------------------------------------------------------------------------- process variation


def covariance(
    xy_mm: Float[Array, "sm 2"], corr_length_mm: ArrayLike
) -> Float[Array, "sm sm"]:
    """Squared-exponential covariance exp(-d^2 / (2 L^2)) between points (L = 0: identity)."""
    xy = _f32(xy_mm)
    d2 = jnp.sum((xy[:, None, :] - xy[None, :, :]) ** 2, axis=-1)
    two_l2 = 2.0 * _f32(corr_length_mm) ** 2
    return jnp.exp(-d2 / jnp.maximum(two_l2, _TINY))  # d = 0 gives exp(0) = 1 for every L


def spatial_field(
    key: PRNGKeyArray, xy_mm: Float[Array, "sm 2"], corr_length_mm: ArrayLike
) -> Float[Array, " sm"]:
    """A zero-mean, unit-variance Gaussian random field at the points `xy_mm` (Cholesky of the
    squared-exponential covariance plus a `JITTER` nugget, rescaled to unit variance)."""
    n = xy_mm.shape[0]
    cov = covariance(xy_mm, corr_length_mm) + JITTER * jnp.eye(n, dtype=jnp.float32)
    chol = jnp.linalg.cholesky(cov)
    z = jax.random.normal(key, (n,), dtype=jnp.float32)
    return chol @ z / jnp.sqrt(1.0 + JITTER)


def default_corr_length_mm(arch: Arch) -> Array:
    """Default correlation length: the die's longer side / 6 (5.5 mm on GH100)."""
    return jnp.max(_f32(arch.die_mm)) * CORR_LENGTH_DIE_FRACTION


def process_variation(
    key: PRNGKeyArray,
    arch: Arch,
    *,
    mean_mhz: ArrayLike | None = None,
    sigma_within: ArrayLike = SIGMA_WITHIN,
    sigma_die: ArrayLike = SIGMA_DIE,
    corr_length_mm: ArrayLike | None = None,
) -> Float[Array, " sm"]:
    """Per-SM maximum clock of one chip: mean (1 + sigma_die z_die + sigma_within z(x)).

    `mean_mhz` defaults to the boost clock, `corr_length_mm` to `default_corr_length_mm`.
    Relative sigmas; z_die is one N(0, 1) per chip (per key), z the spatial field over
    `arch.sm_xy_mm`. Clipped at 0 (a negative clock is meaningless); 0 on floorswept slots.
    """
    _check_value(sigma_within, "sigma_within", lambda v: v >= 0, "a relative std deviation >= 0")
    _check_value(sigma_die, "sigma_die", lambda v: v >= 0, "a relative std deviation >= 0")
    if mean_mhz is not None:
        _check_value(mean_mhz, "mean_mhz", lambda v: v > 0, "a positive frequency")
    if corr_length_mm is not None:
        _check_value(corr_length_mm, "corr_length_mm", lambda v: v >= 0, "a length >= 0 mm")
    mean = _boost_mhz(arch) if mean_mhz is None else _f32(mean_mhz)
    length = default_corr_length_mm(arch) if corr_length_mm is None else _f32(corr_length_mm)
    k_die, k_field = jax.random.split(key)
    z_die = jax.random.normal(k_die, (), dtype=jnp.float32)
    z = spatial_field(k_field, _f32(arch.sm_xy_mm), length)
    mhz = mean * (1.0 + _f32(sigma_die) * z_die + _f32(sigma_within) * z)
    return _mask(arch, jnp.maximum(mhz, 0.0))


# ----------------------------------------------------------------------------- IR drop


def default_bumps(arch: Arch, grid: tuple[int, int] = BUMP_GRID) -> Float[Array, "bump 2"]:
    """Supply-bump sites on a regular `grid` (nx, ny) over the die, each at the centre of its
    cell. Real dies have thousands of C4 bumps at ~0.15-0.2 mm pitch; a site stands for the
    package's feed into one region, which is what sets the die-scale drop pattern."""
    nx, ny = grid
    check(nx >= 1 and ny >= 1, "freqmap.grid", grid, "at least one bump site in each direction")
    die = _f32(arch.die_mm)
    gx = (jnp.arange(nx, dtype=jnp.float32) + 0.5) / nx * die[0]
    gy = (jnp.arange(ny, dtype=jnp.float32) + 0.5) / ny * die[1]
    return jnp.stack(jnp.meshgrid(gx, gy, indexing="xy"), axis=-1).reshape(nx * ny, 2)


def bump_distance_mm(
    xy_mm: Float[Array, "sm 2"], bumps_xy_mm: Float[Array, "bump 2"]
) -> Float[Array, " sm"]:
    """Distance from each point to its nearest bump."""
    diff = _f32(xy_mm)[:, None, :] - _f32(bumps_xy_mm)[None, :, :]
    return jnp.sqrt(jnp.min(jnp.sum(diff**2, axis=-1), axis=-1))


def ir_defaults(arch: Arch) -> dict[str, Array]:
    """Default IR-drop parameters of a preset (traceable in `arch`):

    - vdd 0.9 V, v_th 0.35 V, alpha 1.3, f_nominal the boost clock;
    - bumps: `default_bumps` (4 x 3 sites);
    - current per SM: SM_POWER_SHARE x power_limit_w / (enabled SMs x vdd) (3.5 A on an H200);
    - r_ohm_per_mm: chosen so that the enabled SM farthest from the default bumps drops
      IR_BUDGET x vdd (45 mV) at that current, which costs it ~6% frequency under the
      alpha-power law; r is a property of the grid, so user-given bumps keep it.
    """
    vdd = jnp.float32(VDD_V)
    n_on = jnp.sum(arch.sm_enabled).astype(jnp.float32)
    current = SM_POWER_SHARE * _f32(arch.power_limit_w) / (n_on * vdd)
    bumps = default_bumps(arch)
    d = bump_distance_mm(arch.sm_xy_mm, bumps)
    d_far = jnp.max(jnp.where(arch.sm_enabled, d, 0.0))
    r = IR_BUDGET * vdd / (current * jnp.maximum(d_far, _TINY))
    return dict(
        vdd=vdd,
        bumps_xy_mm=bumps,
        r_ohm_per_mm=r,
        current_a=current,
        current_radius_mm=jnp.float32(CURRENT_RADIUS_MM),
        v_th=jnp.float32(V_TH_V),
        alpha=jnp.float32(ALPHA),
        f_nominal_mhz=_boost_mhz(arch),
    )


def _ir_params(arch: Arch, given: dict[str, Any]) -> dict[str, Any]:
    """Fill unset parameters from `ir_defaults` and validate the concrete ones."""
    params = ir_defaults(arch)
    params.update({k: v for k, v in given.items() if v is not None})
    b_shape = np.shape(params["bumps_xy_mm"])
    check(len(b_shape) == 2 and b_shape[1] == 2 and b_shape[0] >= 1, "freqmap.bumps_xy_mm",
          f"shape {b_shape}", "(n_bumps >= 1, 2) positions in mm")
    params["current_a"] = _per_sm(params["current_a"], arch, "current_a")
    positive = lambda v: v > 0  # noqa: E731
    non_negative = lambda v: v >= 0  # noqa: E731
    _check_value(params["vdd"], "vdd", positive, "a positive supply voltage")
    _check_value(params["v_th"], "v_th", non_negative, "a threshold voltage >= 0")
    _check_value(params["alpha"], "alpha", positive, "an alpha-power exponent > 0")
    _check_value(params["r_ohm_per_mm"], "r_ohm_per_mm", non_negative, "a resistance >= 0")
    _check_value(params["current_a"], "current_a", non_negative, "a current >= 0 A")
    _check_value(params["current_radius_mm"], "current_radius_mm", non_negative, ">= 0 mm")
    _check_value(params["f_nominal_mhz"], "f_nominal_mhz", positive, "a positive frequency")
    vdd, v_th = _concrete(params["vdd"]), _concrete(params["v_th"])
    if vdd is not None and v_th is not None:
        check(float(v_th) < float(vdd), "freqmap.v_th", float(v_th), f"< vdd ({float(vdd)} V)")
    return params


def supply_voltage(
    arch: Arch,
    *,
    vdd: ArrayLike | None = None,
    bumps_xy_mm: ArrayLike | None = None,
    r_ohm_per_mm: ArrayLike | None = None,
    current_a: ArrayLike | None = None,
    current_radius_mm: ArrayLike | None = None,
) -> Float[Array, " sm"]:
    """Per-SM supply voltage V_i = vdd - r d_i I_i (see the module docstring); unset parameters
    come from `ir_defaults`. `current_a` is a scalar or one value per SM slot (e.g. scaled by
    activity); floorswept SMs draw nothing."""
    p = _ir_params(arch, dict(vdd=vdd, bumps_xy_mm=bumps_xy_mm, r_ohm_per_mm=r_ohm_per_mm,
                              current_a=current_a, current_radius_mm=current_radius_mm))
    xy = _f32(arch.sm_xy_mm)
    amps = jnp.where(arch.sm_enabled, jnp.broadcast_to(_f32(p["current_a"]), (xy.shape[0],)), 0.0)
    weight = covariance(xy, p["current_radius_mm"])  # Gaussian neighbourhood, 1 on the diagonal
    local = weight @ amps / jnp.sum(weight, axis=-1)
    drop = _f32(p["r_ohm_per_mm"]) * bump_distance_mm(xy, p["bumps_xy_mm"]) * local
    return _f32(p["vdd"]) - drop


def alpha_power(v: ArrayLike, *, v_th: ArrayLike = V_TH_V, alpha: ArrayLike = ALPHA) -> Array:
    """The alpha-power law's speed g(V) = (V - v_th)^alpha / V (0 at or below v_th)."""
    v = _f32(v)
    return jnp.maximum(v - _f32(v_th), 0.0) ** _f32(alpha) / jnp.maximum(v, _TINY)


def ir_factor(
    arch: Arch,
    *,
    vdd: ArrayLike | None = None,
    bumps_xy_mm: ArrayLike | None = None,
    r_ohm_per_mm: ArrayLike | None = None,
    current_a: ArrayLike | None = None,
    current_radius_mm: ArrayLike | None = None,
    v_th: ArrayLike | None = None,
    alpha: ArrayLike | None = None,
) -> Float[Array, " sm"]:
    """Per-SM clock multiplier g(V_i) / g(vdd) from IR drop (1 with no drop; 0 on floorswept
    slots). Unset parameters come from `ir_defaults(arch)`."""
    p = _ir_params(arch, dict(vdd=vdd, bumps_xy_mm=bumps_xy_mm, r_ohm_per_mm=r_ohm_per_mm,
                              current_a=current_a, current_radius_mm=current_radius_mm,
                              v_th=v_th, alpha=alpha))
    v = supply_voltage(arch, vdd=p["vdd"], bumps_xy_mm=p["bumps_xy_mm"],
                       r_ohm_per_mm=p["r_ohm_per_mm"], current_a=p["current_a"],
                       current_radius_mm=p["current_radius_mm"])
    g = alpha_power(v, v_th=p["v_th"], alpha=p["alpha"])
    g_nom = alpha_power(p["vdd"], v_th=p["v_th"], alpha=p["alpha"])
    return _mask(arch, g / jnp.maximum(g_nom, _TINY))


def ir_drop(
    arch: Arch,
    *,
    vdd: ArrayLike | None = None,
    bumps_xy_mm: ArrayLike | None = None,
    r_ohm_per_mm: ArrayLike | None = None,
    current_a: ArrayLike | None = None,
    current_radius_mm: ArrayLike | None = None,
    v_th: ArrayLike | None = None,
    alpha: ArrayLike | None = None,
    f_nominal_mhz: ArrayLike | None = None,
) -> Float[Array, " sm"]:
    """Per-SM clock (MHz) under IR drop: f_nominal g(V_i) / g(vdd). Unset parameters come from
    `ir_defaults(arch)` (f_nominal: the boost clock)."""
    if f_nominal_mhz is not None:
        _check_value(f_nominal_mhz, "f_nominal_mhz", lambda v: v > 0, "a positive frequency")
    f_nom = _boost_mhz(arch) if f_nominal_mhz is None else _f32(f_nominal_mhz)
    factor = ir_factor(arch, vdd=vdd, bumps_xy_mm=bumps_xy_mm, r_ohm_per_mm=r_ohm_per_mm,
                       current_a=current_a, current_radius_mm=current_radius_mm, v_th=v_th,
                       alpha=alpha)
    return f_nom * factor


# ----------------------------------------------------------------------------- bins and caps


def bin_and_cap(
    mhz: ArrayLike,
    *,
    step_mhz: ArrayLike,
    cap_mhz: ArrayLike | None = None,
    floor_mhz: ArrayLike | None = None,
) -> Float[Array, " sm"]:
    """Floor each clock to a multiple of `step_mhz`, then clip to [floor, cap] bins: the lowest
    bin >= `floor_mhz` (default: one step, so an enabled SM never stops) and the highest bin
    <= `cap_mhz` (scalar or per SM; default none). The result never exceeds the cap. Zeros
    (floorswept SMs) stay zero."""
    _check_value(step_mhz, "step_mhz", lambda v: v > 0, "a positive clock step")
    if cap_mhz is not None:
        _check_value(cap_mhz, "cap_mhz", lambda v: v > 0, "a positive cap")
    if floor_mhz is not None:
        _check_value(floor_mhz, "floor_mhz", lambda v: v >= 0, "a floor >= 0")
    cap_c, floor_c = _concrete(cap_mhz), _concrete(floor_mhz)
    if cap_c is not None and floor_c is not None:
        check(bool(np.all(floor_c <= cap_c)), "freqmap.floor_mhz", float(np.max(floor_c)),
              f"<= cap_mhz ({float(np.min(cap_c))})")
    mhz, step = _f32(mhz), _f32(step_mhz)
    # The 1e-4 bin of slack keeps values that float32 puts just below a bin (1979.9999) in it.
    binned = jnp.floor(mhz / step + 1e-4) * step
    lo = step if floor_mhz is None else jnp.ceil(_f32(floor_mhz) / step - 1e-4) * step
    if cap_mhz is None:
        out = jnp.maximum(binned, lo)
    else:
        cap = _f32(cap_mhz)
        hi = jnp.floor(cap / step) * step
        hi = jnp.where(hi > cap, hi - step, hi)  # float32 division may round up onto the next bin
        out = jnp.minimum(jnp.maximum(binned, lo), hi)
    return jnp.where(mhz > 0, out, 0.0).astype(jnp.float32)


def combine(
    arch: Arch,
    base_mhz: ArrayLike,
    *factors: ArrayLike,
    step_mhz: ArrayLike | None = None,
    cap_mhz: ArrayLike | None = None,
    floor_mhz: ArrayLike | None = None,
) -> Float[Array, " sm"]:
    """A map `base_mhz` times clock multipliers (e.g. `ir_factor`), binned and capped
    (`bin_and_cap`; step defaults to `arch.clock_step_mhz`), 0 on floorswept slots."""
    mhz = _f32(base_mhz)
    for factor in factors:
        mhz = mhz * _f32(factor)
    step = _f32(arch.clock_step_mhz) if step_mhz is None else step_mhz
    return _mask(arch, bin_and_cap(_mask(arch, mhz), step_mhz=step, cap_mhz=cap_mhz,
                                   floor_mhz=floor_mhz))
