"""What makes a sweep store's record of a chunk trustworthy: the chunk's data reaches the disk
(`fsync`) before its `done` entry is written, and a SHA-256 checksum of that data, kept in the
store, lets every later reader verify it.

A chunk is written in three steps, each made durable before the next: its data (one zarr file
per variable), its checksums, its `done` entry. A kill, a full disk or an I/O error at any point
leaves the chunk not done (it is recomputed on `--resume`), never done with data that is not
on disk. A chunk file that changes afterwards (truncated, overwritten, lost) no longer matches
its checksum: `jaxsched check` reports it and `--resume` recomputes it.

Checksums are per chunk and per variable: SHA-256 of the variable's dtype, shape and values over
the chunk's region as zarr stores them (NaNs in one canonical form, so that the check does not
depend on a NaN's payload). They live in the zarr array `CHECKSUMS` of the store (uint8, shape
(chunks, variables, 32), one zarr chunk per compute chunk, so that processes writing different
chunks never write one file), in a subgroup that `xarray.open_zarr` does not show; its
`variables` attribute names the columns. All zeros: no checksum recorded.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import zarr

CHECKSUMS = "integrity/sha256"  # the checksum array, relative to the store
_DIGEST_BYTES = 32

Region = tuple[slice, ...]  # a chunk's index ranges over the configuration dimensions


def digest(values: np.ndarray) -> np.ndarray:
    """SHA-256 of one variable's values over one chunk (uint8[32])."""
    a = np.ascontiguousarray(values)
    if a.dtype.kind == "f":
        a = np.where(np.isnan(a), np.nan, a).astype(a.dtype)
    h = hashlib.sha256(f"{a.dtype.str} {a.shape} ".encode())
    h.update(a.tobytes())
    return np.frombuffer(h.digest(), dtype=np.uint8)


def digests(values: dict[str, np.ndarray], names: Sequence[str]) -> np.ndarray:
    """The checksums of one chunk's variables, in the order of `names` (uint8[variables, 32])."""
    return np.stack([digest(values[name]) for name in names])


def create(store: Path, n_chunks: int, names: Sequence[str]) -> None:
    """The empty checksum array of a new store (no chunk has a checksum yet)."""
    group = zarr.open_group(str(store), mode="r+", zarr_format=2).require_group(CHECKSUMS.split("/")[0])
    group.create_array(CHECKSUMS.split("/")[1], shape=(n_chunks, len(names), _DIGEST_BYTES),
                       chunks=(1, len(names), _DIGEST_BYTES), dtype="uint8", fill_value=0,
                       attributes={"variables": list(names),
                                   "long_name": "SHA-256 of each chunk's values, per variable (0: none recorded)"})


def recorded(store: Path) -> tuple[list[str], np.ndarray] | None:
    """(variable names, checksums uint8[chunks, variables, 32]) of a store; None if it has no
    checksum array (a store made before checksums)."""
    if not (store / CHECKSUMS / ".zarray").is_file():
        return None
    array = zarr.open_array(str(store / CHECKSUMS), mode="r")
    return list(array.attrs["variables"]), np.asarray(array[...])


def record(store: Path, i: int, values: dict[str, np.ndarray]) -> None:
    """Write the checksums of chunk `i`'s `values` (variable -> values over its region) and make
    them durable."""
    array = zarr.open_array(str(store / CHECKSUMS), mode="r+")
    array[i] = digests(values, array.attrs["variables"])
    sync([store / CHECKSUMS / f"{i}.0.0"])


def sync(files: Iterable[Path]) -> None:
    """`fsync` each file that exists, then each of their folders (which hold the renames zarr
    writes with); a file zarr did not write (a chunk equal to the fill value) is skipped."""
    folders = set()
    for path in files:
        folders.add(path.parent)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    for folder in sorted(folders):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def verify(store: Path, regions: dict[int, Region], names: Sequence[str], table: np.ndarray) -> dict[int, str]:
    """Chunks of `regions` whose data does not match its checksum in `table`, with what is wrong
    ("makespan_ns unreadable (RuntimeError)", "sm_ctas differs from its checksum").

    Each variable is read whole once (one variable in memory at a time); if that fails, chunk by
    chunk, to find the chunks that cannot be read."""
    problems: dict[int, list[str]] = {i: [] for i in regions}
    for j, name in enumerate(names):
        array = zarr.open_array(str(store / name), mode="r")
        read: Callable[[Region], np.ndarray]
        try:
            whole = array[...]
            read = lambda region: whole[region]  # noqa: E731
        except Exception:  # noqa: BLE001 -- a damaged chunk file: find it below
            read = lambda region: array[region]  # noqa: E731
        for i, region in regions.items():
            try:
                values = read(region)
            except Exception as exc:  # noqa: BLE001 -- whatever the codec says about a damaged file
                problems[i].append(f"{name} unreadable ({type(exc).__name__})")
                continue
            if not np.array_equal(digest(values), table[i, j]):
                problems[i].append(f"{name} differs from its checksum" if table[i, j].any()
                                   else f"{name} has no checksum recorded")
    return {i: "; ".join(p) for i, p in problems.items() if p}
