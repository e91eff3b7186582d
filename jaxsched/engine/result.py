"""What a run returns (`Result`): makespan, per-SM counters, per-CTA and per-launch times, DVFS
outputs and clock traces, read from the engine's final state (`outputs`); docs/model.md
section 10."""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from ..arch import Arch
from ..lower import Shapes
from .power import final_outputs
from .state import STALL_REASONS, State
from .step import Run


class Result(eqx.Module):
    """Outputs of one configuration (or a batch: a leading axis on every field)."""

    makespan_ticks: Int[Array, ""]
    makespan_ns: Float[Array, ""]
    makespan_cycles: Float[Array, ""]  # cycles of the nominal (boost) clock
    tick_mhz: Int[Array, ""]
    completed: Bool[Array, ""]  # False if max_ticks ran out first
    ticks_stepped: Int[Array, ""]  # ticks the engine processed; the rest it skipped or fast-forwarded exactly
    sm_cycles: Int[Array, " sm"]
    sm_busy_cycles: Int[Array, " sm"]
    sm_issued: Int[Array, " sm"]
    sm_issued_op: Int[Array, "sm op"]  # by isa.Op class
    sm_active_lanes: Int[Array, " sm"]
    sm_warp_cycles: Int[Array, " sm"]
    sm_stalls: Int[Array, "sm reason"]
    sm_ctas: Int[Array, " sm"]
    sm_items: Int[Array, " sm"]  # work items taken (persistent kernels)
    cta_sm: Int[Array, " grid"]  # per CTA in global order g = cta_base[l] + c
    cta_start_tick: Int[Array, " grid"]
    cta_end_tick: Int[Array, " grid"]
    cta_kernel: Int[Array, " grid"]  # the launch of each CTA, -1 past the last
    # per launch (docs/model.md section 13; one entry for a plain kernel)
    kernel_ready_tick: Int[Array, " launch"]
    kernel_start_tick: Int[Array, " launch"]  # tick of its first CTA's dispatch
    kernel_end_tick: Int[Array, " launch"]  # tick its last CTA completed
    # DVFS (docs/model.md section 12; zeros and trace_tick -1 with DVFS off)
    sm_energy_pj: Int[Array, " sm"]
    sm_clock_end_mhz: Int[Array, " sm"]
    sm_temp_end_mk: Int[Array, " sm"]
    trace_tick: Int[Array, " row"]
    trace_mhz: Int[Array, "row sm"]
    trace_mw: Int[Array, "row sm"]
    trace_mk: Int[Array, "row sm"]
    max_warps_per_sm: int = eqx.field(static=True)

    stall_reasons = STALL_REASONS

    @property
    def ipc(self) -> np.ndarray:
        """Issued instructions per busy cycle, per SM."""
        return np.asarray(self.sm_issued) / np.maximum(np.asarray(self.sm_busy_cycles), 1)

    @property
    def achieved_occupancy(self) -> np.ndarray:
        """Mean resident warps per busy cycle over the SM's warp slots, per SM."""
        busy = np.maximum(np.asarray(self.sm_busy_cycles), 1)
        return np.asarray(self.sm_warp_cycles) / busy / self.max_warps_per_sm

    @property
    def simt_efficiency(self) -> np.ndarray:
        """Active lanes per issued instruction over 32 (whole kernel)."""
        issued = np.sum(np.asarray(self.sm_issued), axis=-1)
        return np.sum(np.asarray(self.sm_active_lanes), axis=-1) / np.maximum(32 * issued, 1)

    @property
    def sm_power_w(self) -> np.ndarray:
        """Mean power per SM over the makespan (DVFS on), W."""
        return np.asarray(self.sm_energy_pj) / np.asarray(self.makespan_ns)[..., None] * 1e-3

    @property
    def trace_us(self) -> np.ndarray:
        """Times of the clock-trace rows, microseconds (NaN where unused)."""
        t = np.asarray(self.trace_tick, dtype=np.float64)
        return np.where(t >= 0, t / np.asarray(self.tick_mhz)[..., None], np.nan)

    @property
    def cta_start_ns(self) -> np.ndarray:
        return np.asarray(self.cta_start_tick) * 1000.0 / np.asarray(self.tick_mhz)[..., None]

    @property
    def cta_end_ns(self) -> np.ndarray:
        return (np.asarray(self.cta_end_tick) + 1) * 1000.0 / np.asarray(self.tick_mhz)[..., None]

    @property
    def kernel_ready_ns(self) -> np.ndarray:
        """When each launch may start (the start of its ready tick), ns from the host's first call."""
        return np.asarray(self.kernel_ready_tick) * 1000.0 / np.asarray(self.tick_mhz)[..., None]

    @property
    def kernel_start_ns(self) -> np.ndarray:
        return np.asarray(self.kernel_start_tick) * 1000.0 / np.asarray(self.tick_mhz)[..., None]

    @property
    def kernel_end_ns(self) -> np.ndarray:
        """The end of each launch's last tick (the last launch's equals the makespan)."""
        return (np.asarray(self.kernel_end_tick) + 1) * 1000.0 / np.asarray(self.tick_mhz)[..., None]


def outputs(final: State, run: Run, arch: Arch, shapes: Shapes) -> Result:
    """The outputs of a run that ended in `final`."""
    launch, launches = run.launch, run.launches
    c = final.counters
    ticks = final.last_exit_tick + 1
    ns = ticks.astype(jnp.float64) * 1000.0 / launch.clocks.tick_mhz
    return Result(
        makespan_ticks=ticks,
        makespan_ns=ns,
        makespan_cycles=ticks.astype(jnp.float64) * jnp.round(arch.boost_clock_ghz * 1000.0).astype(jnp.float64)
        / launch.clocks.tick_mhz,
        tick_mhz=launch.clocks.tick_mhz,
        completed=final.ctas_done >= launch.program.n_ctas,
        ticks_stepped=final.steps,
        sm_cycles=c.sm_cycles,
        sm_busy_cycles=c.sm_busy_cycles,
        sm_issued=c.sm_issued,
        sm_issued_op=c.sm_issued_op.T,
        sm_active_lanes=c.sm_active_lanes,
        sm_warp_cycles=c.sm_warp_cycles,
        sm_stalls=c.sm_stalls.T,
        sm_ctas=c.sm_ctas,
        sm_items=c.sm_items,
        cta_sm=c.cta_sm,
        cta_start_tick=c.cta_start_tick,
        cta_end_tick=c.cta_end_tick,
        cta_kernel=launches.cta_launch,
        kernel_ready_tick=final.kernel_ready,
        kernel_start_tick=final.kernel_start,
        kernel_end_tick=final.kernel_end,
        **final_outputs(final, launch),
        max_warps_per_sm=shapes.warp_slots,
    )
