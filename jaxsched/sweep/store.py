"""The result dataset and where it is kept: its variables (`VARIABLES`, `TRACE_VARIABLES`) with
their fill values, its coordinates and attributes (with the resolved spec's `fingerprint`), the
resumable zarr store (`create_store`; each chunk's data, checksums and `done` entry made durable
in turn; `open_store`, `read_done`, `store_progress`, `verify_chunks`), the netCDF copy
(`write_netcdf`) and reading a result back (`open_result`; `describe` for `jaxsched info`). The
file format is described in the package docstring ("Output store")."""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import os
import shutil
from pathlib import Path
from typing import Sequence

import numpy as np
import xarray as xr
import zarr

from .. import __version__, archio, sweep_integrity
from ..engine.state import STALL_REASONS
from ..errors import JaxschedError, check, os_error
from ..sweep_design import CONFIG_DIM, design_coords
from .layout import Layout, dim_name, point_dims
from .spec import Sweep

STORE = "sweep.zarr"
NETCDF = "sweep.nc"
STORE_VERSION = 2  # 2: per-chunk checksums (sweep_integrity)


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



def _unfilled(sweep: Sweep, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    """Every variable at its fill value (NaN, or 0 for counts) over configurations `shape`."""
    return {name: np.full(shape + _extra_shape(sweep, extra), _fill_of(name, dtype), dtype=dtype)
            for name, (extra, dtype, _) in variables(sweep).items()}


def fingerprint(sweep: Sweep) -> str:
    """SHA-256 of the spec text, the resolved arch and kernel (files named by the spec may
    change while its text does not), the design's samples (a library update could change
    them) and the fitted policy's file."""
    h = hashlib.sha256(sweep.text.encode())
    h.update(archio.dumps(sweep.arch).encode())
    for f in dataclasses.fields(sweep.kernel):
        h.update(f.name.encode())
        h.update(np.asarray(getattr(sweep.kernel, f.name)).tobytes())
    for path, values in (sweep.design.values.items() if sweep.design else ()):
        h.update(path.encode())
        h.update(np.asarray(values).tobytes())
    if sweep.fitted is not None:  # the fitted policy's file may change while the spec does not
        h.update(sweep.fitted.text.encode())
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
        **({"fitted_policy": sweep.fitted.text} if sweep.fitted is not None else {}),
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
