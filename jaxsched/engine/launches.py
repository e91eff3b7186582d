"""The launches of a workload as the engine reads them (docs/model.md section 13).

Every per-launch number a warp or the dispatcher needs sits in a table with a leading `launch`
axis: each warp slot carries the index of its launch and gathers from these tables. Values
shared by all launches (the chip, the policies) stay in the engine's `Launch`.
With one launch (a plain kernel) every lookup is a static slice, so a single kernel runs the
same operations it always did.
"""

from __future__ import annotations

from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

from ..kernel import WAIT_BITS
from ..lower import Launch, Program, Shapes
from ..workload import WorkloadLaunch
from .state import INF


def instruction_table(program: Program) -> Int[Array, "instr 9"]:
    """Per-instruction fields packed as columns (op, waits, lat, issue_cost64, mio, mem_lat, l2,
    dram, writes)."""
    p = program
    return jnp.stack([p.op, p.waits, p.lat_cycles, p.issue_cost64, p.mio_cost, p.mem_lat_ticks, p.l2_cost, p.dram_cost,
                      p.writes], axis=-1)


class Launches(eqx.Module):
    """Per-launch tables (leading axis `launch`) and the workload's integers."""

    instructions: Int[Array, "launch instr 9"]  # instruction_table of each launch
    op_waits: Int[Array, "launch instr"]  # `op << 24 | waits`: all the per-slot status reads
    loop_start: Int[Array, "launch loop"]
    loop_end: Int[Array, "launch loop"]
    branch_start: Int[Array, "launch branch"]
    branch_mid: Int[Array, "launch branch"]
    branch_end: Int[Array, "launch branch"]
    # each launch's CTA shape and what one CTA holds of an SM (engine/residency.py)
    warps_per_cta: Int[Array, " launch"]
    lanes_last_warp: Int[Array, " launch"]
    cta_reg_share: Int[Array, " launch"]  # warps x Launch.warp_reg_share
    cta_smem_bytes: Int[Array, " launch"]
    n_ctas: Int[Array, " launch"]
    cta_base: Int[Array, " launch"]  # global index g of the launch's CTA 0
    submit_ticks: Int[Array, " launch"]
    gap_ticks: Int[Array, ""]
    deps: Bool[Array, "launch launch"]  # deps[l, d]: l waits for d to complete
    cta_launch: Int[Array, " grid"]  # the launch of global CTA g, -1 past the last CTA

    @property
    def n_launches(self) -> int:
        return int(self.n_ctas.shape[-1])


def _cta_launch(cta_base: Int[Array, " launch"], n_ctas: Int[Array, " launch"], shapes: Shapes) -> Array:
    g = jnp.arange(shapes.max_ctas, dtype=jnp.int32)
    launch = jnp.sum(g[:, None] >= cta_base[None, 1:], axis=1, dtype=jnp.int32)
    return jnp.where(g < jnp.sum(n_ctas), launch, -1)


def make_launches(per: Launch, work: WorkloadLaunch, shapes: Shapes) -> Launches:
    """`per`: the launches' own lowerings stacked on a leading axis (`lower.lower` of each
    kernel at the same tick rate); `work`: the workload-level lowering."""
    instructions = jax.vmap(instruction_table)(per.program)
    return Launches(
        instructions=instructions,
        op_waits=(instructions[..., 0] << WAIT_BITS) | instructions[..., 1],
        loop_start=per.program.loop_start,
        loop_end=per.program.loop_end,
        branch_start=per.program.branch_start,
        branch_mid=per.program.branch_mid,
        branch_end=per.program.branch_end,
        warps_per_cta=per.program.warps_per_cta,
        lanes_last_warp=per.program.lanes_last_warp,
        cta_reg_share=per.program.warps_per_cta * per.program.warp_reg_share,
        cta_smem_bytes=per.program.cta_smem_bytes,
        n_ctas=work.grid_ctas,
        cta_base=work.cta_base,
        submit_ticks=work.submit_ticks,
        gap_ticks=work.gap_ticks,
        deps=work.deps,
        cta_launch=_cta_launch(work.cta_base, work.grid_ctas, shapes),
    )


def single(launch: Launch, shapes: Shapes) -> Launches:
    """One kernel as the workload of one launch with no launch overhead (`simulate(kernel)`)."""
    zero = jnp.zeros((1,), jnp.int32)
    work = WorkloadLaunch(submit_ticks=zero, gap_ticks=jnp.int32(0), deps=jnp.zeros((1, 1), bool),
                          grid_ctas=launch.program.n_ctas[None], cta_base=zero)
    return make_launches(jax.tree.map(lambda x: jnp.asarray(x)[None], launch), work, shapes)


class WarpProgram(NamedTuple):
    """The structure of the program each warp runs, loop or branch axis first: [loop, 1, 1]
    with one launch, else [loop, *warp axes] (docs/model.md section 6 reads these through
    `variation.resolve_pc`)."""

    loop_start: Array
    loop_end: Array
    branch_start: Array
    branch_mid: Array
    branch_end: Array


def warp_program(launches: Launches, warp_launch: Int[Array, "warp sm"]) -> WarpProgram:
    def of_warp(x: Array) -> Array:
        if x.shape[0] == 1:
            return x[0].reshape(x.shape[1:] + (1,) * warp_launch.ndim)
        return jnp.moveaxis(x[warp_launch], -1, 0)

    return WarpProgram(*(of_warp(x) for x in (
        launches.loop_start, launches.loop_end, launches.branch_start, launches.branch_mid,
        launches.branch_end)))


def instruction_fields(launches: Launches, warp_launch: Int[Array, "warp sm"], pc: Int[Array, "warp sm"]) -> Array:
    """The packed instruction-table row (instruction_table) at each warp's pc, from its
    launch's program: [sm, warp, 9]."""
    table = launches.instructions
    return table[0][pc] if table.shape[0] == 1 else table[warp_launch, pc]



def op_and_waits(
    launches: Launches, warp_launch: Int[Array, "warp sm"], pc: Int[Array, "warp sm"]
) -> tuple[Int[Array, "warp sm"], Int[Array, "warp sm"]]:
    """The op class and the dependence slots waited for (bits) at each warp's pc: the only
    instruction fields the per-slot status needs, gathered from the narrow table
    `Launches.op_waits`."""
    table = launches.op_waits
    code = table[0][pc] if table.shape[0] == 1 else table[warp_launch, pc]
    return code >> WAIT_BITS, code & ((1 << WAIT_BITS) - 1)


def initial_ready(launches: Launches) -> Int[Array, " launch"]:
    """Launches without dependencies may start at `submit + gap`; the others are unknown (INF)
    until their dependencies complete."""
    free = ~jnp.any(launches.deps, axis=1)
    return jnp.where(free, launches.submit_ticks + launches.gap_ticks, INF)


def update_ready(
    ready: Int[Array, " launch"], done: Int[Array, " launch"], end: Int[Array, " launch"], launches: Launches
) -> Int[Array, " launch"]:
    """After the CTA completions of a tick: every launch whose ready tick is unknown and whose
    dependencies have all completed gets `max(submit, max_d (end_d + 1)) + gap`."""
    complete = done >= launches.n_ctas
    deps_done = jnp.all(complete[None, :] | ~launches.deps, axis=1)
    after = jnp.max(jnp.where(launches.deps, end[None, :] + 1, 0), axis=1)
    known = jnp.maximum(launches.submit_ticks, after) + launches.gap_ticks
    return jnp.where((ready == INF) & deps_done, known, ready)


def head_launch(
    ready: Int[Array, " launch"], next_cta: Int[Array, " launch"], launches: Launches, tick: Int[Array, ""]
) -> tuple[Bool[Array, ""], Int[Array, ""]]:
    """(whether there is one, which): among launches ready by `tick` with CTAs left to dispatch,
    the smallest (ready tick, launch index) — the GigaThread engine's leftover order."""
    waiting = (ready <= tick) & (next_cta < launches.n_ctas)
    head = jnp.argmin(jnp.where(waiting, ready, INF)).astype(jnp.int32)  # first of equal: lowest l
    return jnp.any(waiting), head


def next_ready_tick(
    ready: Int[Array, " launch"], next_cta: Int[Array, " launch"], launches: Launches, tick: Int[Array, ""]
) -> Int[Array, ""]:
    """A known ready tick after `tick` of a launch with CTAs left: an event (section 13)."""
    pending = (ready > tick) & (ready < INF) & (next_cta < launches.n_ctas)
    return jnp.min(jnp.where(pending, ready, INF))


def per_launch_sum(x: Int[Array, "cta sm"], slot_launch: Int[Array, "cta sm"], n_launches: int) -> Int[Array, " launch"]:
    """Sum of a per-CTA-slot count over the slots of each launch."""
    if n_launches == 1:
        return jnp.sum(x, dtype=jnp.int32)[None]
    return jnp.zeros(n_launches, jnp.int32).at[jnp.clip(slot_launch, 0, n_launches - 1)].add(x)
