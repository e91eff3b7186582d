"""The static sizes a simulation compiles for: the caller's program length and per-CTA trace
length rounded up, so that configurations of similar size share one compilation. Without it a
Python loop over grid sizes, or over kernels whose programs differ by an instruction, compiles
once per value (several seconds each); with it, once per bucket.

The rounding is exact: a padded instruction is an EXIT after the program's own last one, which
no warp fetches, and a padded per-CTA trace entry is never written (the differential tests pad
further still, `tests/helpers.simulate_padded`). Callers cut the trace back to the sizes they
were asked for (`run._trimmed`). Names are dropped too: they are static fields of `Arch` and
`Kernel` that change no number, and a new name would otherwise compile anew.
"""

from __future__ import annotations

import copy
import dataclasses

from ...arch import Arch
from ...kernel import MAX_DEP_SLOTS, Kernel, pad_data, pad_program
from ...structure import MAX_BRANCHES, MAX_LOOPS, padded_count
from ...lower import Shapes
from ..prepare import WorkloadInput

INSTR_QUANTUM = 8  # program lengths round up to a multiple of this


def compiled_shapes(shapes: Shapes) -> Shapes:
    """`shapes` with the program length rounded up to a multiple of `INSTR_QUANTUM` and the
    per-CTA trace to one of four sizes per octave (`quarter_octave`). Neither costs a step
    anything measurable: instructions are fetched by index, and the trace and the per-CTA
    variation table are written once per run and read once per CTA start and end. Programs with
    register dependences get every dependence slot, so that they share one compilation however
    many registers each names (a program without them keeps its one slot). Loop and branch
    entries round up to a power of two (`structure.padded_count`)."""
    max_ctas = quarter_octave(shapes.max_ctas)
    return dataclasses.replace(shapes, n_instr=-(-shapes.n_instr // INSTR_QUANTUM) * INSTR_QUANTUM,
                               max_ctas=max_ctas, data_rows=1 if shapes.data_rows == 1 else max_ctas,
                               dep_slots=1 if shapes.dep_slots == 1 else MAX_DEP_SLOTS,
                               loops=padded_count(shapes.loops, MAX_LOOPS),
                               branches=padded_count(shapes.branches, MAX_BRANCHES))


def quarter_octave(n: int) -> int:
    """The least of 5, 6, 7 or 8 times a power of two that is at least `n` (`n` itself up to 8):
    under 25 % more, so that the per-CTA arrays of a large grid (the variation table holds 32
    entries per CTA per configuration) grow little, and a loop over grids still compiles once
    per bucket."""
    step = 1 << max(0, (n - 1).bit_length() - 3)
    return -(-n // step) * step


def compiled_input(item: Kernel | WorkloadInput, shapes: Shapes) -> Kernel | WorkloadInput:
    """A kernel, or a prepared workload's kernels, padded to `shapes.n_instr` instructions and
    `shapes.loops` loops, `shapes.branches` branches and `shapes.data_rows` rows of data, and
    unnamed."""
    def fit(k: Kernel) -> Kernel:
        return pad_data(pad_program(k, shapes.n_instr, shapes.loops, shapes.branches), shapes.data_rows)

    if isinstance(item, WorkloadInput):
        return dataclasses.replace(item, kernels=tuple(fit(k) for k in item.kernels))
    return _unnamed(fit(item))


def unnamed(arch: Arch) -> Arch:
    return _unnamed(arch)


def _unnamed(module: Arch | Kernel) -> Arch | Kernel:
    """`module` without its name, not checked again: its numbers, checked already, are the same."""
    out = copy.copy(module)
    object.__setattr__(out, "name", "")
    return out
