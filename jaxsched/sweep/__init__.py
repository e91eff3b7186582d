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
              weights = "clocks", ema_alpha = 0.25, ema_prior_ns = 0.0, hold_margin = 0.125,
              hold_noise = 0.0, hold_queue = 0.0, hold_left = 1.0
    [grid]    "policy.warp" = ["lrr", "gto"], "clocks.sigma" = [0.0, 0.1], "kernel.regs" = [...]
    [workload] launches = 16, streams = 1, mode = "stream"    # optional: N launches of the kernel
    [design]  kind = "lhs", samples = 200, seed = 1          # optional; see `sweep_design`
    [design.ranges]   "clocks.sigma" = [0.0, 0.2], "kernel.trips" = [4, 32],
                      "policy.dispatch" = ["hardware", "closed_loop"]
    [design.choices]  "kernel.threads" = [128, 256, 512]

Swept paths (`sweep_paths`): `policy.{warp, dispatch, dispatch_start, weights, ema_alpha,
ema_prior_ns, hold_margin, hold_noise, hold_queue, hold_left}` (`weights`: the `weighted` policy's
per-SM weights, "clocks" = each SM's clock in MHz or "uniform"; `ema_alpha` in [0, 1],
`ema_prior_ns` in [0, 1e8], `hold_margin` in [0, 1], `hold_noise` in [0, 8], `hold_queue` in
[0, 1] and `hold_left` in [0, 4] drive `closed_loop`),
`clocks.{model, mean_ghz, sigma, sigma_die, corr_length_mm, ir_drop}`,
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

Modules
-------
`spec` (the `Sweep` a spec parses into, `load`, every check made before anything runs),
`configs` (a configuration's engine inputs: launch, clock map, DVFS draw), `layout` (the
configuration array, its dimensions and chunks), `store` (the dataset's variables, the zarr
store, the netCDF, reading a result back) and `execution` (devices, the batched runner, `run` in
memory and `execute` into the store, progress). Every name is re-exported here: `sweep.load`,
`sweep.execute`, `sweep.open_result` and the rest work as when this package was one module.
"""

from __future__ import annotations

from .. import sweep_paths  # re-exported: experiments/die_scaling_report.py reads `sweep.sweep_paths`
from .configs import (REPLICATE_STRIDE, Config, clock_map, configurations, dvfs_params, engine_config, launched,
                      point_configs)
from .execution import (THROTTLE_ENV, Outcome, Progress, Runner, auto_chunk, execute, print_progress, run,
                        runner_for, select_devices)
from .execution import _compute_chunk  # noqa: F401 -- private, re-exported for tests/test_sweep_designs.py
from .layout import Layout, block_shape, chunk_configs, dim_name, make_layout, point_dims, sweep_dims
from .spec import MAX_CONFIGS, MAX_SEED, Sweep, load, loads, uses_closed_loop, uses_dvfs
from .store import (NETCDF, STORE, STORE_VERSION, TRACE_VARIABLES, VARIABLES, create_store, describe,
                    fingerprint, open_result, open_store, read_done, store_layout, store_progress, variables,
                    verify_chunks, write_netcdf)

__all__ = [
    # spec
    "MAX_CONFIGS", "MAX_SEED", "Sweep", "load", "loads", "uses_closed_loop", "uses_dvfs",
    # configs
    "REPLICATE_STRIDE", "Config", "clock_map", "configurations", "dvfs_params", "engine_config", "launched",
    "point_configs",
    # layout
    "Layout", "block_shape", "chunk_configs", "dim_name", "make_layout", "point_dims", "sweep_dims",
    # store
    "NETCDF", "STORE", "STORE_VERSION", "TRACE_VARIABLES", "VARIABLES", "create_store", "describe", "fingerprint",
    "open_result", "open_store", "read_done", "store_layout", "store_progress", "variables", "verify_chunks",
    "write_netcdf",
    # execution
    "THROTTLE_ENV", "Outcome", "Progress", "Runner", "auto_chunk", "execute", "print_progress", "run",
    "runner_for", "select_devices",
    # a module, as before
    "sweep_paths",
]
