"""Counting instructions in `cuobjdump -sass` output: what a timed loop really executes.

ptxas may fuse or rewrite a chain (two dependent integer adds become one IADD3), so latencies
and issue rates divide by the SASS count of the loop body, not by the source's operation count.
"""

from __future__ import annotations

import collections
import re

from ..sass import read_listing

_BACK_BRANCH = re.compile(r"BRA (?:`\(\S+\) )?(0x[0-9a-f]+)")


def functions(sass: str) -> dict[str, list[tuple[int, str]]]:
    """Per function: its instructions as (address, text without predicate)."""
    return {f.name: [(ins.addr, ins.text) for ins in f.instrs] for f in read_listing(sass)}


def opcode(text: str) -> str:
    """The base opcode of an instruction: `FFMA.FTZ R1, ...` -> `FFMA`."""
    return text.split()[0].split(".")[0]


def loop_bodies(instrs: list[tuple[int, str]]) -> list[collections.Counter]:
    """Opcode counts of every loop (a backward branch and the instructions it spans)."""
    loops = []
    for addr, text in instrs:
        m = _BACK_BRANCH.search(text)
        if m and int(m.group(1), 16) <= addr:
            target = int(m.group(1), 16)
            loops.append(collections.Counter(opcode(t) for a, t in instrs if target <= a <= addr))
    return loops


def loop_with(sass: str, function: str, op: str) -> collections.Counter | None:
    """The loop of `function` that holds the most `op` instructions (None if no loop has any)."""
    bodies = [b for b in loop_bodies(functions(sass).get(function, [])) if b[op] > 0]
    return max(bodies, key=lambda b: b[op]) if bodies else None
