"""Oracle bounds on a launch's makespan: the fluid lower bound and the clairvoyant schedule.

Dispatch policies are judged by how far their makespan stays from what a scheduler could reach
at best on the same chip (issue 5). Both references are computed on a *work model* measured
from the simulator itself; docs/bounds.md defines them in full and states their limits.

- **Work model** (`Work`). A CTA runs in one of the `slots_per_sm` slots of an SM; CTA `c` in a
  slot of SM `s` (clock `f_s` MHz) takes `a_cs = cycles_c * 1000 / f_s + ns_c` nanoseconds:
  `cycles_c` SM cycles that scale with the clock and `ns_c` nanoseconds (memory latency and
  queueing, in other clock domains) that do not. `work_from_uniform` measures it on a *uniform*
  chip: one run at `f0` gives `cycles_c` and `ns_c = 0`; two runs at two clocks give both parts
  (solved per CTA, or once for the grid: `split`). Two ways to turn a run into per-CTA work
  (`attribution`): `"slot"`: the CTA's slot occupancy, `end - start` ticks, with `slots_per_sm`
  = the most CTAs the run ever had resident on one SM (its occupancy); a strict bound in every
  measurement so far, loose by the warp scheduler's own tail. `"sm"`: each busy SM cycle is
  split equally among the CTAs resident in it (so the works of an SM sum to its busy cycles)
  and an SM is one slot serving work at its clock; tighter, not strict.
- **Tabulated work model** (`WorkTable`, `work_table_from_uniform`). The same slots, with each
  CTA's time measured on uniform chips at several clocks and affine in the period between
  them. A CTA's slot occupancy does not follow one line through two clocks: at a lower clock
  its co-residents overlap it longer and its slot waits longer for the launch credit (docs/
  model.md section 9), so the two-clock model, exact only at its first clock, runs the uniform
  chip 1-10 % faster than the engine at lower clocks (docs/bounds.md section 1).
- **Fluid lower bound** (`fluid_ns`): total work over total speed, through the LP relaxation of
  the model (CTAs split fractionally over slots), raised to the longest CTA on the fastest SM.
- **Clairvoyant earliest-finish schedule** (`clairvoyant_ns`): knowing every `a_cs`, CTAs in grid
  order (or longest first) each go to the slot where they would finish first (list scheduling).
  An upper bound on the model's optimum, never below the fluid bound.

**The uniform chip at the same mean clock** (`UniformChip`, `uniform_chip`): what dispatch can
reach when the spread of the clocks, not their mean, is what it fights. Two runs of the kernel on
uniform chips at clocks `f_a != f_b` give its makespan as `cycles * 1000 / f + ns` (the same
split as the work model, for the whole launch); `makespan_ns(f)` evaluates it at a chip's mean
clock. `recovered` is a policy's share of hardware dispatch's loss against such a reference:
`(T_hardware - T_policy) / (T_hardware - T_reference)`.

**CTA launch latency** (`launch_ns`, docs/model.md section 9: a freed slot takes its next CTA
`cta_launch_ns` later). A slot that runs `k` CTAs needs `sum a + (k - 1) L <= T`, that is
`sum (a + L) <= T + L`: both bounds are computed on the work `a + L` and lowered by `L` (for the
clairvoyant schedule this is exact: each slot's next CTA starts `L` after its last ended; for the
fluid bound it stays a valid lower bound). `launch_ns = 0` (the default) is the model without
latency.

Both add the engine's launch tick, `1000 / max_s f_s` ns (CTAs are dispatched at tick 0 and
issue from tick 1; docs/model.md section 2). Everything after `work_from_uniform` is `jax.numpy`
with static shapes: `jit` and `vmap` over clock maps and works (of one `slots_per_sm`) work.
"""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float

from .engine.run import Result
from .errors import check

ATTRIBUTIONS = ("slot", "sm")
SPLITS = ("cta", "kernel")


class Work(eqx.Module):
    """Per-CTA work (grid order): a CTA takes `cycles * 1000 / f + ns` ns in a slot of an SM at
    `f` MHz; every SM has `slots_per_sm` slots, each running one CTA at a time."""

    cycles: Float[Array, "*batch grid"]
    ns: Float[Array, "*batch grid"]
    valid: Bool[Array, "*batch grid"]  # False on entries padded past the grid
    slots_per_sm: int = eqx.field(static=True)


class WorkTable(eqx.Module):
    """Per-CTA slot times (ns, grid order) measured on uniform chips at several clocks: between two
    measured clocks a CTA's time is affine in the clock period through both measurements, beyond
    the first and last the nearest segment extends (never below 0 ns); every SM has
    `slots_per_sm` slots, each running one CTA at a time. It holds each measured run's slot
    occupancy (`work_table_from_uniform`), where `Work`'s one line through two runs keeps only
    the first (docs/bounds.md section 1)."""

    period_ns: Float[Array, "*batch clock"]  # 1000 / MHz of each measurement, ascending
    ns: Float[Array, "*batch clock grid"]
    valid: Bool[Array, "*batch grid"]  # False on entries padded past the grid
    slots_per_sm: int = eqx.field(static=True)


AnyWork = Work | WorkTable


class Bounds(eqx.Module):
    """Reference makespans of one launch (ns), or relative gaps to them (`gaps`)."""

    fluid_ns: Float[Array, "*batch"]
    clairvoyant_ns: Float[Array, "*batch"]  # earliest finish, CTAs in grid order
    clairvoyant_lpt_ns: Float[Array, "*batch"]  # earliest finish, longest CTA first


# ----------------------------------------------------------------------------- measuring work


def _residency(cta_sm: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, int]:
    """Per CTA the SM-shared ticks (each tick of an SM split equally among its resident CTAs),
    and the most CTAs ever resident on one SM. A CTA is resident in ticks `start + 1 .. end`."""
    on = cta_sm >= 0
    sm, t0, t1 = cta_sm[on], start[on].astype(np.int64) + 1, end[on].astype(np.int64) + 1
    n = len(sm)
    key = np.concatenate([sm, sm]) * (np.int64(1) << 40) + np.concatenate([t0, t1])
    delta = np.concatenate([np.ones(n), -np.ones(n)])
    order = np.lexsort((delta, key))  # at equal ticks, departures before arrivals
    key, delta = key[order], delta[order]
    resident = np.cumsum(delta)  # on the segment after each event (counts return to 0 per SM)
    length = np.append(np.diff(key), 0).astype(np.float64)
    length[resident == 0] = 0.0  # also zeroes the jump from one SM's last event to the next SM
    shared = np.concatenate([[0.0], np.cumsum(length / np.maximum(resident, 1))])
    position = np.empty(2 * n, np.int64)
    position[order] = np.arange(2 * n)
    ticks = np.zeros(cta_sm.shape)
    ticks[on] = shared[position[n:]] - shared[position[:n]]
    return ticks, int(resident.max(initial=0))


def _durations_ns(result: Result, attribution: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Per-CTA work in ns of one uniform run (rows: configurations), the validity mask, the
    clock (MHz, per row) and the slots per SM; rejects runs whose SMs did not all run at the
    tick clock the whole time (unequal clocks, DVFS)."""
    ticks = np.atleast_1d(np.asarray(result.makespan_ticks))
    sm_cycles = np.asarray(result.sm_cycles).reshape(len(ticks), -1)
    uniform = np.all((sm_cycles == 0) | (sm_cycles == ticks[:, None]), axis=-1)
    check(bool(np.all(uniform)), "result", "a run on unequal or changing SM clocks",
          "the work model is measured on a uniform chip (every enabled SM at one fixed clock)")
    check(bool(np.all(np.asarray(result.completed))), "result.completed", False,
          "the run must have finished every CTA")
    cta_sm, start, end = (np.asarray(x).reshape(len(ticks), -1)
                          for x in (result.cta_sm, result.cta_start_tick, result.cta_end_tick))
    rows = [_residency(*row) for row in zip(cta_sm, start, end)]
    slots = max(r[1] for r in rows)
    if attribution == "slot":
        work_ticks = end.astype(np.float64) - start.astype(np.float64)
    else:
        work_ticks, slots = np.stack([r[0] for r in rows]), 1
    valid = cta_sm >= 0
    mhz = np.atleast_1d(np.asarray(result.tick_mhz, np.float64))[:, None]
    return np.where(valid, work_ticks * 1000.0 / mhz, 0.0), valid, mhz, slots


def work_from_uniform(result_a: Result, result_b: Result | None = None, *, attribution: str = "slot",
                      split: str = "cta") -> Work:
    """The work model of a launch from one or two runs on a uniform chip (batched Results too).

    One run at `f0`: `cycles_c` = the CTA's work in cycles of `f0`, `ns_c = 0`. Two runs at
    clocks `f_a != f_b` (same kernel, grid and policies), works `d_a`, `d_b` in ns: solve
    `d_a = 1000 cycles / f_a + ns`, `d_b = 1000 cycles / f_b + ns` per CTA (`split="cta"`), or
    once for the grid's totals, giving every CTA the kernel's share of clock-bound time
    (`split="kernel"`: per-CTA solutions are noisy, because a CTA's co-residents differ between
    the two runs, and the LP of `fluid_ns` can exploit that noise; it matters for "sm"
    attribution). Where a part comes out negative, `cycles` is clipped to `[0, d_a f_a / 1000]`
    and `ns = d_a - 1000 cycles / f_a`, which keeps run `a` exact. `attribution`: "slot" or
    "sm" (module doc).
    """
    check(attribution in ATTRIBUTIONS, "attribution", attribution, f"one of {ATTRIBUTIONS}")
    check(split in SPLITS, "split", split, f"one of {SPLITS}")
    d_a, valid, f_a, slots = _durations_ns(result_a, attribution)
    if result_b is None:
        cycles, ns = d_a * f_a / 1000.0, np.zeros_like(d_a)
    else:
        d_b, valid_b, f_b, slots_b = _durations_ns(result_b, attribution)
        check(valid_b.shape == valid.shape and bool(np.all(valid_b == valid)), "result_b",
              f"grid of {int(valid_b.sum())} CTAs", f"the same grid as result_a ({int(valid.sum())} CTAs)")
        check(bool(np.all(f_a != f_b)), "result_b.tick_mhz", float(f_b.ravel()[0]),
              "a clock different from result_a's, to separate cycles from nanoseconds")
        slots = max(slots, slots_b)
        per_cycle_ns = 1000.0 / f_a - 1000.0 / f_b
        if split == "cta":
            cycles = np.clip((d_a - d_b) / per_cycle_ns, 0.0, d_a * f_a / 1000.0)
        else:
            total_a, total_b = d_a.sum(-1, keepdims=True), d_b.sum(-1, keepdims=True)
            total_cycles = np.clip((total_a - total_b) / per_cycle_ns, 0.0, total_a * f_a / 1000.0)
            cycles = d_a * total_cycles / np.maximum(total_a, 1e-30)
        ns = d_a - cycles * 1000.0 / f_a
    shape = np.shape(result_a.cta_sm)
    as_f32 = lambda x: jnp.asarray(np.where(valid, x, 0.0).reshape(shape), jnp.float32)  # noqa: E731
    return Work(cycles=as_f32(cycles), ns=as_f32(ns), valid=jnp.asarray(valid.reshape(shape)),
                slots_per_sm=slots)


def work_table_from_uniform(*results: Result, split: str = "kernel") -> WorkTable:
    """The tabulated work model of a launch from its runs on uniform chips at two or more distinct
    clocks (same kernel, grid and policies; one configuration each), by each CTA's slot occupancy
    (`"slot"` attribution); `slots_per_sm` is the most CTAs any run had resident on one SM.

    `split="cta"`: each CTA's own occupancy at each clock. Exact on every measured uniform chip,
    but a CTA's co-residents differ from run to run, so its times across clocks carry noise the
    clairvoyant schedule exploits on unequal SMs (a CTA "short" at one clock and long at the
    next). `split="kernel"` (default): every CTA keeps its share of the fastest run's total and
    the total follows the runs (each CTA's time at a measured clock is its time in the fastest
    run times the ratio of the two runs' total occupancies).
    """
    check(split in SPLITS, "split", split, f"one of {SPLITS}")
    check(len(results) >= 2, "results", f"{len(results)} run(s)", "uniform runs at two or more clocks")
    measured = [_durations_ns(r, "slot") for r in results]
    check(all(d.shape[0] == 1 for d, _, _, _ in measured), "results", "a batched Result",
          "one configuration per run")
    valid = measured[0][1][0]
    for i, (_, v, _, _) in enumerate(measured[1:], 1):
        check(v.shape == (1, *valid.shape) and bool(np.all(v[0] == valid)), f"results[{i}]",
              f"grid of {int(v.sum())} CTAs", f"the same grid as results[0] ({int(valid.sum())} CTAs)")
    mhz = np.array([float(f[0, 0]) for _, _, f, _ in measured])
    check(len(np.unique(mhz)) == len(mhz), "results.tick_mhz", sorted(mhz.tolist()), "distinct clocks")
    order = np.argsort(-mhz)  # fastest first: ascending period
    ns = np.stack([np.where(valid, measured[i][0][0], 0.0) for i in order])  # [clock, grid]
    if split == "kernel":
        totals = ns.sum(axis=-1, keepdims=True)
        ns = ns[:1] * totals / np.maximum(totals[:1], 1e-30)
    shape = np.shape(results[0].cta_sm)
    return WorkTable(period_ns=jnp.asarray(1000.0 / mhz[order], jnp.float32),
                     ns=jnp.asarray(ns.reshape(len(order), *shape), jnp.float32),
                     valid=jnp.asarray(valid.reshape(shape)),
                     slots_per_sm=max(slots for _, _, _, slots in measured))


class UniformChip(eqx.Module):
    """A launch's makespan on a uniform chip at clock `f` MHz: `cycles * 1000 / f + ns`."""

    cycles: Float[Array, "*batch"]
    ns: Float[Array, "*batch"]

    def makespan_ns(self, mean_mhz: Float[Array, "*chips"] | ArrayLike) -> Float[Array, "*chips"]:
        """The makespan at each of `mean_mhz` (ns)."""
        return self.cycles * 1000.0 / jnp.asarray(mean_mhz, jnp.float32) + self.ns


def uniform_chip(result_a: Result, result_b: Result) -> UniformChip:
    """The uniform chip's makespan against its clock, from two runs of one launch on uniform
    chips at different clocks (exact at both; between them, exact where the schedule does not
    change with the clock, as for compute-bound kernels)."""
    (d_a, _, f_a, _), (d_b, _, f_b, _) = (_durations_ns(r, "slot") for r in (result_a, result_b))
    t_a, t_b = (np.asarray(r.makespan_ns, np.float64) for r in (result_a, result_b))
    f_a, f_b = f_a[..., 0].reshape(t_a.shape), f_b[..., 0].reshape(t_b.shape)
    check(bool(np.all(f_a != f_b)), "result_b.tick_mhz", float(np.ravel(f_b)[0]),
          "a clock different from result_a's, to separate cycles from nanoseconds")
    cycles = np.clip((t_a - t_b) / (1000.0 / f_a - 1000.0 / f_b), 0.0, t_a * f_a / 1000.0)
    return UniformChip(cycles=jnp.asarray(cycles, jnp.float32),
                       ns=jnp.asarray(t_a - cycles * 1000.0 / f_a, jnp.float32))


def recovered(hardware_ns: ArrayLike, policy_ns: ArrayLike, reference_ns: ArrayLike) -> np.ndarray:
    """The share of hardware dispatch's loss against `reference_ns` that a policy wins back:
    `(T_hardware - T_policy) / (T_hardware - T_reference)` (1: all of it, 0: none, negative:
    worse than hardware dispatch); NaN where hardware dispatch is not above the reference."""
    hw, policy, ref = (np.asarray(x, np.float64) for x in (hardware_ns, policy_ns, reference_ns))
    loss = hw - ref
    return np.where(loss > 0, (hw - policy) / np.where(loss > 0, loss, 1.0), np.nan)


# ----------------------------------------------------------------------------- the bounds


def _cta_ns(work: AnyWork, sm_freq_mhz: Float[Array, " sm"]) -> Float[Array, "grid sm"]:
    """`a_cs`: the time of CTA c in a slot of SM s (inf on floorswept SMs, f = 0)."""
    f = sm_freq_mhz.astype(jnp.float32)
    period = 1000.0 / jnp.where(f > 0, f, 1.0)
    if isinstance(work, WorkTable):
        p = work.period_ns
        k = jnp.clip(jnp.searchsorted(p, period) - 1, 0, p.shape[0] - 2)  # each SM's segment
        lo, hi = work.ns[k], work.ns[k + 1]  # [sm, grid]
        on_sm = jnp.maximum(lo + (hi - lo) * ((period - p[k]) / (p[k + 1] - p[k]))[:, None], 0.0).T
    else:
        on_sm = work.cycles[:, None] * period[None, :] + work.ns[:, None]
    return jnp.where(f[None, :] > 0, on_sm, jnp.inf)


def _launch_tick_ns(sm_freq_mhz: Float[Array, " sm"]) -> Float[Array, ""]:
    return 1000.0 / jnp.max(sm_freq_mhz).astype(jnp.float32)


def _plus_latency(work: AnyWork, launch_ns: Float[Array, ""] | float) -> AnyWork:
    """The work with every CTA's clock-independent part lengthened by the slot's launch latency."""
    return eqx.tree_at(lambda w: w.ns, work, jnp.where(work.valid, work.ns + launch_ns, 0.0))


@jax.jit
def fluid_ns(work: AnyWork, sm_freq_mhz: Float[Array, " sm"],
             launch_ns: Float[Array, ""] | float = 0.0) -> Float[Array, ""]:
    """Fluid lower bound (ns): max(LP-relaxation bound, longest CTA on the fastest SM) + launch tick.

    LP: `min T` with `sum_s x_cs = 1` over the slots and `sum_c x_cs a_cs <= T` per slot. Any
    slot weights `v >= 0` summing to 1 give `T >= sum_c min_s v_s a_cs` (weak duality). With
    `v_s` proportional to the slot's effective speed `1 / sum_c a_cs` (for `Work`,
    `1 / (1000 C / f_s + N)`, `C`, `N`: total cycles and ns) the bound is exactly total work
    over total speed whenever every CTA has the same `ns / cycles` ratio (in particular `ns =
    0`: `1000 C / (slots_per_sm sum_s f_s)`), and a valid lower bound of the model always.
    With a launch latency `L` it is the larger of the bound on the work `a + L` lowered by `L`
    (module doc) and the bound without latency (both valid; the weights differ, so either may
    be the tighter).
    """
    f = jnp.asarray(sm_freq_mhz).astype(jnp.float32)
    with_latency = _fluid_core(_plus_latency(work, launch_ns), f) - launch_ns
    return jnp.maximum(with_latency, _fluid_core(work, f)) + _launch_tick_ns(f)


def _fluid_core(work: AnyWork, f: Float[Array, " sm"]) -> Float[Array, ""]:
    """max(LP-relaxation bound, longest CTA on the fastest SM), without the launch tick."""
    enabled = f > 0
    a = _cta_ns(work, f)
    total_ns = jnp.sum(jnp.where(work.valid[:, None], a, 0.0), axis=0)  # the grid on one slot of each SM
    speed = jnp.where(enabled, 1.0 / jnp.where(enabled & (total_ns > 0), total_ns, 1.0), 0.0)
    weighted = jnp.min(jnp.where(enabled[None, :], speed[None, :] * a, jnp.inf), axis=1)
    lp_ns = jnp.sum(jnp.where(work.valid, weighted, 0.0)) / (work.slots_per_sm * jnp.sum(speed))
    longest_ns = jnp.max(jnp.where(work.valid, jnp.min(a, axis=1), 0.0))
    return jnp.maximum(lp_ns, longest_ns)


def _longest_first(work: AnyWork, sm_freq_mhz: Float[Array, " sm"]) -> AnyWork:
    """The CTAs sorted by their time on the fastest SM, longest first (padding last, stable)."""
    key = jnp.where(work.valid, jnp.min(_cta_ns(work, sm_freq_mhz), axis=1), -jnp.inf)
    order = jnp.argsort(-key, stable=True)
    if isinstance(work, WorkTable):
        return WorkTable(period_ns=work.period_ns, ns=work.ns[:, order], valid=work.valid[order],
                         slots_per_sm=work.slots_per_sm)
    return jax.tree.map(lambda x: x[order], work)


@functools.partial(jax.jit, static_argnames=("longest_first",))
def clairvoyant_ns(work: AnyWork, sm_freq_mhz: Float[Array, " sm"], launch_ns: Float[Array, ""] | float = 0.0, *,
                   longest_first: bool = False) -> Float[Array, ""]:
    """Makespan (ns) of the clairvoyant earliest-finish list schedule, plus the launch tick; a
    slot takes its next CTA `launch_ns` after its last one ended.

    CTAs go one by one (grid order, or longest first) to the slot where they finish first; ties
    go to the faster SM, then to the lower SM and slot index, so the result does not depend on
    how the SMs are numbered.
    """
    f = jnp.asarray(sm_freq_mhz).astype(jnp.float32)
    work = _plus_latency(work, launch_ns)
    if longest_first:
        work = _longest_first(work, f)
    k = work.slots_per_sm
    usable = jnp.repeat(f > 0, k)
    slot_mhz = jnp.repeat(f, k)

    def place(free_ns: Float[Array, " slot"], cta) -> tuple[Float[Array, " slot"], None]:
        a_c, valid = cta
        finish = jnp.where(usable, free_ns + jnp.repeat(a_c, k), jnp.inf)
        first = finish == jnp.min(finish)
        slot = jnp.argmax(jnp.where(first, slot_mhz, -1.0))
        return jnp.where(valid, free_ns.at[slot].set(finish[slot]), free_ns), None

    free_ns, _ = jax.lax.scan(place, jnp.zeros(usable.shape, jnp.float32), (_cta_ns(work, f), work.valid))
    return jnp.max(jnp.where(usable, free_ns, 0.0)) - launch_ns + _launch_tick_ns(f)


def bounds(work: AnyWork, sm_freq_mhz: Float[Array, " sm"] | ArrayLike,
           launch_ns: Float[Array, ""] | float = 0.0) -> Bounds:
    """The fluid bound and both clairvoyant schedules of one launch (`jax.vmap` it for many).

    `sm_freq_mhz`: one clock per SM slot, 0 on floorswept SMs (`Clocks.sm_freq_mhz`);
    `launch_ns`: the CTA launch latency of a freed slot (`Arch.cta_launch_ns`; 0: none).
    """
    f = jnp.asarray(sm_freq_mhz)
    if not isinstance(f, jax.core.Tracer):
        check(f.ndim == 1 and bool(jnp.all(f >= 0)) and bool(jnp.any(f > 0)), "sm_freq_mhz",
              f"shape {f.shape}, min {float(jnp.min(f)) if f.size else 'none'}",
              "one clock >= 0 MHz per SM slot, at least one SM running")
    return Bounds(
        fluid_ns=fluid_ns(work, f, launch_ns),
        clairvoyant_ns=clairvoyant_ns(work, f, launch_ns),
        clairvoyant_lpt_ns=clairvoyant_ns(work, f, launch_ns, longest_first=True),
    )


def gaps(makespan_ns: Float[Array, "*batch"] | ArrayLike, reference: Bounds) -> Bounds:
    """Relative gaps `makespan / bound - 1` to each bound (broadcasting, e.g. over policies)."""
    return jax.tree.map(lambda b: jnp.asarray(makespan_ns) / b - 1.0, reference)
