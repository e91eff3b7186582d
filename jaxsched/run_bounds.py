"""The lower bounds `jaxsched run` sets a finished run against, and which one binds.

Each holds for every warp and dispatch policy on fixed clocks (docs/bounds.md section 9):

- **issue slots** (`issue_bound.issue_ns`, docs/bounds.md section 7): the instructions, and the
  launch credit of a kernel's refills, over the warp schedulers' issue cycles. For a workload
  the credit is left out (it is counted per kernel), which keeps the bound valid.
- **DRAM bandwidth** and **L2 bandwidth**: every global load adds its bytes to the chip-wide
  DRAM and L2 queues, which drain one tick of work per tick, and a load's result is ready only
  after its latency and the queue's backlog (docs/model.md section 7). So the last load a warp
  waits for is ready no earlier than its latency plus all the bytes over the bandwidth. This
  needs the program to wait for its loads (a `dep` instruction after its last `ldg`, outside
  the if/else): a load nobody waits for may still be queued when the kernel ends, and then no
  bandwidth bound is given.
- **launch** (a workload): the host's launch calls and the launch gaps along the dependencies
  (docs/model.md section 13), as if every kernel took no time.

All are computed in the engine's integer units (ticks, 1/1024-tick queue costs) from the
`Result`'s counts, so they are exact for the model, not estimates.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .isa import Op

if TYPE_CHECKING:
    from .arch import Arch
    from .engine.run import Result
    from .kernel import Kernel
    from .workload import Workload

QUEUE_ONE_TICK = 1024  # lower.QUEUE_ONE_TICK: queue costs in 1/1024 tick
NAMES = {"issue_slots": "issue slots", "dram_bandwidth": "DRAM bandwidth", "l2_bandwidth": "L2 bandwidth",
         "launch": "launch"}


def bounds_ns(result: Result, arch: Arch, item: Kernel | Workload, sm_freq_mhz: np.ndarray) -> dict[str, float]:
    """Every bound that applies to this run (`NAMES`), in ns, largest first. `item` is the kernel
    or workload that ran, on clocks `sm_freq_mhz` (MHz per SM slot)."""
    from .workload import Workload

    kernels = item.kernels if isinstance(item, Workload) else (item,)
    tick_mhz = float(result.tick_mhz)
    out = {"issue_slots": _issue_ns(result, arch, item, sm_freq_mhz)}
    out.update(_memory_ns(result, arch, kernels, tick_mhz))
    if isinstance(item, Workload):
        out["launch"] = _launch_ns(item, arch, tick_mhz)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _issue_ns(result: Result, arch: Arch, item: Kernel | Workload, sm_freq_mhz: np.ndarray) -> float:
    from .issue_bound import IssueDemand, issue_demand, issue_ns
    from .workload import Workload

    if not isinstance(item, Workload):
        return float(issue_ns(issue_demand(result, arch, item), sm_freq_mhz))
    one = issue_demand(result, arch, item.kernels[0])  # the instruction counts are the workload's
    return float(issue_ns(IssueDemand(one.instructions, one.pipe_instructions, one.pipe_interval_cycles,
                                      ctas=np.float32(0), ctas_per_sm=one.ctas_per_sm, credit_cycles=np.float32(0),
                                      schedulers_per_sm=one.schedulers_per_sm), sm_freq_mhz))


def waits_for_loads(kernel: Kernel) -> bool:
    """Whether every warp waits for its last global load: a `dep` instruction (EXIT included)
    follows the program's last `ldg` outside every if/else region."""
    op, dep = np.asarray(kernel.op), np.asarray(kernel.dep)
    loads = np.flatnonzero(op == Op.LDG)
    if loads.size == 0:
        return True
    after = np.arange(loads[-1] + 1, op.size)
    return bool(np.any(dep[after] & ~_conditional(kernel)[after]))


def _conditional(kernel: Kernel) -> np.ndarray:
    """Per instruction, whether it lies inside an if/else region (some warps may skip it)."""
    inside = np.zeros(np.shape(kernel.op)[-1], bool)
    for start, end in zip(np.asarray(kernel.branch_start), np.asarray(kernel.branch_end)):
        inside[max(int(start), 0):max(int(end), 0)] = True
    return inside


def _memory_ns(result: Result, arch: Arch, kernels: tuple, tick_mhz: float) -> dict[str, float]:
    """DRAM and L2 bandwidth bounds (none when no load is issued or one is not waited for): the
    smallest latency of any load plus every load's queue cost. The `Result` counts the loads
    issued, not which instruction issued them: on one kernel whose loads are all outside the
    if/else that is exact (every warp runs its loop body's instructions equally often and the
    rest once), otherwise each load is counted at the cheapest load's cost."""
    loads = int(np.sum(np.asarray(result.sm_issued_op)[..., Op.LDG]))
    if loads == 0 or not all(waits_for_loads(k) for k in kernels):
        return {}
    per_kernel = [_load_costs(k, arch, tick_mhz) for k in kernels if np.any(np.asarray(k.op) == Op.LDG)]
    latency = min(p[0] for p in per_kernel)
    totals = None
    if len(kernels) == 1:
        totals = _exact_totals(kernels[0], loads, *per_kernel[0][1:])
    if totals is None:
        totals = {name: loads * min(float(p[i + 1].min()) for p in per_kernel)
                  for i, name in enumerate(("l2_bandwidth", "dram_bandwidth"))}
    return {name: (latency + total / QUEUE_ONE_TICK) * 1000.0 / tick_mhz for name, total in totals.items() if total > 0}


def _load_costs(kernel: Kernel, arch: Arch, tick_mhz: float) -> tuple[float, np.ndarray, np.ndarray]:
    """A kernel's load latency (ticks) and each load instruction's L2 and DRAM queue costs
    (1/1024 tick), with the lowering's own formulas, dtypes and rounding (lower.py,
    docs/model.md section 3)."""
    ticks_per_ns = tick_mhz / 1000.0
    nbytes = np.asarray(kernel.bytes_per_warp)[np.asarray(kernel.op) == Op.LDG].astype(np.float32)
    miss = np.float32(1.0) - np.float32(kernel.l2_hit_rate)
    l2 = np.maximum(np.round(nbytes * ticks_per_ns / np.float64(arch.l2_bytes_per_ns) * QUEUE_ONE_TICK), 1)
    dram = np.round(nbytes * miss * ticks_per_ns / np.float64(arch.dram_bytes_per_ns) * QUEUE_ONE_TICK)
    latency_ns = np.float32(arch.l2_hit_latency_ns) + miss * (np.float32(arch.dram_latency_ns)
                                                              - np.float32(arch.l2_hit_latency_ns))
    return float(np.round(np.float64(latency_ns) * tick_mhz / 1000.0)), l2, dram


def _exact_totals(kernel: Kernel, loads: int, l2: np.ndarray, dram: np.ndarray) -> dict[str, float] | None:
    """Every load's queue cost summed, from the count of loads issued: each warp runs the
    instructions outside the loop once and every instruction of the loop body equally often.
    None where a load is inside an if/else (how many warps take it is random) or the program
    has several loops."""
    op = np.asarray(kernel.op)
    index = np.flatnonzero(op == Op.LDG)
    if np.any(_conditional(kernel)[index]) or kernel.n_loops > 1:
        return None
    start, end = int(kernel.loop_start[0]), int(kernel.loop_end[0])
    in_loop = (index >= start) & (index <= end) if start >= 0 else np.zeros(index.size, bool)
    warps = int(kernel.grid_ctas) * -(-int(kernel.threads_per_cta) // 32)
    outside = warps * int(np.sum(~in_loop))
    trips, left = divmod(loads - outside, max(int(np.sum(in_loop)), 1))
    if left or trips < 0 or (trips and not in_loop.any()):
        return None
    return {"l2_bandwidth": float(trips * l2[in_loop].sum() + warps * l2[~in_loop].sum()),
            "dram_bandwidth": float(trips * dram[in_loop].sum() + warps * dram[~in_loop].sum())}


def _launch_ns(workload: Workload, arch: Arch, tick_mhz: float) -> float:
    """When the last launch may start if every kernel took no time: launch `l` is ready at
    `max(submit_l, ready of its dependencies) + gap`, in the lowering's rounded ticks."""
    from .workload import overheads_ns

    api_ns, gap_ns = overheads_ns(workload, arch)
    api, gap = (float(np.round(float(x) * tick_mhz / 1000.0)) for x in (api_ns, gap_ns))
    ready: list[float] = []
    for l, deps in enumerate(workload.dependencies()):
        submit = api if workload.mode == "graph" else (l + 1) * api
        ready.append(max([submit, *(ready[d] for d in deps)]) + gap)
    return max(ready) * 1000.0 / tick_mhz
