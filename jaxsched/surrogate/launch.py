"""What the surrogate runs on: per-CTA work measured by the exact engine, per-SM clocks and the
dispatcher's SM order, from the same architecture, kernel, clocks and policy inputs.

The work model is the one `jaxsched.bounds` defines: CTA `c` occupies a CTA slot of SM `s`
for `cycles_c * 1000 / f_s + ns_c` ns, both parts measured per CTA on a uniform chip at two
clocks (`measure_work`; `ns` may be negative here, see `work_from_runs`). The measured
occupancies carry the warp scheduler's effect on each CTA (GTO finishes co-resident CTAs
staggered), which is what lets a slot-level model track the cycle-level engine
(docs/surrogate.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Int

from .. import clocks as clocks_mod
from ..arch import Arch
from ..bounds import Work, work_from_uniform
from ..engine.run import Result, simulate_batch
from ..errors import check
from ..kernel import Kernel
from ..lower import DISPATCH_POLICIES, WARP_POLICIES, lower, policy_index
from ..policies import (DEFAULT_DISPATCH_START, DEFAULT_EMA_ALPHA, DEFAULT_EMA_PRIOR_NS, DEFAULT_HOLD_LEFT,
                        DEFAULT_HOLD_MARGIN, DEFAULT_HOLD_NOISE, DEFAULT_HOLD_QUEUE, DEFAULT_WARP_POLICY)
from ..occupancy import occupancy

WORK_CLOCKS = (1.0, 0.7)  # the two uniform clocks of `measure_work`, as fractions of boost


class SurrogateLaunch(eqx.Module):
    """One configuration for the surrogate (a leading batch axis on every leaf for vmap)."""

    work: Work
    sm_freq_mhz: Float[Array, "*b sm"]  # differentiable; 0 on floorswept SMs
    sm_enabled: Bool[Array, "*b sm"]
    dispatch_rank: Float[Array, "*b sm"]  # position in the rotated hardware order, 0 = first
    ctas_per_sm: Int[Array, "*b"]
    cta_launch_ns: Float[Array, "*b"]  # a freed slot starts its next CTA this much later


class DispatchParams(eqx.Module):
    """Tunable dispatch numbers (all differentiable): `weighted` scores `weight / (resident + 1)`
    (only ratios matter); `closed_loop` smooths with `ema_alpha` from `ema_prior_ns`, which may
    differ per SM (the engine takes one value for every SM), and holds a CTA in the tail for a
    slot expected to finish it earlier by `hold_margin` times its estimate plus `hold_noise` times
    its deviation, where the better slots, each counting 1 plus `hold_queue` per later CTA it
    would finish first, reach `hold_left` times the CTAs left."""

    weight: Float[Array, "*b sm"]
    ema_alpha: Float[Array, "*b"]
    ema_prior_ns: Float[Array, "*b sm"]
    hold_margin: Float[Array, "*b"]
    hold_noise: Float[Array, "*b"]
    hold_queue: Float[Array, "*b"]
    hold_left: Float[Array, "*b"]


def uniform_runs(arch: Arch, kernel: Kernel, warp_policy: str = DEFAULT_WARP_POLICY,
                dispatch_start: int = DEFAULT_DISPATCH_START) -> tuple[Result, Result]:
    """Two exact runs of `kernel` on a uniform chip, at boost and 0.7 x boost (the range of the
    clock maps studied), in one batched call: what the work models split into clock-scaled
    cycles and fixed nanoseconds."""
    boost = float(arch.boost_clock_ghz)
    clks = [clocks_mod.uniform(arch, boost * k) for k in WORK_CLOCKS]
    wp = policy_index(warp_policy, WARP_POLICIES, "warp_policy")
    both = simulate_batch([arch, arch], [kernel, kernel], clks, [wp, wp],
                          [DISPATCH_POLICIES.index("hardware")] * 2, [dispatch_start] * 2)
    first, second = (jax.tree.map(lambda x, i=i: x[i], both) for i in (0, 1))
    return first, second


def slot_occupancy_ticks(run: Result, launch_ns: float) -> np.ndarray:
    """Per CTA (grid order), the ticks it holds its CTA slot: from its start, or for a refill
    from the moment its slot became usable (the previous CTA's end plus the launch latency),
    to its end. A refill that waits longer (for launch credit, docs/model.md section 9) thus
    carries the wait, which no CTA's own start-to-end time shows. Refills are matched to the
    frees of their SM in time order; the sum of the waits on an SM does not depend on that
    matching. A CTA that finds no earlier free (a first fill) holds its slot from its start."""
    sm = np.asarray(run.cta_sm)
    start = np.asarray(run.cta_start_tick, np.float64)
    end = np.asarray(run.cta_end_tick, np.float64)
    launch_ticks = launch_ns * float(run.tick_mhz) / 1000.0
    held_from = start.copy()
    for s in np.unique(sm[sm >= 0]):
        mine = np.flatnonzero(sm == s)
        frees = np.sort(end[mine])
        n_free = 0
        for c in mine[np.argsort(start[mine], kind="stable")]:
            # frees at or before this start can have emptied its slot (with no launch latency a
            # slot freed in a tick takes its next CTA in the same tick's dispatch)
            available = np.searchsorted(frees, start[c], side="right")
            if n_free < available:
                held_from[c] = min(start[c], frees[n_free] + launch_ticks)
                n_free += 1
    return end - held_from


def work_from_runs(run_a: Result, run_b: Result, launch_ns: float) -> Work:
    """The surrogate's work model from two uniform runs at different clocks: per CTA, the slot
    occupancy `d = cycles * 1000 / f + ns` through both measurements (`bounds.work_from_uniform`
    with slot attribution and a per-CTA split, except that `ns` may be negative, and that a
    refill's occupancy includes any wait beyond the launch latency `launch_ns`:
    `slot_occupancy_ticks`).

    A freed slot idles for the launch latency while its SM's other CTAs run faster; the faster
    the clock, the larger that idle share and the shorter each CTA's occupancy, so occupancy
    grows faster than `1 / f`: a negative `ns` (about -0.7 x the latency measured on the H200
    preset). The fluid bound clips it at 0, which keeps the bound a bound; the surrogate keeps
    it, which halves its error on unequal clocks (docs/surrogate.md).
    """
    clipped = work_from_uniform(run_a, run_b)  # validates the runs, gives the mask and slots
    f_a, f_b = float(run_a.tick_mhz), float(run_b.tick_mhz)
    d_a, d_b = (slot_occupancy_ticks(r, launch_ns) * 1000.0 / f for r, f in ((run_a, f_a), (run_b, f_b)))
    cycles = (d_a - d_b) / (1000.0 / f_a - 1000.0 / f_b)
    valid = np.asarray(clipped.valid)
    as_f32 = lambda x: jnp.asarray(np.where(valid, x, 0.0), jnp.float32)
    return Work(cycles=as_f32(cycles), ns=as_f32(d_a - cycles * 1000.0 / f_a), valid=clipped.valid,
                slots_per_sm=clipped.slots_per_sm)


def measure_work(arch: Arch, kernel: Kernel, warp_policy: str = DEFAULT_WARP_POLICY,
                dispatch_start: int = DEFAULT_DISPATCH_START) -> Work:
    """Per-CTA slot work of `kernel` for the surrogate (`work_from_runs` of `uniform_runs`)."""
    return work_from_runs(*uniform_runs(arch, kernel, warp_policy, dispatch_start), float(arch.cta_launch_ns))


def stack_launches(launches: Sequence[SurrogateLaunch]) -> SurrogateLaunch:
    """Stack launches of one chip size for `vmap`, padding shorter grids with invalid CTAs (the
    slot array is as wide as the largest occupancy; `ctas_per_sm` stays per launch)."""
    grid = max(int(x.work.valid.shape[-1]) for x in launches)
    slots = max(x.work.slots_per_sm for x in launches)
    pad = lambda x: jnp.pad(x, (0, grid - x.shape[-1]))
    padded = [dataclasses.replace(x, work=Work(cycles=pad(x.work.cycles), ns=pad(x.work.ns), valid=pad(x.work.valid),
                                               slots_per_sm=slots)) for x in launches]
    return jax.tree.map(lambda *xs: jnp.stack(xs), *padded)


def make_launch(arch: Arch, kernel: Kernel, sm_freq_mhz: ArrayLike, work: Work,
                dispatch_start: int = DEFAULT_DISPATCH_START) -> SurrogateLaunch:
    """The surrogate's view of one launch (clocks as a float array, one per SM slot or one per
    enabled SM: `clocks.lengths_hint`)."""
    f = clocks_mod.per_slot(arch, np.asarray(sm_freq_mhz, np.float32), "sm_freq_mhz")
    enabled = np.asarray(arch.sm_enabled)
    check(bool(np.all(f[enabled] > 0)), "sm_freq_mhz", float(f[enabled].min()), "> 0 on every enabled SM")
    check(int(np.sum(np.asarray(work.valid))) == int(kernel.grid_ctas), "work",
          f"{int(np.sum(np.asarray(work.valid)))} CTAs", f"the kernel's grid ({int(kernel.grid_ctas)})")
    launch = lower(arch, kernel, clocks_mod.uniform(arch), 0, 0, dispatch_start)
    occ = occupancy(arch, kernel.threads_per_cta, kernel.regs_per_thread, kernel.dynamic_smem_bytes,
                    kernel.static_smem_bytes)
    return SurrogateLaunch(
        work=work,
        sm_freq_mhz=jnp.asarray(np.where(enabled, f, 0.0)),
        sm_enabled=jnp.asarray(enabled),
        dispatch_rank=jnp.asarray(np.asarray(launch.policy.dispatch_rank), jnp.float32),
        ctas_per_sm=jnp.asarray(int(occ.blocks_per_sm), jnp.int32),
        cta_launch_ns=jnp.asarray(arch.cta_launch_ns, jnp.float32),
    )


def replay_launch(arch: Arch, kernel: Kernel, sm_freq_mhz: ArrayLike, result: Result) -> SurrogateLaunch:
    """The launch of `result`, a run of `kernel` on `arch` at `sm_freq_mhz` (one configuration,
    no DVFS), with each CTA's work its own slot occupancy in that run (ns, on whatever SM takes
    it) and the launch latency in the run's whole ticks, in float64 (under `jax.enable_x64`):
    a replay. Its hard schedule under the run's policy makes the engine's decisions wherever the
    surrogate's rules are the engine's, so that the surrogate's error against the engine splits
    into its policy's and its work model's (docs/surrogate.md 2.1). The architecture needs the
    launch credit off (`cta_launch_idle_cycles = 0`): a refill's wait for it is no CTA's work."""
    check(int(arch.cta_launch_idle_cycles) == 0, "arch.cta_launch_idle_cycles", int(arch.cta_launch_idle_cycles),
          "0 for a replay (a refill's wait for launch credit is no CTA's work)")
    check(np.asarray(result.makespan_ticks).ndim == 0, "result", f"a batch {np.shape(result.makespan_ticks)}",
          "one configuration's result")
    tick_ns = 1000.0 / float(result.tick_mhz)
    ticks = np.asarray(result.cta_end_tick, np.float64) - np.asarray(result.cta_start_tick, np.float64)
    valid = np.asarray(result.cta_sm) >= 0
    work = Work(cycles=jnp.zeros(ticks.shape, jnp.float64), ns=jnp.asarray(np.where(valid, ticks * tick_ns, 0.0)),
                valid=jnp.asarray(valid), slots_per_sm=int(occupancy(arch, kernel.threads_per_cta,
                kernel.regs_per_thread, kernel.dynamic_smem_bytes, kernel.static_smem_bytes).blocks_per_sm))
    launch = make_launch(arch, kernel, sm_freq_mhz, work)
    launch_ticks = round(float(arch.cta_launch_ns) * float(result.tick_mhz) / 1000.0)  # as the lowering rounds
    as_f64 = lambda x: jnp.asarray(x, jnp.float64) if jnp.issubdtype(x.dtype, jnp.floating) else x  # noqa: E731
    return dataclasses.replace(jax.tree.map(as_f64, launch), cta_launch_ns=jnp.float64(launch_ticks * tick_ns))


def dispatch_params(arch: Arch, sm_freq_mhz: ArrayLike, dispatch_weight: ArrayLike | None = None,
                    ema_alpha: float = DEFAULT_EMA_ALPHA,
                    ema_prior_ns: ArrayLike = DEFAULT_EMA_PRIOR_NS,
                    hold_margin: float = DEFAULT_HOLD_MARGIN,
                    hold_noise: float = DEFAULT_HOLD_NOISE, hold_queue: float = DEFAULT_HOLD_QUEUE,
                    hold_left: float = DEFAULT_HOLD_LEFT) -> DispatchParams:
    """The engine's dispatch inputs as surrogate parameters (weights default to the clocks; per-SM
    arrays per SM slot or per enabled SM)."""
    f = clocks_mod.per_slot(arch, np.asarray(sm_freq_mhz, np.float32), "sm_freq_mhz")
    w = f if dispatch_weight is None else clocks_mod.per_slot(arch, np.asarray(dispatch_weight, np.float32),
                                                              "dispatch_weight")
    enabled = np.asarray(arch.sm_enabled)
    return DispatchParams(
        weight=jnp.asarray(np.where(enabled, np.maximum(w, 1.0), 1.0)),
        ema_alpha=jnp.asarray(ema_alpha, jnp.float32),
        ema_prior_ns=jnp.broadcast_to(jnp.asarray(ema_prior_ns, jnp.float32), f.shape),
        hold_margin=jnp.asarray(hold_margin, jnp.float32),
        hold_noise=jnp.asarray(hold_noise, jnp.float32),
        hold_queue=jnp.asarray(hold_queue, jnp.float32),
        hold_left=jnp.asarray(hold_left, jnp.float32),
    )
