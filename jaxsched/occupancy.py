"""Occupancy exactly as CUDA computes it (`cudaOccMaxActiveBlocksPerMultiprocessor`).

Follows the CUDA toolkit's `cuda_occupancy.h` rule by rule (docs/model.md, "Occupancy"):
register allocation per warp rounded to the allocation unit and the per-sub-partition register
file; the warp-slot limit; the block-slot limit; shared memory rounded to its allocation
granularity, plus the driver's reserved bytes per block, against the SM size the carveout picks;
and from CC 9.0 on the CTA-barrier limit. The launch is treated as `cudaFuncAttributes` would
describe it: the function opted in to exactly the dynamic shared memory it asks for
(`cudaFuncSetAttribute(MaxDynamicSharedMemorySize)`), and it uses one block barrier.

All functions broadcast over their numeric arguments and work under `jit` and `vmap`. They run
in numpy when every input is a concrete number (an `ArchValues` or a concrete `Arch`: the
command line answers without starting JAX) and in `jax.numpy` otherwise, by the same rules.
Concrete inputs are validated first: values that CUDA would refuse to launch raise
`JaxschedError`; under tracing they yield 0 blocks, as CUDA's calculator does.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from .errors import INT32_MAX, INT32_MIN, JaxschedError, is_traced

if TYPE_CHECKING:
    from jaxtyping import Array, ArrayLike, Float, Int

    from .arch import Arch
    from .archvalues import ArchValues

# cuda_occupancy.h uses INT_MAX for "this resource sets no limit".
NO_LIMIT = np.iinfo(np.int32).max
CARVEOUT_DEFAULT = -1  # SHAREDMEM_CARVEOUT_DEFAULT: prefer the largest shared size
# CTAs of different shapes on one SM (docs/model.md section 13): a warp holds 1 / n of its
# sub-partition's register file when n warps of its kind fit there, in units of REG_SHARE_ONE
# per sub-partition (floor(2^20 / n)), so that one shape alone fits exactly as many CTAs as
# the register limit above says (n <= 64 warps: the rounding never admits one more).
REG_SHARE_ONE = 1 << 20


class Limiter(enum.IntFlag):
    """The limiting-factor bits of `cudaOccResult.limitingFactors`."""

    WARPS = 0x01
    REGISTERS = 0x02
    SHARED_MEMORY = 0x04
    BLOCKS = 0x08
    BARRIERS = 0x10


class Occupancy(NamedTuple):
    """Everything NVIDIA's occupancy calculator shows, broadcast to the inputs' shape (a pytree:
    a named tuple)."""

    blocks_per_sm: Int[Array, "..."]
    limit_warps: Int[Array, "..."]
    limit_registers: Int[Array, "..."]
    limit_shared_memory: Int[Array, "..."]
    limit_blocks: Int[Array, "..."]
    limit_barriers: Int[Array, "..."]
    limiting_factors: Int[Array, "..."]  # bit set of `Limiter`
    warps_per_block: Int[Array, "..."]
    active_warps: Int[Array, "..."]
    occupancy: Float[Array, "..."]  # active warps / max warps per SM, in [0, 1]
    regs_per_block_allocated: Int[Array, "..."]
    smem_per_block_allocated_bytes: Int[Array, "..."]
    smem_per_sm_bytes: Int[Array, "..."]  # shared memory size the carveout gives the SM

    def limiters(self) -> list[str]:
        """Names of the limiting factors (scalar results only)."""
        bits = int(self.limiting_factors)
        return [f.name.lower() for f in Limiter if bits & f]


def _ceil_div(x: Array, y: Array) -> Array:
    return (x + y - 1) // y


def _round_up(x: Array, y: Array) -> Array:
    return _ceil_div(x, y) * y


def _align_up_carveout(xp: Any, arch: Arch | ArchValues, size_bytes: Array) -> Array:
    """Smallest supported SM shared-memory size >= size (cudaOccAlignUpShmemSizeVoltaPlus)."""
    sizes = arch.smem_carveout_kib * 1024
    fits = sizes >= size_bytes[..., None]
    return xp.min(xp.where(fits, sizes, NO_LIMIT), axis=-1)


_ARCH_NUMBERS = ("max_threads_per_block", "max_threads_per_sm", "max_blocks_per_sm", "regs_per_sm", "regs_per_block",
                 "max_regs_per_thread", "reg_alloc_unit", "smem_per_sm_bytes", "smem_per_block_bytes",
                 "smem_per_block_optin_bytes", "reserved_smem_per_block_bytes", "smem_alloc_unit_bytes",
                 "smem_carveout_kib", "barriers_per_block_slot")


def _array_module(arch: Arch | ArchValues, inputs: tuple) -> Any:
    """numpy when the architecture's numbers and every input are concrete numpy or Python values,
    else `jax.numpy` (traced, or JAX arrays)."""
    values = (*inputs, *(getattr(arch, f) for f in _ARCH_NUMBERS))
    if all(isinstance(x, (np.ndarray, np.generic, int, float)) for x in values):
        return np
    import jax.numpy as jnp

    return jnp


def occupancy(
    arch: Arch | ArchValues,
    threads_per_block: ArrayLike,
    regs_per_thread: ArrayLike,
    dynamic_smem_bytes: ArrayLike,
    static_smem_bytes: ArrayLike = 0,
    *,
    carveout_percent: ArrayLike = CARVEOUT_DEFAULT,
    block_barriers: ArrayLike = 1,
) -> Occupancy:
    """Blocks per SM, every limit and the limiting factors, as `cudaOccMaxActiveBlocksPerMultiprocessor`.

    `carveout_percent` is `cudaFuncAttributePreferredSharedMemoryCarveout` (-1: default, else
    0..100). `block_barriers` is the number of named CTA barriers the kernel uses (CC >= 9).
    """
    inputs = (threads_per_block, regs_per_thread, dynamic_smem_bytes, static_smem_bytes,
              carveout_percent, block_barriers)
    if not any(is_traced(x) for x in inputs):
        check_launch(arch, *inputs)
    xp = _array_module(arch, inputs)
    threads, regs, dyn, static, carve, bars = xp.broadcast_arrays(
        *(xp.asarray(x, dtype=xp.int32) for x in inputs)
    )
    sub = arch.schedulers_per_sm
    warps = _ceil_div(threads, arch.warp_size)
    valid_block = (threads > 0) & (threads <= arch.max_threads_per_block)

    # Registers: allocated per warp, per sub-partition (cudaOccMaxBlocksPerSMRegsLimit).
    regs_per_warp = _round_up(regs * arch.warp_size, arch.reg_alloc_unit)
    regs_per_cta = regs_per_warp * warps
    regs_assumed = regs_per_warp * _round_up(warps, sub)  # hardware check: all partitions
    reg_infeasible = (
        (arch.regs_per_block < regs_assumed)
        | (arch.regs_per_block < regs_per_cta)
        | (regs > arch.max_regs_per_thread)
    )
    warps_per_sub = (arch.regs_per_sm // sub) // xp.maximum(regs_per_warp, 1)
    limit_regs = xp.where(
        reg_infeasible,
        0,
        xp.where(regs_per_warp > 0, warps_per_sub * sub // xp.maximum(warps, 1), NO_LIMIT),
    )

    # Warp slots (cudaOccMaxBlocksPerSMWarpsLimit).
    max_warps = arch.max_threads_per_sm // arch.warp_size
    limit_warps = xp.where(valid_block, max_warps // xp.maximum(warps, 1), 0)

    # Block slots (cudaOccMaxBlocksPerMultiprocessor).
    limit_blocks = xp.broadcast_to(arch.max_blocks_per_sm, threads.shape)

    # Shared memory (cudaOccMaxBlocksPerSMSmemLimit, cudaOccSMemPerBlock, carveout preference).
    static_total = static + arch.reserved_smem_per_block_bytes
    smem_alloc = _round_up(static_total + dyn, arch.smem_alloc_unit_bytes)
    per_block_limit = (
        xp.where(
            static_total + dyn > arch.smem_per_block_bytes,
            arch.smem_per_block_optin_bytes,
            arch.smem_per_block_bytes,
        )
        + arch.reserved_smem_per_block_bytes
    )
    preference = xp.where(
        carve == CARVEOUT_DEFAULT,
        arch.smem_per_sm_bytes,
        _align_up_carveout(xp, arch, carve * arch.smem_per_sm_bytes // 100),
    )
    smem_sm = xp.where(preference >= smem_alloc, preference, _align_up_carveout(xp, arch, smem_alloc))
    limit_smem = xp.where(
        smem_alloc > per_block_limit,
        0,
        xp.where(smem_alloc > 0, smem_sm // xp.maximum(smem_alloc, 1), NO_LIMIT),
    )

    limit = xp.minimum(xp.minimum(limit_regs, limit_smem), xp.minimum(limit_warps, limit_blocks))
    factors = (
        xp.where(limit == limit_warps, int(Limiter.WARPS), 0)
        | xp.where(limit == limit_regs, int(Limiter.REGISTERS), 0)
        | xp.where(limit == limit_smem, int(Limiter.SHARED_MEMORY), 0)
        | xp.where(limit == limit_blocks, int(Limiter.BLOCKS), 0)
    )
    # From Hopper on, named CTA barriers are a per-SM resource too (cudaOccMaxBlocksPerSMBlockBarrierLimit).
    if arch.compute_capability[0] >= 9:
        uses_bars = bars > 0
        limit_bars = xp.where(
            uses_bars, arch.barriers_per_block_slot * arch.max_blocks_per_sm // xp.maximum(bars, 1),
            NO_LIMIT,
        )
        limit = xp.minimum(limit, limit_bars)
        factors = factors | xp.where(uses_bars & (limit == limit_bars), int(Limiter.BARRIERS), 0)
    else:
        limit_bars = xp.full(threads.shape, NO_LIMIT, dtype=xp.int32)
    # Inputs CUDA's calculator rejects (it returns an error) give 0 blocks under tracing.
    accepted = (threads > 0) & ((carve == CARVEOUT_DEFAULT) | ((carve >= 0) & (carve <= 100)))
    limit = xp.where(accepted & (bars >= 0) & (bars <= 16), limit, 0)

    active_warps = limit * warps
    occ = Occupancy(
        blocks_per_sm=limit,
        limit_warps=limit_warps,
        limit_registers=limit_regs,
        limit_shared_memory=limit_smem,
        limit_blocks=limit_blocks,
        limit_barriers=limit_bars,
        limiting_factors=factors,
        warps_per_block=warps,
        active_warps=active_warps,
        occupancy=active_warps.astype(xp.float32) / max_warps.astype(xp.float32),
        regs_per_block_allocated=regs_per_cta,
        smem_per_block_allocated_bytes=smem_alloc,
        smem_per_sm_bytes=smem_sm,
    )
    if xp is np:  # numpy's Python-int results are int64: the dtypes JAX gives
        return Occupancy(*(np.asarray(v, np.float32 if k == "occupancy" else np.int32) for k, v in occ._asdict().items()))
    return occ


def max_active_blocks(
    arch: Arch | ArchValues,
    threads_per_block: ArrayLike,
    regs_per_thread: ArrayLike,
    dynamic_smem_bytes: ArrayLike,
    static_smem_bytes: ArrayLike = 0,
) -> Int[Array, "..."]:
    """Resident blocks per SM (`cudaOccupancyMaxActiveBlocksPerMultiprocessor`), broadcast."""
    return occupancy(
        arch, threads_per_block, regs_per_thread, dynamic_smem_bytes, static_smem_bytes
    ).blocks_per_sm


def check_launch(
    arch: Arch | ArchValues,
    threads_per_block: ArrayLike,
    regs_per_thread: ArrayLike,
    dynamic_smem_bytes: ArrayLike,
    static_smem_bytes: ArrayLike = 0,
    carveout_percent: ArrayLike = CARVEOUT_DEFAULT,
    block_barriers: ArrayLike = 1,
) -> None:
    """Raise `JaxschedError` for a launch CUDA would refuse (field, value and limit named).

    Arrays are checked element-wise; the first bad element is reported with its index.
    """
    static_limit = int(arch.smem_per_block_bytes)
    optin = int(arch.smem_per_block_optin_bytes)
    reserved = int(arch.reserved_smem_per_block_bytes)
    unit = int(arch.smem_alloc_unit_bytes)
    t, r, d, s, c, b = np.broadcast_arrays(
        *(np.asarray(x) for x in (threads_per_block, regs_per_thread, dynamic_smem_bytes,
                                  static_smem_bytes, carveout_percent, block_barriers))
    )
    for name, arr in (("threads_per_block", t), ("regs_per_thread", r),
                      ("dynamic_smem_bytes", d), ("static_smem_bytes", s),
                      ("carveout_percent", c), ("block_barriers", b)):
        if arr.dtype == object or arr.dtype.kind not in "iuf":
            raise JaxschedError(name, arr.tolist() if arr.ndim == 0 else f"dtype {arr.dtype}",
                                "an integer in -2^31 .. 2^31 - 1")
        if np.any((arr < INT32_MIN) | (arr > INT32_MAX)):
            raise JaxschedError(name, _first(arr, (arr < INT32_MIN) | (arr > INT32_MAX)),
                                "an integer in -2^31 .. 2^31 - 1")
        if not np.issubdtype(arr.dtype, np.integer):
            if not np.all(np.equal(np.mod(arr, 1), 0)):
                raise JaxschedError(name, _first(arr, ~np.equal(np.mod(arr, 1), 0)), "must be an integer")
    smem_alloc = -(-(s.astype(np.int64) + d + reserved) // unit) * unit
    rules = (
        ("threads_per_block", t, t < 1, "must be at least 1"),
        ("threads_per_block", t, t > int(arch.max_threads_per_block),
         f"exceeds maxThreadsPerBlock = {int(arch.max_threads_per_block)} on {arch.name}"),
        ("regs_per_thread", r, r < 0, "must be >= 0"),
        ("regs_per_thread", r, r > int(arch.max_regs_per_thread),
         f"exceeds the per-thread register limit {int(arch.max_regs_per_thread)}"),
        ("dynamic_smem_bytes", d, d < 0, "must be >= 0"),
        ("static_smem_bytes", s, s < 0, "must be >= 0"),
        ("static_smem_bytes", s, s > static_limit,
         f"static shared memory is limited to {static_limit} B; use dynamic shared memory"),
        ("dynamic_smem_bytes", d, smem_alloc > optin + reserved,
         f"static + dynamic shared memory exceeds sharedMemPerBlockOptin = {optin} B on {arch.name}"),
        ("carveout_percent", c, (c != CARVEOUT_DEFAULT) & ((c < 0) | (c > 100)),
         "must be -1 (default) or 0..100"),
        ("block_barriers", b, (b < 0) | (b > 16), "must be between 0 and 16"),
    )
    for name, arr, bad, limit in rules:
        if np.any(bad):
            raise JaxschedError(name, _first(arr, bad), limit)


def _first(arr: np.ndarray, bad: np.ndarray) -> object:
    """The first offending value, with its index when the input is an array."""
    idx = tuple(int(i) for i in np.argwhere(bad)[0])
    value = arr[idx].item()
    return value if arr.ndim == 0 else f"{value} (at index {idx})"
