"""The DVFS step (docs/model.md section 12): energy folds, power and thermal sampling, the clock
controller and activity-dependent droop, vectorised over SMs.

Domains (chip, GPC or SM) are handled with an SM x SM "same domain" mask: a domain's sum or
maximum is computed on every SM of the domain, so domain values stay replicated per SM and every
update is elementwise. All arithmetic is integer (int64 for energy, power and temperature), so
the engine equals the reference exactly.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

from ..dvfs import T_MAX_MK, T_MIN_MK, T_REF_MK
from ..lower import Launch, Shapes
from .state import INF, Counters, DvfsState, State
from .variation import hash3

_NOISE_STREAM = 6  # section 4's hash, stream 6, keyed by the DVFS seed
OFF, DVFS, LOCK = 0, 1, 2


class Domains(NamedTuple):
    """Which enabled SMs share each SM's clock and thermal domain (constant during a run)."""

    clock_same: Bool[Array, "sm sm"]  # [s, s']: s' is enabled and in s's clock domain
    thermal_same: Bool[Array, "sm sm"]
    clock_size: Int[Array, " sm"]  # n(cd(s))
    thermal_size: Int[Array, " sm"]  # n(td(s))
    n_enabled: Int[Array, ""]  # N


def domains(launch: Launch) -> Domains:
    d, en = launch.clocks.dvfs, launch.chip.sm_enabled
    clock = (d.clock_domain[:, None] == d.clock_domain[None, :]) & en[None, :]
    thermal = (d.thermal_domain[:, None] == d.thermal_domain[None, :]) & en[None, :]
    return Domains(clock, thermal, jnp.sum(clock, axis=1, dtype=jnp.int64),
                   jnp.sum(thermal, axis=1, dtype=jnp.int64), jnp.sum(en, dtype=jnp.int64))


def _i64(x: Array) -> Array:
    return jnp.asarray(x).astype(jnp.int64)


def voltage_mv(launch: Launch, f_mhz: Int[Array, " sm"]) -> Int[Array, " sm"]:
    """The linear V-f curve between (f_min, v_min) and (f_max, v_max), int64 mV."""
    d = launch.clocks.dvfs
    span = _i64(d.f_max_mhz - d.f_min_mhz)
    f = _i64(jnp.clip(f_mhz, d.f_min_mhz, d.f_max_mhz))
    v = _i64(d.v_min_mv) + _i64(d.v_max_mv - d.v_min_mv) * (f - _i64(d.f_min_mhz)) // jnp.maximum(span, 1)
    return jnp.where(span == 0, _i64(d.v_max_mv), v)


def sm_clock(launch: Launch, dv: DvfsState) -> Int[Array, " sm"]:
    """f_s = max(1, min(fd, cap_s) - droop_s) on enabled SMs, 0 on floorswept ones."""
    f = jnp.maximum(1, jnp.minimum(dv.domain_mhz, launch.clocks.sm_freq_mhz) - dv.droop_mhz)
    return jnp.where(launch.chip.sm_enabled, f, 0).astype(jnp.int32)


def initial_dvfs(launch: Launch, dv: DvfsState) -> tuple[Int[Array, " sm"], DvfsState]:
    """Clocks at tick 0 and the DVFS state at launch (section 12, "State")."""
    d = launch.clocks.dvfs
    dv = replace(
        dv,
        domain_mhz=jnp.full_like(dv.domain_mhz, d.f_init_mhz),
        temp_mk=jnp.full_like(dv.temp_mk, _i64(d.temp0_mk)),
        next_sample=d.phase_ticks,
    )
    return jnp.where(d.mode == OFF, launch.clocks.sm_freq_mhz, sm_clock(launch, dv)), dv


def _fold(dv: DvfsState, counters: Counters, launch: Launch, do: Bool[Array, ""]) -> DvfsState:
    """Energy fold of every SM at its domain's current voltage (if `do`)."""
    d = launch.clocks.dvfs
    activity = (jnp.sum(_i64(d.e_op_pj)[:, None] * (counters.sm_issued_op - dv.snap_issued_op), axis=0)
                + _i64(d.e_cycle_pj) * (counters.sm_cycles - dv.snap_cycles))
    v = voltage_mv(launch, dv.domain_mhz)
    v_max = _i64(d.v_max_mv)
    scale = v * v * 1024 // (v_max * v_max)
    return replace(
        dv,
        energy_pj=jnp.where(do, dv.energy_pj + activity * scale // 1024, dv.energy_pj),
        snap_issued_op=jnp.where(do, counters.sm_issued_op, dv.snap_issued_op),
        snap_cycles=jnp.where(do, counters.sm_cycles, dv.snap_cycles),
    )


def _apply_pending(dv: DvfsState, counters: Counters, launch: Launch, k: Array, on: Array) -> DvfsState:
    """Steps 1-2: pending clocks (after a fold at the old voltage) and pending droop take effect."""
    due = on & (dv.pending_tick == k)
    dv = _fold(dv, counters, launch, due)
    droop_due = on & (dv.droop_tick == k)
    return replace(
        dv,
        domain_mhz=jnp.where(due, dv.pending_mhz, dv.domain_mhz),
        pending_tick=jnp.where(due, INF, dv.pending_tick),
        droop_mhz=jnp.where(droop_due, dv.pending_droop_mhz, dv.droop_mhz),
        droop_tick=jnp.where(droop_due, INF, dv.droop_tick),
    )


def _domain_sum(same: Bool[Array, "sm sm"], x: Int[Array, " sm"]) -> Int[Array, " sm"]:
    return jnp.sum(jnp.where(same, x[None, :], 0), axis=1)


def _sm_power_mw(dv: DvfsState, launch: Launch) -> Int[Array, " sm"]:
    """Dynamic power over the last window plus static power at the current V and T, mW."""
    d = launch.clocks.dvfs
    window = dv.energy_pj - dv.energy_at_sample_pj
    dynamic = window * _i64(launch.clocks.tick_mhz) // (1000 * _i64(d.period_ticks))
    leak = _i64(d.leak_mw) * voltage_mv(launch, dv.domain_mhz) // _i64(d.v_max_mv)
    temp_factor = 1000 + _i64(d.leak_pm) * (dv.temp_mk - T_REF_MK) // 1000
    static = jnp.maximum(0, leak * temp_factor // 1000)
    return jnp.where(launch.chip.sm_enabled, dynamic + static, 0)


def _controller(dv: DvfsState, launch: Launch, doms: Domains, power: Int[Array, " sm"]) -> Int[Array, " sm"]:
    """One bin down over the cap or the thermal limit, one bin up if it would still fit."""
    d = launch.clocks.dvfs
    f = _i64(dv.domain_mhz)
    step = _i64(d.bin_mhz)
    amp = _i64(d.noise_mw)
    draw = hash3(d.seed, _NOISE_STREAM, dv.n_sample, d.clock_domain) % (2 * amp + 1).astype(jnp.uint32)
    noise = draw.astype(jnp.int64) - amp
    n = jnp.maximum(doms.n_enabled, 1)
    p_dom = _domain_sum(doms.clock_same, power) + _i64(d.uncore_mw) * doms.clock_size // n + noise
    cap = _i64(d.cap_mw) * doms.clock_size // n
    t_dom = jnp.max(jnp.where(doms.clock_same, dv.temp_mk[None, :], jnp.iinfo(jnp.int64).min), axis=1)
    limit = _i64(d.limit_mk)
    down = (p_dom > cap) | (t_dom >= limit)
    up = (f < d.f_max_mhz) & (p_dom * (f + step) <= cap * f) & (t_dom < limit - _i64(d.hyst_mk))
    new = jnp.where(down, jnp.maximum(_i64(d.f_min_mhz), f - step),
                    jnp.where(up, jnp.minimum(_i64(d.f_max_mhz), f + step), f))
    return jnp.where(d.mode == DVFS, new, f).astype(jnp.int32)


def _sample(dv: DvfsState, state: State, launch: Launch, shapes: Shapes, doms: Domains, k: Int[Array, ""],
            do: Bool[Array, ""]) -> DvfsState:
    """Step 3 at tick `k`: power and temperature of the last window, the decision, droop, the trace."""
    d = launch.clocks.dvfs
    dv = _fold(dv, state.counters, launch, do)
    power = _sm_power_mw(dv, launch)
    t_power = _domain_sum(doms.thermal_same, power)
    target = _i64(d.ambient_mk) + t_power * (_i64(d.r_mk) // jnp.maximum(doms.thermal_size, 1)) // 1000
    tau = _i64(d.tau_ticks)
    temp = dv.temp_mk + (target - dv.temp_mk) * jnp.minimum(_i64(d.period_ticks), tau) // tau
    temp = jnp.clip(temp, T_MIN_MK, T_MAX_MK)  # a thermal runaway saturates
    dv = replace(dv, temp_mk=jnp.where(do, temp, dv.temp_mk))
    pending = _controller(dv, launch, doms, power)
    droop = _i64(d.bin_mhz) * ((power * _i64(d.droop_m) // 1_000_000) // _i64(d.bin_mhz))

    n = dv.n_sample
    if shapes.trace_len > 0:
        row = jnp.where(do & (n % d.trace_every == 0), n // d.trace_every, shapes.trace_len)
        dv = replace(
            dv,
            trace_tick=dv.trace_tick.at[row].set(k, mode="drop"),
            trace_mhz=dv.trace_mhz.at[row].set(state.freq, mode="drop"),
            trace_mw=dv.trace_mw.at[row].set(power, mode="drop"),
            trace_mk=dv.trace_mk.at[row].set(jnp.where(launch.chip.sm_enabled, dv.temp_mk, 0), mode="drop"),
        )
    return replace(
        dv,
        energy_at_sample_pj=jnp.where(do, dv.energy_pj, dv.energy_at_sample_pj),
        pending_mhz=jnp.where(do, pending, dv.pending_mhz),
        pending_tick=jnp.where(do, k + d.latency_ticks, dv.pending_tick),
        pending_droop_mhz=jnp.where(do, droop.astype(jnp.int32), dv.pending_droop_mhz),
        droop_tick=jnp.where(do, k + d.droop_delay_ticks, dv.droop_tick),
        next_sample=jnp.where(do, dv.next_sample + d.period_ticks, dv.next_sample),
        n_sample=jnp.where(do, n + 1, n),
    )


def dvfs_step(state: State, launch: Launch, shapes: Shapes, doms: Domains, k: Int[Array, ""],
              due: Bool[Array, ""]) -> State:
    """Section 12's step at tick `k`, after the tick's cycles, dispatch and queue drain, where
    `due` (every SM has run to `k`: `decouple.dvfs_due`)."""
    on = (launch.clocks.dvfs.mode != OFF) & due
    dv = _apply_pending(state.dvfs, state.counters, launch, k, on)
    dv = _sample(dv, state, launch, shapes, doms, k, on & (k == dv.next_sample))
    dv = _apply_pending(dv, state.counters, launch, k, on)
    return replace(state, dvfs=dv, freq=jnp.where(on, sm_clock(launch, dv), state.freq))


def next_dvfs_event(state: State, launch: Launch) -> Int[Array, ""]:
    """The next tick at which the DVFS step changes anything (INF with DVFS off)."""
    dv = state.dvfs
    nxt = jnp.minimum(dv.next_sample, jnp.minimum(dv.pending_tick, dv.droop_tick))
    return jnp.where(launch.clocks.dvfs.mode != OFF, nxt, INF)


def final_outputs(state: State, launch: Launch) -> dict[str, Array]:
    """Section 12's outputs: energy after a final fold, end clocks and temperatures, the trace."""
    on = launch.clocks.dvfs.mode != OFF
    dv = _fold(state.dvfs, state.counters, launch, on)
    keep = on & launch.chip.sm_enabled
    return dict(
        sm_energy_pj=jnp.where(keep, dv.energy_pj, 0),
        sm_clock_end_mhz=jnp.where(keep, state.freq, 0),
        sm_temp_end_mk=jnp.where(keep, dv.temp_mk, 0),
        trace_tick=dv.trace_tick,
        trace_mhz=dv.trace_mhz,
        trace_mw=dv.trace_mw,
        trace_mk=dv.trace_mk,
    )
