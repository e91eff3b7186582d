"""Instruction classes of the simulated warp programs.

Each class stands for a group of SASS instructions that share a pipe and a latency behaviour
(seed 000; Nsight Compute's pipe names). The class index orders the per-class arrays in `Arch`
(`latency_cycles`, `issue_cycles`).
"""

from __future__ import annotations

import enum


class Op(enum.IntEnum):
    """Instruction class; the value indexes the per-class arrays of `Arch`."""

    FMA = 0  # FP32 fused multiply-add (FMA pipe, fixed latency)
    ALU = 1  # integer / logic (ALU pipe, fixed latency)
    SFU = 2  # transcendental (MUFU: quarter-rate pipe, fixed latency)
    LDS = 3  # shared-memory load (MIO queue -> LSU, variable latency: short scoreboard)
    LDG = 4  # global load (LSU -> L1 -> L2 -> DRAM, memory clock domain: long scoreboard)
    SHFL = 5  # warp shuffle (MIO queue, short scoreboard)
    BAR = 6  # __syncthreads(): the CTA's warps wait until all have arrived
    EXIT = 7  # end of the warp's program


N_OPS = len(Op)
OP_NAMES: tuple[str, ...] = tuple(op.name.lower() for op in Op)
