"""Lowering: (Arch, Kernel, Clocks, policies) -> `Launch`, the integers both engines run on.

Both the JAX engine and the plain reference consume a `Launch`, so unit conversions (ns to
ticks, bandwidth to fixed-point queue costs, occupancy) happen once, in one place, with one
rounding. Everything here is `jax.numpy` and traceable, so lowering runs inside `jit`/`vmap`
with the swept numbers traced. docs/model.md defines every formula.
"""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from .arch import Arch
from .archvalues import ISSUE_UNITS_PER_CYCLE
from .archvalues import validate as validate_arch
from .clocks import Clocks, lengths_hint, validate_clocks
from .dvfs import Dvfs, DvfsLaunch, lower_dvfs, off, tick_mhz as reachable_tick_mhz
from .errors import INT32_MAX, INT32_MIN, JaxschedError, check, check_floats, check_ints, check_values
from .isa import Op
from .kernel import WAIT_BITS, Kernel, data_rows, validate_kernel
from .occupancy import REG_SHARE_ONE, check_launch, occupancy
from .policies import (DEFAULT_EMA_ALPHA, DEFAULT_EMA_PRIOR_NS, DEFAULT_HOLD_LEFT, DEFAULT_HOLD_MARGIN,
                       DEFAULT_HOLD_NOISE, DEFAULT_HOLD_QUEUE, DISPATCH_POLICIES, MAX_HOLD_LEFT, MAX_HOLD_NOISE,
                       MAX_HOLD_QUEUE, WARP_POLICIES)

QUEUE_ONE_TICK = 1024  # memory-queue backlog is kept in 1/1024 of a tick
BRANCH_HASH_ONE = 1 << 24  # branch lane draws compare 24-bit hashes against p * 2^24


@dataclasses.dataclass(frozen=True)
class Shapes:
    """Static array sizes of one compiled simulation (a sweep pads every config to these)."""

    n_sm: int  # SM slots
    warp_slots: int  # warp slots per SM (max threads per SM / 32)
    cta_slots: int  # CTA slots per SM: the largest occupancy (CTAs per SM) of the batch
    schedulers: int
    n_instr: int
    max_ctas: int  # per-CTA trace length (all launches of a workload)
    # the engine's run-time guard on values that were traced when given (equinox.error_if); off
    # where every value was concrete, so checked where it was built: its host callbacks keep an
    # executable out of every compilation cache (compile_cache.py)
    guarded: bool = True
    trace_len: int = 0  # rows of the DVFS clock trace (section 12)
    n_launches: int = 1  # kernel launches of a workload (section 13)
    dvfs: bool = True  # False when every configuration has DVFS off: section 12's step is compiled out
    closed_loop: bool = True  # False when no configuration dispatches by the closed loop: its learning is compiled out
    fast_forward: bool = True  # jump whole periods of an SM's recurring state (docs/model.md section 11)
    free_sms: bool = True  # SMs may run on their own time between chip events (engine/decouple.py)
    data_rows: int = 1  # rows of each launch's data tables (kernel.data_rows: 1 without data)
    dep_slots: int = 1  # dependence slots per warp: the highest slot the batch's programs write, + 1
    loops: int = 1  # loop entries per program (structure.py; absent ones are -1)
    branches: int = 1  # if/else entries per program

    @property
    def warps_per_scheduler(self) -> int:
        return self.warp_slots // self.schedulers


class Clocking(eqx.Module):
    """The clocks in ticks: the tick rate, each SM's clock, DVFS (docs/model.md sections 2 and 12)."""

    tick_mhz: Int[Array, ""]  # the global tick rate: the fastest clock an enabled SM can reach
    sm_freq_mhz: Int[Array, " sm"]  # 0 for floorswept SMs
    dvfs: DvfsLaunch


class Chip(eqx.Module):
    """What the architecture fixes for every launch on it: the SMs that exist, the MIO queue and
    the CTA launch path (docs/model.md sections 7 and 9)."""

    sm_enabled: Bool[Array, " sm"]
    mio_depth: Int[Array, ""]
    cta_launch_ticks: Int[Array, ""]  # a freed CTA slot takes its next CTA this much later
    taken_branch_cycles: Int[Array, ""]  # a warp jumping back to its loop start waits this long
    launch_idle_cycles: Int[Array, ""]  # starved scheduler-cycles an SM collects per refill, 0: off


class Policy(eqx.Module):
    """The warp and dispatch policies and their parameters (docs/model.md sections 7 and 9)."""

    warp_policy: Int[Array, ""]
    dispatch_policy: Int[Array, ""]
    dispatch_rank: Int[Array, " sm"]  # position of each SM in the rotated dispatch order
    dispatch_weight: Int[Array, " sm"]  # weighted policy: integer weight per SM, 0 if floorswept
    ema_alpha_256: Int[Array, ""]  # closed-loop smoothing, 0..256
    ema_prior_ticks: Int[Array, ""]  # closed-loop initial estimate of a CTA's duration
    hold_margin_256: Int[Array, ""]  # closed-loop hold margin, a share of the estimate in 1/256, 0..256
    hold_noise_256: Int[Array, ""]  # closed-loop hold margin per unit of the deviation, in 1/256, 0..2048
    hold_queue_256: Int[Array, ""]  # closed-loop hold: weight of a better slot's later CTAs, in 1/256, 0..256
    hold_left_256: Int[Array, ""]  # closed-loop hold: weight of the CTAs left, in 1/256, 0..1024


class Program(eqx.Module):
    """One kernel on this chip: its grid and CTA shape, what one CTA holds of an SM, its
    instructions in engine units, its structure and variation (docs/model.md sections 3-8)."""

    n_ctas: Int[Array, ""]
    warps_per_cta: Int[Array, ""]
    lanes_last_warp: Int[Array, ""]
    ctas_per_sm: Int[Array, ""]
    # what one CTA holds of its SM while resident (mixed CTA shapes, docs/model.md section 13)
    warp_reg_share: Int[Array, ""]  # per warp, in REG_SHARE_ONE per sub-partition
    cta_smem_bytes: Int[Array, ""]  # allocated shared memory
    smem_per_sm_bytes: Int[Array, ""]  # the SM's shared-memory size (the carveout)
    # per instruction
    op: Int[Array, " instr"]
    waits: Int[Array, " instr"]  # dependence slots it waits for (bits per kind of result; a bare `dep`: every slot)
    writes: Int[Array, " instr"]  # dependence slots of its kind its result goes to (bits)
    lat_cycles: Int[Array, " instr"]
    issue_cost64: Int[Array, " instr"]  # pipe issue interval in 1/64 cycle
    mio_cost: Int[Array, " instr"]
    mem_lat_ticks: Int[Array, " instr"]
    l2_cost: Int[Array, " instr"]
    dram_cost: Int[Array, " instr"]
    grid_sync: Bool[Array, " instr"]
    # structure and variation (kernel.py, structure.py): per loop and per branch
    loop_start: Int[Array, " loop"]
    loop_end: Int[Array, " loop"]
    branch_start: Int[Array, " branch"]
    branch_mid: Int[Array, " branch"]
    branch_end: Int[Array, " branch"]
    branch_parent: Int[Array, " branch"]
    trips: Int[Array, " loop"]
    trips_cta_spread: Int[Array, " loop"]
    trips_warp_spread: Int[Array, " loop"]
    branch_threshold: Int[Array, " branch"]
    seed: Int[Array, ""]
    grid_sync_ticks: Int[Array, ""]
    work_items: Int[Array, ""]  # persistent kernel's queue length, 0: off
    trips_from_data: Bool[Array, " loop"]  # trip counts from `trips_data` (else the hashes, section 4)
    trips_data: Int[Array, "loop cta 32"]
    if_from_data: Bool[Array, " branch"]  # if-path lane masks from `if_data`
    if_data: Int[Array, "branch cta 32"]


class Launch(eqx.Module):
    """One configuration in the engines' integer units (docs/model.md, "Lowering"), in four
    parts: the clocks, the chip, the policies, and the program. A workload's launches share the
    first three and each has its own program (section 13)."""

    clocks: Clocking
    chip: Chip
    policy: Policy
    program: Program


def policy_index(name: str | int, known: tuple[str, ...], field: str) -> int:
    """The index of a policy given by name or index, checked against `known`."""
    if isinstance(name, (int, np.integer)):
        check(0 <= int(name) < len(known), field, name, f"one of {known} or 0..{len(known) - 1}")
        return int(name)
    check(name in known, field, name, f"one of {known}")
    return known.index(name)


def policy_indices(indices: np.ndarray, known: tuple[str, ...], field: str) -> np.ndarray:
    """`policy_index` for a batch's integer indices: every one checked against `known` (an
    index past them would run as some other policy), the bad ones named together."""
    bad = [int(p) for p in np.unique(indices) if not 0 <= p < len(known)]
    check(not bad, field, bad, f"indices 0..{len(known) - 1} into {known}")
    return indices


def shapes_for(arch: Arch, kernel: Kernel) -> Shapes:
    """Static sizes for one (concrete) arch and kernel."""
    return Shapes(
        n_sm=arch.n_sm_slots,
        warp_slots=int(arch.max_threads_per_sm) // arch.warp_size,
        cta_slots=cta_slots_for(arch, kernel),
        schedulers=arch.schedulers_per_sm,
        n_instr=kernel.n_instr,
        max_ctas=int(kernel.grid_ctas),
        data_rows=data_rows(kernel),
        dep_slots=dep_slots(kernel),
        loops=int(np.shape(kernel.loop_start)[-1]),
        branches=int(np.shape(kernel.branch_start)[-1]),
    )


def dep_slots(kernel: Kernel) -> int:
    """Dependence slots a (concrete) kernel's warps need: its highest slot written, + 1."""
    return max(1, int(np.max(np.asarray(kernel.writes), initial=0)).bit_length())


def cta_slots_for(arch: Arch, kernel: Kernel) -> int:
    """CTA slots per SM that a (concrete) kernel needs: its occupancy, at least 1. Slots at or
    beyond `ctas_per_sm` never hold a CTA, so sizing the per-slot arrays by the occupancy rather
    than the architecture's maximum (32 on Hopper) changes no result, and makes every per-slot
    array and each iteration of the dispatch loop that much smaller."""
    occ = occupancy(arch, kernel.threads_per_cta, kernel.regs_per_thread, kernel.dynamic_smem_bytes,
                    kernel.static_smem_bytes)
    return max(1, int(occ.blocks_per_sm))


def validate(arch: Arch, kernel: Kernel, clocks: Clocks) -> None:
    """Raise `JaxschedError` for a configuration that cannot run (concrete inputs only). Every
    field is checked again here, where a configuration enters the engine: a value set with
    `eqx.tree_at` (which skips the modules' own checks) is caught too."""
    check(isinstance(arch, Arch), "arch", type(arch).__name__, "a jaxsched.Arch")
    check(isinstance(kernel, Kernel), "kernel", type(kernel).__name__, "a jaxsched.Kernel")
    check(isinstance(clocks, Clocks), "clocks", type(clocks).__name__, "a jaxsched.Clocks")
    validate_arch(arch)
    validate_clocks(arch, clocks)
    validate_launch(arch, kernel)


def validate_launch(arch: Arch, kernel: Kernel) -> None:
    """Raise `JaxschedError` for a kernel that cannot launch on `arch` (concrete inputs, `arch`
    already checked): its own fields, its CTA's resources, its barriers and its grid."""
    check(isinstance(kernel, Kernel), "kernel", type(kernel).__name__, "a jaxsched.Kernel")
    validate_kernel(kernel)
    check_launch(arch, kernel.threads_per_cta, kernel.regs_per_thread,
                 kernel.dynamic_smem_bytes, kernel.static_smem_bytes)
    occ = occupancy(arch, kernel.threads_per_cta, kernel.regs_per_thread,
                    kernel.dynamic_smem_bytes, kernel.static_smem_bytes)
    if int(occ.blocks_per_sm) == 0:
        raise JaxschedError(
            "kernel", f"{int(kernel.threads_per_cta)} threads x {int(kernel.regs_per_thread)} registers",
            f"too many resources requested for launch: a CTA fits on no SM of {arch.name} "
            f"(limited by {', '.join(occ.limiters())}; {int(occ.regs_per_block_allocated)} registers "
            f"per CTA of {int(arch.regs_per_block)})",
        )
    check(int(arch.issue_width) == 1, "issue_width", int(arch.issue_width),
          "the engine models single-issue schedulers only (every preset)")
    check(int(kernel.grid_ctas) >= 1, "grid_ctas", int(kernel.grid_ctas), "at least 1")
    check(int(arch.max_threads_per_sm) // arch.warp_size <= 127, "max_threads_per_sm",
          int(arch.max_threads_per_sm), "the engine counts at most 127 warp slots per SM")
    bars = np.asarray(kernel.op) == Op.BAR
    grid_bars = bars & np.asarray(kernel.grid_sync)
    if grid_bars.any():
        check(bool(kernel.cooperative), "program", "gsync", "grid.sync() needs a cooperative launch")
        check(not (bars & ~grid_bars).any(), "program", "bar and gsync",
              "a program uses either CTA barriers or grid barriers")
    check(int(kernel.work_items) == 0 or kernel.n_loops == 1, "work_items", int(kernel.work_items),
          "a persistent kernel needs a loop, exactly one: each work item is one iteration of it")
    if bool(kernel.cooperative):
        fit = int(occ.blocks_per_sm) * arch.sm_count
        check(int(kernel.grid_ctas) <= fit, "grid_ctas", int(kernel.grid_ctas),
              f"a cooperative launch needs every CTA co-resident: at most {int(occ.blocks_per_sm)} "
              f"CTAs per SM x {arch.sm_count} SMs = {fit} on {arch.name} "
              "(cudaErrorCooperativeLaunchTooLarge)")


def validate_dispatch(arch: Arch, weights: object, ema_alpha: float, ema_prior_ns: float, hold_margin: float,
                      hold_noise: float, hold_queue: float, hold_left: float) -> None:
    """Raise `JaxschedError` for bad dispatch parameters (concrete inputs only). `weights` has
    one integer per SM slot (`clocks.per_slot`: per enabled SM is expanded before this)."""
    if weights is not None:
        w = np.asarray(weights)
        check(w.shape == (arch.n_sm_slots,), "dispatch_weight", f"{w.size} entries",
              f"needs {lengths_hint(arch)}")
        enabled = np.asarray(arch.sm_enabled)
        check_ints(w, "dispatch_weight", INT32_MIN, INT32_MAX, "integer weights", rank=1)
        check_values(w, "dispatch_weight", lambda v: ~enabled | ((v >= 1) & (v <= 2**15)),
                     "every enabled SM needs a weight in 1 .. 32768", rank=1)
    check_floats(ema_alpha, "ema_alpha", 0.0, 1.0, "a smoothing factor in [0, 1]")
    check_floats(ema_prior_ns, "ema_prior_ns", 0.0, 1e8, "in [0, 1e8] ns")
    check_floats(hold_margin, "hold_margin", 0.0, 1.0, "a share of the estimate in [0, 1]")
    check_floats(hold_noise, "hold_noise", 0.0, MAX_HOLD_NOISE, f"deviations in [0, {MAX_HOLD_NOISE:g}]")
    check_floats(hold_queue, "hold_queue", 0.0, MAX_HOLD_QUEUE, f"a weight per queued CTA in [0, {MAX_HOLD_QUEUE:g}]")
    check_floats(hold_left, "hold_left", 0.0, MAX_HOLD_LEFT, f"a weight of the CTAs left in [0, {MAX_HOLD_LEFT:g}]")


def _round_i32(x: Array) -> Array:
    return jnp.round(x).astype(jnp.int32)


def ns_to_ticks(ns: Float[Array, "..."] | float, tick_mhz: Int[Array, ""]) -> Int[Array, "..."]:
    """`round(ns * F / 1000)` ticks (docs/model.md section 2), the product first: `ns * (F / 1000)`
    rounds a tie such as 300 ns at 1505 MHz (451.5) one way eagerly (451.4999...) and the other
    under jit, where XLA reassociates it, so the reference and the engine would disagree."""
    return _round_i32(jnp.asarray(ns, jnp.float64) * jnp.asarray(tick_mhz).astype(jnp.float64) / 1000.0)


def _lower(
    arch: Arch,
    kernel: Kernel,
    clocks: Clocks,
    warp_policy: Int[Array, ""] | int,
    dispatch_policy: Int[Array, ""] | int,
    dispatch_start: Int[Array, ""] | int,
    dispatch_weight: Int[Array, " sm"] | None = None,
    ema_alpha: Float[Array, ""] | float = DEFAULT_EMA_ALPHA,
    ema_prior_ns: Float[Array, ""] | float = DEFAULT_EMA_PRIOR_NS,
    hold_margin: Float[Array, ""] | float = DEFAULT_HOLD_MARGIN,
    hold_noise: Float[Array, ""] | float = DEFAULT_HOLD_NOISE,
    hold_queue: Float[Array, ""] | float = DEFAULT_HOLD_QUEUE,
    hold_left: Float[Array, ""] | float = DEFAULT_HOLD_LEFT,
    dvfs: Dvfs | None = None,
) -> Launch:
    """Convert one configuration to engine units. Traceable; call `validate` first when concrete.

    Unit conversions run in float64 (inside `jax.enable_x64`), so that the eager lowering the
    reference uses and the lowering fused into the engine's compiled program round alike: in
    float32 a fused multiply-add could land a value such as 157.49999 on the other side of .5.

    `dispatch_weight` defaults to each SM's clock in MHz (the weighted policy's natural choice);
    `dvfs` defaults to static clocks (`dvfs.off`).
    """
    i32 = lambda v: jnp.asarray(v, dtype=jnp.int32)  # noqa: E731
    enabled = jnp.asarray(arch.sm_enabled)
    freq = jnp.where(enabled, i32(clocks.sm_freq_mhz), 0)
    dvfs = off(arch) if dvfs is None else dvfs
    tick_mhz = reachable_tick_mhz(dvfs, freq)
    ticks_per_ns = tick_mhz.astype(jnp.float64) / 1000.0

    occ = occupancy(arch, kernel.threads_per_cta, kernel.regs_per_thread,
                    kernel.dynamic_smem_bytes, kernel.static_smem_bytes)
    warps = occ.warps_per_block

    # Rotated GigaThread order over the enabled SMs: rank 0 is the SM at `dispatch_start`.
    n = enabled.shape[-1]
    n_enabled = jnp.sum(enabled, dtype=jnp.int32)
    order = jnp.asarray(arch.dispatch_order)
    # position of each SM in the fixed order, counting enabled SMs only
    pos_in_order = jnp.zeros(n, jnp.int32).at[order].set(jnp.arange(n, dtype=jnp.int32))
    enabled_before = jnp.cumsum(enabled[order], dtype=jnp.int32) - 1
    enabled_pos = enabled_before[pos_in_order]
    rank = jnp.where(enabled, (enabled_pos - i32(dispatch_start)) % jnp.maximum(n_enabled, 1), n)

    op = i32(kernel.op)
    is_ldg = op == Op.LDG
    hit = kernel.l2_hit_rate.astype(jnp.float64)
    nbytes = i32(kernel.bytes_per_warp).astype(jnp.float64)
    mem_lat_ns = arch.l2_hit_latency_ns + (1.0 - hit) * (arch.dram_latency_ns - arch.l2_hit_latency_ns)
    l2_cost = _round_i32(nbytes * ticks_per_ns / arch.l2_bytes_per_ns * QUEUE_ONE_TICK)
    dram_cost = _round_i32(nbytes * (1.0 - hit) * ticks_per_ns / arch.dram_bytes_per_ns * QUEUE_ONE_TICK)
    mio_cost = jnp.where(op == Op.LDS, i32(kernel.bank_ways),
                         jnp.where((op == Op.SHFL) | is_ldg, 1, 0))

    threads = i32(kernel.threads_per_cta)
    regs_per_warp = -(-i32(kernel.regs_per_thread) * arch.warp_size // i32(arch.reg_alloc_unit)) * i32(arch.reg_alloc_unit)
    warps_per_sub = (i32(arch.regs_per_sm) // arch.schedulers_per_sm) // jnp.maximum(regs_per_warp, 1)
    return Launch(
        clocks=Clocking(
            tick_mhz=tick_mhz,
            sm_freq_mhz=freq,
            dvfs=lower_dvfs(dvfs, arch, tick_mhz),
        ),
        chip=Chip(
            sm_enabled=enabled,
            mio_depth=i32(arch.mio_queue_depth),
            cta_launch_ticks=ns_to_ticks(arch.cta_launch_ns, tick_mhz),
            taken_branch_cycles=i32(arch.taken_branch_cycles),
            launch_idle_cycles=i32(arch.cta_launch_idle_cycles),
        ),
        policy=Policy(
            warp_policy=i32(warp_policy),
            dispatch_policy=i32(dispatch_policy),
            dispatch_rank=rank.astype(jnp.int32),
            dispatch_weight=jnp.where(enabled, freq if dispatch_weight is None else i32(dispatch_weight), 0),
            ema_alpha_256=_round_i32(jnp.asarray(ema_alpha, jnp.float64) * 256.0),
            ema_prior_ticks=ns_to_ticks(ema_prior_ns, tick_mhz),
            hold_margin_256=_round_i32(jnp.asarray(hold_margin, jnp.float64) * 256.0),
            hold_noise_256=_round_i32(jnp.asarray(hold_noise, jnp.float64) * 256.0),
            hold_queue_256=_round_i32(jnp.asarray(hold_queue, jnp.float64) * 256.0),
            hold_left_256=_round_i32(jnp.asarray(hold_left, jnp.float64) * 256.0),
        ),
        program=Program(
            n_ctas=i32(kernel.grid_ctas),
            warps_per_cta=warps,
            lanes_last_warp=threads - arch.warp_size * (warps - 1),
            ctas_per_sm=occ.blocks_per_sm,
            warp_reg_share=jnp.where(regs_per_warp > 0, REG_SHARE_ONE // jnp.maximum(warps_per_sub, 1), 0),
            cta_smem_bytes=occ.smem_per_block_allocated_bytes,
            smem_per_sm_bytes=occ.smem_per_sm_bytes,
            op=op,
            waits=jnp.where(jnp.asarray(kernel.dep), (1 << WAIT_BITS) - 1, i32(kernel.waits)),
            writes=i32(kernel.writes),
            lat_cycles=jnp.asarray(arch.latency_cycles)[op],
            issue_cost64=_round_i32(jnp.asarray(arch.issue_cycles, jnp.float64)[op] * ISSUE_UNITS_PER_CYCLE),
            mio_cost=mio_cost,
            mem_lat_ticks=jnp.where(is_ldg, ns_to_ticks(mem_lat_ns, tick_mhz), 0),
            l2_cost=jnp.where(is_ldg, jnp.maximum(l2_cost, 1), 0),
            dram_cost=jnp.where(is_ldg, dram_cost, 0),
            grid_sync=jnp.asarray(kernel.grid_sync) & (op == Op.BAR),
            loop_start=i32(kernel.loop_start),
            loop_end=i32(kernel.loop_end),
            branch_start=i32(kernel.branch_start),
            branch_mid=i32(kernel.branch_mid),
            branch_end=i32(kernel.branch_end),
            branch_parent=i32(kernel.branch_parent),
            trips=i32(kernel.trips),
            trips_cta_spread=i32(kernel.trips_cta_spread),
            trips_warp_spread=i32(kernel.trips_warp_spread),
            branch_threshold=_round_i32(kernel.branch_if_probability * BRANCH_HASH_ONE),
            seed=i32(kernel.seed),
            grid_sync_ticks=ns_to_ticks(kernel.grid_sync_ns, tick_mhz),
            work_items=i32(kernel.work_items),
            trips_from_data=jnp.asarray(kernel.trips_from_data),
            trips_data=i32(kernel.trips_data),
            if_from_data=jnp.asarray(kernel.if_from_data),
            if_data=i32(kernel.if_data),
        ),
    )


def lower(*args, **kwargs) -> Launch:
    """`_lower` under `jax.enable_x64` (see its docstring); the same arguments."""
    with jax.enable_x64(True):
        return _lower(*args, **kwargs)


def to_numpy(launch: Launch) -> Launch:
    """The same launch with numpy leaves (for the plain reference)."""
    return jax.tree.map(np.asarray, launch)
