"""CTA traces: which SM ran each CTA, and when. One format for the simulator and for hardware.

A trace is an `xarray.Dataset` saved as netCDF (h5netcdf engine, `.nc`) or zarr (`.zarr`):

- dimensions `cta` (grid order: CTA index = `blockIdx` linearised) and `sm` (SM slot = `%smid`);
- `cta_sm[cta]` int32: the SM that ran the CTA;
- `cta_start_ns[cta]`, `cta_end_ns[cta]` float64: when it started and ended, ns since the launch
  (global time: the simulator's ticks, or a globaltimer-style clock on hardware);
- optional `cta_start_cycles[cta]`, `cta_end_cycles[cta]` int64: the SM's own `clock64()` at the
  CTA's start and end (hardware probes record them; both or neither). They give each SM's
  effective clock directly, as cycles over nanoseconds;
- optional `cta_work[cta]` float64: the CTA's work where known (warp instructions it issues;
  simulator traces compute it from the program and the per-CTA trip counts), so that load
  imbalance between CTAs is not mistaken for SM speed;
- `sm_freq_mhz[sm]` float64: the SM's true clock where known (simulator input, or a locked
  clock), NaN otherwise (and on SMs that ran nothing);
- attributes: `source` ("jaxsched" or "probe"), `arch` (preset or chip name), `kernel` (name),
  `threads_per_cta`, `grid_ctas`, `ctas_per_sm` (occupancy), `program` (free-form: the jaxsched
  program text for simulator traces). Simulator traces add what rebuilds the launch
  (`regs_per_thread`, `dynamic_smem_bytes`, `static_smem_bytes`, `l2_hit_rate`, `kernel_seed`,
  `warp_policy`, `dispatch`, `dispatch_start`), so `kernel(ds)` can run it again.

`load` validates everything it reads and names the offending variable, attribute or value.
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import xarray as xr

from .arch import Arch
from .clocks import Clocks
from .engine.run import Result
from .engine.variation import warp_variation
from .errors import JaxschedError, check
from .isa import Op
from .kernel import Kernel, make_kernel
from .structure import executions
from .lower import lower
from .occupancy import occupancy

SOURCES = ("jaxsched", "probe")
REQUIRED_VARS = {"cta_sm": ("cta",), "cta_start_ns": ("cta",), "cta_end_ns": ("cta",), "sm_freq_mhz": ("sm",)}
CYCLE_VARS = ("cta_start_cycles", "cta_end_cycles")
REQUIRED_ATTRS = ("source", "arch", "kernel", "threads_per_cta", "grid_ctas", "ctas_per_sm", "program")
LAUNCH_ATTRS = ("regs_per_thread", "dynamic_smem_bytes", "static_smem_bytes", "l2_hit_rate", "kernel_seed")
_INT_ATTRS = ("threads_per_cta", "grid_ctas", "ctas_per_sm")

_META = {
    "cta_sm": ("SM slot (%smid) that ran the CTA", "1"),
    "cta_start_ns": ("CTA start time since the launch", "ns"),
    "cta_end_ns": ("CTA end time since the launch", "ns"),
    "cta_start_cycles": ("the SM's clock64() at the CTA's start", "cycles"),
    "cta_end_cycles": ("the SM's clock64() at the CTA's end", "cycles"),
    "sm_freq_mhz": ("true SM clock where known (NaN: unknown)", "MHz"),
    "cta_work": ("warp instructions the CTA issues", "1"),
}


def make(
    cta_sm: np.ndarray,
    cta_start_ns: np.ndarray,
    cta_end_ns: np.ndarray,
    sm_freq_mhz: np.ndarray,
    *,
    source: str,
    arch: str,
    kernel: str,
    threads_per_cta: int,
    ctas_per_sm: int,
    program: str,
    cta_start_cycles: np.ndarray | None = None,
    cta_end_cycles: np.ndarray | None = None,
    cta_work: np.ndarray | None = None,
    **attrs: object,
) -> xr.Dataset:
    """A validated trace from per-CTA arrays (grid order) and per-SM clocks (the probe's entry)."""
    data = {
        "cta_sm": ("cta", np.asarray(cta_sm, np.int32)),
        "cta_start_ns": ("cta", np.asarray(cta_start_ns, np.float64)),
        "cta_end_ns": ("cta", np.asarray(cta_end_ns, np.float64)),
        "sm_freq_mhz": ("sm", np.asarray(sm_freq_mhz, np.float64)),
    }
    check((cta_start_cycles is None) == (cta_end_cycles is None), "cta_start_cycles",
          "only one of start/end cycles", "give both cta_start_cycles and cta_end_cycles, or neither")
    if cta_start_cycles is not None:
        data["cta_start_cycles"] = ("cta", np.asarray(cta_start_cycles, np.int64))
        data["cta_end_cycles"] = ("cta", np.asarray(cta_end_cycles, np.int64))
    if cta_work is not None:
        data["cta_work"] = ("cta", np.asarray(cta_work, np.float64))
    n_cta = len(data["cta_sm"][1])
    ds = xr.Dataset(
        data,
        coords={"cta": np.arange(n_cta, dtype=np.int64), "sm": np.arange(len(data["sm_freq_mhz"][1]), dtype=np.int64)},
        attrs={"source": source, "arch": arch, "kernel": kernel, "threads_per_cta": int(threads_per_cta),
               "grid_ctas": int(n_cta), "ctas_per_sm": int(ctas_per_sm), "program": program, **attrs},
    )
    for name, (long_name, units) in _META.items():
        if name in ds:
            ds[name].attrs.update(long_name=long_name, units=units)
    return validate(ds)


def from_result(result: Result, arch: Arch, kernel: Kernel, clocks: Clocks, *, program: str = "",
                **attrs: object) -> xr.Dataset:
    """The trace of one simulated launch (an unbatched `Result`).

    `program` is the kernel's program text (a `Kernel` keeps only its lowered form); pass it so
    that `kernel(trace)` can rebuild the launch. Extra `attrs` (e.g. `warp_policy="gto"`,
    `dispatch="hardware"`) are stored as they are.
    """
    check(np.ndim(result.makespan_ns) == 0, "result", f"batch of {np.shape(result.makespan_ns)}",
          "one configuration (index a batched Result first)")
    n = int(kernel.grid_ctas)
    enabled = np.asarray(arch.sm_enabled)
    mhz = np.where(enabled, np.asarray(clocks.sm_freq_mhz, np.float64), np.nan)
    occ = occupancy(arch, kernel.threads_per_cta, kernel.regs_per_thread, kernel.dynamic_smem_bytes,
                    kernel.static_smem_bytes)
    return make(
        np.asarray(result.cta_sm)[:n], result.cta_start_ns[:n], result.cta_end_ns[:n], mhz,
        cta_work=cta_work(arch, kernel, clocks), source="jaxsched", arch=arch.name, kernel=kernel.name,
        threads_per_cta=int(kernel.threads_per_cta), ctas_per_sm=int(occ.blocks_per_sm), program=program,
        regs_per_thread=int(kernel.regs_per_thread), dynamic_smem_bytes=int(kernel.dynamic_smem_bytes),
        static_smem_bytes=int(kernel.static_smem_bytes), l2_hit_rate=float(kernel.l2_hit_rate),
        kernel_seed=int(kernel.seed), tick_mhz=float(result.tick_mhz), **attrs,
    )


@jax.jit
def _cta_variation(program, warps, ctas):
    """`warp_variation` of warps `warps` of each CTA of `ctas`, in one compiled program (integer
    hashes and tables: the same as op by op, which compiled some 60 small programs per shape)."""
    return jax.vmap(lambda c: warp_variation(program, c, warps))(ctas)


def cta_work(arch: Arch, kernel: Kernel, clocks: Clocks) -> np.ndarray:
    """Warp instructions each CTA issues, summed over its warps: each instruction before the exit
    as often as the loops around it run for the warp, if the if/else paths around it have lanes
    (`structure.executions`; docs/model.md sections 4, 6)."""
    launch = lower(arch, kernel, clocks, 0, 0, 0)
    n_exit = int(np.argmax(np.asarray(kernel.op) == Op.EXIT)) + 1  # padding EXITs never run
    warps = np.arange(int(launch.program.warps_per_cta), dtype=np.int32)
    trips, _, branch_lanes = (np.asarray(x) for x in _cta_variation(launch.program, warps,
                                                                      np.arange(int(kernel.grid_ctas), dtype=np.int32)))
    i = lambda name: np.asarray(getattr(kernel, name))  # noqa: E731
    count = executions(i("loop_start"), i("loop_end"), i("branch_start"), i("branch_mid"), i("branch_end"),
                       n_exit, trips, branch_lanes & 63, branch_lanes >> 6)
    return np.sum(count, axis=(1, 2)).astype(np.float64)


def validate(ds: xr.Dataset, where: str = "trace") -> xr.Dataset:
    """Check variables, dimensions, dtypes, values and attributes; return `ds` unchanged."""
    for name, dims in REQUIRED_VARS.items():
        check(name in ds, f"{where}: {name}", "missing", f"a trace needs {sorted(REQUIRED_VARS)}")
        check(ds[name].dims == dims, f"{where}: {name}", f"dims {ds[name].dims}", f"dims {dims}")
    for attr in REQUIRED_ATTRS:
        check(attr in ds.attrs, f"{where}: attribute {attr}", "missing", f"a trace needs {REQUIRED_ATTRS}")
    check(ds.attrs["source"] in SOURCES, f"{where}: source", ds.attrs["source"], f"one of {SOURCES}")
    for attr in _INT_ATTRS:
        value = ds.attrs[attr]
        check(isinstance(value, (int, np.integer)) and int(value) >= 1, f"{where}: {attr}", value,
              "a positive integer")
    n_cta, n_sm = ds.sizes["cta"], ds.sizes["sm"]
    check(n_cta >= 1 and n_sm >= 1, f"{where}: dims", dict(ds.sizes), "at least one CTA and one SM")
    check(int(ds.attrs["grid_ctas"]) == n_cta, f"{where}: grid_ctas", ds.attrs["grid_ctas"],
          f"the length of the cta dimension ({n_cta})")
    sm = ds["cta_sm"].values
    check(sm.dtype.kind in "iu", f"{where}: cta_sm", f"dtype {sm.dtype}", "integer SM indices")
    bad = (sm < 0) | (sm >= n_sm)
    check(not bad.any(), f"{where}: cta_sm", int(sm[bad][0]) if bad.any() else 0,
          f"an SM index in 0 .. {n_sm - 1} (CTA {int(np.argmax(bad))})")
    start, end = ds["cta_start_ns"].values, ds["cta_end_ns"].values
    finite = np.isfinite(start) & np.isfinite(end)
    check(finite.all(), f"{where}: cta_start_ns/cta_end_ns", "NaN or inf",
          f"finite times (CTA {int(np.argmin(finite))})")
    order = end > start
    check(order.all(), f"{where}: cta_end_ns", float(end[~order][0]) if (~order).any() else 0.0,
          f"after the CTA's start (CTA {int(np.argmin(order))})")
    check(bool((start >= 0).all()), f"{where}: cta_start_ns", float(start.min()), ">= 0 (ns since the launch)")
    present = [v for v in CYCLE_VARS if v in ds]
    check(len(present) in (0, 2), f"{where}: {present}", "only one of the cycle counters",
          f"both {CYCLE_VARS} or neither")
    if present:
        for v in CYCLE_VARS:
            check(ds[v].dims == ("cta",) and ds[v].dtype.kind in "iu", f"{where}: {v}",
                  f"dims {ds[v].dims}, dtype {ds[v].dtype}", "integer cycles per CTA")
        cyc = ds["cta_end_cycles"].values.astype(np.int64) - ds["cta_start_cycles"].values.astype(np.int64)
        check(bool((cyc > 0).all()), f"{where}: cta_end_cycles", int(cyc.min()),
              "more than cta_start_cycles on every CTA")
    if "cta_work" in ds:
        work = ds["cta_work"].values
        check(ds["cta_work"].dims == ("cta",) and bool(np.all(np.isfinite(work) & (work > 0))),
              f"{where}: cta_work", f"min {np.min(work) if work.size else 'none'}", "a positive work per CTA")
    mhz = ds["sm_freq_mhz"].values
    ok = np.isnan(mhz) | (mhz > 0)
    check(ok.all(), f"{where}: sm_freq_mhz", float(mhz[~ok][0]) if (~ok).any() else 0.0, "> 0 MHz, or NaN if unknown")
    return ds


def save(ds: xr.Dataset, path: str | Path) -> Path:
    """Write a validated trace: `.nc` as netCDF (h5netcdf), `.zarr` as a zarr store."""
    p = Path(path)
    check(p.suffix in (".nc", ".zarr"), "trace path", str(p), "ends in .nc (netCDF) or .zarr")
    validate(ds)
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.suffix == ".nc":
        ds.to_netcdf(p, engine="h5netcdf")
    else:
        ds.to_zarr(p, mode="w", zarr_format=2, consolidated=True)
    return p


def load(path: str | Path) -> xr.Dataset:
    """Read and validate a trace written by `save` (or by a hardware probe in the same format)."""
    p = Path(path)
    check(p.exists(), "trace", str(p), "no such file")
    try:
        ds = xr.open_zarr(p) if p.suffix == ".zarr" else xr.open_dataset(p, engine="h5netcdf")
        ds = ds.load()
    except (OSError, ValueError) as exc:
        raise JaxschedError("trace", str(p), f"not a netCDF/zarr trace ({exc})") from None
    for attr in _INT_ATTRS:  # netCDF hands integer attributes back as numpy scalars
        if isinstance(ds.attrs.get(attr), np.integer):
            ds.attrs[attr] = int(ds.attrs[attr])
    return validate(ds, where=str(p))


def kernel(ds: xr.Dataset) -> Kernel:
    """Rebuild the simulated launch's `Kernel` from a jaxsched trace's attributes."""
    check(ds.attrs.get("source") == "jaxsched", "trace source", ds.attrs.get("source"),
          "only jaxsched traces carry the launch (a probe trace's program is free-form)")
    missing = [a for a in LAUNCH_ATTRS if a not in ds.attrs]
    check(not missing and bool(ds.attrs["program"]), "trace attributes", missing or "program",
          "present (write the trace with from_result(..., program=TEXT))")
    a = ds.attrs
    return make_kernel(str(a["program"]), grid=int(a["grid_ctas"]), threads=int(a["threads_per_cta"]),
                       regs=int(a["regs_per_thread"]), smem_bytes=int(a["dynamic_smem_bytes"]),
                       static_smem_bytes=int(a["static_smem_bytes"]), l2_hit_rate=float(a["l2_hit_rate"]),
                       seed=int(a["kernel_seed"]), name=str(a["kernel"]))
