"""The issue-slot fluid bound: a launch's makespan against its SMs' issue capacity.

`bounds.fluid_ns` spreads the CTAs' *slot occupancy* over the slots. On a chip with launch
credit (docs/model.md sections 7 and 9) that bound is loose by a factor: a freed slot stays empty
until its SM's schedulers have starved long enough, and the slot bound counts the empty slot as
capacity. This bound spreads the launch's *issue demand* over the schedulers instead
(docs/bounds.md section 7). Over a makespan of `T` ns an SM at `f_s` MHz runs at most
`T f_s / 1000` cycles (docs/model.md section 2: `floor((k + 1) f_s / F)` cycles in ticks `0..k`),
and in each cycle each of its `S` schedulers

- issues at most one instruction (`issue_width = 1`, which lowering enforces), and
- earns at most one unit of launch credit, and only in a cycle in which it issues nothing
  (a *starved* scheduler). Each refill of a used CTA slot spends `K = launch_idle_cycles` credit;
  an SM starts with `K` and its `ctas_per_sm` slots take their first CTA free, so at least
  `N - n_on (ctas_per_sm + 1)` of a launch's `N` CTAs are paid for with starved cycles.

So `S sum_s T f_s / 1000 >= I + K max(0, N - n_on (ctas_per_sm + 1))` (`I` instructions issued).
Per pipe class `p` (FMA, ALU, SFU) with issue interval `q_p` cycles, a scheduler's `n` issues to
`p` span at least `(n - 1) q_p` cycles, so `S sum_s T f_s / 1000 >= (I_p - S n_on) q_p`. The bound
is the larger of the two, in ns. Both are valid for every dispatch policy, warp policy and clock
map (fixed clocks: a DVFS run changes `f_s` during the run); `I` and `I_p` are conserved by the
model (every CTA runs once, its warps' paths do not depend on where it runs).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from .arch import Arch
from .engine.run import Result
from .engine.state import N_PIPES
from .errors import check
from .kernel import Kernel
from .occupancy import occupancy


class IssueDemand(eqx.Module):
    """What one launch asks of the warp schedulers, whatever the clocks and the dispatch."""

    instructions: Float[Array, ""]  # warp instructions issued, EXITs included
    pipe_instructions: Float[Array, " pipe"]  # of them, per pipe class (isa.Op 0..2)
    pipe_interval_cycles: Float[Array, " pipe"]  # the pipe's issue interval (lowered to 1/64 cycle)
    ctas: Float[Array, ""]
    ctas_per_sm: Float[Array, ""]
    credit_cycles: Float[Array, ""]  # launch_idle_cycles: starved scheduler-cycles per paid refill
    schedulers_per_sm: int = eqx.field(static=True)


def issue_demand(result: Result, arch: Arch, kernel: Kernel) -> IssueDemand:
    """The demand of `kernel` on `arch`, counted from one finished exact-engine run of it (any
    clocks, any policies: the counts are the same in every run)."""
    check(bool(np.all(np.asarray(result.completed))), "result.completed", False,
          "the run must have finished every CTA")
    issued_op = np.asarray(result.sm_issued_op, np.float64)
    check(issued_op.ndim == 2, "result", f"a batch of shape {issued_op.shape[:-2]}",
          "one configuration (index the batch first)")
    occ = occupancy(arch, kernel.threads_per_cta, kernel.regs_per_thread, kernel.dynamic_smem_bytes,
                    kernel.static_smem_bytes)
    interval64 = np.round(np.asarray(arch.issue_cycles, np.float64)[:N_PIPES] * 64.0)
    return IssueDemand(
        instructions=jnp.asarray(issued_op.sum(), jnp.float32),
        pipe_instructions=jnp.asarray(issued_op.sum(axis=0)[:N_PIPES], jnp.float32),
        pipe_interval_cycles=jnp.asarray(interval64 / 64.0, jnp.float32),
        ctas=jnp.asarray(float(kernel.grid_ctas), jnp.float32),
        ctas_per_sm=jnp.asarray(float(occ.blocks_per_sm), jnp.float32),
        credit_cycles=jnp.asarray(float(arch.cta_launch_idle_cycles), jnp.float32),
        schedulers_per_sm=arch.schedulers_per_sm,
    )


@jax.jit
def issue_ns(demand: IssueDemand, sm_freq_mhz: Float[Array, " sm"] | ArrayLike) -> Float[Array, ""]:
    """The issue-slot fluid bound (ns) of the launch on a chip with these clocks (0: floorswept).

    `jax.vmap` it over clock maps (and demands)."""
    f = jnp.asarray(sm_freq_mhz).astype(jnp.float32)
    n_on = jnp.sum(f > 0).astype(jnp.float32)
    s = float(demand.schedulers_per_sm)
    paid_refills = jnp.maximum(0.0, demand.ctas - n_on * (demand.ctas_per_sm + 1.0))
    issue = demand.instructions + demand.credit_cycles * paid_refills
    pipes = jnp.max(jnp.maximum(0.0, demand.pipe_instructions - s * n_on) * demand.pipe_interval_cycles)
    scheduler_cycles_per_ns = s * jnp.sum(jnp.maximum(f, 0.0)) / 1000.0
    return jnp.maximum(issue, pipes) / scheduler_cycles_per_ns
