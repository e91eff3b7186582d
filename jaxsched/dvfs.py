"""DVFS parameters: the power model, the thermal RC model and the clock controller (docs/model.md
section 12), as a traced pytree a user sweeps, and their lowering to the engines' integer units.

`Dvfs` is what a user writes (watts, microseconds, degrees C, picojoules); `DvfsLaunch` is what
both engines run on (mW, ticks, milli-kelvin, pJ as integers), produced once by `lower_dvfs` so
that the JAX engine and the plain reference share one rounding. Three modes: `off` (static clock
map, nothing dynamic), `dvfs` (the controller moves clocks) and `lock` (the `nvidia-smi -lgc`
equivalent: a fixed clock, power and temperature still tracked).
"""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from .arch import Arch
from .clocks import MAX_MHZ
from .errors import INT32_MAX, INT32_MIN, check, check_floats, check_ints, check_values, is_traced
from .isa import Op

MODES = ("off", "dvfs", "lock")
DOMAINS = ("chip", "gpc", "sm")
T_REF_MK = 25_000  # leakage is specified at 25 C
T_MIN_MK, T_MAX_MK = -273_000, 1_000_000  # temperatures saturate (a thermal runaway does not overflow)
MAX_TRACE_ROWS = 1 << 16  # clock-trace rows a run keeps (`trace_len`), in either engine
MAX_PERIOD_US = 100_000.0  # 0.1 s: periods and time constants stay int32 ticks at 10 GHz


class Dvfs(eqx.Module):
    """DVFS, power and thermal parameters of one configuration (every leaf traced)."""

    mode: Int[Array, ""]  # index into MODES
    clock_domain: Int[Array, ""]  # index into DOMAINS: which SMs share one controlled clock
    thermal_domain: Int[Array, ""]  # index into DOMAINS: which SMs share one RC node
    boost_mhz: Float[Array, ""]  # highest clock the controller requests
    min_mhz: Float[Array, ""]  # lowest clock it requests (power or thermal brake)
    bin_mhz: Float[Array, ""]  # clock step
    initial_mhz: Float[Array, ""]  # domain clock at launch (where the previous workload left it)
    lock_mhz: Float[Array, ""]  # the locked clock (lock mode)
    period_us: Float[Array, ""]  # controller sample period
    latency_us: Float[Array, ""]  # from a sample to the clock change (0 .. period)
    phase: Float[Array, ""]  # first sample at phase * period after the launch, in [0, 1)
    power_cap_w: Float[Array, ""]  # board power limit
    uncore_w: Float[Array, ""]  # memory and I/O power counted against the cap
    leak_w: Float[Array, ""]  # static power per SM at the top voltage and 25 C
    leak_per_k: Float[Array, ""]  # relative growth of leakage per kelvin
    ambient_c: Float[Array, ""]
    initial_temp_c: Float[Array, ""]
    thermal_limit_c: Float[Array, ""]  # at or above it the controller steps down
    thermal_hysteresis_c: Float[Array, ""]  # no step up within this much of the limit
    r_th_k_per_w: Float[Array, ""]  # thermal resistance of one SM to ambient
    tau_us: Float[Array, ""]  # thermal time constant
    v_min_mv: Float[Array, ""]  # voltage at min_mhz
    v_max_mv: Float[Array, ""]  # voltage at boost_mhz
    energy_pj: Float[Array, " op"]  # per warp instruction of each isa.Op class, at v_max
    cycle_energy_pj: Float[Array, ""]  # per SM cycle (clock tree, idle logic), at v_max
    droop_mhz_per_w: Float[Array, ""]  # activity-dependent IR drop: clock lost per watt drawn
    droop_delay_us: Float[Array, ""]  # response delay of the droop (0 .. period)
    noise_w: Float[Array, ""]  # amplitude of the uniform power-sensor error
    seed: Int[Array, ""]  # seeds the sensor noise
    trace_every: Int[Array, ""]  # record every n-th sample in the clock trace

    def __check_init__(self) -> None:
        validate_dvfs(self)

    def replace(self, **changes: object) -> "Dvfs":
        """A copy with some fields changed (validated)."""
        return dataclasses.replace(self, **changes)


def _f32(x: object) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


# Energy per warp instruction at the top voltage, pJ, by isa.Op. Sized so that an H200 issuing
# four FMAs per SM cycle at 1.98 GHz draws about 3.2 W of dynamic power per SM (~420 W for 132
# SMs), the remainder of the 700 W cap being uncore, leakage and clock power [DOM].
_ENERGY_PJ = {Op.FMA: 400, Op.ALU: 300, Op.SFU: 600, Op.LDS: 350, Op.LDG: 800, Op.SHFL: 300,
              Op.BAR: 50, Op.EXIT: 50}


def default(arch: Arch, mode: str = "dvfs", **overrides: object) -> Dvfs:
    """DVFS parameters for `arch` (its boost clock, power limit and bin size); `overrides` by
    field name (clock_domain/thermal_domain/mode may be given as names)."""
    boost = float(arch.boost_clock_ghz) * 1000.0
    cap = float(arch.power_limit_w)
    n_sm = max(arch.sm_count, 1)
    values = dict(
        mode=mode,
        clock_domain="chip",
        thermal_domain="sm",
        boost_mhz=boost,
        min_mhz=round(boost * 0.5),
        bin_mhz=float(arch.clock_step_mhz),
        initial_mhz=boost,
        lock_mhz=boost,
        period_us=100.0,
        latency_us=100.0,
        phase=0.0,
        power_cap_w=cap,
        uncore_w=0.25 * cap,
        leak_w=0.15 * cap / n_sm,
        leak_per_k=0.01,
        ambient_c=35.0,
        initial_temp_c=45.0,
        thermal_limit_c=87.0,
        thermal_hysteresis_c=3.0,
        r_th_k_per_w=0.08 * n_sm,  # ~0.08 K/W die to ambient for the whole chip, SMs in parallel
        tau_us=20_000.0,
        v_min_mv=700.0,
        v_max_mv=1000.0,
        energy_pj=[_ENERGY_PJ[op] for op in Op],
        cycle_energy_pj=150.0,
        droop_mhz_per_w=0.0,
        droop_delay_us=0.0,
        noise_w=0.0,
        seed=0,
        trace_every=1,
    )
    unknown = set(overrides) - set(values)
    check(not unknown, "dvfs", sorted(unknown), f"known fields: {sorted(values)}")
    if "period_us" in overrides and "latency_us" not in overrides:
        overrides = {**overrides, "latency_us": overrides["period_us"]}  # acts one period late
    values.update(overrides)
    for name, known in (("mode", MODES), ("clock_domain", DOMAINS), ("thermal_domain", DOMAINS)):
        v = values[name]
        if isinstance(v, str):
            check(v in known, f"dvfs.{name}", v, f"one of {known}")
            values[name] = known.index(v)
    ints = ("mode", "clock_domain", "thermal_domain", "seed", "trace_every")
    for k in ints:
        check_ints(values[k], f"dvfs.{k}", INT32_MIN, INT32_MAX)
    return Dvfs(**{k: (np.asarray(v, np.int32) if k in ints else _f32(v)) for k, v in values.items()})


def off(arch: Arch) -> Dvfs:
    """Static clocks: the clock map of `Clocks` holds for the whole run."""
    return default(arch, mode="off")


def locked(arch: Arch, mhz: float) -> Dvfs:
    """`nvidia-smi -lgc mhz,mhz`: every SM at min(mhz, its cap) for the whole run (less any
    activity-dependent droop, which a clock lock does not prevent; off by default)."""
    return default(arch, mode="lock", lock_mhz=mhz)


def validate_dvfs(d: Dvfs) -> None:
    """Raise `JaxschedError` naming the bad field: every parameter finite, in range and
    representable in the engine's integer units (a stack of them is checked per configuration,
    naming it). Traced parameters are left to the engine."""
    f = lambda name: f"dvfs.{name}"  # noqa: E731
    v = {field.name: getattr(d, field.name) for field in dataclasses.fields(d)}
    check_ints(v["mode"], f("mode"), 0, len(MODES) - 1, f"one of {MODES} (0 .. {len(MODES) - 1})")
    for name in ("clock_domain", "thermal_domain"):
        check_ints(v[name], f(name), 0, len(DOMAINS) - 1, f"one of {DOMAINS} (0 .. {len(DOMAINS) - 1})")
    check_ints(v["seed"], f("seed"), INT32_MIN, INT32_MAX, "a 32-bit integer")
    check_ints(v["trace_every"], f("trace_every"), 1, 2**20, "in 1 .. 2^20 samples")
    check_floats(v["bin_mhz"], f("bin_mhz"), 1, 1000, "a clock step of 1 .. 1000 MHz")
    for name in ("boost_mhz", "min_mhz", "initial_mhz", "lock_mhz"):
        check_floats(v[name], f(name), 1, MAX_MHZ, f"a clock in 1 .. {MAX_MHZ} MHz")
    for name in ("period_us", "tau_us"):
        check_floats(v[name], f(name), 0, MAX_PERIOD_US, f"in (0, {MAX_PERIOD_US:g}] us (int32 ticks at 10 GHz)",
                     low_open=True)
    for name in ("latency_us", "droop_delay_us"):
        check_floats(v[name], f(name), 0, MAX_PERIOD_US, "in [0, period_us]")
    check_floats(v["phase"], f("phase"), 0, 1, "a fraction of the period in [0, 1)")
    check_floats(v["power_cap_w"], f("power_cap_w"), 0, 1e5, "in (0, 1e5] W", low_open=True)
    for name in ("uncore_w", "leak_w", "noise_w", "droop_mhz_per_w"):
        check_floats(v[name], f(name), 0, 1e5, "in [0, 1e5]")
    check_floats(v["leak_per_k"], f("leak_per_k"), -1, 1, "a relative change per kelvin in [-1, 1]")
    for name in ("ambient_c", "initial_temp_c", "thermal_limit_c"):
        check_floats(v[name], f(name), -50, 300, "a temperature in [-50, 300] C")
    check_floats(v["thermal_hysteresis_c"], f("thermal_hysteresis_c"), 0, 100, "in [0, 100] K")
    check_floats(v["r_th_k_per_w"], f("r_th_k_per_w"), 0, 1e4, "in [0, 1e4] K/W")
    for name in ("v_min_mv", "v_max_mv"):
        check_floats(v[name], f(name), 0, 5000, "in (0, 5000] mV", low_open=True)
    check_floats(v["energy_pj"], f("energy_pj"), 0, 1e6, "each in [0, 1e6] pJ", rank=1)
    check_floats(v["cycle_energy_pj"], f("cycle_energy_pj"), 0, 1e6, "in [0, 1e6] pJ")
    if any(is_traced(x) for x in v.values()):
        return
    a = {k: np.asarray(x, np.float64) for k, x in v.items()}
    check(np.shape(v["energy_pj"])[-1:] == (len(Op),), f("energy_pj"), f"shape {np.shape(v['energy_pj'])}",
          f"one energy per isa.Op class ({len(Op)},)")
    check_values(a["min_mhz"], f("min_mhz"), lambda m: m <= a["boost_mhz"], "min_mhz <= boost_mhz")
    for name in ("initial_mhz", "lock_mhz"):
        check_values(a[name], f(name), lambda x: (x >= a["min_mhz"]) & (x <= a["boost_mhz"]),
                     "within [min_mhz, boost_mhz]")
    for name in ("latency_us", "droop_delay_us"):
        check_values(a[name], f(name), lambda x: x <= a["period_us"],
                     "at most period_us: one decision in flight at a time")
    check_values(a["phase"], f("phase"), lambda p: p < 1, "a fraction of the period in [0, 1)")
    check_values(a["v_min_mv"], f("v_min_mv"), lambda x: x <= a["v_max_mv"], "v_min_mv <= v_max_mv")


class DvfsLaunch(eqx.Module):
    """Section 12's parameters in engine units (integers; see docs/model.md section 12)."""

    mode: Int[Array, ""]
    clock_domain: Int[Array, " sm"]  # domain id of each SM: 0, its GPC or its index
    thermal_domain: Int[Array, " sm"]
    f_init_mhz: Int[Array, ""]  # initial domain clock (lock_mhz in lock mode)
    f_min_mhz: Int[Array, ""]
    f_max_mhz: Int[Array, ""]
    bin_mhz: Int[Array, ""]
    period_ticks: Int[Array, ""]
    latency_ticks: Int[Array, ""]
    droop_delay_ticks: Int[Array, ""]
    phase_ticks: Int[Array, ""]
    tau_ticks: Int[Array, ""]
    cap_mw: Int[Array, ""]
    uncore_mw: Int[Array, ""]
    leak_mw: Int[Array, ""]
    leak_pm: Int[Array, ""]  # per mille per kelvin
    ambient_mk: Int[Array, ""]
    temp0_mk: Int[Array, ""]
    limit_mk: Int[Array, ""]
    hyst_mk: Int[Array, ""]
    r_mk: Int[Array, ""]  # mK per W, one SM to ambient
    v_min_mv: Int[Array, ""]
    v_max_mv: Int[Array, ""]
    e_op_pj: Int[Array, " op"]
    e_cycle_pj: Int[Array, ""]
    droop_m: Int[Array, ""]  # droop_mhz_per_w * 1000
    noise_mw: Int[Array, ""]
    seed: Int[Array, ""]
    trace_every: Int[Array, ""]


def tick_mhz(d: Dvfs, cap_mhz: Int[Array, " sm"]) -> Int[Array, ""]:
    """The global tick rate F: the fastest clock any SM can reach (section 2)."""
    f_max = jnp.round(d.boost_mhz).astype(jnp.int32)
    reach = jnp.where(jnp.asarray(d.mode) == 0, cap_mhz, jnp.minimum(cap_mhz, f_max))
    return jnp.max(jnp.where(cap_mhz > 0, reach, 0))


def lower_dvfs(d: Dvfs, arch: Arch, tick: Int[Array, ""]) -> DvfsLaunch:
    """`Dvfs` -> `DvfsLaunch` at tick rate `tick` MHz. Traceable."""
    r = lambda x: jnp.round(jnp.asarray(x, jnp.float64)).astype(jnp.int32)  # noqa: E731
    per_us = tick.astype(jnp.float64)
    period = jnp.maximum(1, r(d.period_us * per_us))
    mk = lambda c: r(jnp.asarray(c, jnp.float64) * 1000.0)  # noqa: E731
    n = arch.n_sm_slots
    ids = jnp.stack([jnp.zeros(n, jnp.int32), jnp.asarray(arch.sm_gpc, jnp.int32), jnp.arange(n, dtype=jnp.int32)])
    mode = jnp.asarray(d.mode, jnp.int32)
    return DvfsLaunch(
        mode=mode,
        clock_domain=ids[d.clock_domain],
        thermal_domain=ids[d.thermal_domain],
        f_init_mhz=jnp.where(mode == 2, r(d.lock_mhz), r(d.initial_mhz)),
        f_min_mhz=r(d.min_mhz),
        f_max_mhz=r(d.boost_mhz),
        bin_mhz=r(d.bin_mhz),
        period_ticks=period,
        latency_ticks=jnp.clip(r(d.latency_us * per_us), 0, period),
        droop_delay_ticks=jnp.clip(r(d.droop_delay_us * per_us), 0, period),
        phase_ticks=jnp.floor(jnp.asarray(d.phase, jnp.float64) * period.astype(jnp.float64)).astype(jnp.int32),
        tau_ticks=jnp.maximum(1, r(d.tau_us * per_us)),
        cap_mw=r(d.power_cap_w * 1000.0),
        uncore_mw=r(d.uncore_w * 1000.0),
        leak_mw=r(d.leak_w * 1000.0),
        leak_pm=r(d.leak_per_k * 1000.0),
        ambient_mk=mk(d.ambient_c),
        temp0_mk=mk(d.initial_temp_c),
        limit_mk=mk(d.thermal_limit_c),
        hyst_mk=mk(d.thermal_hysteresis_c),
        r_mk=r(d.r_th_k_per_w * 1000.0),
        v_min_mv=r(d.v_min_mv),
        v_max_mv=r(d.v_max_mv),
        e_op_pj=r(d.energy_pj),
        e_cycle_pj=r(d.cycle_energy_pj),
        droop_m=r(d.droop_mhz_per_w * 1000.0),
        noise_mw=r(d.noise_w * 1000.0),
        seed=jnp.asarray(d.seed, jnp.int32),
        trace_every=jnp.asarray(d.trace_every, jnp.int32),
    )


def run_to_run(arch: Arch, base: Dvfs, seed: int, n: int, *, temp_c: tuple[float, float] = (35.0, 85.0),
               clock_mhz: tuple[float, float] | None = None) -> list[Dvfs]:
    """`n` copies of `base` with seeded run-to-run state: initial temperature uniform in `temp_c`,
    initial clock uniform on the bin grid in `clock_mhz` (default [min, boost]), controller phase
    uniform in [0, 1) and sensor-noise seed, so "run the same kernel n times" is one batch."""
    rng = np.random.default_rng(seed)
    lo, hi = clock_mhz if clock_mhz is not None else (float(base.min_mhz), float(base.boost_mhz))
    step = float(base.bin_mhz)
    n_bins = int(np.floor((hi - lo) / step)) + 1
    out = []
    for _ in range(n):
        out.append(base.replace(
            initial_temp_c=_f32(rng.uniform(*temp_c)),
            initial_mhz=_f32(lo + step * rng.integers(0, n_bins)),
            phase=_f32(rng.uniform(0.0, 1.0)),
            seed=np.asarray(rng.integers(0, 2**31 - 1), np.int32),
        ))
    return out

