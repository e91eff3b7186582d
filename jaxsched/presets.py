"""Architecture presets: `get(name)` returns an `Arch`, `values(name)` the same numbers without
JAX (`archvalues.ArchValues`); `names()` lists them.

Every number carries its source. Abbreviations used in the comments:
- [occ]   CUDA toolkit `cuda_occupancy.h` (per-CC rules: blocks/SM, granularities, carveouts).
- [pg]    CUDA C++ Programming Guide, "Features and Technical Specifications" table.
- [wpV]   NVIDIA Tesla V100 whitepaper (2017); [wpA] A100 whitepaper (2020);
          [wpH] H100 whitepaper (2022); [wpGA] GA102 (Ampere GA102) whitepaper (2020).
- [dsH200] NVIDIA H200 datasheet (2024); [tpu] TechPowerUp GPU database (base clocks).
- [jia18] Jia et al., "Dissecting the NVIDIA Volta GPU Architecture via Microbenchmarking";
  [jia21] Jia et al./Citadel & chips-and-cheese Ampere/Hopper microbenchmarks, as summarised in
  DOMAIN.md's latency table (cycles at the boost clock, converted to ns).
- [accel] Accel-Sim's shipped configs (SFU and shuffle latencies where no microbenchmark is cited).
- [schem] schematic floorplan: die area from the whitepapers, layout from `hierarchy.py`.
- [dom]   `../shared/DOMAIN.md` (measurements made for this project, or its leads).
- [cal]   measured on an H200 with `jaxsched probe` (issue 8): docs/calibration.md.
Latencies of the other presets are leads, not measurements of this project.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

from .archvalues import ArchValues
from .errors import JaxschedError
from .hierarchy import build_hierarchy
from .isa import Op

if TYPE_CHECKING:
    from .arch import Arch

# Limits shared by every CC >= 7.0: [pg] and [occ].
_COMMON = dict(
    schedulers_per_sm=4,  # [occ] cudaOccSubPartitionsPerMultiprocessor: 4 for CC 7-12
    warp_size=32,  # [pg]
    max_threads_per_block=1024,  # [pg]
    regs_per_sm=65536,  # [pg] 64K 32-bit registers per SM
    regs_per_block=65536,  # [pg]
    max_regs_per_thread=255,  # [pg] (ptxas never assigns more than 255)
    reg_alloc_unit=256,  # [occ] cudaOccRegAllocationGranularity
    smem_per_block_bytes=49152,  # [pg] 48 KiB without opt-in
    issue_width=1,  # [wpV][wpA][wpH] one warp instruction per scheduler per clock
    smem_bytes_per_cycle=128,  # [wpV][wpA] 32 banks x 4 B per clock per SM
    mio_queue_depth=16,  # lead: not documented; calibrate (issue 8)
)


# Kernel launch overheads (docs/model.md section 13), measured on an H200 with CUDA 12
# (docs/calibration.md, "Kernel launch overhead"); leads for the other chips, whose driver
# path is the same.
LAUNCH_OVERHEAD_NS = dict(
    launch_api_ns=4650.0,  # [cal] host time per cudaLaunchKernel: 4210 and 5098 ns in two runs
    launch_gap_ns=1360.0,  # [cal] GPU time per queued empty kernel in a stream
    graph_api_ns=21240.0,  # [cal] host time of one cudaGraphLaunch (20 nodes; 400: ~22-24 us)
    graph_gap_ns=504.0,  # [cal] GPU time per kernel of a graph
)


def _lat(fma: int, alu: int, sfu: int, lds: int, l1: int, shfl: int) -> list[int]:
    """Per-class dependent-issue latency in SM cycles, ordered by `isa.Op`."""
    lat = [0] * len(Op)
    lat[Op.FMA], lat[Op.ALU], lat[Op.SFU] = fma, alu, sfu
    lat[Op.LDS], lat[Op.LDG], lat[Op.SHFL] = lds, l1, shfl
    lat[Op.BAR], lat[Op.EXIT] = 1, 1
    return lat


def _issue(fma: float, alu: float) -> list[float]:
    """Cycles a sub-partition's pipe is busy per warp instruction (32 lanes / pipe lanes)."""
    cyc = [1.0] * len(Op)
    cyc[Op.FMA], cyc[Op.ALU] = fma, alu
    cyc[Op.SFU] = 8  # [wpV][wpA][wpH] 4 SFU lanes per sub-partition: 32 / 4
    return cyc


def _v100() -> dict:
    """Tesla V100 SXM2 (GV100, CC 7.0)."""
    return dict(
        name="v100",
        compute_capability=(7, 0),
        # [wpV] GV100: 6 GPCs x 7 TPCs x 2 SMs = 84; V100 enables 80. 815 mm^2 die. [schem]
        **build_hierarchy([7] * 6, [7, 7, 7, 7, 6, 6], die_mm=(33.0, 24.7), gpc_rows=2),
        **_COMMON,
        max_threads_per_sm=2048,  # [pg] 64 warps
        max_blocks_per_sm=32,  # [occ]
        smem_per_sm_bytes=98304,  # [pg] 96 KiB
        smem_per_block_optin_bytes=98304,  # [pg] 96 KiB
        reserved_smem_per_block_bytes=0,  # [occ] reservation starts with CC 8.0
        smem_alloc_unit_bytes=256,  # [occ] cudaOccSMemAllocationGranularity, CC 7
        smem_carveout_kib=[0, 8, 16, 32, 64, 96],  # [occ] cudaOccAlignUpShmemSizeVoltaPlus
        barriers_per_block_slot=2,  # [occ] cudaOccMaxBlocksPerSMBlockBarrierLimit, CC 7
        latency_cycles=_lat(fma=4, alu=4, sfu=18, lds=19, l1=28, shfl=22),  # [jia18][accel]
        issue_cycles=_issue(fma=2, alu=2),  # [wpV] 16 FP32 and 16 INT32 lanes per sub-partition
        l2_hit_latency_ns=126.0,  # [jia18] ~193 cycles at 1.53 GHz
        dram_latency_ns=300.0,  # [jia18] ~460 cycles at 1.53 GHz
        l2_bytes_per_ns=2155.0,  # [jia18] measured L2 throughput 2155 GB/s
        dram_bytes_per_ns=900.0,  # [wpV] HBM2 900 GB/s
        base_clock_ghz=1.290,  # [tpu] V100 SXM2 base clock
        boost_clock_ghz=1.530,  # [wpV]
        power_limit_w=300.0,  # [wpV] SXM2 TDP
        clock_step_mhz=15.0,  # [dom] clocks move in ~15 MHz bins
        # [cal] CTA end -> next CTA start on the freed slot: 207 ns median (175-237 ns, n = 2478)
        # on an H200 (docs/calibration.md); a lead for the other chips
        cta_launch_ns=207.0,
        taken_branch_cycles=0,
        cta_launch_idle_cycles=0,
        **LAUNCH_OVERHEAD_NS,
    )


def _a100() -> dict:
    """A100 SXM4 40 GB (GA100, CC 8.0)."""
    return dict(
        name="a100",
        compute_capability=(8, 0),
        # [wpA] GA100: 8 GPCs x 8 TPCs x 2 = 128 SMs; A100 enables 108. 826 mm^2. [schem]
        **build_hierarchy([8] * 8, [7, 7, 7, 7, 7, 7, 6, 6], die_mm=(33.2, 24.9), gpc_rows=2),
        **_COMMON,
        max_threads_per_sm=2048,  # [pg]
        max_blocks_per_sm=32,  # [occ]
        smem_per_sm_bytes=167936,  # [pg] 164 KiB
        smem_per_block_optin_bytes=166912,  # [pg] 163 KiB
        reserved_smem_per_block_bytes=1024,  # [pg] 1 KiB reserved per block from CC 8.0
        smem_alloc_unit_bytes=128,  # [occ] CC >= 8
        smem_carveout_kib=[0, 8, 16, 32, 64, 100, 132, 164],  # [occ]
        barriers_per_block_slot=2,  # [occ] CC 8.0
        latency_cycles=_lat(fma=4, alu=4, sfu=18, lds=29, l1=35, shfl=24),  # [dom][accel]
        issue_cycles=_issue(fma=2, alu=2),  # [wpA] 16 FP32 / 16 INT32 lanes per sub-partition
        l2_hit_latency_ns=160.0,  # [dom] ~200-260 cycles at 1.41 GHz
        dram_latency_ns=330.0,  # [dom] ~400-500 cycles at 1.41 GHz
        l2_bytes_per_ns=4900.0,  # [wpA] 2.3x V100's L2 bandwidth
        dram_bytes_per_ns=1555.0,  # [wpA] HBM2 1555 GB/s (40 GB)
        base_clock_ghz=1.095,  # [tpu]
        boost_clock_ghz=1.410,  # [wpA][dom]
        power_limit_w=400.0,  # [wpA] SXM4
        clock_step_mhz=15.0,  # [dom]
        # [cal] CTA end -> next CTA start on the freed slot: 207 ns median (175-237 ns, n = 2478)
        # on an H200 (docs/calibration.md); a lead for the other chips
        cta_launch_ns=207.0,
        taken_branch_cycles=0,
        cta_launch_idle_cycles=0,
        **LAUNCH_OVERHEAD_NS,
    )


# [cal] docs/calibration.md, data/h200/calibration.json: one H200 SXM measured with
# `jaxsched probe`. Which TPCs are enabled differs from die to die, so this layout is that
# chip's; the pipeline latencies are GH100's and hold for the H100 too.
# TPC t holds %smid 2t, 2t+1. TPCs 0-31 go round robin over the 8 GPCs, TPCs 32-59 round robin
# over GPCs 1-7, then TPCs 60 and 61 go to GPCs 6 and 7, and 62-65 to GPC 0. That gives
# 6 x 16 + 2 x 18 SMs. Measured: thread-block clusters (whose CTAs share a GPC) and the order in
# which CTAs are handed out (GPC by GPC).
_H200_TPC_GPC = [t % 8 for t in range(32)] + [1 + (t - 32) % 7 for t in range(32, 60)] + [6, 7, 0, 0, 0, 0]
# [cal] GPC 0 takes CTAs on TPCs 62-65 (%smid 124-131) before its TPCs 0, 8, 16, 24. Every
# launch starts there, while the GPC that follows it rotates between launches.
_H200_LEAD_TPCS = (62, 63, 64, 65)


def _measured_layout(tpc_gpc: list[int], lead_tpcs: tuple[int, ...], gpc_tpcs_full: list[int],
                     die_mm: tuple[float, float]) -> dict[str, np.ndarray]:
    """Hierarchy arrays for a measured TPC -> GPC map (TPC t = %smid 2t, 2t+1). Floorplan sites
    come from `build_hierarchy` with the same TPCs per GPC, the j-th enabled TPC of a GPC
    (in %smid order) at that GPC's j-th site. The dispatch order goes GPC by GPC; inside a GPC,
    `lead_tpcs` come first, then the other TPCs in %smid order."""
    n_gpc = len(gpc_tpcs_full)
    counts = [tpc_gpc.count(g) for g in range(n_gpc)]
    base = build_hierarchy(gpc_tpcs_full, counts, die_mm=die_mm, gpc_rows=2)
    base_tpc_gpc = base["sm_gpc"][0::2]
    n_on = len(tpc_gpc)
    site_of = {}  # measured TPC -> TPC index of the same GPC site in `base`
    for g in range(n_gpc):
        ours = [t for t in range(n_on) if tpc_gpc[t] == g]
        theirs = [t for t in range(n_on) if base_tpc_gpc[t] == g]
        site_of.update(zip(ours, theirs))
    slots = np.arange(base["sm_gpc"].size)
    src = np.asarray([2 * site_of[s // 2] + s % 2 if s < 2 * n_on else s for s in slots])
    order = [2 * t + h for g in range(n_gpc)
             for t in sorted((t for t in range(n_on) if tpc_gpc[t] == g), key=lambda t: (t not in lead_tpcs, t))
             for h in (0, 1)]
    return dict(
        sm_enabled=base["sm_enabled"],
        sm_gpc=np.concatenate([np.repeat(tpc_gpc, 2), base["sm_gpc"][2 * n_on:]]).astype(np.int32),
        sm_tpc=base["sm_tpc"],
        sm_xy_mm=base["sm_xy_mm"][src],
        dispatch_order=np.asarray(order + list(range(2 * n_on, slots.size)), dtype=np.int32),
        die_mm=base["die_mm"],
    )


def _gh100(name: str, dram_bytes_per_ns: float, dram_latency_ns: float,
           hierarchy: dict[str, np.ndarray]) -> dict:
    """GH100 with 132 SMs enabled (H100 SXM5, H200 SXM; CC 9.0)."""
    return dict(
        name=name,
        compute_capability=(9, 0),
        **hierarchy,
        **_COMMON,
        max_threads_per_sm=2048,  # [pg]
        max_blocks_per_sm=32,  # [occ]
        smem_per_sm_bytes=233472,  # [pg] 228 KiB
        smem_per_block_optin_bytes=232448,  # [pg] 227 KiB
        reserved_smem_per_block_bytes=1024,  # [pg]
        smem_alloc_unit_bytes=128,  # [occ]
        smem_carveout_kib=[0, 8, 16, 32, 64, 100, 132, 164, 196, 228],  # [occ]
        barriers_per_block_slot=2,  # [occ] CC 9
        # [cal] dependent chains of one warp, cycles per op: FFMA 4.00, IADD3 4.02, MUFU.RSQ 17.00,
        # LDS 22.96, L1-hit LDG 33.94, SHFL 23.97 (every SM the same)
        latency_cycles=_lat(fma=4, alu=4, sfu=17, lds=23, l1=34, shfl=24),
        # [cal] 64 warps/SM, 8 independent chains: FFMA 1.03, LOP3 2.06, MUFU 8.00 cycles per
        # warp instruction per scheduler (the whitepaper's lanes: 32 FP32, 16 INT32, 4 SFU)
        issue_cycles=_issue(fma=1, alu=2),
        l2_hit_latency_ns=143.0,  # [cal] .cg pointer chase: 283 cycles at 1980 MHz (138-150 ns by SM)
        dram_latency_ns=dram_latency_ns,
        # [cal] fitted on the suite's ldg_l2_t256 (34.6 MB of coalesced L2 hits in 4.9 us): the
        # simulated makespan matches at 7.4 TB/s (the lead was chips-and-cheese's ~5.5 TB/s)
        l2_bytes_per_ns=7400.0,
        dram_bytes_per_ns=dram_bytes_per_ns,
        base_clock_ghz=1.590,  # [tpu] H100 SXM5 base clock
        # [cal] 1980 MHz on every SM (+-0.02 %) idle-to-busy, under 8 FMA-bound CTAs per SM and over
        # 1.7 s of sustained load, no clock-event reason set; also NVML's max SM clock
        boost_clock_ghz=1.980,
        power_limit_w=700.0,  # [wpH][dsH200] SXM TDP
        clock_step_mhz=15.0,  # [dom]
        # [cal] CTA end -> next CTA start on the freed slot: 207 ns median (175-237 ns, n = 2478)
        # on an H200 (docs/calibration.md); a lead for the other chips
        cta_launch_ns=207.0,
        # [cal] on the H200 (a lead for the H100's same SM): a lone warp's CTA takes 437 cycles
        # plus 1032.8 per loop trip (issue_sweep and refill experiments); with the probe
        # programs' SASS outside the loop modelled, 9 cycles of refetch after the BRA give 33493
        # and 8693 cycles for 32 and 8 trips, against 33487.5 and 8700 measured
        taken_branch_cycles=9,
        # [cal] refill experiment, 2 CTAs/SM: a freed slot takes its next CTA 216, 216, 1032 and
        # 8314 ns later with 1, 2, 4 and 8 busy warps per scheduler in the other CTA; of 192, 224,
        # ..., 384 and 512 starved scheduler-cycles per refill, 256 has the least squared log
        # error over the 4- and 8-warp delays (393 and 4625 ns: both short)
        cta_launch_idle_cycles=256,
        **LAUNCH_OVERHEAD_NS,
    )


def _h100() -> dict:
    """H100 SXM5 80 GB."""
    # [wpH] GH100: 8 GPCs x 9 TPCs x 2 SMs = 144; 132 enabled, reported as 6 x 16 + 2 x 18 SMs per
    # GPC [dom]; 814 mm^2 [schem]. Layout not measured on an H100: %smid pairs round robin.
    layout = build_hierarchy([9] * 8, [9, 9, 8, 8, 8, 8, 8, 8], die_mm=(33.0, 24.7), gpc_rows=2)
    # [wpH] HBM3 3.35 TB/s; DRAM latency: [dom] 570-860 cycles at 1.98 GHz
    return _gh100("h100", dram_bytes_per_ns=3350.0, dram_latency_ns=360.0, hierarchy=layout)


def _h200() -> dict:
    """H200 SXM 141 GB."""
    layout = _measured_layout(_H200_TPC_GPC, _H200_LEAD_TPCS, [9] * 8, die_mm=(33.0, 24.7))
    # [cal] DRAM latency: cold .cg pointer chase over 2 GiB (TLB misses included), 684 and 710
    # cycles at 1980 MHz in two runs. Bandwidth fitted on the suite's ldg_dram_t256 (34.6 MB
    # streamed in 9.8 us, median of 6 launches): 3.7 TB/s sustained over a short kernel, against
    # the datasheet's 4.8 TB/s peak [dsH200]
    return _gh100("h200", dram_bytes_per_ns=3700.0, dram_latency_ns=352.0, hierarchy=layout)


def _rtx3090() -> dict:
    """GeForce RTX 3090 (GA102, CC 8.6)."""
    return dict(
        name="rtx3090",
        compute_capability=(8, 6),
        # [wpGA] GA102: 7 GPCs x 6 TPCs x 2 = 84 SMs; RTX 3090 enables 82. 628 mm^2. [schem]
        **build_hierarchy([6] * 7, [6, 6, 6, 6, 6, 6, 5], die_mm=(28.7, 21.9), gpc_rows=2),
        **_COMMON,
        max_threads_per_sm=1536,  # [pg] 48 warps
        max_blocks_per_sm=16,  # [occ]
        smem_per_sm_bytes=102400,  # [pg] 100 KiB
        smem_per_block_optin_bytes=101376,  # [pg] 99 KiB
        reserved_smem_per_block_bytes=1024,  # [pg]
        smem_alloc_unit_bytes=128,  # [occ]
        smem_carveout_kib=[0, 8, 16, 32, 64, 100],  # [occ] CC 8.6
        barriers_per_block_slot=1,  # [occ] CC 8.x other than 8.0
        latency_cycles=_lat(fma=4, alu=4, sfu=18, lds=29, l1=33, shfl=24),  # [dom][accel]
        issue_cycles=_issue(fma=1, alu=2),  # [wpGA] 32 FP32 (16 shared with INT32) per sub-part.
        l2_hit_latency_ns=180.0,  # lead: ~300 cycles at 1.695 GHz (GDDR6X parts)
        dram_latency_ns=380.0,  # lead: ~640 cycles at 1.695 GHz
        l2_bytes_per_ns=2000.0,  # lead: chips-and-cheese GA102 L2 bandwidth, ~2 TB/s
        dram_bytes_per_ns=936.0,  # [wpGA] GDDR6X 936 GB/s
        base_clock_ghz=1.395,  # [wpGA]
        boost_clock_ghz=1.695,  # [wpGA]
        power_limit_w=350.0,  # [wpGA] TGP
        clock_step_mhz=15.0,  # [dom]
        # [cal] CTA end -> next CTA start on the freed slot: 207 ns median (175-237 ns, n = 2478)
        # on an H200 (docs/calibration.md); a lead for the other chips
        cta_launch_ns=207.0,
        taken_branch_cycles=0,
        cta_launch_idle_cycles=0,
        **LAUNCH_OVERHEAD_NS,
    )


_PRESETS: dict[str, Callable[[], dict]] = {
    "v100": _v100,
    "a100": _a100,
    "h100": _h100,
    "h200": _h200,
    "rtx3090": _rtx3090,
}


def names() -> list[str]:
    """Names accepted by `get`."""
    return list(_PRESETS)


def fields(name: str) -> dict:
    """The fields of the preset called `name` (case-insensitive), as plain values."""
    key = name.lower()
    if key not in _PRESETS:
        raise JaxschedError("arch", name, f"unknown preset; known presets: {', '.join(_PRESETS)}")
    return _PRESETS[key]()


def values(name: str) -> ArchValues:
    """The preset called `name` as numpy values, without JAX."""
    return ArchValues(**fields(name))


def get(name: str) -> Arch:
    """The preset called `name` (case-insensitive)."""
    from .arch import make_arch  # imports JAX; `values` reads a preset without it

    return make_arch(**fields(name))
