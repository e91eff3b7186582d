"""A workload made ready for the compiled engine (concrete inputs, before `jit`).

Every launch's kernel is checked as a lone kernel would be, programs are padded to one length
(trailing EXITs change nothing: a warp never passes its EXIT) so the launches stack on one
axis, kernel names are dropped (they are static and would split the stack and the compile
cache), overheads left to the architecture are filled in, and the structure (streams, events,
mode) becomes arrays: one compiled simulation then serves every workload of `L` launches, and
any of them stack into one batch.
"""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float

from ..arch import Arch
from ..errors import check
from ..kernel import Kernel, data_rows, pad_program
from ..lower import Shapes, cta_slots_for, dep_slots, shapes_for, validate_launch
from ..workload import (
    Workload,
    WorkloadLaunch,
    dependency_matrix,
    lower_launches,
    overheads_ns,
    validate_structure,
)


class WorkloadInput(eqx.Module):
    """A workload as the compiled engine takes it: every field traced."""

    kernels: tuple[Kernel, ...]  # padded to one program length, unnamed
    deps: Bool[Array, "launch launch"]
    graph: Bool[Array, ""]  # one cudaGraphLaunch (else one cudaLaunchKernel per launch)
    api_ns: Float[Array, ""]  # the mode's overheads (docs/model.md section 13)
    gap_ns: Float[Array, ""]

    @property
    def n_launches(self) -> int:
        return len(self.kernels)

    def lower(self, tick_mhz: Array) -> WorkloadLaunch:
        grid = jnp.stack([jnp.asarray(k.grid_ctas, jnp.int32) for k in self.kernels])
        return lower_launches(grid, self.deps, self.graph, self.api_ns, self.gap_ns, tick_mhz)


def prepare_workload(workload: Workload, arch: Arch, n_instr: int | None = None) -> WorkloadInput:
    """Checked, padded to `n_instr` instructions (default: the longest program), unnamed,
    overheads filled from `arch`, structure as arrays. `arch` is the caller's to check (`Params`
    does); each launch is checked against it here."""
    check(isinstance(workload, Workload), "workload", type(workload).__name__, "a jaxsched.workload.Workload")
    validate_structure(workload)
    for kernel in workload.kernels:
        validate_launch(arch, kernel)
    n_instr = max(k.n_instr for k in workload.kernels) if n_instr is None else n_instr
    loops = max(np.shape(k.loop_start)[-1] for k in workload.kernels)
    branches = max(np.shape(k.branch_start)[-1] for k in workload.kernels)
    kernels = tuple(pad_program(k, n_instr, loops, branches).replace(name="") for k in workload.kernels)
    api_ns, gap_ns = overheads_ns(workload, arch)
    return WorkloadInput(kernels=kernels, deps=dependency_matrix(workload), graph=np.bool_(workload.mode == "graph"),
                         api_ns=np.float32(api_ns), gap_ns=np.float32(gap_ns))


def workload_shapes(arch: Arch, workload: Workload | WorkloadInput) -> Shapes:
    """Static sizes: the per-CTA trace spans every launch's CTAs."""
    base = shapes_for(arch, workload.kernels[0])
    return dataclasses.replace(base, n_instr=max(k.n_instr for k in workload.kernels),
                               cta_slots=max(cta_slots_for(arch, k) for k in workload.kernels),
                               max_ctas=sum(int(k.grid_ctas) for k in workload.kernels),
                               n_launches=workload.n_launches,
                               data_rows=max(data_rows(k) for k in workload.kernels),
                               dep_slots=max(dep_slots(k) for k in workload.kernels),
                               loops=max(np.shape(k.loop_start)[-1] for k in workload.kernels),
                               branches=max(np.shape(k.branch_start)[-1] for k in workload.kernels))
