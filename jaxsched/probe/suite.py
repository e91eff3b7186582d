"""The probe suite: kernel shapes measured on hardware and simulated the same way.

Each `ProbeCase` names one of the work kernels in `kernels.py`, its launch (threads, grid, CTAs
per SM, forced through dynamic shared memory where the natural occupancy is higher), and its
per-warp loop trip counts, drawn from the simulator's own hash (docs/model.md section 4) so the
hardware and the simulator run the same work per CTA. `program()` is the warp program the
simulator runs for it, instruction for instruction as the SASS of the loop (checked with
`cuobjdump -sass`: 256 FFMA + IADD3 + ISETP + BRA per trip of `work_fma_dep`), with the SASS
outside the loop (address, count test, end stamp) as dependent ALU stand-ins.

`fma_dep_bank` runs the same chain with an FFMA whose two register operands share a register
bank (`FFMA R8, R8, R2, R3`, no operand reuse). The simulator has no register banks
(docs/model.md, "What is not modelled"), so `sim_arch` gives such cases the FMA issue interval
measured for that SASS (`BANK_CONFLICT_FMA_ISSUE_CYCLES`, from the case marked calibration).

Cases are short (a few to a few tens of microseconds) so that simulating them cycle by cycle on
a CPU stays feasible. `role` says whether a case was used to calibrate the preset or only
to check its predictions.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..arch import Arch
from ..errors import JaxschedError, check
from ..isa import Op
from ..kernel import Kernel, make_kernel
from ..occupancy import occupancy
from ..reference import warp_trips
from . import kernels

KERNELS = ("fma_dep", "fma_dep_bank", "fma_ilp", "ldg")
MEMORY = ("l2", "dram")
ROLES = ("calibration", "prediction")

# Instructions of one loop trip besides the FMAs/loads, from the SASS (IADD3, ISETP, BRA), and
# the work_ldg trip's address arithmetic (LEA, IADD3, IMAD, ISETP, SEL: ~9 per trip, unrolled x4).
_LOOP_OVERHEAD_ALU = 3
_LDG_ADDRESS_ALU = 3
_LDG_TAIL_ALU = 6
# The SASS outside the loop (data/h200/sass_work.txt) as dependent 4-cycle ALU stand-ins: the
# trip-count address after the entry bar (S2R, LDC, SHF, IMAD, IMAD.WIDE, ...: 13 instructions),
# the count's test after the load (I2FP, LOP3, FMUL, ISETP, BRA, MOV: 7) and the end stamp's store
# after the loop (CS2R, LDC, LEA, LEA.HI.X, STG, ISETP: 8). ALU, not FMA, so that the bank-conflict
# cases' FMA issue interval does not slow them. The total (32) is fitted to a lone warp's CTA
# time, 437 cycles fixed + 1032.8 per trip on the H200 (docs/calibration.md).
_BEFORE_LOAD_OPS = 15
_AFTER_LOAD_OPS = 8
_EPILOGUE_OPS = 9
# [cal] docs/calibration.md: fma_dep_bank_t256_w1 issues a bank-conflicted FFMA every 2.0 cycles
# per scheduler (conflict-free chains and independent FFMAs with operand reuse: 1.0)
BANK_CONFLICT_FMA_ISSUE_CYCLES = 2


@dataclasses.dataclass(frozen=True)
class ProbeCase:
    """One measured and simulated kernel shape."""

    name: str
    kernel: str  # one of KERNELS
    threads: int
    grid: int
    trips: int  # mean loop trips per warp (one trip = 256 FMAs, or 8 loads + 8 FMAs for ldg)
    ctas_per_sm: int | None = None  # forced through dynamic shared memory; None: natural
    cta_spread: int = 0
    warp_spread: int = 0
    seed: int = 0
    memory: str | None = None  # ldg only: "l2" (resident buffer) or "dram" (streamed, cold)
    role: str = "prediction"
    note: str = ""

    def __post_init__(self) -> None:
        check(self.kernel in KERNELS, f"{self.name}.kernel", self.kernel, f"one of {KERNELS}")
        check(1 <= self.threads <= 1024, f"{self.name}.threads", self.threads, "1..1024")
        check(self.grid >= 1 and self.trips >= 0, f"{self.name}.grid", self.grid, ">= 1")
        check(self.role in ROLES, f"{self.name}.role", self.role, f"one of {ROLES}")
        check((self.kernel == "ldg") == (self.memory in MEMORY), f"{self.name}.memory",
              self.memory, f"one of {MEMORY} for ldg cases, None otherwise")

    @property
    def warps_per_cta(self) -> int:
        return -(-self.threads // 32)

    def smem_bytes(self, arch: Arch) -> int:
        """Dynamic shared memory that caps residency at `ctas_per_sm` (0 when not forced)."""
        if self.ctas_per_sm is None:
            return 0
        unit = int(arch.smem_alloc_unit_bytes)
        per_cta = int(arch.smem_per_sm_bytes) // self.ctas_per_sm // unit * unit
        return per_cta - int(arch.reserved_smem_per_block_bytes)

    def occupancy(self, arch: Arch, regs: int) -> int:
        """CTAs per SM that CUDA's rules give this launch with `regs` registers per thread."""
        return int(occupancy(arch, self.threads, regs, self.smem_bytes(arch)).blocks_per_sm)

    def trip_counts(self) -> np.ndarray:
        """Per-warp trip counts in grid order (CTA-major), from the simulator's hash."""
        return np.asarray([warp_trips(self.seed, self.trips, self.cta_spread, self.warp_spread, c, w)
                           for c in range(self.grid) for w in range(self.warps_per_cta)], dtype=np.int32)

    def program(self) -> str:
        """The simulator's warp program for this case (mirrors the kernel's SASS)."""
        loop = f"loop {self.trips} cta_spread={self.cta_spread} warp_spread={self.warp_spread}"
        if self.kernel in ("fma_dep", "fma_dep_bank"):
            body = ["fma dep"] * kernels.FMA_UNROLL
        elif self.kernel == "fma_ilp":
            group = ["fma dep"] + ["fma"] * (kernels.ILP_CHAINS - 1)
            body = group * kernels.ILP_UNROLL
        else:
            body = (["alu"] * _LDG_ADDRESS_ALU + ["ldg bytes=128"] * kernels.LDG_UNROLL
                    + ["fma dep"] * kernels.LDG_UNROLL + ["alu"] * (_LDG_TAIL_ALU - _LOOP_OVERHEAD_ALU))
        body += ["alu"] * _LOOP_OVERHEAD_ALU
        # bar at entry, the address chain, one 32-byte load of the warp's trip count and the
        # chain that tests it, the loop, the end stamp's chain, bar before exit
        lines = ["bar", *["alu dep"] * _BEFORE_LOAD_OPS, "ldg bytes=32", *["alu dep"] * _AFTER_LOAD_OPS, loop,
                 *(f"  {b}" for b in body), "end", *["alu dep"] * _EPILOGUE_OPS, "bar", "exit"]
        return "\n".join(lines)

    def l2_hit_rate(self) -> float:
        """Fraction of load bytes served by L2: the trip-count array and the resident buffer hit."""
        return 0.0 if self.memory == "dram" else 1.0

    def sim_arch(self, arch: Arch) -> Arch:
        """The architecture to simulate this case on: `arch`, with the FMA issue interval of a
        register-bank-conflicted FFMA for `fma_dep_bank` cases."""
        if self.kernel != "fma_dep_bank":
            return arch
        issue = np.asarray(arch.issue_cycles).copy()
        issue[Op.FMA] = BANK_CONFLICT_FMA_ISSUE_CYCLES
        return arch.replace(issue_cycles=issue)

    def sim_kernel(self, arch: Arch, regs: int) -> Kernel:
        """The simulator's `Kernel` for this case, with the registers the compiler gave it."""
        return make_kernel(self.program(), grid=self.grid, threads=self.threads, regs=regs,
                           smem_bytes=self.smem_bytes(arch), l2_hit_rate=self.l2_hit_rate(),
                           seed=self.seed, name=self.name)


def _waves(n_sm: int, per_sm: int, waves: float) -> int:
    return int(round(n_sm * per_sm * waves))


def default_suite(n_sm: int = 132) -> tuple[ProbeCase, ...]:
    """The shapes of issue 8: block sizes, waves, uniform and imbalanced work, dependent and
    independent FMA chains, global loads. `n_sm` sizes the grids in waves."""
    w = lambda per_sm, waves: _waves(n_sm, per_sm, waves)  # noqa: E731
    return (
        ProbeCase("fma_dep_t256_w1", "fma_dep", 256, w(8, 1), trips=4,
                  note="one full wave, 8 CTAs/SM co-resident: issue-bound, completion stagger"),
        ProbeCase("fma_dep_t64_lat", "fma_dep", 64, w(1, 4) + 17, trips=4, ctas_per_sm=1,
                  note="2 warps per SM: latency-bound FMA chain, 4+ waves"),
        ProbeCase("fma_dep_t256_w2p", "fma_dep", 256, w(8, 2) + 66, trips=2,
                  note="2 waves and a partial third: per-SM counts follow the dispatch order"),
        ProbeCase("fma_dep_t256_imb", "fma_dep", 256, w(8, 3), trips=4, cta_spread=2, seed=11,
                  note="3 waves, per-CTA trip counts 2..6 (load imbalance)"),
        ProbeCase("fma_dep_t256_warpimb", "fma_dep", 256, w(8, 1), trips=3, warp_spread=2, seed=12,
                  note="one wave, per-warp trips 3..5 (divergent-loop-like)"),
        ProbeCase("fma_dep_t128_w1p", "fma_dep", 128, w(16, 1) + 33, trips=4,
                  note="16 CTAs/SM, one wave plus 33 CTAs"),
        ProbeCase("fma_dep_t1024_w2", "fma_dep", 1024, w(2, 2), trips=2,
                  note="largest block, 2 CTAs/SM, 2 waves"),
        ProbeCase("fma_dep_t96_w2", "fma_dep", 96, w(21, 2), trips=2,
                  note="odd block (3 warps), 21 CTAs/SM, 2 waves"),
        ProbeCase("fma_dep_t32_tiny", "fma_dep", 32, w(32, 3), trips=1,
                  note="tiny CTAs (1 warp, 256 FMAs), 32 CTAs/SM, 3 waves: CTA launch cost"),
        ProbeCase("fma_ilp4_t256", "fma_ilp", 256, w(4, 2), trips=4, ctas_per_sm=4,
                  note="4 independent chains per thread, 4 CTAs/SM, 2 waves"),
        ProbeCase("ldg_l2_t256", "ldg", 256, w(8, 1), trips=4, memory="l2", role="calibration",
                  note="coalesced loads from a 16 MiB L2-resident buffer (fits l2_bytes_per_ns)"),
        ProbeCase("ldg_dram_t256", "ldg", 256, w(8, 1), trips=4, memory="dram", role="calibration",
                  note="coalesced loads streamed from DRAM, cold 2 GiB buffer (fits dram_bytes_per_ns)"),
        ProbeCase("fma_dep_bank_t256_w1", "fma_dep_bank", 256, w(8, 1), trips=4, role="calibration",
                  note="as fma_dep_t256_w1 with a register-bank-conflicted FFMA"),
        ProbeCase("fma_dep_bank_t96_w2", "fma_dep_bank", 96, w(21, 2), trips=2,
                  note="as fma_dep_t96_w2 with a register-bank-conflicted FFMA"),
    )


def select(cases: tuple[ProbeCase, ...], names: list[str] | None) -> tuple[ProbeCase, ...]:
    """The cases called `names` (all if None), in suite order; unknown names are an error."""
    if not names:
        return cases
    known = {c.name: c for c in cases}
    for name in names:
        if name not in known:
            raise JaxschedError("cases", name, f"unknown probe case; known: {', '.join(known)}")
    return tuple(c for c in cases if c.name in names)
