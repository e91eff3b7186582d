"""`Arch`: what one GPU is, as a pytree of traced numbers.

Everything a user may sweep (limits, latencies, clocks, the SM hierarchy's masks and positions)
is an array leaf, so one compiled simulation serves many architectures; only what fixes array
shapes or names is static (the number of SM slots, schedulers per SM, warp size, the name).

SM arrays have one entry per SM *slot* of the full die: the enabled SMs first, in `%smid` order
(slot i is `%smid` i), then the floorswept ones. Masking an SM off (`sm_enabled`) is how a sweep
varies the SM count without changing shapes.
"""

from __future__ import annotations

import dataclasses

import equinox as eqx
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from .archvalues import cast, validate


def _is_concrete(x: object) -> bool:
    return isinstance(x, (np.ndarray, np.generic, int, float, bool))


class Arch(eqx.Module):
    """One GPU: SM hierarchy and floorplan, per-SM limits, pipes, memory, clocks.

    Units are in the names. Scalars are 0-d arrays (a leading batch axis when stacked).
    """

    name: str = eqx.field(static=True)
    compute_capability: tuple[int, int] = eqx.field(static=True)
    schedulers_per_sm: int = eqx.field(static=True)  # warp schedulers = register sub-partitions
    warp_size: int = eqx.field(static=True)

    # --- SM hierarchy and floorplan (one entry per SM slot) ---
    sm_enabled: Bool[Array, " sm"]
    sm_gpc: Int[Array, " sm"]
    sm_tpc: Int[Array, " sm"]  # global TPC index; the two SMs of a TPC share it
    sm_xy_mm: Float[Array, "sm 2"]  # centre of the SM on the die, millimetres
    dispatch_order: Int[Array, " sm"]  # the GigaThread engine's fixed SM order (a permutation)
    die_mm: Float[Array, "2"]

    # --- per-SM limits (cuda_occupancy.h, CUDA programming guide) ---
    max_threads_per_block: Int[Array, ""]
    max_threads_per_sm: Int[Array, ""]
    max_blocks_per_sm: Int[Array, ""]
    regs_per_sm: Int[Array, ""]
    regs_per_block: Int[Array, ""]
    max_regs_per_thread: Int[Array, ""]
    reg_alloc_unit: Int[Array, ""]  # registers per warp are rounded up to this
    smem_per_sm_bytes: Int[Array, ""]
    smem_per_block_bytes: Int[Array, ""]  # default per-block limit (48 KiB)
    smem_per_block_optin_bytes: Int[Array, ""]
    reserved_smem_per_block_bytes: Int[Array, ""]
    smem_alloc_unit_bytes: Int[Array, ""]
    smem_carveout_kib: Int[Array, " carveout"]  # supported SM shared sizes, ascending, padded
    barriers_per_block_slot: Int[Array, ""]  # CTA barriers per SM = this x max_blocks_per_sm

    # --- issue and pipes, indexed by `isa.Op` ---
    issue_width: Int[Array, ""]  # instructions per scheduler per cycle
    latency_cycles: Int[Array, " op"]  # dependent-issue latency (LDG: L1 hit)
    issue_cycles: Float[Array, " op"]  # cycles the class's pipe is busy per warp instruction (1/64 steps)
    taken_branch_cycles: Int[Array, ""]  # a warp jumping back to its loop start waits this long (refetch)

    # --- memory (latencies of L2/DRAM are in the memory clock domain: nanoseconds) ---
    l2_hit_latency_ns: Float[Array, ""]
    dram_latency_ns: Float[Array, ""]
    l2_bytes_per_ns: Float[Array, ""]  # chip-wide L2 bandwidth
    dram_bytes_per_ns: Float[Array, ""]  # chip-wide DRAM bandwidth
    smem_bytes_per_cycle: Int[Array, ""]  # per SM
    mio_queue_depth: Int[Array, ""]  # MIO instructions in flight per scheduler before throttle

    # --- clocks and power ---
    base_clock_ghz: Float[Array, ""]
    boost_clock_ghz: Float[Array, ""]
    power_limit_w: Float[Array, ""]
    clock_step_mhz: Float[Array, ""]  # DVFS bin size

    # --- CTA dispatch ---
    cta_launch_ns: Float[Array, ""]  # a freed CTA slot takes this long to start its next CTA
    # starved scheduler-cycles an SM collects per refill of a used CTA slot (docs/model.md sections 7, 9)
    cta_launch_idle_cycles: Int[Array, ""]
    # kernel launches (docs/model.md section 13): the host's cudaLaunchKernel call, and the time
    # from a launch being allowed to start to its first CTA; the same for a CUDA graph's launch
    # call and per node
    launch_api_ns: Float[Array, ""]
    launch_gap_ns: Float[Array, ""]
    graph_api_ns: Float[Array, ""]
    graph_gap_ns: Float[Array, ""]

    def __check_init__(self) -> None:
        if not all(_is_concrete(leaf) for leaf in (self.sm_enabled, self.max_threads_per_sm)):
            return  # traced inside jit/vmap: checked when built
        validate(self)

    @property
    def n_sm_slots(self) -> int:
        """SM slots on the die, enabled or not (a static shape)."""
        return int(self.sm_enabled.shape[-1])

    @property
    def sm_count(self) -> int:
        """Enabled SMs (needs concrete arrays)."""
        return int(np.sum(self.sm_enabled))

    def replace(self, **changes: object) -> "Arch":
        """A copy with some fields changed (validated)."""
        return dataclasses.replace(self, **changes)


def make_arch(**fields: object) -> Arch:
    """Build an `Arch` from plain Python values, casting each leaf to its canonical dtype."""
    return Arch(**cast(fields))
