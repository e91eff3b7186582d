"""Architecture presets: `get(name)` returns an `Arch`; `names()` lists them.

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
Latencies are leads to be calibrated (issue 8), not measurements of this project yet.
"""

from __future__ import annotations

from typing import Callable

from .arch import Arch, make_arch
from .errors import JaxschedError
from .hierarchy import build_hierarchy
from .isa import Op

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


def _lat(fma: int, alu: int, sfu: int, lds: int, l1: int, shfl: int) -> list[int]:
    """Per-class dependent-issue latency in SM cycles, ordered by `isa.Op`."""
    lat = [0] * len(Op)
    lat[Op.FMA], lat[Op.ALU], lat[Op.SFU] = fma, alu, sfu
    lat[Op.LDS], lat[Op.LDG], lat[Op.SHFL] = lds, l1, shfl
    lat[Op.BAR], lat[Op.EXIT] = 1, 1
    return lat


def _issue(fma: int, alu: int) -> list[int]:
    """Cycles a sub-partition's pipe is busy per warp instruction (32 lanes / pipe lanes)."""
    cyc = [1] * len(Op)
    cyc[Op.FMA], cyc[Op.ALU] = fma, alu
    cyc[Op.SFU] = 8  # [wpV][wpA][wpH] 4 SFU lanes per sub-partition: 32 / 4
    return cyc


def v100() -> Arch:
    """Tesla V100 SXM2 (GV100, CC 7.0)."""
    return make_arch(
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
    )


def a100() -> Arch:
    """A100 SXM4 40 GB (GA100, CC 8.0)."""
    return make_arch(
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
    )


def _gh100(name: str, dram_bytes_per_ns: float) -> Arch:
    """GH100 with 132 SMs enabled (H100 SXM5, H200 SXM; CC 9.0)."""
    return make_arch(
        name=name,
        compute_capability=(9, 0),
        # [wpH] GH100: 8 GPCs x 9 TPCs x 2 = 144 SMs; 132 enabled, reported as 6x16 + 2x18 SMs
        # per GPC [dom]; 814 mm^2 [schem].
        **build_hierarchy([9] * 8, [9, 9, 8, 8, 8, 8, 8, 8], die_mm=(33.0, 24.7), gpc_rows=2),
        **_COMMON,
        max_threads_per_sm=2048,  # [pg]
        max_blocks_per_sm=32,  # [occ]
        smem_per_sm_bytes=233472,  # [pg] 228 KiB
        smem_per_block_optin_bytes=232448,  # [pg] 227 KiB
        reserved_smem_per_block_bytes=1024,  # [pg]
        smem_alloc_unit_bytes=128,  # [occ]
        smem_carveout_kib=[0, 8, 16, 32, 64, 100, 132, 164, 196, 228],  # [occ]
        barriers_per_block_slot=2,  # [occ] CC 9
        latency_cycles=_lat(fma=4, alu=4, sfu=18, lds=29, l1=39, shfl=24),  # [dom][accel]
        issue_cycles=_issue(fma=1, alu=2),  # [wpH] 32 FP32, 16 INT32 lanes per sub-partition
        l2_hit_latency_ns=120.0,  # [dom] 219-260 cycles at 1.98 GHz
        dram_latency_ns=360.0,  # [dom] 570-860 cycles at 1.98 GHz
        l2_bytes_per_ns=5500.0,  # lead: chips-and-cheese H100 L2 bandwidth, ~5.5 TB/s
        dram_bytes_per_ns=dram_bytes_per_ns,
        base_clock_ghz=1.590,  # [tpu] H100 SXM5 base clock
        boost_clock_ghz=1.980,  # [dom][wpH] max SM clock
        power_limit_w=700.0,  # [wpH][dsH200] SXM TDP
        clock_step_mhz=15.0,  # [dom]
    )


def h100() -> Arch:
    """H100 SXM5 80 GB."""
    return _gh100("h100", dram_bytes_per_ns=3350.0)  # [wpH] HBM3 3.35 TB/s


def h200() -> Arch:
    """H200 SXM 141 GB."""
    return _gh100("h200", dram_bytes_per_ns=4800.0)  # [dsH200] HBM3e 4.8 TB/s


def rtx3090() -> Arch:
    """GeForce RTX 3090 (GA102, CC 8.6)."""
    return make_arch(
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
    )


_PRESETS: dict[str, Callable[[], Arch]] = {
    "v100": v100,
    "a100": a100,
    "h100": h100,
    "h200": h200,
    "rtx3090": rtx3090,
}


def names() -> list[str]:
    """Names accepted by `get`."""
    return list(_PRESETS)


def get(name: str) -> Arch:
    """The preset called `name` (case-insensitive)."""
    key = name.lower()
    if key not in _PRESETS:
        raise JaxschedError("arch", name, f"unknown preset; known presets: {', '.join(_PRESETS)}")
    return _PRESETS[key]()
