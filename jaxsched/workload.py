"""Workloads: several kernel launches on streams, with event dependencies, or as one CUDA graph.

A CUDA program is rarely one kernel. Kernels in one stream run one after another; kernels in
different streams may run at once and share SMs under the GigaThread engine's leftover policy;
`cudaStreamWaitEvent` orders kernels across streams; a CUDA graph submits the same dependency
graph with one call and a smaller per-kernel overhead. docs/model.md section 13 defines the
semantics both engines implement; this module holds the description (`Workload`), its checks,
and the workload-level integers of the lowering (`WorkloadLaunch`). Each launch's kernel is
lowered on its own by `jaxsched.lower.lower`.
"""

from __future__ import annotations

from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from . import tomldoc
from .arch import Arch
from .errors import JaxschedError, check, check_floats, is_traced
from .kernel import Kernel, kernel_from_dict, load_kernel
from .lower import ns_to_ticks

MODES = ("stream", "graph")
MAX_LAUNCHES = 64
OVERHEAD_FIELDS = ("launch_api_ns", "launch_gap_ns", "graph_api_ns", "graph_gap_ns")
MAX_OVERHEAD_NS = 1e6


class Workload(eqx.Module):
    """Launches `l = 0..L-1` in host program order.

    `kernels[l]` runs on stream `streams[l]` after the launches in `after[l]` (event waits) and
    the previous launch of its stream. `mode` is "stream" (one `cudaLaunchKernel` per launch)
    or "graph" (one `cudaGraphLaunch` for all). An overhead left `None` takes the
    architecture's value (`Arch.launch_api_ns` ...). The kernels' numbers and the overheads are
    traced (sweepable); the structure (`L`, streams, dependencies, mode) is static.
    """

    kernels: tuple[Kernel, ...]
    streams: tuple[int, ...] = eqx.field(static=True)
    after: tuple[tuple[int, ...], ...] = eqx.field(static=True)
    mode: str = eqx.field(static=True, default="stream")
    launch_api_ns: Float[Array, ""] | None = None
    launch_gap_ns: Float[Array, ""] | None = None
    graph_api_ns: Float[Array, ""] | None = None
    graph_gap_ns: Float[Array, ""] | None = None

    def __check_init__(self) -> None:
        if all(np.ndim(k.grid_ctas) == 0 and not is_traced(k.grid_ctas) for k in self.kernels):
            validate_structure(self)

    @property
    def n_launches(self) -> int:
        return len(self.kernels)

    def dependencies(self) -> tuple[tuple[int, ...], ...]:
        """Per launch, the earlier launches it waits for: its stream's previous launch and
        `after` (sorted, without repeats)."""
        deps = []
        last_on_stream: dict[int, int] = {}
        for l, stream in enumerate(self.streams):
            d = set(self.after[l])
            if stream in last_on_stream:
                d.add(last_on_stream[stream])
            last_on_stream[stream] = l
            deps.append(tuple(sorted(d)))
        return tuple(deps)


def make_workload(
    kernels: list[Kernel] | tuple[Kernel, ...],
    streams: list[int] | tuple[int, ...] | None = None,
    after: list | tuple | None = None,
    mode: str = "stream",
    **overheads_ns: float,
) -> Workload:
    """A checked `Workload`. `streams` defaults to every launch on stream 0 (a chain);
    `after[l]` lists earlier launches that launch `l` waits for (default none)."""
    kernels = tuple(kernels)
    n = len(kernels)
    check(1 <= n <= MAX_LAUNCHES, "workload.launches", n, f"1 .. {MAX_LAUNCHES} launches")
    streams = tuple(0 for _ in kernels) if streams is None else tuple(streams)
    after = tuple(() for _ in kernels) if after is None else tuple(tuple(a) for a in after)
    check(len(streams) == n, "workload.streams", len(streams), f"one stream per launch ({n})")
    check(len(after) == n, "workload.after", len(after), f"one list per launch ({n})")
    for key in overheads_ns:
        check(key in OVERHEAD_FIELDS, f"workload.{key}", overheads_ns[key], f"one of {OVERHEAD_FIELDS}")
    over = {k: (None if v is None else np.float32(v)) for k, v in overheads_ns.items()}
    workload = Workload(kernels=kernels, streams=tuple(int(s) for s in streams),
                        after=tuple(tuple(int(d) for d in a) for a in after), mode=mode, **over)
    return workload  # validated by Workload.__check_init__


def validate_structure(workload: Workload) -> None:
    """The checks of docs/model.md section 13 that need no architecture (concrete inputs)."""
    n = workload.n_launches
    check(1 <= n <= MAX_LAUNCHES, "workload.launches", n, f"1 .. {MAX_LAUNCHES} launches")
    check(workload.mode in MODES, "workload.mode", workload.mode, f"one of {MODES}")
    for l, stream in enumerate(workload.streams):
        check(0 <= stream < 2**31, f"workload.launch[{l}].stream", stream, "an integer in 0 .. 2^31 - 1")
        for d in workload.after[l]:
            check(0 <= d < l, f"workload.launch[{l}].after", d,
                  f"an earlier launch (0 .. {l - 1}): an event is recorded before it is waited on")
    for key in OVERHEAD_FIELDS:
        value = getattr(workload, key)
        if value is not None:
            check_floats(value, f"workload.{key}", 0.0, MAX_OVERHEAD_NS, f"in [0, {MAX_OVERHEAD_NS:g}] ns")
    check(all(isinstance(k, Kernel) for k in workload.kernels), "workload.kernels",
          [type(k).__name__ for k in workload.kernels], "jaxsched.Kernel launches")
    for l, kernel in enumerate(workload.kernels):
        if n > 1:
            check(not bool(kernel.cooperative), f"workload.launch[{l}].cooperative", True,
                  "a cooperative kernel must be the workload's only launch")
            check(int(kernel.work_items) == 0, f"workload.launch[{l}].work_items", int(kernel.work_items),
                  "a persistent kernel must be the workload's only launch")


def overheads_ns(workload: Workload, arch: Arch) -> tuple[Array, Array]:
    """(api_ns, gap_ns) of the workload's mode: its own values, else the architecture's."""
    pick = lambda key: getattr(arch, key) if getattr(workload, key) is None else getattr(workload, key)  # noqa: E731
    if workload.mode == "graph":
        return pick("graph_api_ns"), pick("graph_gap_ns")
    return pick("launch_api_ns"), pick("launch_gap_ns")


class WorkloadLaunch(eqx.Module):
    """The workload-level integers both engines run on (docs/model.md section 13)."""

    submit_ticks: Int[Array, " launch"]  # when the host's call has submitted launch l
    gap_ticks: Int[Array, ""]  # from "may start" to the first CTA
    deps: Bool[Array, "launch launch"]  # deps[l, d]: launch l waits for launch d to complete
    grid_ctas: Int[Array, " launch"]
    cta_base: Int[Array, " launch"]  # global index of launch l's CTA 0


def lower_workload(workload: Workload, arch: Arch, tick_mhz: Int[Array, ""]) -> WorkloadLaunch:
    """Workload-level lowering at tick rate `tick_mhz` (float64 under `enable_x64`, rounding to
    nearest as section 3). Traceable in the kernels' numbers and the overheads."""
    api_ns, gap_ns = overheads_ns(workload, arch)
    grid = jnp.stack([jnp.asarray(k.grid_ctas, jnp.int32) for k in workload.kernels])
    return lower_launches(grid, dependency_matrix(workload), workload.mode == "graph", api_ns, gap_ns, tick_mhz)


def dependency_matrix(workload: Workload) -> Bool[np.ndarray, "launch launch"]:
    """`deps[l, d]`: launch `l` waits for launch `d` (its stream's previous launch and `after`)."""
    n = workload.n_launches
    deps = np.zeros((n, n), bool)
    for l, ds in enumerate(workload.dependencies()):
        deps[l, list(ds)] = True
    return deps


def lower_launches(
    grid_ctas: Int[Array, " launch"],
    deps: Bool[Array, "launch launch"],
    graph: Bool[Array, ""] | bool,
    api_ns: Float[Array, ""],
    gap_ns: Float[Array, ""],
    tick_mhz: Int[Array, ""],
) -> WorkloadLaunch:
    """`lower_workload` from arrays: the dependencies and the mode may be traced too (one
    compiled simulation serves every workload of `L` launches). `api_ns`, `gap_ns` are the
    mode's overheads."""
    with jax.enable_x64(True):
        api = ns_to_ticks(api_ns, tick_mhz)
        gap = ns_to_ticks(gap_ns, tick_mhz)
        grid = jnp.asarray(grid_ctas, jnp.int32)
        order = jnp.arange(1, grid.shape[-1] + 1, dtype=jnp.int32)
        submit = jnp.where(graph, 1, order) * api  # one graph launch submits every node at once
        base = jnp.cumsum(grid) - grid
        return WorkloadLaunch(submit_ticks=submit, gap_ticks=gap, deps=jnp.asarray(deps),
                              grid_ctas=grid, cta_base=base.astype(jnp.int32))


def single(kernel: Kernel) -> Workload:
    """The workload of one launch with no launch overhead: what `simulate(arch, kernel)` runs."""
    zero = np.float32(0.0)
    return Workload(kernels=(kernel,), streams=(0,), after=((),), mode="stream",
                    launch_api_ns=zero, launch_gap_ns=zero, graph_api_ns=zero, graph_gap_ns=zero)


_LAUNCH_KEYS = ("kernel", "stream", "after")
_WORKLOAD_KEYS = ("mode", "launch", *OVERHEAD_FIELDS)


def workload_from_dict(doc: dict, source: str = "<dict>", base_dir: Path | None = None) -> Workload:
    """A `Workload` from a TOML `[workload]` table: `mode`, optional overheads, and
    `[[workload.launch]]` entries with `kernel` (a kernel file path relative to the TOML file,
    or an inline kernel table), `stream` (default 0) and `after` (default [])."""
    table = doc.get("workload", doc)
    for key in table:
        check(key in _WORKLOAD_KEYS, f"{source}: workload.{key}", table[key], f"unknown key; expected one of {_WORKLOAD_KEYS}")
    launches = table.get("launch", [])
    check(isinstance(launches, list) and len(launches) >= 1, f"{source}: workload.launch", launches,
          "at least one [[workload.launch]] entry")
    kernels, streams, after = [], [], []
    for l, entry in enumerate(launches):
        where = f"{source}: workload.launch[{l}]"
        for key in entry:
            check(key in _LAUNCH_KEYS, f"{where}.{key}", entry[key], f"unknown key; expected one of {_LAUNCH_KEYS}")
        check("kernel" in entry, f"{where}.kernel", None, "required: a kernel file or an inline table")
        spec = entry["kernel"]
        if isinstance(spec, str):
            path = Path(spec) if base_dir is None or Path(spec).is_absolute() else base_dir / spec
            kernels.append(load_kernel(path))
        elif isinstance(spec, dict):
            kernels.append(kernel_from_dict(spec, where, base_dir))
        else:
            raise JaxschedError(f"{where}.kernel", spec, "a kernel file path or an inline table")
        streams.append(entry.get("stream", 0))
        after.append(entry.get("after", []))
        check(isinstance(streams[-1], int), f"{where}.stream", streams[-1], "an integer >= 0")
        check(isinstance(after[-1], list) and all(isinstance(d, int) for d in after[-1]),
              f"{where}.after", after[-1], "a list of earlier launch indices")
    overheads = {k: float(table[k]) for k in OVERHEAD_FIELDS if k in table}
    return make_workload(kernels, streams, after, table.get("mode", "stream"), **overheads)


def load_workload(path: str | Path) -> Workload:
    """Read a workload TOML file (a `[workload]` table; see `examples/`)."""
    return workload_from_dict(tomldoc.read(path, "workload file"), str(path), Path(path).parent)
