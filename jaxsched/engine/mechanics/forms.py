"""Which forms of the step's scatter, gather and minimum the backend runs faster (one switch, so
that a differential test can run the GPU's forms on the CPU)."""

from __future__ import annotations

import jax


def gpu_forms() -> bool:
    """Whether the step uses the forms XLA's GPU backend runs faster, off the CPU: the issuing
    warps' fields written back by a scatter (4 slots per SM) rather than a select over every
    slot, and each scheduler's minimum key as a chain of elementwise minima rather than a
    reduction. On the CPU each scatter is a kernel of its own that costs as much as the select,
    and the chain, fused into each of its consumers, is recomputed there: the whole run took 2.3x
    as long (docs/engine_performance.md, "The H200 step waits on its loops" and "The H200's step, kernel by
    kernel"). Likewise the selected warps' fields are read by a gather off the CPU and by a masked
    sum on it (`warp_scheduler.of_selected`; docs/engine_performance.md, "The CPU step's recomputed values, found
    through a profile without the per-kernel overhead"). Results do not depend on it."""
    return jax.default_backend() != "cpu"
