"""The probe's warp programs imported from the probe kernels' own SASS (`data/h200/sass_work.txt`,
`cuobjdump -sass` of `kernels.py` for sm_90) instead of written by hand (`ProbeCase.program`).

`jaxsched.sass_import` turns each work kernel into a program: the entry barrier, thread 0's start
stamp, the load of the warp's trip count, the trip loop (or, where ptxas unrolled it, the
unrolled loop and its remainder loop), the warp's end stamp, the exit barrier and thread 0's end
stamp. What SASS cannot know comes from the case, as arrays per warp (`[grid, warps_per_cta]`):

- `trips`: the warp's trip count (`ProbeCase.trip_counts`, the simulator's own hash, which the
  hardware run read from its `trips[]` array). An unrolled loop runs `trips // u` times and the
  remainder loop `trips % u` (`u`: FFMAs per SASS loop trip over FFMAs per source trip);
- `stamp`: the lanes of thread 0's stamps (lane 0 of the CTA's warp 0);
- the sink store after the last branch (`@P1 EXIT`: every thread exits, the store never runs)
  falls through for no lane (`0.0`);
- `work`: whether the warp has any trip (`trips > 0`), for a test around both loops;

and every global memory instruction outside the loops touches one 32-byte sector (`sectors`).

The test ptxas puts before each loop (its zero-trip guard) takes the loop's array by default
(`if @trips>0`, docs/sass_import.md rule 6).
"""

from __future__ import annotations

import re

import numpy as np

from ..arch import Arch
from ..errors import check
from ..kernel import Kernel, make_kernel
from ..sass import find_function
from ..sass_import import describe, from_sass, instruction_class, structure
from . import kernels
from .sass import loop_with
from .suite import ProbeCase

# FFMAs per trip of each kernel's source loop: what one SASS loop trip divides by.
_FMAS_PER_TRIP = {"fma_dep": kernels.FMA_UNROLL, "fma_dep_bank": kernels.FMA_UNROLL,
                  "fma_ilp": kernels.ILP_CHAINS * kernels.ILP_UNROLL, "ldg": kernels.LDG_UNROLL}


def _names(listing: str, function: str) -> tuple[list[str], list[str]]:
    """The function's loops (L1, ...) and its branches that are not zero-trip guards, in address
    order (`sass_import.describe`)."""
    text = describe(listing, function)
    loops = re.findall(r"^\s*(L\d+)\s+loop", text, re.M)
    lines = [m.group(0) for m in re.finditer(r"^\s*B\d+\s+if.*$", text, re.M)]
    branches = [line.split()[0] for line in lines if "zero-trip guard" not in line]
    return loops, branches


def _one_sector(listing: str, function: str) -> dict[str, int]:
    """The global memory instructions outside the loops, by address, each touching one 32-byte
    sector: thread 0's and lane 0's stamp stores, the load of the warp's trip count (one address
    for every lane) and the sink store (never run). Counted as 32 coalesced lanes they would add
    about 19 % to the load kernel's bytes."""
    s = structure(find_function(listing, function))
    spans = [(s.instrs[loop.header].addr, s.instrs[loop.latch].addr) for loop in s.loops]
    return {f"0x{ins.addr:04x}": 1 for ins in s.instrs
            if instruction_class(ins) == "ldg" and not any(lo <= ins.addr <= hi for lo, hi in spans)}


def program(case: ProbeCase, listing: str) -> tuple[str, dict[str, np.ndarray]]:
    """`case`'s warp program from its kernel's SASS in `listing`, and the arrays it names."""
    function = f"work_{case.kernel}"
    loops, branches = _names(listing, function)
    body = loop_with(listing, function, "FFMA")
    check(body is not None, f"{function}: loops", loops, "a loop of FFMAs (the trip loop)")
    unroll = body["FFMA"] // _FMAS_PER_TRIP[case.kernel]
    check(len(loops) == (1 if unroll == 1 else 2) and len(branches) in (2, 3), f"{function}: structure",
          f"loops {loops}, branches {branches}", "the trip loop (and a remainder loop where unrolled), thread 0's "
          "two stamps and at most one test around the loops")
    warps = case.warps_per_cta
    trips = case.trip_counts().reshape(case.grid, warps)
    stamp = np.zeros((case.grid, warps), np.int32)
    stamp[:, 0] = 1
    arrays = {"trips": trips // unroll, "stamp": stamp}
    trip_of = {loops[0]: "trips"}
    if unroll > 1:
        arrays["rest"] = trips % unroll
        trip_of[loops[1]] = "rest"
    outcome = {branches[0]: "stamp", branches[-1]: 0.0}
    if len(branches) == 3:
        arrays["work"] = trips > 0
        outcome[branches[1]] = "work"
    text = from_sass(listing, function, trips=trip_of, branches=outcome, sectors=_one_sector(listing, function),
                     comments=False)
    return text, arrays


def kernel(case: ProbeCase, listing: str, arch: Arch, regs: int, pad_to: int | None = None) -> Kernel:
    """The simulator's `Kernel` for `case` from the SASS, as `ProbeCase.sim_kernel` from the
    hand-written program."""
    text, arrays = program(case, listing)
    return make_kernel(text, grid=case.grid, threads=case.threads, regs=regs, smem_bytes=case.smem_bytes(arch),
                       l2_hit_rate=case.l2_hit_rate(), seed=case.seed, name=case.name, pad_to=pad_to, arrays=arrays)
