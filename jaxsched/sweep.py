"""Sweeps: a TOML spec of a base configuration and an orthogonal grid of swept values, run in
batched chunks (one compilation for equal shapes), returned as a labelled `xarray.Dataset`.

Spec (see `sweeps/demo.toml`):

    title = "..."
    arch = "h200"                    # preset name or arch TOML path (relative to the spec)
    kernel = "kernels/fma_ldg.toml"  # kernel TOML path, or an inline [kernel] table
    replicates = 4                   # independent clock-map draws per grid point
    seed = 0
    chunk = 64                       # configurations per batched call
    [clocks]  mean_ghz = 1.9, sigma = 0.05     # per-SM clock map, see `clock_map`
    [policy]  warp = "gto", dispatch = "hardware", dispatch_start = 0
    [grid]    "policy.warp" = ["lrr", "gto"], "clocks.sigma" = [0.0, 0.1], "arch.dram_bytes_per_ns" = [...]

Swept paths: `policy.{warp,dispatch,dispatch_start}`, `clocks.{mean_ghz,sigma}`, `kernel.<field>`
and `arch.<field>` for scalar fields of `Kernel` and `Arch`. Every path and value is checked
before anything runs. Replicate r draws its clock map from seed `seed * 1_000_003 + r`, the same
for every grid point (common random numbers: policies are compared on the same chips).
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import sys
import time
import tomllib
from pathlib import Path
from typing import Callable

import jax
import numpy as np
import xarray as xr

from . import __version__, archio, clocks, freqmap, presets
from .arch import Arch
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
    chunk: int

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
        chunk=int(doc.get("chunk", 64)),
    )
    check(sweep.chunk >= 1, f"{source}: chunk", sweep.chunk, ">= 1")
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
    """Yield (grid index tuple, replicate, arch, kernel, clocks, warp, dispatch, start)."""
    keys = list(sweep.grid)
    for combo in itertools.product(*(range(len(sweep.grid[k])) for k in keys)):
        arch, kernel, clk, policy = sweep.arch, sweep.kernel, dict(sweep.clocks), dict(sweep.policy)
        for key, i in zip(keys, combo):
            arch, kernel, clk, policy = _apply(key, sweep.grid[key][i], arch, kernel, clk, policy)
        validate(arch, kernel, clocks.uniform(arch))
        for r in range(sweep.replicates):
            cmap = clock_map(arch, clk, sweep.seed * 1_000_003 + r)
            yield (combo, r, arch, kernel, cmap, WARP_POLICIES.index(policy["warp"]),
                   DISPATCH_POLICIES.index(policy["dispatch"]), int(policy["dispatch_start"]))


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


def run(sweep: Sweep, progress: Callable[[int, int, float], None] | None = None) -> xr.Dataset:
    """Run every configuration in chunks and assemble the dataset."""
    configs = list(configurations(sweep))
    n = len(configs)
    results: list[Result] = []
    t0 = time.perf_counter()
    for start in range(0, n, sweep.chunk):
        part = configs[start:start + sweep.chunk]
        pad = sweep.chunk - len(part) if n > sweep.chunk else 0  # same batch shape: no recompile
        batch = simulate_batch(*(list(col) for col in list(zip(*(part + part[-1:] * pad)))[2:]))
        results.append(jax.tree.map(lambda x: x[: len(part)], batch))
        if progress:
            progress(min(start + sweep.chunk, n), n, time.perf_counter() - t0)
    return _dataset(sweep, configs, results)


def _cat(results: list[Result], name: str) -> np.ndarray:
    return np.concatenate([np.asarray(getattr(r, name)) for r in results])


def _dataset(sweep: Sweep, configs: list, results: list[Result]) -> xr.Dataset:
    keys = list(sweep.grid)
    shape = tuple(len(sweep.grid[k]) for k in keys) + (sweep.replicates,)
    dims = tuple(k.replace(".", "_") for k in keys) + ("replicate",)
    enabled = np.asarray(sweep.arch.sm_enabled)

    def grid_array(flat: np.ndarray) -> np.ndarray:
        return flat.reshape(shape + flat.shape[1:])

    stalls = _cat(results, "sm_stalls")[:, enabled].sum(axis=1)
    busy = _cat(results, "sm_busy_cycles")[:, enabled]
    issued = _cat(results, "sm_issued")[:, enabled]
    warp_cycles = _cat(results, "sm_warp_cycles")[:, enabled]
    max_warps = results[0].max_warps_per_sm
    data = {
        "makespan_ns": (dims, grid_array(_cat(results, "makespan_ns")),
                        {"units": "ns", "long_name": "kernel makespan"}),
        "makespan_cycles": (dims, grid_array(_cat(results, "makespan_cycles")),
                            {"units": "cycles", "long_name": "makespan in cycles of the boost clock"}),
        "sm_ctas": (dims + ("sm",), grid_array(_cat(results, "sm_ctas")[:, enabled]),
                    {"units": "1", "long_name": "CTAs run per SM"}),
        "sm_busy_cycles": (dims + ("sm",), grid_array(busy),
                           {"units": "cycles", "long_name": "SM cycles with a resident warp"}),
        "sm_freq_mhz": (dims + ("sm",), grid_array(np.stack([np.asarray(c[4].sm_freq_mhz)[enabled] for c in configs])),
                        {"units": "MHz", "long_name": "SM clock"}),
        "ipc": (dims + ("sm",), grid_array(issued / np.maximum(busy, 1)),
                {"units": "1", "long_name": "instructions issued per busy cycle"}),
        "achieved_occupancy": (dims + ("sm",), grid_array(warp_cycles / np.maximum(busy, 1) / max_warps),
                               {"units": "1", "long_name": "resident warps per busy cycle / warp slots"}),
        "stall_fraction": (dims + ("stall_reason",), grid_array(stalls / np.maximum(stalls.sum(-1, keepdims=True), 1)),
                           {"units": "1", "long_name": "share of warp-cycles in each state (Nsight names)"}),
    }
    coords = {d: sweep.grid[k] for d, k in zip(dims, keys)}
    coords.update(replicate=np.arange(sweep.replicates), sm=np.flatnonzero(enabled),
                  stall_reason=list(STALL_REASONS))
    return xr.Dataset(
        data, coords=coords,
        attrs={
            "title": sweep.title,
            "source": f"jaxsched {__version__}",
            "history": f"{datetime.datetime.now(datetime.timezone.utc).isoformat()} jaxsched sweep",
            "device": str(jax.devices()[0]),
            "arch": sweep.arch.name,
            "kernel": sweep.kernel.name,
            "seed": sweep.seed,
            "spec": sweep.text,
        },
    )


def print_progress(done: int, total: int, seconds: float) -> None:
    """One line per chunk on stderr (works when output is not a terminal)."""
    rate = done / max(seconds, 1e-9)
    eta = (total - done) / max(rate, 1e-9)
    print(f"  {done}/{total} configurations, {rate:.1f}/s, ETA {eta:.0f} s", file=sys.stderr, flush=True)
