"""Sweeps: a TOML spec of a base configuration and an orthogonal grid of swept values, run in
batched chunks (one compilation for equal shapes), sharded over the local devices, written chunk
by chunk to a resumable zarr store and returned as a labelled `xarray.Dataset`.

Spec (see `sweeps/demo.toml`):

    title = "..."
    arch = "h200"                    # preset name or arch TOML path (relative to the spec)
    kernel = "kernels/fma_ldg.toml"  # kernel TOML path, or an inline [kernel] table
    replicates = 4                   # independent clock-map draws per grid point
    seed = 0
    chunk = 64                       # configurations per batched call (default: sized to memory)
    [clocks]  mean_ghz = 1.9, sigma = 0.05     # per-SM clock map, see `clock_map`
    [policy]  warp = "gto", dispatch = "hardware", dispatch_start = 0
    [grid]    "policy.warp" = ["lrr", "gto"], "clocks.sigma" = [0.0, 0.1], "arch.dram_bytes_per_ns" = [...]

Swept paths: `policy.{warp,dispatch,dispatch_start}`, `clocks.{mean_ghz,sigma,...}`,
`kernel.<field>` and `arch.<field>` for scalar fields of `Kernel` and `Arch`. Every path and value
is checked before anything runs. Replicate r draws its clock map from seed `seed * 1_000_003 + r`,
the same for every grid point (common random numbers: policies are compared on the same chips).

Dataset: one dimension per swept path (dots become underscores: `policy_warp`, `clocks_sigma`)
plus `replicate`; per-SM variables add `sm` (enabled SMs, with `sm_x_mm`, `sm_y_mm`, `sm_gpc`
coordinates from the floorplan), the stall breakdown adds `stall_reason`.

Execution
---------
The configurations form an N-d array (grid dimensions x replicates). It is cut into rectangular
*chunks* of at most `chunk` configurations, filled from the last dimension backwards: with
shape (2, 4, 4) and chunk 8 a chunk is (1, 2, 4). One chunk is one batched engine call of a
fixed batch size (edge chunks are padded by repeating their last configuration, so every call
reuses one compilation); the batch is padded to a multiple of the device count and its
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
shape (no data files: unwritten chunks read as the fill values, NaN or 0). A boolean variable
`done` (same dimensions, same chunks) is written after each chunk's data; `--resume` recomputes
exactly the chunks whose `done` is not set. Attributes hold the spec text, a fingerprint of the
resolved spec (arch, kernel, grid; `--resume` refuses a store whose fingerprint differs) and the
chunk shape. When every chunk is done, `OUT/sweep.nc` (netCDF4 via h5netcdf, without `done`) is
written from the store. `open_result(path)` opens either (a folder, `.zarr` or `.nc`) and checks
completeness.

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

Testing aid: `JAXSCHED_SWEEP_THROTTLE_S` (seconds) sleeps after each recorded chunk, so that the
resume test can kill a sweep between chunks deterministically.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import hashlib
import itertools
import math
import os
import shutil
import sys
import threading
import time
import tomllib
from pathlib import Path
from typing import Callable, Sequence

import jax
import numpy as np
import xarray as xr
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from . import __version__, archio, clocks, freqmap, presets
from .arch import Arch
from .engine import run as engine_run
from .engine.run import Result, simulate_batch
from .engine.state import STALL_REASONS
from .errors import JaxschedError, check
from .kernel import Kernel, kernel_from_dict, load_kernel
from .lower import DISPATCH_POLICIES, WARP_POLICIES, validate

_POLICY_KEYS = {"warp": WARP_POLICIES, "dispatch": DISPATCH_POLICIES, "dispatch_start": None}
_CLOCK_KEYS = ("model", "mean_ghz", "sigma", "sigma_die", "corr_length_mm", "ir_drop")
_CLOCK_MODELS = ("gaussian", "variation")
_TOP_KEYS = ("title", "arch", "kernel", "replicates", "seed", "chunk", "clocks", "policy", "grid")


@dataclasses.dataclass(frozen=True)
class Sweep:
    """A parsed, validated sweep."""

    title: str
    text: str
    arch: Arch
    kernel: Kernel
    clocks: dict
    policy: dict
    grid: dict[str, list]
    replicates: int
    seed: int
    chunk: int | None  # configurations per batched call; None: sized to device memory

    @property
    def n_configs(self) -> int:
        return int(np.prod([len(v) for v in self.grid.values()], dtype=np.int64)) * self.replicates


def load(path: str | Path) -> Sweep:
    p = Path(path)
    check(p.is_file(), "sweep spec", str(p), "no such file")
    return loads(p.read_text(), base_dir=p.parent, source=str(p))


def loads(text: str, base_dir: Path = Path("."), source: str = "<spec>") -> Sweep:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise JaxschedError(source, "malformed TOML", str(exc)) from None
    for key in doc:
        check(key in _TOP_KEYS, f"{source}: {key}", doc[key], f"unknown key; expected one of {_TOP_KEYS}")
    arch_spec = str(doc.get("arch", "h200"))
    arch = (archio.load(base_dir / arch_spec) if arch_spec.endswith(".toml") else presets.get(arch_spec))
    check("kernel" in doc, f"{source}: kernel", None, "required (a kernel TOML path or a [kernel] table)")
    kspec = doc["kernel"]
    kernel = (kernel_from_dict(kspec, source) if isinstance(kspec, dict) else load_kernel(base_dir / kspec))
    clk = {"model": "gaussian", "mean_ghz": float(arch.boost_clock_ghz), "sigma": 0.0,
           "sigma_die": 0.0, "corr_length_mm": float(freqmap.default_corr_length_mm(arch)),
           "ir_drop": False, **doc.get("clocks", {})}
    for key in clk:
        check(key in _CLOCK_KEYS, f"{source}: clocks.{key}", clk[key], f"expected one of {_CLOCK_KEYS}")
    check(clk["model"] in _CLOCK_MODELS, f"{source}: clocks.model", clk["model"], f"one of {_CLOCK_MODELS}")
    check(isinstance(clk["ir_drop"], bool), f"{source}: clocks.ir_drop", clk["ir_drop"], "true or false")
    policy = {"warp": "gto", "dispatch": "hardware", "dispatch_start": 0, **doc.get("policy", {})}
    for key in policy:
        check(key in _POLICY_KEYS, f"{source}: policy.{key}", policy[key], f"expected one of {tuple(_POLICY_KEYS)}")
    grid = doc.get("grid", {})
    check(isinstance(grid, dict), f"{source}: grid", grid, "a table of path = [values]")
    for path, values in grid.items():
        check(isinstance(values, list) and len(values) > 0, f"{source}: grid.{path}", values,
              "a non-empty list of values")
        for v in values:
            _apply(path, v, arch, kernel, dict(clk), dict(policy), source)  # validates path + value
    replicates = int(doc.get("replicates", 1))
    check(replicates >= 1, f"{source}: replicates", replicates, ">= 1")
    sweep = Sweep(
        title=str(doc.get("title", source)), text=text, arch=arch, kernel=kernel, clocks=clk,
        policy=policy, grid=dict(grid), replicates=replicates, seed=int(doc.get("seed", 0)),
        chunk=int(doc["chunk"]) if "chunk" in doc else None,
    )
    check(sweep.chunk is None or sweep.chunk >= 1, f"{source}: chunk", sweep.chunk, ">= 1")
    return sweep


def _apply(path: str, value, arch: Arch, kernel: Kernel, clk: dict, policy: dict, source: str = "grid"):
    """Set one dotted path; returns the updated (arch, kernel, clocks, policy). Validates."""
    head, _, field = path.partition(".")
    where = f"{source}: grid.{path}"
    if head == "policy":
        check(field in _POLICY_KEYS, where, value, f"policy fields: {tuple(_POLICY_KEYS)}")
        known = _POLICY_KEYS[field]
        if known is not None:
            check(value in known, where, value, f"one of {known}")
        else:
            check(isinstance(value, int), where, value, "an integer")
        policy[field] = value
    elif head == "clocks":
        numeric = tuple(k for k in _CLOCK_KEYS if k not in ("model", "ir_drop"))
        if field == "model":
            check(value in _CLOCK_MODELS, where, value, f"one of {_CLOCK_MODELS}")
        elif field == "ir_drop":
            check(isinstance(value, bool), where, value, "true or false")
        else:
            check(field in numeric, where, value, f"clocks fields: {_CLOCK_KEYS}")
            check(isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0,
                  where, value, "a number >= 0")
            value = float(value)
        clk[field] = value
    elif head in ("arch", "kernel"):
        obj = arch if head == "arch" else kernel
        names = [f.name for f in dataclasses.fields(obj) if np.ndim(getattr(obj, f.name)) == 0
                 and not isinstance(getattr(obj, f.name), str)]
        check(field in names, where, value, f"scalar {head} fields: {names}")
        check(isinstance(value, (int, float)) and not isinstance(value, bool), where, value, "a number")
        old = np.asarray(getattr(obj, field))
        try:
            obj = obj.replace(**{field: np.asarray(value, dtype=old.dtype)})
        except JaxschedError as exc:
            raise JaxschedError(where, value, exc.limit) from None
        if head == "arch":
            arch = obj
        else:
            kernel = obj
    else:
        raise JaxschedError(where, value, "paths start with policy., clocks., kernel. or arch.")
    return arch, kernel, clk, policy


def configurations(sweep: Sweep):
    """Yield (grid index tuple, replicate, arch, kernel, clocks, warp, dispatch, start), in
    C order over (grid dimensions..., replicate)."""
    for combo in itertools.product(*(range(len(v)) for v in sweep.grid.values())):
        yield from _grid_point_configs(sweep, combo, range(sweep.replicates))


def _grid_point_configs(sweep: Sweep, combo: tuple[int, ...], replicates: Sequence[int]) -> list:
    arch, kernel, clk, policy = sweep.arch, sweep.kernel, dict(sweep.clocks), dict(sweep.policy)
    for key, i in zip(sweep.grid, combo):
        arch, kernel, clk, policy = _apply(key, sweep.grid[key][i], arch, kernel, clk, policy)
    validate(arch, kernel, clocks.uniform(arch))
    return [(tuple(combo), r, arch, kernel, clock_map(arch, clk, sweep.seed * 1_000_003 + r),
             WARP_POLICIES.index(policy["warp"]), DISPATCH_POLICIES.index(policy["dispatch"]),
             int(policy["dispatch_start"])) for r in replicates]


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
STORE_VERSION = 1
THROTTLE_ENV = "JAXSCHED_SWEEP_THROTTLE_S"
_CPU_CHUNK_PER_DEVICE = 64  # when the backend reports no memory figures
_MAX_CHUNK_PER_DEVICE = 4096


def sweep_dims(sweep: Sweep) -> tuple[str, ...]:
    """Dataset dimensions of the configuration array: one per swept path, then `replicate`."""
    return tuple(k.replace(".", "_") for k in sweep.grid) + ("replicate",)


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
    """The configuration array (grid dimensions x replicate) cut into rectangular chunks."""

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

    def region(self, i: int) -> tuple[slice, ...]:
        """Index slices of chunk `i` (C order over the chunk grid)."""
        index = np.unravel_index(i, self.chunk_grid)
        return tuple(slice(int(j) * b, min((int(j) + 1) * b, s))
                     for j, b, s in zip(index, self.block, self.shape))

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
    shape = tuple(len(v) for v in sweep.grid.values()) + (sweep.replicates,)
    return Layout(sweep_dims(sweep), shape, block_shape(shape, chunk))


def chunk_configs(sweep: Sweep, layout: Layout, i: int) -> list:
    """The configurations of chunk `i`, in C order over its region."""
    *grid, reps = layout.region(i)
    out = []
    for combo in itertools.product(*(range(s.start, s.stop) for s in grid)):
        out.extend(_grid_point_configs(sweep, combo, range(reps.start, reps.stop)))
    return out


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


@functools.lru_cache(maxsize=16)
def _shard_mapped(compiled: Callable, mesh: Mesh, static: tuple) -> Callable:
    fn = functools.partial(compiled, **dict(static))
    spec = PartitionSpec("config")
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False))


_ENGINE_LOCK = threading.Lock()


@contextlib.contextmanager
def _sharded_engine(mesh: Mesh):
    """Run `simulate_batch` with its configuration axis sharded over `mesh`.

    `simulate_batch` validates, stacks and pads the configurations and hands the stacked inputs
    (every one with a leading configuration axis) to the engine's jitted `_compiled`. Here that
    call is routed through `shard_map`: the inputs are placed with
    `NamedSharding(mesh, PartitionSpec("config"))` and each device runs the same vmapped engine
    on its own slice. Nothing else changes, so results equal the unsharded ones bit for bit.
    """
    original = getattr(engine_run, "_compiled", None)
    check(callable(original), "engine", "jaxsched.engine.run._compiled",
          "not found; sharded sweeps need the engine's batched entry point")
    sharding = NamedSharding(mesh, PartitionSpec("config"))

    def compiled(*config, **static):
        if not static.get("batched", True):
            return original(*config, **static)
        return _shard_mapped(original, mesh, tuple(sorted(static.items())))(*jax.device_put(config, sharding))

    with _ENGINE_LOCK:
        engine_run._compiled = compiled
        try:
            yield
        finally:
            engine_run._compiled = original


class Runner:
    """Runs batches of configurations on local devices, sharded over them when more than one."""

    def __init__(self, devices: Sequence | None = None):
        self.devices = list(devices) if devices else jax.local_devices()
        self.mesh = Mesh(np.asarray(self.devices), ("config",)) if len(self.devices) > 1 else None

    def batch_size(self, n: int) -> int:
        """`n` rounded up to a multiple of the device count."""
        d = len(self.devices)
        return -(-n // d) * d

    def describe(self) -> str:
        d = self.devices[0]
        kinds = sorted({x.device_kind for x in self.devices})
        return (f"{len(self.devices)} x {d.platform} ({', '.join(kinds)})"
                + (f", process {jax.process_index()} of {jax.process_count()}" if jax.process_count() > 1 else ""))

    def __call__(self, configs: list, batch: int) -> Result:
        n = len(configs)
        padded = configs + configs[-1:] * (batch - n)
        cols = [list(col) for col in zip(*padded)][2:]
        if self.mesh is None:
            with jax.default_device(self.devices[0]):
                result = simulate_batch(*cols)
        else:
            with _sharded_engine(self.mesh):
                result = simulate_batch(*cols)
        return jax.tree.map(lambda x: x[:n], result)


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
    from .lower import shapes_for

    grids = [int(v) for v in sweep.grid.get("kernel.grid_ctas", [])] + [int(sweep.kernel.grid_ctas)]
    shapes = dataclasses.replace(shapes_for(sweep.arch, sweep.kernel), max_ctas=max(grids))
    with jax.enable_x64(True):
        state = jax.eval_shape(lambda: initial_state(shapes))
    return 8 * sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(state)) + (1 << 16)


# ----------------------------------------------------------------------------- variables

# name: (extra dimensions, dtype, attributes); every variable also has the sweep dimensions.
VARIABLES: dict[str, tuple[tuple[str, ...], type, dict]] = {
    "makespan_ns": ((), np.float64, {"units": "ns", "long_name": "kernel makespan"}),
    "makespan_cycles": ((), np.float64, {"units": "cycles", "long_name": "makespan in cycles of the boost clock"}),
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


def _fill(dtype) -> object:
    return np.nan if np.issubdtype(dtype, np.floating) else dtype(0)


def _variables(sweep: Sweep, configs: list, result: Result) -> dict[str, np.ndarray]:
    """Per-configuration outputs (leading axis: the configurations), enabled SMs only."""
    enabled = np.asarray(sweep.arch.sm_enabled)

    def per_sm(name: str) -> np.ndarray:
        return np.asarray(getattr(result, name))[:, enabled]

    busy, cycles = per_sm("sm_busy_cycles"), per_sm("sm_cycles")
    stalls = np.asarray(result.sm_stalls)[:, enabled].sum(axis=1)
    values = {
        "makespan_ns": np.asarray(result.makespan_ns),
        "makespan_cycles": np.asarray(result.makespan_cycles),
        "sm_ctas": per_sm("sm_ctas"),
        "sm_busy_cycles": busy,
        "sm_cycles": cycles,
        "sm_utilisation": busy / np.maximum(cycles, 1),
        "sm_freq_mhz": np.stack([np.asarray(c[4].sm_freq_mhz)[enabled] for c in configs]),
        "ipc": per_sm("sm_issued") / np.maximum(busy, 1),
        "achieved_occupancy": per_sm("sm_warp_cycles") / np.maximum(busy, 1) / result.max_warps_per_sm,
        "stall_fraction": stalls / np.maximum(stalls.sum(-1, keepdims=True), 1),
    }
    return {k: v.astype(VARIABLES[k][1]) for k, v in values.items()}


def _compute_chunk(sweep: Sweep, layout: Layout, i: int, runner: Runner, batch: int) -> dict[str, np.ndarray]:
    """Variables of chunk `i`, shaped like its region (plus `sm`/`stall_reason`)."""
    configs = chunk_configs(sweep, layout, i)
    values = _variables(sweep, configs, runner(configs, batch))
    shape = tuple(s.stop - s.start for s in layout.region(i))
    return {k: v.reshape(shape + v.shape[1:]) for k, v in values.items()}


def fingerprint(sweep: Sweep) -> str:
    """SHA-256 of the spec text and the resolved arch and kernel (files named by the spec may
    change while its text does not)."""
    h = hashlib.sha256(sweep.text.encode())
    h.update(archio.dumps(sweep.arch).encode())
    for f in dataclasses.fields(sweep.kernel):
        h.update(f.name.encode())
        h.update(np.asarray(getattr(sweep.kernel, f.name)).tobytes())
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
        "swept_paths": list(sweep.grid) + ["replicate"],
        "die_width_mm": round(float(die[0]), 4),
        "die_height_mm": round(float(die[1]), 4),
        "chunk_shape": list(layout.block),
        "fingerprint": fingerprint(sweep),
        "store_version": STORE_VERSION,
        "spec": sweep.text,
    }


def _dataset(sweep: Sweep, layout: Layout, arrays: dict, attrs: dict, done=None) -> xr.Dataset:
    enabled = np.asarray(sweep.arch.sm_enabled)
    xy = np.asarray(sweep.arch.sm_xy_mm, dtype=np.float64)[enabled]
    data = {name: (layout.dims + extra, arrays[name], dict(a)) for name, (extra, _, a) in VARIABLES.items()}
    if done is not None:
        data["done"] = (layout.dims, done, {"long_name": "configuration computed and written (resume record)"})
    coords = {d: list(v) for d, v in zip(layout.dims, sweep.grid.values())}
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
    sizes = {"sm": int(np.sum(np.asarray(sweep.arch.sm_enabled))), "stall_reason": len(STALL_REASONS)}
    return tuple(sizes[d] for d in extra)


# ----------------------------------------------------------------------------- in memory


def run(sweep: Sweep, progress: Callable[[int, int, float], None] | None = None, *,
        devices: Sequence | None = None, chunk: int | None = None) -> xr.Dataset:
    """Run every configuration in chunks and return the dataset (in memory, no store)."""
    runner = Runner(devices)
    layout = make_layout(sweep, chunk or sweep.chunk or auto_chunk(sweep, runner.devices))
    arrays = {name: np.full(layout.shape + _extra_shape(sweep, extra), _fill(dtype), dtype=dtype)
              for name, (extra, dtype, _) in VARIABLES.items()}
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
    """Write the template: full shape, metadata and coordinates, no data chunks."""
    arrays = {name: np.broadcast_to(np.asarray(_fill(dtype), dtype=dtype), layout.shape + _extra_shape(sweep, extra))
              for name, (extra, dtype, _) in VARIABLES.items()}
    ds = _dataset(sweep, layout, arrays, _attrs(sweep, layout, device),
                  done=np.broadcast_to(np.asarray(False), layout.shape))
    encoding = {name: {"chunks": layout.block + _extra_shape(sweep, VARIABLES.get(name, ((),))[0])}
                for name in ds.data_vars}
    tmp = path.with_name(path.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    ds.to_zarr(tmp, mode="w", encoding=encoding, zarr_format=2, consolidated=True)
    if path.exists():
        shutil.rmtree(path)
    os.replace(tmp, path)


def _write_chunk(path: Path, layout: Layout, i: int, values: dict[str, np.ndarray]) -> None:
    """Chunk `i`'s data, then its `done` record (a kill in between only loses this chunk)."""
    region = dict(zip(layout.dims, layout.region(i)))
    data = {name: (layout.dims + VARIABLES[name][0], v) for name, v in values.items()}
    xr.Dataset(data).to_zarr(path, region=region, consolidated=False)
    shape = tuple(s.stop - s.start for s in region.values())
    xr.Dataset({"done": (layout.dims, np.ones(shape, dtype=bool))}).to_zarr(path, region=region, consolidated=False)


def _open_store(path: Path) -> xr.Dataset:
    try:
        ds = xr.open_zarr(path, consolidated=True)
    except Exception as exc:  # noqa: BLE001
        raise JaxschedError(str(path), "unreadable", f"not a jaxsched sweep store ({type(exc).__name__}: {exc})") from None
    check("done" in ds and "chunk_shape" in ds.attrs, str(path), "a zarr store", "not a jaxsched sweep store")
    return ds


def store_layout(ds: xr.Dataset) -> Layout:
    dims = tuple(ds["done"].dims)
    return Layout(dims, tuple(ds.sizes[d] for d in dims), tuple(int(b) for b in ds.attrs["chunk_shape"]))


def store_progress(path: Path) -> tuple[Layout, np.ndarray, np.ndarray]:
    """(layout, per-configuration done, per-chunk done) of a store."""
    ds = _open_store(path)
    layout = store_layout(ds)
    done = np.asarray(ds["done"].values, dtype=bool)
    return layout, done, layout.done_chunks(done)


def _check_resumable(ds: xr.Dataset, sweep: Sweep, path: Path) -> None:
    if ds.attrs.get("spec") != sweep.text:
        raise JaxschedError(str(path), "spec changed",
                            "the store was made from a different spec text; run without --resume "
                            "to start over, or use another -o")
    if ds.attrs.get("fingerprint") != fingerprint(sweep):
        raise JaxschedError(str(path), "spec changed",
                            "the spec text is the same but the arch or kernel it names changed; run "
                            "without --resume to start over, or use another -o")


def open_result(path: str | Path, *, partial: bool = False) -> xr.Dataset:
    """The dataset of a sweep: an output folder, its `sweep.zarr` or `sweep.nc`.

    A zarr store must be complete unless `partial` (missing configurations are NaN or 0); the
    resume record `done` is dropped (kept with `partial=True`).
    """
    p = Path(path)
    if p.is_dir() and p.suffix != ".zarr":
        p = p / STORE if (p / STORE).exists() else p / NETCDF
    check(p.exists(), "sweep result", str(path), "no such folder, .zarr store or .nc file")
    if p.is_file():
        return xr.open_dataset(p, engine="h5netcdf")
    ds = _open_store(p)
    if partial:
        return ds
    done = np.asarray(ds["done"].values)
    check(bool(done.all()), str(p), f"{int(done.sum())}/{done.size} configurations done",
          "an unfinished sweep: finish it with `jaxsched sweep SPEC -o OUT --resume` "
          "(or open it with partial=True)")
    return ds.drop_vars("done")


def write_netcdf(store: Path, path: Path) -> Path:
    """The complete store as netCDF (h5netcdf), written atomically."""
    ds = open_result(store).load()
    for v in ds.variables.values():
        v.encoding = {}
    tmp = path.with_name(path.name + ".partial")
    ds.to_netcdf(tmp, engine="h5netcdf")
    os.replace(tmp, path)
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
    chunks not yet recorded. Without it an existing store is replaced, unless it is unfinished
    (an error: pass `resume` or remove it). `chunk` overrides the spec's chunk size for a new
    store (a resumed store keeps its chunk shape). `progress(total, done)` makes a reporter
    with `update(done)` and `close()`. `stop()` is checked after every chunk is written: when
    it returns True the run ends early (`Outcome.interrupted`). Under `jax.distributed`, every
    process calls this with the same arguments (see the module docstring).
    """
    out = Path(out)
    store = out / STORE
    rank, n_proc = jax.process_index(), jax.process_count()
    runner = Runner(devices)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        keep = False
        if store.exists():
            if resume:
                ds = _open_store(store)
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
    ds = _open_store(store)
    _check_resumable(ds, sweep, store)
    layout = store_layout(ds)
    chunk_done = layout.done_chunks(np.asarray(ds["done"].values, dtype=bool))
    mine = [i for i in range(layout.n_chunks) if i % n_proc == rank]
    todo = [i for i in mine if not chunk_done[i]]
    total = sum(layout.count(i) for i in mine)
    already = total - sum(layout.count(i) for i in todo)
    if already:
        log(f"resuming: {already} of {total} configurations already done "
            f"({len(mine) - len(todo)}/{len(mine)} chunks); computing {total - already}")
    batch = runner.batch_size(layout.chunk_size)
    log(f"{layout.n_configs} configurations in {layout.n_chunks} chunks of shape {layout.block} "
        f"(batch {batch}) on {runner.describe()}" + (f"; this process: {len(mine)} chunks" if n_proc > 1 else ""))
    reporter = progress(total, already) if progress else None
    computed, interrupted = 0, False
    throttle = float(os.environ.get(THROTTLE_ENV, "0") or 0)
    try:
        for i in todo:
            if stop is not None and stop():
                interrupted = True
                break
            _write_chunk(store, layout, i, _compute_chunk(sweep, layout, i, runner, batch))
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
    ds = xr.open_dataset(p, engine="h5netcdf") if p.is_file() else _open_store(p)
    a = ds.attrs
    lines = [f"{a.get('title', '')}", f"  path        : {p}", f"  made by     : {a.get('source', '?')}",
             f"  device      : {a.get('device', '?')}", f"  created     : {str(a.get('history', '?')).split(' ')[0]}",
             f"  arch        : {a.get('arch', '?')}, kernel {a.get('kernel', '?')}, seed {a.get('seed', '?')}"]
    sweep_dims_ = [d for d in ds["makespan_ns"].dims]
    lines.append("  dimensions  : " + ", ".join(f"{d}={n}" for d, n in ds.sizes.items()))
    paths = list(np.atleast_1d(a.get("swept_paths", sweep_dims_)))
    lines.append("  swept:")
    for d, path_ in zip(sweep_dims_, paths):
        values = ds[d].values
        shown = ", ".join(str(v) for v in values[:12]) + (", ..." if len(values) > 12 else "")
        lines.append(f"    {d} ({path_}): {shown}")
    if "done" in ds:
        layout = store_layout(ds)
        done = np.asarray(ds["done"].values, dtype=bool)
        chunks = layout.done_chunks(done)
        state = "complete" if done.all() else "unfinished (continue with --resume)"
        lines.append(f"  completion  : {int(chunks.sum())}/{layout.n_chunks} chunks of shape {layout.block}, "
                     f"{int(done.sum())}/{done.size} configurations, {state}")
    else:
        lines.append(f"  completion  : complete ({int(np.prod([ds.sizes[d] for d in sweep_dims_]))} configurations, netCDF)")
    lines.append("  variables   : " + ", ".join(
        f"{k} [{ds[k].attrs.get('units', '')}]" for k in ds.data_vars if k != "done"))
    return "\n".join(lines)
