"""`jaxsched check OUT [--against OTHER]`: is a sweep result what it claims to be, and is it the
same result as another one.

The store's done chunks are verified against their checksums (`sweep_integrity`): a chunk file
truncated, overwritten or lost is reported with the chunk's index ranges (`--resume` recomputes
it). A `sweep.nc` beside a complete store must equal the store. `--against OTHER` compares two
results (folders, stores or netCDF files) value by value. Two runs of one spec give identical
datasets except for the attributes in `VOLATILE_ATTRS`, which differ by design and are not
compared.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import xarray as xr

from . import sweep
from .errors import check

# Attributes that differ between two runs of one spec by design (what they record).
VOLATILE_ATTRS = {
    "history": "when the store was created (UTC) and by which command",
    "device": "the devices that ran the sweep (count, platform, kind; the process under jax.distributed)",
    "chunk_shape": "the store's chunking, from --chunk or the devices' memory (results do not depend on it)",
}


def _paths(path: Path) -> tuple[Path | None, Path | None]:
    """(store, netCDF file) of a result path: a folder holds either or both."""
    if path.is_file():
        return None, path
    if path.suffix == ".zarr":
        return path, None
    store, nc = path / sweep.STORE, path / sweep.NETCDF
    return (store if store.exists() else None), (nc if nc.exists() else None)


def check_result(path: str | Path, against: str | Path | None = None) -> tuple[bool, list[str]]:
    """(whether every check passed, the report's lines) for the result at `path`."""
    p = Path(path)
    check(p.exists(), "sweep result", str(path), "no such folder, .zarr store or .nc file")
    store, nc = _paths(p)
    check(store is not None or nc is not None, "sweep result", str(path), f"holds neither {sweep.STORE} nor {sweep.NETCDF}")
    ok, lines = True, []
    complete = False
    if store is not None:
        intact, complete, found = _check_store(store)
        ok, lines = ok and intact, lines + found
    if nc is not None:
        nc_ds = sweep.open_result(nc)
        if store is None:
            lines.append(f"{nc}: readable, {_configs(nc_ds)} configurations; no store beside it, so no chunk "
                         "checksums to verify")
        elif not complete or not ok:
            lines.append(f"{nc}: not compared with the store (the store is unfinished or damaged)")
        else:
            diffs = differences(sweep.open_result(store), nc_ds)
            ok = ok and not diffs
            lines += [f"{nc}: equals the store"] if not diffs else [f"{nc}: differs from the store:"] + [
                f"  {d}" for d in diffs]
    if against is not None:
        other = Path(against)
        check(other.exists(), "--against", str(against), "no such folder, .zarr store or .nc file")
        other_store, _ = _paths(other)
        other_intact = True
        if other_store is not None:
            other_intact, _, found = _check_store(other_store)
            lines += found
        if not (ok and other_intact):
            ok = False
            lines.append(f"against {against}: not compared (a store is damaged)")
        else:
            diffs = differences(sweep.open_result(p), sweep.open_result(other))
            ok = not diffs
            volatile = ", ".join(VOLATILE_ATTRS)
            lines += ([f"against {against}: identical (attributes {volatile} differ by design and are not compared)"]
                      if not diffs else [f"against {against}: {len(diffs)} differences"] + [f"  {d}" for d in diffs])
    return ok, lines


def _configs(ds: xr.Dataset) -> int:
    return int(np.prod([ds.sizes[d] for d in ds["makespan_ns"].dims]))


def _check_store(store: Path) -> tuple[bool, bool, list[str]]:
    """(every done chunk intact, every chunk done, report lines) of a store."""
    ds = sweep.open_store(store)
    layout = sweep.store_layout(ds)
    done, unreadable = sweep.read_done(store, layout)
    chunk_done = layout.done_chunks(done)
    recorded = [i for i in range(layout.n_chunks) if chunk_done[i]]
    bad = sweep.verify_chunks(store, layout, recorded)
    bad.update({i: "its done record cannot be read" for i in unreadable})
    lines = [f"{store}: {len(recorded)}/{layout.n_chunks} chunks done "
             f"({int(done.sum())}/{done.size} configurations)"]
    lines += [f"  {layout.describe(i)}: {problem}" for i, problem in sorted(bad.items())]
    if bad:
        lines.append(f"damaged chunks: {len(bad)} (`jaxsched sweep SPEC -o OUT --resume` recomputes them)")
    else:
        lines.append("every done chunk matches its checksum")
    return not bad, bool(done.all()) and not bad, lines


def differences(a: xr.Dataset, b: xr.Dataset) -> list[str]:
    """What differs between two sweep datasets: dimensions, coordinates and variables value by
    value (NaN equals NaN), and attributes other than `VOLATILE_ATTRS`; empty if identical."""
    if dict(a.sizes) != dict(b.sizes):
        return [f"dimensions {dict(a.sizes)} against {dict(b.sizes)}"]
    out = []
    for kind, mine, theirs in (("coordinate", a.coords, b.coords), ("variable", a.data_vars, b.data_vars)):
        for name in sorted(set(mine) | set(theirs), key=str):
            if name not in mine or name not in theirs:
                out.append(f"{kind} {name}: only in {'the first' if name in mine else 'the second'}")
                continue
            x, y = mine[name], theirs[name]
            if x.dims != y.dims:
                out.append(f"{kind} {name}: dimensions {x.dims} against {y.dims}")
                continue
            try:
                n = _unequal(x.values, y.values)
            except Exception as exc:  # noqa: BLE001 -- a damaged netCDF file reads as whatever h5py says
                out.append(f"{kind} {name}: unreadable ({type(exc).__name__})")
                continue
            if n:
                out.append(f"{kind} {name}: {n} of {x.size} values differ")
    for key in sorted((set(a.attrs) | set(b.attrs)) - set(VOLATILE_ATTRS)):
        x, y = _plain(a.attrs.get(key)), _plain(b.attrs.get(key))
        if x != y:
            out.append(f"attribute {key}: {_short(x)} against {_short(y)}")
    return out


def _unequal(x: np.ndarray, y: np.ndarray) -> int:
    """How many elements differ (NaN equals NaN; text compared as text)."""
    if x.dtype.kind in "OSU" or y.dtype.kind in "OSU":
        return int(np.sum(x.astype(str) != y.astype(str)))
    if x.dtype.kind == "f" or y.dtype.kind == "f":
        return int(np.sum(~((x == y) | (np.isnan(x.astype(float)) & np.isnan(y.astype(float))))))
    return int(np.sum(x != y))


def _plain(v: object) -> object:
    """An attribute as plain Python (netCDF gives arrays where zarr gives lists)."""
    return np.asarray(v).tolist() if isinstance(v, (list, tuple, np.ndarray, np.generic)) else v


def _short(v: object) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."
