"""Sweeps: a TOML spec of a base configuration, an orthogonal grid of swept values and/or a
random or Latin-hypercube design, run in batched chunks (one compilation for equal shapes),
sharded over the local devices, written chunk by chunk to a resumable zarr store and returned as
a labelled `xarray.Dataset`.

Spec (see `sweeps/demo.toml`, `sweeps/random_design.toml`):

    title = "..."
    arch = "h200"                    # preset name or arch TOML path (relative to the spec)
    kernel = "kernels/fma_ldg.toml"  # kernel TOML path, or an inline [kernel] table
    replicates = 4                   # independent clock-map draws per point
    seed = 0
    chunk = 64                       # configurations per batched call (default: sized to memory)
    cta_trace = false                # true: keep every configuration's per-CTA trace (dim `cta`)
    [engine]  fast_forward = true    # false: step every event (same results; docs/model.md section 11)
    [clocks]  model = "gaussian", mean_ghz = 1.9, sigma = 0.05   # per-SM clock map, see `clock_map`
    [policy]  warp = "gto", dispatch = "hardware", dispatch_start = 0,
              weights = "clocks", ema_alpha = 0.25, ema_prior_ns = 0.0
    [grid]    "policy.warp" = ["lrr", "gto"], "clocks.sigma" = [0.0, 0.1], "kernel.regs" = [...]
    [workload] launches = 16, streams = 1, mode = "stream"    # optional: N launches of the kernel
    [design]  kind = "lhs", samples = 200, seed = 1          # optional; see `sweep_design`
    [design.ranges]   "clocks.sigma" = [0.0, 0.2], "kernel.trips" = [4, 32],
                      "policy.dispatch" = ["hardware", "closed_loop"]
    [design.choices]  "kernel.threads" = [128, 256, 512]

Swept paths (`sweep_paths`): `policy.{warp, dispatch, dispatch_start, weights, ema_alpha,
ema_prior_ns}` (`weights`: the `weighted` policy's per-SM weights, "clocks" = each SM's clock
in MHz or "uniform"; `ema_alpha` in [0, 1] and `ema_prior_ns` in [0, 1e8] drive
`closed_loop`), `clocks.{model, mean_ghz, sigma, sigma_die, corr_length_mm, ir_drop}`,
`kernel.{grid, threads, regs, smem_bytes, static_smem_bytes, trips, cta_spread, warp_spread,
if_probability, l2_hit_rate, seed, threads_fixed_work}` (or the `Kernel` field names) and
`arch.<field>` for every scalar field of `Arch`, `workload.{mode, launch_api_ns, launch_gap_ns,
graph_api_ns, graph_gap_ns}` (with `[workload] launches = N`: the kernel launched N times, launch
l on stream l mod `streams`, docs/model.md section 13; `launches` and `streams` are static and
not swept). The base tables take the same fields.

Validation happens in `load`, before anything runs: every key, path, grid value, design range
end and choice, and then every point (grid point x design sample): a point whose kernel CUDA
would refuse to launch (more threads, registers or shared memory than the chip allows: a CTA
fits on no SM) is *infeasible*: it is kept, not run, its results are NaN (0 for counts), and
`feasible` / `infeasible_reason` say so; a spec whose points are all infeasible is an error,
and so is any other failure of a point (simulator limits, a change of the engine's static
shapes). Replicate r draws its clock map from seed `seed * 1_000_003 + r`, the same for every
point (common random numbers: policies are compared on the same chips).

Grid and design together: the grid is crossed with the design (every grid point runs every
design sample), so grid values are compared on the same sampled configurations; a path may be
in one of them only.

Dataset: one dimension per grid path (dots become underscores: `policy_warp`, `clocks_sigma`),
then, for a design, a `config` dimension (0 .. samples - 1) with one coordinate per sampled path
(`clocks_sigma(config)`, ...), then `replicate`; per-SM variables add `sm` (enabled SMs, with
`sm_x_mm`, `sm_y_mm`, `sm_gpc` coordinates from the floorplan), the stall breakdown adds
`stall_reason`. `feasible` and `infeasible_reason` have the point dimensions (no `replicate`).

Execution
---------
The configurations form an N-d array (grid dimensions x config x replicates). It is cut into
rectangular *chunks* of at most `chunk` configurations, filled from the last dimension
backwards: with shape (2, 4, 4) and chunk 8 a chunk is (1, 2, 4). One chunk is one batched engine
call of a fixed batch size (edge chunks, and chunks with infeasible points, are padded by
repeating their last configuration, so every call reuses one compilation; a chunk of infeasible
points only makes no call); the batch is padded to a multiple of the device count and its
configuration axis is sharded over the devices with
`NamedSharding(Mesh(devices, ("config",)), PartitionSpec("config"))`, each device running its
slice under `shard_map` (no cross-device traffic inside the event loop). Results do not depend on
the chunk size or the number of devices (`tests/test_sharding.py`). Without `chunk`, the chunk is
sized from the devices' free memory and the engine state size (64 per device where the backend
reports no memory, as on CPU).

Output store (file-format decision)
-----------------------------------
`OUT/sweep.zarr` is a zarr (format 2) store holding the *user-facing N-d dataset directly*: the
same dimensions and coordinates as above, so `xarray.open_zarr` gives a dataset on which
`.sel(policy_warp="gto", clocks_sigma=0.1)` and `.to_dataframe()` work. Because a chunk is a
rectangular block of that array, the zarr chunk shape *is* the compute chunk shape: each finished
chunk is one `Dataset.to_zarr(region=...)` write that touches only its own zarr chunk files (zarr
writes each file atomically), so a killed process can never damage a chunk already written and
several hosts never write the same file. The store is created up front as a template of the full
shape (no data files: unwritten chunks read as the fill values, NaN or 0; `feasible` and
`infeasible_reason`, known from the spec, are written with it). A boolean variable `done` (same
dimensions, same chunks) is written after each chunk's data and its SHA-256 checksums, each made
durable (`fsync`) before the next (`sweep_integrity`); `--resume` recomputes exactly the chunks
whose `done` is not set, and those whose data no longer matches its checksums (a truncated or
overwritten file), saying which. A full disk or another I/O error while writing a chunk or the
netCDF is a one-line error that leaves the store valid (the chunk not done). Attributes hold the
spec text, a fingerprint of the resolved spec (arch, kernel, grid, design samples; `--resume`
refuses a store whose fingerprint differs), the chunk shape and the store version. When every
chunk is done and verified, `OUT/sweep.nc` (netCDF4 via h5netcdf, without `done`) is written from
the store. `open_result(path)` opens either (a folder, `.zarr` or `.nc`) and checks completeness;
`jaxsched check` verifies a result (`sweep_check`).

One writer: a run holds `OUT/sweep.lock` while it writes (`sweep_lock`), and a second run on the
same output (the same command twice, a `--resume` while the first is going) is refused with an
error naming the first's pid, host and command.

Several hosts
-------------
Every host runs the same command with `jax.distributed` coordinates; the output folder must be
on a shared filesystem:

    # host 0 (the coordinator), host 1, ... host N-1: same spec, same -o
    jaxsched sweep spec.toml -o /shared/out --coordinator host0:1234 --num-processes N --process-id 0
    jaxsched sweep spec.toml -o /shared/out --coordinator host0:1234 --num-processes N --process-id 1

(`--distributed` instead of the three options lets `jax.distributed.initialize()` read them from
SLURM or another supported cluster environment.) Process 0 creates (or, with `--resume`, checks)
the store; after a barrier every process computes the chunks `i` with
`i % num_processes == process_id` that are not done, on its own local devices (`--devices` picks
a subset), and writes them into the shared store. After a final barrier process 0 writes
`sweep.nc`. A lost host's chunks are picked up by running the same commands with `--resume`.
Process `i` > 0 holds `OUT/sweep.lock.<i>` (two hosts given the same `--process-id` are refused);
the shared filesystem's locks must be coherent between the hosts (`sweep_lock`).

Testing aid: `JAXSCHED_SWEEP_THROTTLE_S` (seconds) sleeps after each recorded chunk, so that the
resume test can kill a sweep between chunks deterministically.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import math
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Callable, Iterator, NamedTuple, Sequence

import jax
import numpy as np
import xarray as xr
import zarr
from . import __version__, archio, clocks, dvfs, freqmap, presets, tomldoc
from . import sweep_design, sweep_integrity, sweep_lock, sweep_paths
from .arch import Arch
from .engine.fast_forward import may_fast_forward
from .engine.run import Result, any_dvfs, simulate_batch
from .engine.state import STALL_REASONS
from .errors import JaxschedError, check, os_error
from .dvfs import Dvfs, validate_dvfs
from .kernel import Kernel, kernel_from_dict, load_kernel, pad_program
from .lower import DISPATCH_POLICIES, WARP_POLICIES, cta_slots_for, shapes_for, validate
from .policies import ESTIMATE_DISPATCH
from .occupancy import check_launch, occupancy
from .sweep_design import CONFIG_DIM, Design, design_coords
from .sweep_paths import Point
from .workload import OVERHEAD_FIELDS, Workload, make_workload

_TOP_KEYS = ("title", "arch", "kernel", "kernels", "replicates", "seed", "chunk", "cta_trace", "engine", "grid",
             "design") + sweep_paths.TABLES
_ENGINE_KEYS = ("fast_forward",)
_LAUNCH_GROUPS = ("arch", "kernel")  # the path groups that decide whether a point can launch
REPLICATE_STRIDE = 1_000_003  # replicate r of seed s draws its chip from seed s x REPLICATE_STRIDE + r
MAX_SEED = 2**31 - 1  # a 32-bit seed, as the kernel's and DVFS's: its replicates' seeds fit 64 bits
# The resume record, the feasibility of every point and a design's draws are held in memory, one
# entry per configuration or point: 10^8 configurations take a few GB of host memory.
MAX_CONFIGS = 10**8


@dataclasses.dataclass(frozen=True)
class Sweep:
    """A parsed, validated sweep: the base point, the grid, the design, and per point (grid
    dimensions x design samples) whether it can launch."""

    title: str
    text: str
    base: Point
    grid: dict[str, list]
    design: Design | None
    replicates: int
    seed: int
    chunk: int | None  # configurations per batched call; None: sized to device memory
    cta_trace: bool  # keep the per-CTA trace (SM, start, end, launch) of every configuration
    fast_forward: bool  # the engine jumps recurring steady state (results are the same either way)
    feasible: np.ndarray  # bool, point shape
    infeasible_reason: np.ndarray  # str, point shape ("" where feasible)
    max_grid_ctas: int  # the largest grid of any feasible point (sizes the engine state)
    max_cta_slots: int  # the largest occupancy (CTAs per SM) of any feasible point (sizes it too)

    @property
    def arch(self) -> Arch:
        return self.base["arch"]

    @property
    def kernel(self) -> Kernel:
        return self.base["kernel"]

    @property
    def point_shape(self) -> tuple[int, ...]:
        return tuple(len(v) for v in self.grid.values()) + ((self.design.samples,) if self.design else ())

    @property
    def n_configs(self) -> int:
        return math.prod(self.point_shape) * self.replicates

    def assignments(self, index: Sequence[int]) -> list[tuple[str, object]]:
        """(path, value) pairs of the point at `index` (grid indices, then the sample)."""
        pairs = [(path, values[i]) for (path, values), i in zip(self.grid.items(), index)]
        if self.design:
            pairs += [(path, v[index[-1]].item()) for path, v in self.design.values.items()]
        return pairs

    def point(self, index: Sequence[int]) -> dict:
        return sweep_paths.assign_all(self.base, self.assignments(index), _point_label(self, index))


def load(path: str | Path) -> Sweep:
    p = Path(path)
    return loads(tomldoc.read_text(p, "sweep spec"), base_dir=p.parent, source=str(p))


def loads(text: str, base_dir: Path = Path("."), source: str = "<spec>") -> Sweep:
    """Parse and validate a spec (module docstring); every point is checked, nothing runs."""
    doc = tomldoc.parse(text, source)
    for key in doc:
        check(key in _TOP_KEYS, f"{source}: {key}", doc[key], f"unknown key; expected one of {_TOP_KEYS}")
    arch_spec = str(doc.get("arch", "h200"))
    arch = (archio.load(base_dir / arch_spec) if arch_spec.endswith(".toml") else presets.get(arch_spec))
    check("kernel" in doc, f"{source}: kernel", None, "required (a kernel TOML path or a [kernel] table)")
    kspec = doc["kernel"]
    kernel = (kernel_from_dict(kspec, source, base_dir) if isinstance(kspec, dict) else load_kernel(base_dir / kspec))
    variants = _kernel_variants(doc, kernel, base_dir, source)
    every = [kernel, *variants.values()]
    n_instr = max(k.n_instr for k in every)
    loops, branches = (max(np.shape(getattr(k, f))[-1] for k in every) for f in ("loop_start", "branch_start"))
    variants = {name: pad_program(k, n_instr, loops, branches) for name, k in variants.items()}
    base = {"arch": arch, "kernel": pad_program(kernel, n_instr, loops, branches), sweep_paths.VARIANTS: variants}
    for name in sweep_paths.TABLES:
        base[name] = sweep_paths.GROUPS[name].base(doc.get(name, {}), arch, f"{source}: {name}")
    seed = doc.get("seed", 0)
    check(isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed <= MAX_SEED, f"{source}: seed", seed,
          f"an integer in 0 .. {MAX_SEED} (replicate r draws its chip from seed x {REPLICATE_STRIDE} + r)")
    replicates = doc.get("replicates", 1)
    check(isinstance(replicates, int) and not isinstance(replicates, bool) and 1 <= replicates <= MAX_CONFIGS,
          f"{source}: replicates", replicates, f"an integer in 1 .. {MAX_CONFIGS}")
    chunk = doc.get("chunk")
    check(chunk is None or (isinstance(chunk, int) and not isinstance(chunk, bool) and chunk >= 1),
          f"{source}: chunk", chunk, "an integer >= 1")
    cta_trace = doc.get("cta_trace", False)
    check(isinstance(cta_trace, bool), f"{source}: cta_trace", cta_trace, "true or false")
    fast_forward = _engine_options(doc.get("engine", {}), source)
    grid = _parse_grid(doc.get("grid", {}), base, source)
    design = None
    if "design" in doc:
        design = sweep_design.parse(
            doc["design"], default_seed=seed, max_samples=MAX_CONFIGS, where=f"{source}: design",
            kind_of=lambda path, value, where: sweep_paths.kind(base, path, where, value),
            check_value=lambda path, value, where: sweep_paths.assign(base, path, value, where))
    n_configs = math.prod(len(v) for v in grid.values()) * (design.samples if design else 1) * replicates
    check(n_configs <= MAX_CONFIGS, f"{source}: configurations", n_configs,
          f"at most {MAX_CONFIGS} (grid points x design samples x replicates): split the sweep")
    swept = [(f"grid.{p}", p) for p in grid] + [(f"design.{f.path}", f.path) for f in (design.factors if design else ())]
    _check_distinct_paths(base, swept, source)
    partial = Sweep(title=str(doc.get("title", source)), text=text, base=base, grid=grid, design=design,
                    replicates=replicates, seed=seed, chunk=chunk, cta_trace=cta_trace, fast_forward=fast_forward, feasible=np.ones((), bool),
                    infeasible_reason=np.asarray(""),
                    max_grid_ctas=int(kernel.grid_ctas) * max(1, base["workload"]["launches"]),
                    max_cta_slots=int(arch.max_blocks_per_sm))
    _check_dvfs(partial, source)
    feasible, reasons, max_grid, max_slots = _check_points(partial, source)
    return dataclasses.replace(partial, feasible=feasible, infeasible_reason=reasons, max_grid_ctas=max_grid,
                               max_cta_slots=max_slots)


def _engine_options(table: object, source: str) -> bool:
    """The `[engine]` table: `fast_forward` (default true)."""
    check(isinstance(table, dict), f"{source}: engine", table, "a table")
    for key in table:
        check(key in _ENGINE_KEYS, f"{source}: engine.{key}", table[key], f"unknown key; expected one of {_ENGINE_KEYS}")
    value = table.get("fast_forward", True)
    check(isinstance(value, bool), f"{source}: engine.fast_forward", value, "true or false")
    return value


def _kernel_variants(doc: dict, kernel: Kernel, base_dir: Path, source: str) -> dict[str, Kernel]:
    """The spec's `[kernels]` (name -> kernel TOML path or inline table) for `kernel.variant`,
    every program padded to one length so that they share one compilation."""
    table = doc.get("kernels", {})
    check(isinstance(table, dict), f"{source}: kernels", table, "a table of name = kernel TOML path or table")
    loaded = {name: (kernel_from_dict(v, f"{source}: kernels.{name}", base_dir) if isinstance(v, dict)
                     else load_kernel(base_dir / str(v))) for name, v in table.items()}
    n = max([k.n_instr for k in loaded.values()] + [kernel.n_instr])
    return {name: pad_program(k, n) for name, k in loaded.items()}


def _parse_grid(grid: object, base: Point, source: str) -> dict[str, list]:
    check(isinstance(grid, dict), f"{source}: grid", grid, 'a table of "path" = [values]')
    for path, values in grid.items():
        where = f"{source}: grid.{path}"
        check(isinstance(values, list) and len(values) > 0, where, values, "a non-empty list of values")
        for v in values:
            sweep_paths.assign(base, path, v, where)
    return dict(grid)


def _check_distinct_paths(base: Point, swept: list[tuple[str, str]], source: str) -> None:
    """No field is set by two swept paths (aliases and derived paths included); `swept` holds
    (where in the spec, path) pairs."""
    seen: dict[str, str] = {}
    for label, path in swept:
        for target in sweep_paths.writes(sweep_paths.canonical(base, path, f"{source}: {label}")):
            check(target not in seen, f"{source}: {label}", path,
                  f"sets {target}, which {seen.get(target)} also sets; sweep each field in one place")
            seen[target] = label


def _point_label(sweep: Sweep, index: Sequence[int]) -> str:
    """A point for error messages: its grid values, its design sample and that sample's values."""
    label = ", ".join(f"{p}={v!r}" for p, v in sweep.assignments(index))
    where = f"design sample {index[-1]}" if sweep.design else ("grid point" if sweep.grid else "base point")
    return f"{where} ({label})" if label else where


def _launch_refusal(arch: Arch, kernel: Kernel) -> str | None:
    """Why CUDA would refuse this launch (resources beyond the chip's limits), or None."""
    try:
        check_launch(arch, kernel.threads_per_cta, kernel.regs_per_thread, kernel.dynamic_smem_bytes,
                     kernel.static_smem_bytes)
    except JaxschedError as exc:
        return str(exc)
    occ = occupancy(arch, kernel.threads_per_cta, kernel.regs_per_thread, kernel.dynamic_smem_bytes,
                    kernel.static_smem_bytes)
    if int(occ.blocks_per_sm) == 0:
        return (f"{int(kernel.threads_per_cta)} threads x {int(kernel.regs_per_thread)} registers: a CTA "
                f"fits on no SM of {arch.name} (limited by {', '.join(occ.limiters())})")
    return None


def _static_shapes(arch: Arch, kernel: Kernel):
    """The sizes every point must share: the CTA trace and the CTA slots are padded to the
    sweep's largest (`max_grid_ctas`, `max_cta_slots`)."""
    return dataclasses.replace(shapes_for(arch, kernel), max_ctas=0, cta_slots=0)


def _dvfs_settings(sweep: Sweep, source: str) -> Iterator[tuple[str, Callable[[], Dvfs]]]:
    """Each distinct `[dvfs]` setting of the sweep: (where, its Dvfs), built lazily so that a
    caller can catch its error."""
    swept = [p for p in list(sweep.grid) + [f.path for f in (sweep.design.factors if sweep.design else ())]
             if p.startswith("dvfs.")]
    seen = set()
    for index in np.ndindex(*sweep.point_shape):
        key = tuple((p, v) for p, v in sweep.assignments(index) if p in swept)
        if key not in seen:
            seen.add(key)
            where = f"{source}: {_point_label(sweep, index)}"
            point = sweep_paths.assign_all(sweep.base, key, where)
            yield where, lambda point=point: dvfs_params(sweep.arch, point["dvfs"], sweep.seed)


def uses_dvfs(sweep: Sweep) -> bool:
    """Whether any configuration runs DVFS: then every chunk compiles the DVFS step, so that the
    sweep compiles once (`simulate_batch`'s `dvfs_step`)."""
    return any(any_dvfs(make()) for _, make in _dvfs_settings(sweep, "sweep"))


def uses_closed_loop(sweep: Sweep) -> bool:
    """Whether any configuration dispatches by a policy that reads the closed loop's estimates
    (`policies.ESTIMATE_DISPATCH`): then every chunk compiles its learning, so that the sweep
    compiles once (`simulate_batch`'s `closed_loop_step`)."""
    path = "policy.dispatch"
    if path in sweep.grid:
        values = list(sweep.grid[path])
    elif sweep.design and path in sweep.design.values:
        values = list(sweep.design.values[path])
    else:
        values = [sweep.base["policy"]["dispatch"]]
    return any(v in ESTIMATE_DISPATCH for v in values)


def _check_dvfs(sweep: Sweep, source: str) -> None:
    """Every distinct `[dvfs]` setting of the sweep is a valid combination (before any compute)."""
    for where, make in _dvfs_settings(sweep, source):
        try:
            validate_dvfs(make())
        except JaxschedError as exc:
            raise JaxschedError(f"{where}: {exc.field}", exc.value, exc.limit) from None


def _check_points(sweep: Sweep, source: str) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Feasibility and reason of every point, the largest feasible grid and occupancy; raises for
    a point that fails otherwise.

    Only the `_LAUNCH_GROUPS` paths matter here (less `sweep_paths.VALUE_ONLY`), so points are
    checked once per distinct assignment of those (a grid over policies and clocks is checked
    once).
    """
    shape = sweep.point_shape
    swept = list(sweep.grid) + [f.path for f in (sweep.design.factors if sweep.design else ())]
    relevant = {p for p in swept if p.split(".", 1)[0] in _LAUNCH_GROUPS
                and sweep_paths.canonical(sweep.base, p, source) not in sweep_paths.VALUE_ONLY}
    feasible = np.ones(shape, dtype=bool)
    reasons = np.full(shape, "", dtype=object)
    shapes0 = _static_shapes(sweep.arch, sweep.kernel)
    checked: dict[tuple, str | None] = {}
    max_grid, max_slots = 1, 1
    for index in np.ndindex(*shape):
        key = tuple((p, v) for p, v in sweep.assignments(index) if p in relevant)
        if key not in checked:
            label = _point_label(sweep, index)
            point = sweep_paths.assign_all(sweep.base, key, f"{source}: {label}")
            arch, kernel = point["arch"], point["kernel"]
            refusal = _launch_refusal(arch, kernel)
            if refusal is None:
                try:
                    validate(arch, kernel, clocks.uniform(arch))
                    launched(kernel, point["workload"])  # the workload's own checks
                except JaxschedError as exc:
                    raise JaxschedError(f"{source}: {label}: {exc.field}", exc.value, exc.limit) from None
                got = _static_shapes(arch, kernel)
                changed = [f"{f.name} {getattr(shapes0, f.name)} -> {getattr(got, f.name)}"
                           for f in dataclasses.fields(got) if getattr(got, f.name) != getattr(shapes0, f.name)]
                check(not changed, f"{source}: {label}", "; ".join(changed),
                      "changes the engine's static array sizes; every configuration of a sweep must share them")
                max_grid = max(max_grid, int(kernel.grid_ctas) * max(1, sweep.base["workload"]["launches"]))
                max_slots = max(max_slots, cta_slots_for(arch, kernel))
            checked[key] = refusal
        if checked[key] is not None:
            feasible[index], reasons[index] = False, checked[key]
    check(bool(feasible.any()), f"{source}: every point", str(reasons.flat[0]),
          "no configuration of this sweep can launch")
    return feasible, reasons.astype(str), max_grid, max_slots


class Config(NamedTuple):
    """One configuration, ready for the engine."""

    index: tuple[int, ...]  # point index: grid dimensions..., design sample
    replicate: int
    arch: Arch
    kernel: Kernel
    clocks: clocks.Clocks
    warp_policy: int
    dispatch: int
    dispatch_start: int
    dispatch_weight: np.ndarray | None  # None: the SM clocks in MHz
    ema_alpha: float
    ema_prior_ns: float
    dvfs: Dvfs


def engine_config(sweep: Sweep, point: Point, index: tuple[int, ...], replicate: int) -> Config:
    """The engine inputs of one point and replicate (the place where swept groups reach the
    engine call)."""
    arch, policy = point["arch"], point["policy"]
    weight = None if policy["weights"] == "clocks" else np.ones(arch.n_sm_slots, dtype=np.int32)
    return Config(
        index=tuple(index), replicate=replicate, arch=arch, kernel=launched(point["kernel"], point["workload"]),
        clocks=clock_map(arch, point["clocks"], sweep.seed * REPLICATE_STRIDE + replicate),
        warp_policy=WARP_POLICIES.index(policy["warp"]), dispatch=DISPATCH_POLICIES.index(policy["dispatch"]),
        dispatch_start=policy["dispatch_start"], dispatch_weight=weight, ema_alpha=policy["ema_alpha"],
        ema_prior_ns=policy["ema_prior_ns"],
        dvfs=dvfs_params(arch, point["dvfs"], sweep.seed * REPLICATE_STRIDE + replicate))


def launched(kernel: Kernel, table: dict) -> Kernel | Workload:
    """The point's kernel, or with `[workload] launches = N` a workload of N launches of it
    (launch `l` with seed `seed + l` on stream `l mod streams`; sweep_paths.WorkloadGroup)."""
    if table["launches"] == 0:
        return kernel
    n, seed = table["launches"], int(kernel.seed)
    kernels = [kernel.replace(seed=np.asarray(seed + l, np.asarray(kernel.seed).dtype)) for l in range(n)]
    overheads = {key: table[key] for key in OVERHEAD_FIELDS}
    return make_workload(kernels, [l % table["streams"] for l in range(n)], None, table["mode"], **overheads)


def dvfs_params(arch: Arch, table: dict, seed: int) -> Dvfs:
    """The `Dvfs` of one replicate: the `[dvfs]` values, plus a run-to-run draw (initial
    temperature, clock, controller phase, noise seed) from `seed` if `run_to_run`."""
    fields = {k: v for k, v in table.items() if k != "run_to_run" and not k.startswith("r2r_")}
    base = dvfs.default(arch, **fields)
    if not table["run_to_run"]:
        return base
    (drawn,) = dvfs.run_to_run(arch, base, seed, 1, temp_c=(table["r2r_temp_min_c"], table["r2r_temp_max_c"]),
                               clock_mhz=(table["r2r_clock_min_mhz"], table["r2r_clock_max_mhz"]))
    return drawn


def point_configs(sweep: Sweep, points: Sequence[tuple[int, ...]], replicates: Sequence[int]) -> list[Config]:
    """The configurations of the feasible `points` x `replicates`, in that (C) order."""
    out = []
    for index in points:
        if sweep.feasible[index]:
            point = sweep.point(index)
            out.extend(engine_config(sweep, point, index, r) for r in replicates)
    return out


def configurations(sweep: Sweep) -> Iterator[Config]:
    """Every configuration that runs (feasible points), in C order over (points..., replicate)."""
    for index in np.ndindex(*sweep.point_shape):
        yield from point_configs(sweep, [index], range(sweep.replicates))


def clock_map(arch: Arch, clk: dict, seed: int) -> clocks.Clocks:
    """The per-SM clock map of one replicate.

    `gaussian`: independent per-SM clocks, `mean (1 + sigma z)`, capped at boost.
    `variation`: `freqmap.process_variation` (spatially correlated within-die part `sigma`,
    die-to-die part `sigma_die`, correlation length `corr_length_mm`), times the IR-drop factor
    if `ir_drop`, floored to the arch's clock bins and capped at the boost clock.
    """
    if clk["model"] == "gaussian":
        return clocks.gaussian(arch, seed, clk["mean_ghz"], clk["sigma"])
    mhz = freqmap.process_variation(
        jax.random.key(seed), arch, mean_mhz=clk["mean_ghz"] * 1000.0, sigma_within=clk["sigma"],
        sigma_die=clk["sigma_die"], corr_length_mm=clk["corr_length_mm"])
    factors = (freqmap.ir_factor(arch),) if clk["ir_drop"] else ()
    boost = float(arch.boost_clock_ghz) * 1000.0
    return freqmap.to_clocks(arch, freqmap.combine(arch, mhz, *factors, cap_mhz=boost))


# ----------------------------------------------------------------------------- layout

STORE = "sweep.zarr"
NETCDF = "sweep.nc"
STORE_VERSION = 2  # 2: per-chunk checksums (sweep_integrity)
THROTTLE_ENV = "JAXSCHED_SWEEP_THROTTLE_S"
_CPU_CHUNK_PER_DEVICE = 64  # when the backend reports no memory figures
_MAX_CHUNK_PER_DEVICE = 4096


def dim_name(path: str) -> str:
    """The dataset name of a swept path: dots become underscores."""
    return path.replace(".", "_")


def point_dims(sweep: Sweep) -> tuple[str, ...]:
    """Dimensions of the points: one per grid path, then `config` for a design."""
    return tuple(dim_name(k) for k in sweep.grid) + ((CONFIG_DIM,) if sweep.design else ())


def sweep_dims(sweep: Sweep) -> tuple[str, ...]:
    """Dataset dimensions of the configuration array: the point dimensions, then `replicate`."""
    return point_dims(sweep) + ("replicate",)


def block_shape(shape: Sequence[int], chunk: int) -> tuple[int, ...]:
    """The rectangular chunk of at most `chunk` configurations, filled from the last dimension."""
    block, budget = [], max(int(chunk), 1)
    for size in reversed(shape):
        b = max(1, min(size, budget))
        block.append(b)
        budget = max(1, budget // b)
    return tuple(reversed(block))


@dataclasses.dataclass(frozen=True)
class Layout:
    """The configuration array (grid dimensions x config x replicate) cut into rectangular chunks."""

    dims: tuple[str, ...]
    shape: tuple[int, ...]
    block: tuple[int, ...]

    @property
    def n_configs(self) -> int:
        return math.prod(self.shape)

    @property
    def chunk_grid(self) -> tuple[int, ...]:
        return tuple(-(-s // b) for s, b in zip(self.shape, self.block))

    @property
    def n_chunks(self) -> int:
        return math.prod(self.chunk_grid)

    @property
    def chunk_size(self) -> int:
        return math.prod(self.block)

    def chunk_index(self, i: int) -> tuple[int, ...]:
        """Position of chunk `i` on the chunk grid (C order): its zarr chunk key."""
        return tuple(int(j) for j in np.unravel_index(i, self.chunk_grid))

    def region(self, i: int) -> tuple[slice, ...]:
        """Index slices of chunk `i` (C order over the chunk grid)."""
        return tuple(slice(j * b, min((j + 1) * b, s))
                     for j, b, s in zip(self.chunk_index(i), self.block, self.shape))

    def describe(self, i: int) -> str:
        """Chunk `i` for messages: its index ranges ("chunk 3 (policy_warp[1], replicate[0:2])")."""
        ranges = [f"{d}[{r.start}]" if r.stop - r.start == 1 else f"{d}[{r.start}:{r.stop}]"
                  for d, r in zip(self.dims, self.region(i))]
        return f"chunk {i} ({', '.join(ranges)})"

    def count(self, i: int) -> int:
        return math.prod(s.stop - s.start for s in self.region(i))

    def done_chunks(self, done: np.ndarray) -> np.ndarray:
        """Per chunk: every configuration in it is done."""
        full = tuple(g * b for g, b in zip(self.chunk_grid, self.block))
        padded = np.ones(full, dtype=bool)
        padded[tuple(slice(0, s) for s in self.shape)] = done
        split = padded.reshape([x for g, b in zip(self.chunk_grid, self.block) for x in (g, b)])
        return split.all(axis=tuple(range(1, 2 * len(self.shape), 2))).reshape(-1)


def make_layout(sweep: Sweep, chunk: int) -> Layout:
    shape = sweep.point_shape + (sweep.replicates,)
    return Layout(sweep_dims(sweep), shape, block_shape(shape, chunk))


def chunk_configs(sweep: Sweep, layout: Layout, i: int) -> list[Config]:
    """The configurations of chunk `i` that run (feasible points), in C order over its region."""
    *points, reps = layout.region(i)
    indices = [tuple(int(j) for j in ix) for ix in np.ndindex(*(s.stop - s.start for s in points))]
    starts = [s.start for s in points]
    return point_configs(sweep, [tuple(a + b for a, b in zip(ix, starts)) for ix in indices],
                         range(reps.start, reps.stop))


# ----------------------------------------------------------------------------- devices


def select_devices(spec: str | int | None = None) -> list:
    """Local devices: all (None or "all"), the first N ("N"), or indices ("0,2", "4:8")."""
    local = jax.local_devices()
    if spec is None or str(spec).strip().lower() in ("", "all"):
        return local
    text = str(spec).strip()
    picked: list[int] = []
    try:
        if "," not in text and ":" not in text:
            n = int(text)
            check(1 <= n <= len(local), "--devices", spec, f"a count between 1 and the {len(local)} local devices")
            return local[:n]
        for part in filter(None, text.split(",")):
            if ":" in part:
                a, _, b = part.partition(":")
                picked.extend(range(int(a or 0), int(b) if b else len(local)))
            else:
                picked.append(int(part))
    except JaxschedError:
        raise
    except ValueError:
        raise JaxschedError("--devices", spec, "a count N, or device indices like 0,2 or 4:8") from None
    check(len(picked) > 0 and len(set(picked)) == len(picked) and all(0 <= j < len(local) for j in picked),
          "--devices", spec, f"distinct indices of the {len(local)} local devices")
    return [local[j] for j in picked]


class Runner:
    """Runs batches of configurations on local devices, sharded over them when more than one."""

    def __init__(self, devices: Sequence | None = None, dvfs_step: bool | None = None,
                 cta_slots: int | None = None, max_ctas: int | None = None, closed_loop_step: bool | None = None,
                 fast_forward_step: bool = True):
        self.devices = list(devices) if devices else jax.local_devices()
        # simulate_batch's; None decides per batch. A sweep fixes them so that it compiles once.
        self.dvfs_step, self.cta_slots, self.max_ctas = dvfs_step, cta_slots, max_ctas
        self.closed_loop_step, self.fast_forward_step = closed_loop_step, fast_forward_step

    def batch_size(self, n: int) -> int:
        """`n` rounded up to a multiple of the device count."""
        d = len(self.devices)
        return -(-n // d) * d

    def describe(self) -> str:
        d = self.devices[0]
        kinds = sorted({x.device_kind for x in self.devices})
        return (f"{len(self.devices)} x {d.platform} ({', '.join(kinds)})"
                + (f", process {jax.process_index()} of {jax.process_count()}" if jax.process_count() > 1 else ""))

    def __call__(self, configs: list[Config], batch: int) -> Result:
        n = len(configs)
        padded = configs + configs[-1:] * (batch - n)
        col = {name: [getattr(c, name) for c in padded] for name in Config._fields}
        args = [col[name] for name in ("arch", "kernel", "clocks", "warp_policy", "dispatch", "dispatch_start")]
        kwargs = dict(dispatch_weight=col["dispatch_weight"], ema_alpha=np.asarray(col["ema_alpha"]),
                      ema_prior_ns=np.asarray(col["ema_prior_ns"]), dvfs=col["dvfs"],
                      dvfs_step=self.dvfs_step, closed_loop_step=self.closed_loop_step,
                      cta_slots=self.cta_slots, max_ctas=self.max_ctas, devices=self.devices,
                      fast_forward_step=self.fast_forward_step)
        result = simulate_batch(*args, **kwargs)
        return jax.tree.map(lambda x: x[:n], result)


def runner_for(sweep: Sweep, devices: Sequence | None) -> Runner:
    """The runner of a sweep: static engine options fixed for all its chunks (one compilation)."""
    kernels = [sweep.kernel, *sweep.base[sweep_paths.VARIANTS].values()]
    uses_ff = sweep.fast_forward and (any(may_fast_forward(k) for k in kernels) or _sweeps_loops(sweep))
    return Runner(devices, uses_dvfs(sweep), sweep.max_cta_slots, sweep.max_grid_ctas, uses_closed_loop(sweep),
                  uses_ff)


def _sweeps_loops(sweep: Sweep) -> bool:
    """Whether a swept kernel path could give a point fast-forward can use where the base kernel
    has none (trip counts): then every chunk compiles it in (it is exact either way)."""
    loops = ("kernel.trips", "kernel.cta_spread", "kernel.warp_spread", "kernel.trips_cta_spread",
             "kernel.trips_warp_spread")
    swept = list(sweep.grid) + (list(sweep.design.values) if sweep.design else [])
    return any(p in loops for p in swept)


def auto_chunk(sweep: Sweep, devices: Sequence) -> int:
    """Configurations per chunk that fit the devices' free memory (heuristic: 8 x the engine
    state per configuration in half the free memory), at most 4096 per device; 64 per device
    where the backend reports no memory figures (CPU)."""
    per_device = _CPU_CHUNK_PER_DEVICE
    try:
        stats = [d.memory_stats() for d in devices]
        if all(s and "bytes_limit" in s for s in stats):
            free = min(s["bytes_limit"] - s.get("bytes_in_use", 0) for s in stats)
            per_device = int(0.5 * free // _bytes_per_config(sweep))
    except Exception:  # noqa: BLE001 -- a heuristic: keep the default
        pass
    per_device = min(max(per_device, 1), _MAX_CHUNK_PER_DEVICE)
    n = len(devices)
    return max(1, min(per_device * n, -(-sweep.n_configs // n) * n))


def _bytes_per_config(sweep: Sweep) -> int:
    from .engine.state import initial_state

    shapes = dataclasses.replace(shapes_for(sweep.arch, sweep.kernel), max_ctas=sweep.max_grid_ctas,
                                 cta_slots=sweep.max_cta_slots)
    with jax.enable_x64(True):
        state = jax.eval_shape(lambda: initial_state(shapes))
    return 8 * sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(state)) + (1 << 16)


# ----------------------------------------------------------------------------- variables

# name: (extra dimensions, dtype, attributes); every variable also has the sweep dimensions.
VARIABLES: dict[str, tuple[tuple[str, ...], type, dict]] = {
    "makespan_ns": ((), np.float64, {"units": "ns", "long_name": "kernel makespan"}),
    "makespan_cycles": ((), np.float64, {"units": "cycles", "long_name": "makespan in cycles of the boost clock"}),
    "ticks_stepped": ((), np.int64, {"units": "1", "long_name": "ticks the engine processed (the rest it skipped "
                                     "or fast-forwarded exactly; depends on [engine] fast_forward)"}),
    "sm_ctas": (("sm",), np.int64, {"units": "1", "long_name": "CTAs run per SM"}),
    "sm_busy_cycles": (("sm",), np.int64, {"units": "cycles", "long_name": "SM cycles with a resident warp"}),
    "sm_cycles": (("sm",), np.int64, {"units": "cycles", "long_name": "SM cycles until the kernel ended"}),
    "sm_utilisation": (("sm",), np.float64, {"units": "1", "long_name": "busy cycles / SM cycles until the kernel ended"}),
    "sm_freq_mhz": (("sm",), np.int32, {"units": "MHz", "long_name": "SM clock"}),
    "ipc": (("sm",), np.float64, {"units": "1", "long_name": "instructions issued per busy cycle"}),
    "achieved_occupancy": (("sm",), np.float64, {"units": "1", "long_name": "resident warps per busy cycle / warp slots"}),
    "stall_fraction": (("stall_reason",), np.float64,
                       {"units": "1", "long_name": "share of warp-cycles in each state (Nsight names)"}),
}

# With `cta_trace = true`: the per-CTA trace, CTAs in grid order (over a workload's launches, in
# launch order); entries past a configuration's grid are -1 / NaN.
TRACE_VARIABLES: dict[str, tuple[tuple[str, ...], type, dict]] = {
    "cta_sm": (("cta",), np.int32, {"units": "1", "long_name": "SM that ran the CTA (-1: no such CTA)"}),
    "cta_kernel": (("cta",), np.int32, {"units": "1", "long_name": "launch the CTA belongs to (-1: no such CTA)"}),
    "cta_start_ns": (("cta",), np.float64, {"units": "ns", "long_name": "CTA start (its dispatch tick)"}),
    "cta_end_ns": (("cta",), np.float64, {"units": "ns", "long_name": "CTA end (end of its last tick)"}),
}


def variables(sweep: Sweep) -> dict[str, tuple[tuple[str, ...], type, dict]]:
    """The dataset's variables: (extra dimensions, dtype, attributes) by name."""
    return {**VARIABLES, **(TRACE_VARIABLES if sweep.cta_trace else {})}


def _fill(dtype) -> object:
    return np.nan if np.issubdtype(dtype, np.floating) else dtype(0)


def _fill_of(name: str, dtype) -> object:
    """What a configuration not (yet) run holds: NaN, 0 for counts, -1 for trace indices."""
    return dtype(-1) if name in ("cta_sm", "cta_kernel") else _fill(dtype)


def _variables(sweep: Sweep, configs: list[Config], result: Result) -> dict[str, np.ndarray]:
    """Per-configuration outputs (leading axis: the configurations), enabled SMs only."""
    enabled = np.asarray(sweep.arch.sm_enabled)

    def per_sm(name: str) -> np.ndarray:
        return np.asarray(getattr(result, name))[:, enabled]

    busy, cycles = per_sm("sm_busy_cycles"), per_sm("sm_cycles")
    stalls = np.asarray(result.sm_stalls)[:, enabled].sum(axis=1)
    values = {
        "makespan_ns": np.asarray(result.makespan_ns),
        "makespan_cycles": np.asarray(result.makespan_cycles),
        "ticks_stepped": np.asarray(result.ticks_stepped),
        "sm_ctas": per_sm("sm_ctas"),
        "sm_busy_cycles": busy,
        "sm_cycles": cycles,
        "sm_utilisation": busy / np.maximum(cycles, 1),
        "sm_freq_mhz": np.stack([np.asarray(c.clocks.sm_freq_mhz)[enabled] for c in configs]),
        "ipc": per_sm("sm_issued") / np.maximum(busy, 1),
        "achieved_occupancy": per_sm("sm_warp_cycles") / np.maximum(busy, 1) / result.max_warps_per_sm,
        "stall_fraction": stalls / np.maximum(stalls.sum(-1, keepdims=True), 1),
    }
    if sweep.cta_trace:
        n = sweep.max_grid_ctas
        sm = np.asarray(result.cta_sm)[:, :n]
        ran = sm >= 0
        values.update(cta_sm=sm, cta_kernel=np.where(ran, np.asarray(result.cta_kernel)[:, :n], -1),
                      cta_start_ns=np.where(ran, np.asarray(result.cta_start_ns)[:, :n], np.nan),
                      cta_end_ns=np.where(ran, np.asarray(result.cta_end_ns)[:, :n], np.nan))
    return {k: v.astype(variables(sweep)[k][1]) for k, v in values.items()}


def _unfilled(sweep: Sweep, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    """Every variable at its fill value (NaN, or 0 for counts) over configurations `shape`."""
    return {name: np.full(shape + _extra_shape(sweep, extra), _fill_of(name, dtype), dtype=dtype)
            for name, (extra, dtype, _) in variables(sweep).items()}


def _compute_chunk(sweep: Sweep, layout: Layout, i: int, runner: Runner, batch: int) -> dict[str, np.ndarray]:
    """Variables of chunk `i`, shaped like its region (plus `sm`/`stall_reason`); infeasible
    points keep the fill values."""
    region = layout.region(i)
    shape = tuple(s.stop - s.start for s in region)
    out = _unfilled(sweep, shape)
    configs = chunk_configs(sweep, layout, i)
    if configs:
        runs = np.broadcast_to(sweep.feasible[region[:-1]][..., None], shape)
        for name, v in _variables(sweep, configs, runner(configs, batch)).items():
            out[name][runs] = v
    return out


def fingerprint(sweep: Sweep) -> str:
    """SHA-256 of the spec text, the resolved arch and kernel (files named by the spec may
    change while its text does not) and the design's samples (a library update could change
    them)."""
    h = hashlib.sha256(sweep.text.encode())
    h.update(archio.dumps(sweep.arch).encode())
    for f in dataclasses.fields(sweep.kernel):
        h.update(f.name.encode())
        h.update(np.asarray(getattr(sweep.kernel, f.name)).tobytes())
    for path, values in (sweep.design.values.items() if sweep.design else ()):
        h.update(path.encode())
        h.update(np.asarray(values).tobytes())
    return h.hexdigest()


def _attrs(sweep: Sweep, layout: Layout, device: str) -> dict:
    die = np.asarray(sweep.arch.die_mm, dtype=np.float64)
    return {
        "title": sweep.title,
        "source": f"jaxsched {__version__}",
        "history": f"{datetime.datetime.now(datetime.timezone.utc).isoformat()} jaxsched sweep",
        "device": device,
        "arch": sweep.arch.name,
        "kernel": sweep.kernel.name,
        "seed": sweep.seed,
        "swept_paths": list(sweep.grid) + ([CONFIG_DIM] if sweep.design else []) + ["replicate"],
        "die_width_mm": round(float(die[0]), 4),
        "die_height_mm": round(float(die[1]), 4),
        "chunk_shape": list(layout.block),
        "fingerprint": fingerprint(sweep),
        "store_version": STORE_VERSION,
        "spec": sweep.text,
        **({"design": sweep.design.describe(), "design_paths": [f.path for f in sweep.design.factors]}
           if sweep.design else {}),
    }


def _dataset(sweep: Sweep, layout: Layout, arrays: dict, attrs: dict, done=None) -> xr.Dataset:
    enabled = np.asarray(sweep.arch.sm_enabled)
    xy = np.asarray(sweep.arch.sm_xy_mm, dtype=np.float64)[enabled]
    data = {name: (layout.dims + extra, arrays[name], dict(a)) for name, (extra, _, a) in variables(sweep).items()}
    if done is not None:
        data["done"] = (layout.dims, done, {"long_name": "configuration computed and written (resume record)"})
    points = point_dims(sweep)
    data["feasible"] = (points, sweep.feasible, {"long_name": "the point's kernel can launch (else not run: NaN)"})
    data["infeasible_reason"] = (points, sweep.infeasible_reason,
                                 {"long_name": "why the launch is refused ('' where feasible)"})
    coords = {d: list(v) for d, v in zip(layout.dims, sweep.grid.values())}
    if sweep.design:
        coords[CONFIG_DIM] = np.arange(sweep.design.samples)
        for f in sweep.design.factors:
            coords[dim_name(f.path)] = (CONFIG_DIM, sweep.design.values[f.path],
                                        {"long_name": f"sampled {f.path}", "path": f.path, "range": f.describe()})
    coords.update(
        replicate=np.arange(sweep.replicates),
        sm=np.flatnonzero(enabled),
        sm_x_mm=("sm", xy[:, 0], {"units": "mm", "long_name": "SM centre on the die, x"}),
        sm_y_mm=("sm", xy[:, 1], {"units": "mm", "long_name": "SM centre on the die, y"}),
        sm_gpc=("sm", np.asarray(sweep.arch.sm_gpc)[enabled], {"long_name": "GPC of the SM"}),
        stall_reason=list(STALL_REASONS),
    )
    return xr.Dataset(data, coords=coords, attrs=attrs)


def _extra_shape(sweep: Sweep, extra: tuple[str, ...]) -> tuple[int, ...]:
    sizes = {"sm": int(np.sum(np.asarray(sweep.arch.sm_enabled))), "stall_reason": len(STALL_REASONS),
             "cta": sweep.max_grid_ctas}
    return tuple(sizes[d] for d in extra)


# ----------------------------------------------------------------------------- in memory


def run(sweep: Sweep, progress: Callable[[int, int, float], None] | None = None, *,
        devices: Sequence | None = None, chunk: int | None = None) -> xr.Dataset:
    """Run every configuration in chunks and return the dataset (in memory, no store)."""
    runner = runner_for(sweep, devices)
    layout = make_layout(sweep, chunk or sweep.chunk or auto_chunk(sweep, runner.devices))
    arrays = _unfilled(sweep, layout.shape)
    batch = runner.batch_size(layout.chunk_size)
    t0, done = time.perf_counter(), 0
    for i in range(layout.n_chunks):
        values = _compute_chunk(sweep, layout, i, runner, batch)
        for name, v in values.items():
            arrays[name][layout.region(i)] = v
        done += layout.count(i)
        if progress:
            progress(done, layout.n_configs, time.perf_counter() - t0)
    return _dataset(sweep, layout, arrays, _attrs(sweep, layout, runner.describe()))


# ----------------------------------------------------------------------------- the store


def create_store(path: Path, sweep: Sweep, layout: Layout, device: str) -> None:
    """Write the template: full shape, metadata, coordinates and an empty checksum array, no
    data chunks. It is built beside `path` and renamed into place, so a store is never half made."""
    arrays = {name: np.broadcast_to(np.asarray(_fill_of(name, dtype), dtype=dtype), layout.shape + _extra_shape(sweep, extra))
              for name, (extra, dtype, _) in variables(sweep).items()}
    ds = _dataset(sweep, layout, arrays, _attrs(sweep, layout, device),
                  done=np.broadcast_to(np.asarray(False), layout.shape))
    block = dict(ds.sizes) | dict(zip(layout.dims, layout.block))  # sm, stall_reason: whole
    encoding = {name: {"chunks": tuple(block[d] for d in ds[name].dims)} for name in ds.data_vars}
    tmp = path.with_name(path.name + ".partial")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        ds.to_zarr(tmp, mode="w", encoding=encoding, zarr_format=2, consolidated=True)
        sweep_integrity.create(tmp, layout.n_chunks, list(variables(sweep)))
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise JaxschedError(str(path), "not created", f"{os_error(exc)}; nothing was computed: free space "
                            "(or fix the cause) and run again") from None


def _chunk_files(path: Path, layout: Layout, i: int, names: Sequence[str], extra: dict[str, int]) -> list[Path]:
    """The zarr files (format 2, "." separator) of chunk `i` of the variables `names`; `extra`
    gives each variable's number of trailing dimensions (held whole in every chunk)."""
    index = layout.chunk_index(i)
    return [path / name / ".".join(map(str, index + (0,) * extra.get(name, 0))) for name in names]


def _write_chunk(path: Path, layout: Layout, i: int, values: dict[str, np.ndarray]) -> None:
    """Chunk `i`'s data, its checksums, then its `done` entry, each durable before the next (a
    kill or an I/O error at any point leaves the chunk not done; sweep_integrity)."""
    region = dict(zip(layout.dims, layout.region(i)))
    dims = {**VARIABLES, **TRACE_VARIABLES}
    data = {name: (layout.dims + dims[name][0], v) for name, v in values.items()}
    xr.Dataset(data).to_zarr(path, region=region, consolidated=False)
    sweep_integrity.sync(_chunk_files(path, layout, i, list(values), {k: len(dims[k][0]) for k in values}))
    sweep_integrity.record(path, i, values)
    _write_done(path, layout, i, True)


def _write_done(path: Path, layout: Layout, i: int, done: bool) -> None:
    """Set chunk `i`'s `done` entries and make them durable."""
    region = dict(zip(layout.dims, layout.region(i)))
    shape = tuple(s.stop - s.start for s in region.values())
    xr.Dataset({"done": (layout.dims, np.full(shape, done))}).to_zarr(path, region=region, consolidated=False)
    sweep_integrity.sync(_chunk_files(path, layout, i, ["done"], {}))


def open_store(path: Path) -> xr.Dataset:
    """A sweep store as a lazy dataset (with `done`), checked to be one and to have every array."""
    try:
        ds = xr.open_zarr(path, consolidated=True)
    except Exception as exc:  # noqa: BLE001
        raise JaxschedError(str(path), "unreadable", f"not a jaxsched sweep store ({type(exc).__name__}: {exc})") from None
    check("done" in ds and "chunk_shape" in ds.attrs, str(path), "a zarr store", "not a jaxsched sweep store")
    # The consolidated metadata lists every array; a store damaged on disk may have lost one.
    missing = [name for name in ds.variables if not (path / name / ".zarray").is_file()]
    check(not missing, str(path), f"missing arrays {missing}",
          "a damaged sweep store: run without --resume to start over, or use another -o")
    return ds


def _open_netcdf(path: Path) -> xr.Dataset:
    try:
        return xr.open_dataset(path, engine="h5netcdf")
    except Exception as exc:  # noqa: BLE001
        raise JaxschedError(str(path), "unreadable", f"not a netCDF sweep result ({type(exc).__name__}: {exc})") \
            from None


def store_layout(ds: xr.Dataset) -> Layout:
    dims = tuple(ds["done"].dims)
    return Layout(dims, tuple(ds.sizes[d] for d in dims), tuple(int(b) for b in ds.attrs["chunk_shape"]))


def read_done(path: Path, layout: Layout) -> tuple[np.ndarray, list[int]]:
    """(per-configuration done, chunks whose `done` entries cannot be read): a damaged `done`
    file makes its chunk not done rather than the store unreadable."""
    array = zarr.open_array(str(path / "done"), mode="r")
    try:
        return np.asarray(array[...], dtype=bool), []
    except Exception:  # noqa: BLE001 -- a damaged chunk file: find it below
        done, unreadable = np.zeros(layout.shape, dtype=bool), []
        for i in range(layout.n_chunks):
            try:
                done[layout.region(i)] = array[layout.region(i)]
            except Exception:  # noqa: BLE001 -- whatever the codec says about a damaged file
                unreadable.append(i)
        return done, unreadable


def store_progress(path: Path) -> tuple[Layout, np.ndarray, np.ndarray]:
    """(layout, per-configuration done, per-chunk done) of a store."""
    layout = store_layout(open_store(path))
    done, _ = read_done(path, layout)
    return layout, done, layout.done_chunks(done)


def verify_chunks(path: Path, layout: Layout, chunks: Sequence[int]) -> dict[int, str]:
    """Chunks (of `chunks`) whose data does not match the checksums in the store, with what is
    wrong (sweep_integrity.verify)."""
    recorded = sweep_integrity.recorded(path)
    check(recorded is not None, str(path), "no checksums", "a store made before chunk checksums: nothing to verify")
    names, table = recorded
    return sweep_integrity.verify(path, {i: layout.region(i) for i in chunks}, names, table)


def _check_resumable(ds: xr.Dataset, sweep: Sweep, path: Path) -> None:
    if ds.attrs.get("store_version") != STORE_VERSION:
        raise JaxschedError(str(path), f"store_version {ds.attrs.get('store_version')}",
                            f"made by another jaxsched version (this one writes store_version {STORE_VERSION}); "
                            "remove it to start over, or use another -o")
    if ds.attrs.get("spec") != sweep.text:
        raise JaxschedError(str(path), "spec changed",
                            "the store was made from a different spec text; run without --resume "
                            "to start over, or use another -o")
    if ds.attrs.get("fingerprint") != fingerprint(sweep):
        raise JaxschedError(str(path), "spec changed",
                            "the spec text is the same but what it resolves to changed (the arch or "
                            "kernel files it names, or the design samples after a library update); "
                            "run without --resume to start over, or use another -o")


def open_result(path: str | Path, *, partial: bool = False) -> xr.Dataset:
    """The dataset of a sweep: an output folder, its `sweep.zarr` or `sweep.nc`.

    A zarr store must be complete unless `partial` (missing configurations are NaN or 0); the
    resume record `done` is dropped (kept, in memory, with `partial=True`).
    """
    p = Path(path)
    if p.is_dir() and p.suffix != ".zarr":
        p = p / STORE if (p / STORE).exists() else p / NETCDF
    check(p.exists(), "sweep result", str(path), "no such folder, .zarr store or .nc file")
    if p.is_file():
        return _open_netcdf(p)
    ds = open_store(p)
    layout = store_layout(ds)
    done, _ = read_done(p, layout)
    if partial:
        return ds.assign(done=(layout.dims, done, ds["done"].attrs))
    check(bool(done.all()), str(p), f"{int(done.sum())}/{done.size} configurations done",
          "an unfinished sweep: finish it with `jaxsched sweep SPEC -o OUT --resume` "
          "(or open it with partial=True)")
    return ds.drop_vars("done")


def write_netcdf(store: Path, path: Path) -> Path:
    """The complete store as netCDF (h5netcdf), written beside `path` and renamed into place,
    after every chunk is verified against its checksum (a store changed on disk is refused)."""
    ds = open_result(store)
    layout = store_layout(open_store(store))
    bad = verify_chunks(store, layout, range(layout.n_chunks))
    if bad:
        i, problem = next(iter(bad.items()))
        raise JaxschedError(str(store), f"{len(bad)} chunks changed on disk",
                            f"{layout.describe(i)}: {problem}; continue with --resume to recompute them "
                            f"({path.name} not written)")
    ds = ds.load()
    for v in ds.variables.values():
        v.encoding = {}
    tmp = path.with_name(path.name + ".partial")
    try:
        ds.to_netcdf(tmp, engine="h5netcdf")
        sweep_integrity.sync([tmp])
        os.replace(tmp, path)
        sweep_integrity.sync([path])
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise JaxschedError(str(path), "not written", f"{os_error(exc)}; every chunk is in {store}: free space "
                            "(or fix the cause) and continue with --resume to write it") from None
    return path


# ----------------------------------------------------------------------------- execution


@dataclasses.dataclass
class Outcome:
    store: Path
    netcdf: Path | None
    n_configs: int
    configs_done: int  # in the store, by every process
    computed: int  # by this call
    chunks_done: int
    n_chunks: int
    interrupted: bool

    @property
    def complete(self) -> bool:
        return self.configs_done == self.n_configs


def _barrier(name: str, process_count: int) -> None:
    if process_count > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def execute(
    sweep: Sweep,
    out: str | Path,
    *,
    resume: bool = False,
    chunk: int | None = None,
    devices: Sequence | None = None,
    progress: Callable[..., "Progress"] | None = None,
    stop: Callable[[], bool] | None = None,
    log: Callable[[str], None] = _stderr,
) -> Outcome:
    """Run a sweep into `out/sweep.zarr`, chunk by chunk, then write `out/sweep.nc`.

    `resume`: continue an existing store (refused if the spec changed), computing only the
    chunks not yet recorded, and those recorded whose data no longer matches its checksum.
    Without it an existing store is replaced, unless it is unfinished (an error: pass `resume`
    or remove it). `chunk` overrides the spec's chunk size for a new store (a resumed store keeps
    its chunk shape). `progress(total, done)` makes a reporter with `update(done)` and `close()`.
    `stop()` is checked after every chunk is written: when it returns True the run ends early
    (`Outcome.interrupted`). Under `jax.distributed`, every process calls this with the same
    arguments (see the module docstring).

    The run holds `out`'s lock throughout (`sweep_lock`): another run writing `out` is an error
    naming it. A full disk or another I/O error is an error too, and leaves the store valid: the
    chunk being written is not marked done, and `resume` completes the sweep.
    """
    out = Path(out)
    check(not out.exists() or out.is_dir(), "-o", str(out), "exists and is not a folder: name an output folder")
    rank, n_proc = jax.process_index(), jax.process_count()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise JaxschedError("-o", str(out), f"cannot be created: {os_error(exc)}") from None
    lock = sweep_lock.StoreLock(sweep_lock.lock_path(out, rank), sweep_lock.Owner.me(rank, n_proc))
    stale = lock.acquire()
    if stale is not None:
        log(f"{lock.path}: taking over from {stale.describe()}, which ended without releasing it")
    try:
        return _execute(sweep, out, resume, chunk, devices, progress, stop, log)
    finally:
        lock.release()


def _io_error(store: Path, layout: Layout, i: int, exc: OSError) -> JaxschedError:
    """A chunk that could not be written: what failed, and that the store stays valid."""
    return JaxschedError(str(store), f"{layout.describe(i)} not written",
                         f"{os_error(exc)}; the store keeps every chunk written before and this one is not "
                         "marked done: free space (or fix the cause) and continue with --resume")


def _execute(sweep: Sweep, out: Path, resume: bool, chunk: int | None, devices: Sequence | None,
             progress: Callable[..., "Progress"] | None, stop: Callable[[], bool] | None,
             log: Callable[[str], None]) -> Outcome:
    """`execute` with `out`'s lock held."""
    store = out / STORE
    rank, n_proc = jax.process_index(), jax.process_count()
    runner = runner_for(sweep, devices)
    if rank == 0:
        keep = False
        if store.exists():
            if resume:
                ds = open_store(store)
                _check_resumable(ds, sweep, store)
                keep = True
                if chunk and tuple(store_layout(ds).block) != make_layout(sweep, chunk).block:
                    log(f"--resume: keeping the store's chunk shape {tuple(ds.attrs['chunk_shape'])}")
            else:
                try:
                    _, done, _ = store_progress(store)
                    unfinished = not done.all()
                except JaxschedError:
                    unfinished = False  # not readable: replaced
                if unfinished:
                    raise JaxschedError(str(store), f"{int(done.sum())}/{done.size} configurations done",
                                        "an unfinished sweep is there: continue it with --resume, or remove it")
                log(f"replacing {store}")
        elif resume:
            log(f"--resume: no store at {store} yet; starting it")
        if not keep:
            layout = make_layout(sweep, chunk or sweep.chunk or auto_chunk(sweep, runner.devices))
            create_store(store, sweep, layout, runner.describe())
    _barrier("jaxsched-sweep-store", n_proc)
    ds = open_store(store)
    _check_resumable(ds, sweep, store)
    layout = store_layout(ds)
    done, unreadable = read_done(store, layout)
    chunk_done = layout.done_chunks(done)
    mine = [i for i in range(layout.n_chunks) if i % n_proc == rank]
    for i in unreadable:
        if i in mine:
            log(f"{layout.describe(i)}: its done record cannot be read; recomputing it")
    recorded = [i for i in mine if chunk_done[i]]
    changed = verify_chunks(store, layout, recorded)
    if recorded:
        log(f"verified {len(recorded)} chunks done against their checksums: "
            + (f"{len(changed)} changed on disk" if changed else "all intact"))
    for i, problem in changed.items():
        log(f"{layout.describe(i)}: {problem}; recomputing it")
        try:
            _write_done(store, layout, i, False)  # the store no longer claims it
        except OSError as exc:
            raise _io_error(store, layout, i, exc) from None
        chunk_done[i] = False
    todo = [i for i in mine if not chunk_done[i]]
    total = sum(layout.count(i) for i in mine)
    already = total - sum(layout.count(i) for i in todo)
    if already:
        log(f"resuming: {already} of {total} configurations already done "
            f"({len(mine) - len(todo)}/{len(mine)} chunks); computing {total - already}")
    batch = runner.batch_size(layout.chunk_size)
    log(f"{layout.n_configs} configurations in {layout.n_chunks} chunks of shape {layout.block} "
        f"(batch {batch}) on {runner.describe()}" + (f"; this process: {len(mine)} chunks" if n_proc > 1 else ""))
    if not sweep.feasible.all():
        log(f"{int((~sweep.feasible).sum())} of {sweep.feasible.size} points cannot launch and are not run "
            f"(feasible = False, NaN results), e.g. {sweep.infeasible_reason[~sweep.feasible].flat[0]}")
    reporter = progress(total, already) if progress else None
    computed, interrupted = 0, False
    throttle = float(os.environ.get(THROTTLE_ENV, "0") or 0)
    try:
        for i in todo:
            if stop is not None and stop():
                interrupted = True
                break
            values = _compute_chunk(sweep, layout, i, runner, batch)
            try:
                _write_chunk(store, layout, i, values)
            except OSError as exc:
                raise _io_error(store, layout, i, exc) from None
            computed += layout.count(i)
            if reporter:
                reporter.update(already + computed)
            if throttle:
                time.sleep(throttle)
    finally:
        if reporter:
            reporter.close()
    _barrier("jaxsched-sweep-done", n_proc)
    _, done, chunk_done = store_progress(store)
    nc = None
    if rank == 0 and done.all():
        nc = write_netcdf(store, out / NETCDF)
    return Outcome(store=store, netcdf=nc, n_configs=layout.n_configs, configs_done=int(done.sum()),
                   computed=computed, chunks_done=int(chunk_done.sum()), n_chunks=layout.n_chunks,
                   interrupted=interrupted)


# ----------------------------------------------------------------------------- progress


class Progress:
    """Configurations done, rate and ETA on stderr: a rich bar on a terminal, otherwise one
    plain line per update (logs, CI, pipes). The rate counts this run's configurations only."""

    def __init__(self, total: int, done: int = 0, *, stream=None, bar: bool | None = None,
                 label: str = "configurations"):
        self.stream = stream or sys.stderr
        self.total, self.start, self.label = total, done, label
        self.t0 = time.perf_counter()
        isatty = getattr(self.stream, "isatty", lambda: False)()
        self._rich = None
        if bar if bar is not None else isatty:
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress as RichProgress,
                                       TextColumn, TimeElapsedColumn, TimeRemainingColumn)

            self._rich = RichProgress(
                TextColumn("[bold]sweep"), BarColumn(), MofNCompleteColumn(), TextColumn(label),
                TextColumn("{task.fields[rate]}"), TextColumn("elapsed"), TimeElapsedColumn(),
                TextColumn("ETA"), TimeRemainingColumn(),
                console=Console(file=self.stream), transient=False)
            self._rich.start()
            self._task = self._rich.add_task("sweep", total=total, completed=done, rate="")

    def rate_eta(self, done: int) -> tuple[float, float]:
        seconds = time.perf_counter() - self.t0
        rate = (done - self.start) / max(seconds, 1e-9)
        return rate, (self.total - done) / rate if rate > 0 else float("inf")

    def update(self, done: int) -> None:
        rate, eta = self.rate_eta(done)
        if self._rich is not None:
            self._rich.update(self._task, completed=done, rate=f"{rate:.1f}/s")
        else:
            print(f"  {done}/{self.total} {self.label}, {rate:.1f}/s, ETA {eta:.0f} s",
                  file=self.stream, flush=True)

    def close(self) -> None:
        if self._rich is not None:
            self._rich.stop()
            self._rich = None


def print_progress(done: int, total: int, seconds: float) -> None:
    """One line per chunk on stderr (the `run` callback form)."""
    rate = done / max(seconds, 1e-9)
    eta = (total - done) / max(rate, 1e-9)
    print(f"  {done}/{total} configurations, {rate:.1f}/s, ETA {eta:.0f} s", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- info


def describe(path: str | Path) -> str:
    """`jaxsched info`: title, dimensions, swept values, completion, device, version."""
    p = Path(path)
    if p.is_dir() and p.suffix != ".zarr":
        p = p / STORE if (p / STORE).exists() else p / NETCDF
    check(p.exists(), "sweep result", str(path), "no such folder, .zarr store or .nc file")
    ds = _open_netcdf(p) if p.is_file() else open_store(p)
    a = ds.attrs
    lines = [f"{a.get('title', '')}", f"  path        : {p}", f"  made by     : {a.get('source', '?')}",
             f"  device      : {a.get('device', '?')}", f"  created     : {str(a.get('history', '?')).split(' ')[0]}",
             f"  arch        : {a.get('arch', '?')}, kernel {a.get('kernel', '?')}, seed {a.get('seed', '?')}"]
    sweep_dims_ = [d for d in ds["makespan_ns"].dims]
    lines.append("  dimensions  : " + ", ".join(f"{d}={n}" for d, n in ds.sizes.items()))
    paths = list(np.atleast_1d(a.get("swept_paths", sweep_dims_)))
    lines.append("  swept:")
    for d, path_ in zip(sweep_dims_, paths):
        if d == CONFIG_DIM:
            lines.append(f"    {d} ({a.get('design', 'design')}):")
            lines.extend(f"      {c} ({ds[c].attrs.get('path', c)} in {ds[c].attrs.get('range', '?')}): "
                         f"{_summary(ds[c].values)}" for c in design_coords(ds))
            continue
        values = ds[d].values
        shown = ", ".join(str(v) for v in values[:12]) + (", ..." if len(values) > 12 else "")
        lines.append(f"    {d} ({path_}): {shown}")
    if "feasible" in ds:
        feasible = np.asarray(ds["feasible"].values, dtype=bool)
        line = f"  feasible    : {int(feasible.sum())}/{feasible.size} points"
        if not feasible.all():
            first = str(np.asarray(ds["infeasible_reason"].values)[~feasible].flat[0])
            line += f"; the others cannot launch (NaN results), e.g. {first}"
        lines.append(line)
    if "done" in ds:
        layout = store_layout(ds)
        done, _ = read_done(p, layout)
        chunks = layout.done_chunks(done)
        # info reads the done table only; the chunks' data is verified by `jaxsched check`
        state = ("complete by its done table (`jaxsched check` verifies the data)" if done.all()
                 else "unfinished (continue with --resume)")
        lines.append(f"  completion  : {int(chunks.sum())}/{layout.n_chunks} chunks of shape {layout.block}, "
                     f"{int(done.sum())}/{done.size} configurations, {state}")
    else:
        lines.append(f"  completion  : complete ({int(np.prod([ds.sizes[d] for d in sweep_dims_]))} configurations, netCDF)")
    lines.append("  variables   : " + ", ".join(
        f"{k} [{ds[k].attrs.get('units', '')}]" for k in ds.data_vars if k in VARIABLES or k in TRACE_VARIABLES))
    return "\n".join(lines)


def _summary(values: np.ndarray) -> str:
    """min .. max of numbers, or each value's count."""
    if np.issubdtype(values.dtype, np.number) and values.dtype.kind != "b":
        return f"{values.min():.6g} .. {values.max():.6g} ({len(np.unique(values))} distinct)"
    kinds, counts = np.unique(values, return_counts=True)
    return ", ".join(f"{k} x{n}" for k, n in zip(kinds, counts))
