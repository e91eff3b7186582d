"""Figures from sweep datasets and single runs (matplotlib; PNG or SVG by the file suffix).

Axes, legends and titles name each variable by its CF attributes (`long_name`, `units`) and a
swept dimension by what it sweeps ("warp policy", "per-SM clock spread σ"), values as the
documentation writes them ("LRR", "round robin"); long titles are wrapped, not cut.

- `makespan(ds, out, x=...)`: makespan against any swept dimension, one panel per combination
  of the other swept dimensions (e.g. per policy: small multiples, the other panels' medians
  in grey behind each), median over replicates as a line with an interquartile band and a
  lighter min-max band. On a random or Latin-hypercube design sweep, `x` is one of
  the sampled parameters (default: the first numeric one): every configuration is a point of a
  scatter, with the median over bins of `x` (or over its values, when few or categorical) drawn
  as a line, one colour per combination of the grid dimensions; infeasible (NaN) points are
  counted in the title.
- `floorplan(ds, out, var="sm_utilisation")`: a per-SM variable drawn at each SM's position on
  the die outline (`sm_x_mm`, `sm_y_mm`, `die_width_mm`, `die_height_mm`), averaged over every
  dimension not fixed by `sel`.
- `stalls(ds, out, x=...)`: the warp-state (stall reason) breakdown as stacked bars per value of
  a swept dimension, one panel per combination of the other swept dimensions (averaged over
  replicates and a design's samples).
- `gantt(result, arch, out)`: each CTA as a bar from its start to its end on its SM's row (CTAs
  resident together on one SM are stacked in lanes), from a `Result`, the JSON of
  `jaxsched run --json` or a CTA trace (`jaxsched.trace`).

`content(path)` tells what a file holds by reading it, whatever its name.
"""

from __future__ import annotations

import itertools
import json
import textwrap
import warnings
from pathlib import Path
from typing import Any, Mapping

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import xarray as xr  # noqa: E402
from matplotlib.collections import PatchCollection  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from . import tomldoc  # noqa: E402
from .errors import JaxschedError, check  # noqa: E402
from .policies import DISPATCH_POLICIES  # noqa: E402
from .sweep_design import CONFIG_DIM, design_coords  # noqa: E402

KINDS = ("makespan", "floorplan", "stalls", "gantt")
_MAX_PANELS = 12
_MAX_BINS = 12

# What a swept dimension sweeps, where the dataset's coordinate carries no `long_name`.
_DIM_NAMES = {
    "policy_warp": "warp policy", "policy_dispatch": "CTA dispatch", "policy_dispatch_start": "dispatch start",
    "policy_weights": "dispatch weights", "policy_ema_alpha": "closed-loop EMA α",
    "policy_ema_prior_ns": "closed-loop prior (ns)", "policy_hold_margin": "closed-loop hold margin",
    "policy_hold_noise": "closed-loop hold noise weight", "policy_hold_queue": "closed-loop hold queue weight",
    "policy_hold_left": "closed-loop hold CTAs-left weight",
    "clocks_model": "clock model", "clocks_mean_ghz": "mean SM clock (GHz)",
    "clocks_sigma": "per-SM clock spread σ", "clocks_sigma_die": "die-to-die clock spread σ",
    "clocks_corr_length_mm": "clock correlation length (mm)", "clocks_ir_drop": "IR drop",
    "kernel_threads": "threads per CTA", "kernel_threads_fixed_work": "threads per CTA (fixed work)",
    "kernel_regs": "registers per thread", "kernel_grid": "grid (CTAs)", "kernel_trips": "loop trips",
    "kernel_smem_bytes": "dynamic shared memory (B)", "replicate": "random chip", "config": "sample",
}
_VALUE_NAMES = {"lrr": "LRR", "gto": "GTO", "oldest": "oldest first",
                **{name: name.replace("_", " ") for name in DISPATCH_POLICIES}}
_UNITS = {"ns": "ns", "us": "µs", "ms": "ms", "ghz": "GHz", "mhz": "MHz", "mm": "mm", "bytes": "B", "w": "W",
          "c": "°C", "cycles": "cycles"}


def label(ds: xr.Dataset, name: str) -> str:
    """How a figure names variable or dimension `name`: its `long_name` and `units` (CF), else
    what the swept path is, else the name with its unit suffix spelt out ("mean_ghz": "mean
    (GHz)")."""
    attrs = ds[name].attrs if name in ds.variables else {}
    if name in _DIM_NAMES:  # a swept path; a design's coordinates say "sampled" and which path
        return _DIM_NAMES[name] + (", sampled" if "path" in attrs else "")
    if "long_name" in attrs:
        units = attrs.get("units", "")
        return attrs["long_name"] + (f" ({_UNITS.get(units.lower(), units)})" if units not in ("", "1") else "")
    stem, _, unit = name.rpartition("_")
    return f"{stem.replace('_', ' ')} ({_UNITS[unit]})" if stem and unit in _UNITS else name.replace("_", " ")


def _short(ds: xr.Dataset, name: str) -> str:
    """`label` without its units: a legend or panel title names a dimension before its value."""
    return label(ds, name).split(" (")[0].removesuffix(", sampled")


def value_text(value: object) -> str:
    """A coordinate value as text: policy names as written in the docs, numbers short."""
    if isinstance(value, (bytes, np.bytes_)):
        value = value.decode()
    if isinstance(value, (str, np.str_)):
        return _VALUE_NAMES.get(str(value), str(value))
    if isinstance(value, (bool, np.bool_)):
        return "on" if value else "off"
    if isinstance(value, (float, np.floating)):
        return f"{float(value):g}"
    return str(value)


def _over(ds: xr.Dataset, dims: list[str]) -> str:
    """The dimensions a figure averages over, plural: "the random chips, warp policy"."""
    plural = {"replicate": "the random chips", CONFIG_DIM: "the design's samples"}
    return ", ".join(plural.get(d) or _short(ds, d) for d in dims)


def _combo(ds: xr.Dataset, dims: list[str], values: tuple) -> str:
    return ", ".join(f"{_short(ds, d)} {value_text(v)}" for d, v in zip(dims, values))


def _wrap(text: str, width: int) -> str:
    """`text` broken into lines of at most `width` characters (existing line breaks kept)."""
    return "\n".join(textwrap.fill(line, width) if line else line for line in text.splitlines())


def content(path: str | Path) -> str:
    """What `path` holds, read from its bytes rather than its name: "json" (the trace of
    `jaxsched run --json`) or "dataset" (a netCDF/HDF5 file, a zarr store, or a sweep's output
    folder). Anything else is a `JaxschedError` naming the file."""
    p = Path(path)
    what = ("a sweep's output folder, sweep.zarr or sweep.nc, a CTA trace (.nc), or the JSON of "
            "`jaxsched run --json`")
    check(p.exists(), "dataset", str(p), "no such file or folder")
    if p.is_dir():
        markers = ("sweep.zarr", "sweep.nc", ".zgroup", "zarr.json", ".zattrs")
        check(any((p / m).exists() for m in markers), "dataset", str(p), f"a folder without a sweep result: expected {what}")
        return "dataset"
    try:
        with p.open("rb") as f:
            head = f.read(512)
    except OSError as exc:
        raise JaxschedError("dataset", str(p), f"cannot be read ({exc.strerror})") from None
    if head.startswith(b"\x89HDF\r\n\x1a\n"):
        return "dataset"
    if head.lstrip()[:1] == b"{":
        return "json"
    kind = "netCDF-3 (jaxsched writes netCDF-4)" if head.startswith(b"CDF") else "neither JSON nor netCDF/HDF5"
    raise JaxschedError("dataset", str(p), f"{kind}: expected {what}")


def _grid_dims(ds: xr.Dataset) -> list[str]:
    """The grid's dimensions (not `replicate`, nor a design's `config`)."""
    return [d for d in ds["makespan_ns"].dims if d not in ("replicate", CONFIG_DIM)]


def _is_numeric(values: np.ndarray) -> bool:
    return np.issubdtype(values.dtype, np.number) and values.dtype.kind != "b"


def _pick_x(ds: xr.Dataset, x: str | None, choices: list[str]) -> str:
    numeric = [d for d in choices if _is_numeric(ds[d].values)]
    x = x or (numeric[0] if numeric else (choices[0] if choices else None))
    check(x is not None, "plot x", x, "the dataset has no swept dimension")
    check(x in choices, "plot x", x, f"one of {choices}")
    return x


def _save(fig: plt.Figure, out: str | Path) -> Path:
    """Write `fig` (its constrained layout fits every text at the file's resolution) and close it."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _apply_sel(da: xr.DataArray, sel: Mapping[str, Any] | None) -> xr.DataArray:
    if not sel:
        return da
    for dim in sel:
        check(dim in da.dims, "plot sel", dim, f"one of the dimensions {list(da.dims)}")
    return da.sel(dict(sel))


def _panels(n: int) -> tuple[int, int]:
    """(rows, columns) of small multiples: up to 3 columns."""
    cols = min(n, 2 if n <= 4 else 3)
    return -(-n // cols), cols


def makespan(ds: xr.Dataset, out: str | Path, x: str | None = None) -> Path:
    """Makespan against swept dimension `x` (default: the first numeric one), one panel per
    value of the other swept dimensions (the other panels' medians drawn in grey behind each),
    median over replicates (and design samples) as a line with an interquartile band and a
    lighter min-max band. On a design sweep `x` defaults to a sampled parameter: see
    `makespan_scatter`."""
    params, grid = design_coords(ds), _grid_dims(ds)
    if params and x not in grid:
        check(x is None or x in params, "plot x", x, f"one of the sampled parameters {params} or the grid dimensions {grid}")
        return makespan_scatter(ds, out, _pick_x(ds, x, params))
    x = _pick_x(ds, x, grid)
    others = [d for d in grid if d != x]
    spread = ["replicate"] + ([CONFIG_DIM] if params else [])
    xs = ds[x].values
    numeric = _is_numeric(xs)
    xpos = xs if numeric else np.arange(len(xs))
    combos = list(itertools.product(*(ds[d].values for d in others)))
    if len(combos) > _MAX_PANELS:  # too many panels to read: the median over the others
        combos, spread = [()], spread + others
        others = []
    quantiles = []
    for combo in combos:
        sel = ds["makespan_ns"].sel(dict(zip(others, combo)))
        with warnings.catch_warnings():  # infeasible points: all-NaN slices give NaN, drawn as gaps
            warnings.simplefilter("ignore", RuntimeWarning)
            quantiles.append(sel.quantile([0.0, 0.25, 0.5, 0.75, 1.0], dim=spread).transpose("quantile", x).values
                             / 1000.0)
    rows, cols = _panels(len(combos))
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols + 0.6, 3.3 * rows + 1.3), sharex=True, sharey=True,
                             squeeze=False, layout="constrained")
    colors = plt.get_cmap("tab10")(np.arange(len(combos)) % 10)
    for k, (ax, combo, q) in enumerate(zip(axes.flat, combos, quantiles)):
        for other in quantiles:  # the other panels' medians, for comparison
            ax.plot(xpos, other[2], color="0.8", linewidth=1.0, zorder=1)
        ax.fill_between(xpos, q[0], q[4], color=colors[k], alpha=0.12, linewidth=0, zorder=2, label="min-max")
        ax.fill_between(xpos, q[1], q[3], color=colors[k], alpha=0.3, linewidth=0, zorder=3, label="interquartile range")
        ax.plot(xpos, q[2], color=colors[k], marker="o", markersize=4, zorder=4, label="median")
        ax.set_title(_wrap(_combo(ds, others, combo), 45) or "all configurations", fontsize=9)
        ax.grid(alpha=0.3)
        ax.ticklabel_format(axis="y", useOffset=False, style="plain")
        if not numeric or len(xs) <= _MAX_BINS:  # ticks at the swept values
            ax.set_xticks(xpos, [value_text(v) for v in xs])
    for ax in list(axes.flat)[len(combos):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel(label(ds, x))
    for ax in axes[:, 0]:
        ax.set_ylabel(label(ds, "makespan_ns").replace("(ns)", "(µs)"))
    axes[0, 0].legend(fontsize=7, loc="best")
    n = int(np.prod([ds.sizes[d] for d in spread]))
    over = "random chips" + (" and samples" if params else "") + (" and " + ", ".join(_short(ds, d) for d in spread
                                                                                         if d not in ("replicate", CONFIG_DIM))
                                                                   if len(spread) > 1 + bool(params) else "")
    fig.suptitle(_wrap(f"{ds.attrs.get('title', '')}\nper point: median, interquartile range and min-max over {n} "
                       f"{over}; grey: the other panels' medians", 110), fontsize=10)
    return _save(fig, out)


def _bins(xs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bin of each x, bin centre): its distinct values when there are few, else equal-width bins."""
    distinct = np.unique(xs)
    if len(distinct) <= _MAX_BINS:
        return np.searchsorted(distinct, xs), distinct.astype(float)
    n = int(np.clip(np.sqrt(len(xs)), 3, _MAX_BINS))
    edges = np.linspace(distinct[0], distinct[-1], n + 1)
    return np.clip(np.searchsorted(edges, xs, side="right") - 1, 0, n - 1), 0.5 * (edges[:-1] + edges[1:])


def makespan_scatter(ds: xr.Dataset, out: str | Path, x: str) -> Path:
    """Design sweep: makespan of every configuration against the sampled parameter `x` (a
    coordinate along `config`), with the median per bin of `x` as a line, one colour per
    combination of the grid dimensions. Categorical `x` is spread over its values (jittered)."""
    others = _grid_dims(ds)
    xv = ds[x].values
    numeric = _is_numeric(xv)
    categories = np.unique(xv)
    xpos = xv.astype(float) if numeric else np.searchsorted(categories, xv).astype(float)
    rng = np.random.default_rng(0)  # the same jitter every time
    fig, ax = plt.subplots(figsize=(7, 4.5), layout="constrained")
    missing = total = 0
    for k, combo in enumerate(itertools.product(*(ds[d].values for d in others))):
        y = ds["makespan_ns"].sel(dict(zip(others, combo))).transpose(CONFIG_DIM, "replicate").values / 1000.0
        xs = np.repeat(xpos, y.shape[1])
        y = y.ravel()
        jitter = np.zeros(y.size) if numeric else rng.uniform(-0.15, 0.15, y.size)
        keep = np.isfinite(y)
        missing, total = missing + int((~keep).sum()), total + y.size
        if not keep.any():
            continue
        color = plt.get_cmap("tab10")(k % 10)
        ax.scatter(xs[keep] + jitter[keep], y[keep], s=9, alpha=0.35, color=color, linewidths=0)
        bins, centres = _bins(xs[keep])
        med = np.array([np.median(y[keep][bins == b]) if np.any(bins == b) else np.nan for b in range(len(centres))])
        name = _combo(ds, others, combo) or "makespan"
        ax.plot(centres[np.isfinite(med)], med[np.isfinite(med)], color=color, marker="o" if numeric else "D",
                linestyle="-" if numeric else "none", label=f"{name}: {'binned ' if numeric else ''}median")
    if not numeric:
        ax.set_xticks(np.arange(len(categories)), [value_text(v) for v in categories])
    ax.set_xlabel(label(ds, x))
    ax.set_ylabel(label(ds, "makespan_ns").replace("(ns)", "(µs)"))
    ax.ticklabel_format(axis="y", useOffset=False, style="plain")
    note = (f"dots: {total - missing} configurations (random chips and samples); lines: binned medians"
            + (f"; {missing} infeasible (NaN) not shown" if missing else ""))
    ax.set_title(_wrap(f"{ds.attrs.get('title', '')}\n{note}", 80), fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out)


def _sm_cell(x: np.ndarray, y: np.ndarray, die: tuple[float, float]) -> tuple[float, float]:
    """Width and height of an SM tile: the nearest neighbour spacing along x and along y."""
    dx = np.abs(x[:, None] - x[None, :])
    dy = np.abs(y[:, None] - y[None, :])
    same_row, same_col = dy < 1e-6, dx < 1e-6
    w = dx[same_row & (dx > 1e-6)]
    h = dy[same_col & (dy > 1e-6)]
    return (float(w.min()) if w.size else die[0] / 16), (float(h.min()) if h.size else die[1] / 16)


def floorplan(ds: xr.Dataset, out: str | Path, var: str = "sm_utilisation",
              sel: Mapping[str, Any] | None = None) -> Path:
    """Per-SM `var` (default: utilisation = busy cycles / SM cycles) on the die floorplan,
    averaged over every dimension left after `sel` (e.g. `{"policy_warp": "gto"}`)."""
    check(var in ds and "sm" in ds[var].dims, "plot var", var,
          f"a per-SM variable: {[k for k in ds.data_vars if 'sm' in ds[k].dims]}")
    check("sm_x_mm" in ds.coords and "sm_y_mm" in ds.coords, "dataset", "sm_x_mm/sm_y_mm",
          "the dataset has no SM floorplan coordinates (written by jaxsched sweep)")
    da = _apply_sel(ds[var], sel)
    rest = [d for d in da.dims if d != "sm"]
    values = (da.mean(rest) if rest else da).values.astype(float)
    x, y = ds["sm_x_mm"].values.astype(float), ds["sm_y_mm"].values.astype(float)
    die = (float(ds.attrs.get("die_width_mm", x.max() + x.min())),
           float(ds.attrs.get("die_height_mm", y.max() + y.min())))
    w, h = _sm_cell(x, y, die)
    fig, ax = plt.subplots(figsize=(8, 8 * die[1] / die[0] + 0.8), layout="constrained")
    ax.add_patch(Rectangle((0, 0), die[0], die[1], fill=False, linewidth=1.5, edgecolor="black"))
    tiles = PatchCollection([Rectangle((xi - 0.45 * w, yi - 0.45 * h), 0.9 * w, 0.9 * h) for xi, yi in zip(x, y)],
                            cmap="viridis", edgecolor="none")
    tiles.set_array(values)
    ax.add_collection(tiles)
    if "sm_gpc" in ds.coords:  # outline each GPC
        gpc = ds["sm_gpc"].values
        for g in np.unique(gpc):
            m = gpc == g
            x0, x1 = x[m].min() - 0.5 * w, x[m].max() + 0.5 * w
            y0, y1 = y[m].min() - 0.5 * h, y[m].max() + 0.5 * h
            ax.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, linewidth=0.6,
                                   edgecolor="0.4", linestyle="--"))
            ax.text(x0, y0 - 0.1 * h, f"GPC {g}", fontsize=7, va="bottom", color="0.3")  # above its box
    fig.colorbar(tiles, ax=ax, shrink=0.8, label=_wrap(label(ds, var), 40))
    ax.set_xlim(-0.02 * die[0], 1.02 * die[0])
    ax.set_ylim(1.02 * die[1], -0.06 * die[1])  # y grows downwards, like a die photo
    ax.set_aspect("equal")
    ax.set_xlabel("x (mm)")
    ax.set_ylabel("y (mm)")
    how = f"mean over {_over(ds, rest)}" if rest else "one configuration"
    fixed = _combo(ds, list(sel or {}), tuple((sel or {}).values()))
    ax.set_title(_wrap(f"{ds.attrs.get('title', '')}\n{_short(ds, var)}: {how}" + (f" at {fixed}" if fixed else "")
                       + f"\nmin {np.nanmin(values):.3g}, mean {np.nanmean(values):.3g}, max {np.nanmax(values):.3g}",
                       75), fontsize=9)
    return _save(fig, out)


def stalls(ds: xr.Dataset, out: str | Path, x: str | None = None,
           sel: Mapping[str, Any] | None = None) -> Path:
    """Stall-reason breakdown (share of warp-cycles per state, mean over replicates) as stacked
    bars per value of `x`, one panel per combination of the other swept dimensions (averaged
    over them when there would be more than 12 panels)."""
    da = _apply_sel(ds["stall_fraction"], sel)
    averaged = [d for d in ("replicate", CONFIG_DIM) if d in da.dims and d != x]
    da = da.mean(averaged) if averaged else da
    grid_dims = [d for d in da.dims if d != "stall_reason"]
    if not grid_dims and x is None:  # nothing swept (or everything fixed by sel): one bar
        da, grid_dims = da.expand_dims(configuration=["all"]), ["configuration"]
    x = x or grid_dims[0]
    check(x in grid_dims, "plot x", x, f"one of the swept dimensions {grid_dims}")
    others = [d for d in grid_dims if d != x]
    combos = list(itertools.product(*(da[d].values for d in others)))
    if len(combos) > _MAX_PANELS:
        da, others, combos = da.mean(others), [], [()]
    reasons = [str(r) for r in da["stall_reason"].values]
    colors = plt.get_cmap("tab10")(np.arange(len(reasons)) % 10)
    ncols = min(len(combos), 4)
    nrows = -(-len(combos) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.2 * ncols + 2.2, 3.2 * nrows + 0.8), sharey=True, squeeze=False,
                             layout="constrained")
    xs = [value_text(v) for v in da[x].values]
    for ax, combo in zip(axes.flat, combos):
        part = da.sel(dict(zip(others, combo))).transpose(x, "stall_reason").values
        bottom = np.zeros(len(xs))
        for k, reason in enumerate(reasons):
            ax.bar(np.arange(len(xs)), part[:, k], bottom=bottom, color=colors[k], label=reason, width=0.7)
            bottom += np.nan_to_num(part[:, k])
        ax.set_xticks(np.arange(len(xs)), xs, rotation=30 if max(map(len, xs)) > 6 else 0, fontsize=8)
        ax.set_xlabel(label(ds, x) if x in ds.variables else x, fontsize=8)
        ax.set_title(_wrap(_combo(ds, others, combo), 40) or "all configurations", fontsize=8)
        ax.set_ylim(0, 1)
    for ax in list(axes.flat)[len(combos):]:
        ax.set_visible(False)
    axes[0, 0].set_ylabel("share of warp-cycles")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles[::-1], labels[::-1], loc="outside right center", fontsize=8, frameon=False, title="warp state",
               title_fontsize=8)
    fixed = _combo(ds, list(sel or {}), tuple((sel or {}).values()))
    over = _over(ds, averaged) or "nothing"
    fig.suptitle(_wrap(f"{ds.attrs.get('title', '')}\nwarp states (Nsight Compute's stall reasons), mean over {over}"
                       + (f" at {fixed}" if fixed else ""), 40 + 25 * ncols), fontsize=9)
    return _save(fig, out)


def load_trace(path: str | Path) -> dict:
    """The JSON written by `jaxsched run --json` (it has the per-CTA trace)."""
    p = Path(path)
    check(p.is_file(), "trace", str(p), "no such file (write one with `jaxsched run KERNEL --json > trace.json`)")
    try:
        doc = json.loads(tomldoc.read_text(p, "trace"))
    except json.JSONDecodeError as exc:
        raise JaxschedError("trace", str(p), f"not JSON ({exc})") from None
    check(isinstance(doc, dict) and "cta_trace" in doc, "trace", str(p),
          "no cta_trace: expected the output of `jaxsched run --json`")
    return doc


def trace_dict(ds: xr.Dataset) -> dict:
    """A CTA trace (`jaxsched.trace`: simulator or hardware probe) in the form of
    `jaxsched run --json`, for `gantt`."""
    policies = {k: ds.attrs[k] for k in ("warp_policy", "dispatch") if k in ds.attrs}
    kernel = ds.attrs["kernel"] + (" (measured)" if ds.attrs["source"] == "probe" else "")
    return {"kernel": kernel, "arch": ds.attrs["arch"], **policies,
            "cta_trace": {k: ds[f"cta_{k}"].values.tolist() for k in ("sm", "start_ns", "end_ns")}}


def _lanes(sm: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, dict[int, int]]:
    """Greedy interval colouring per SM: a lane per CTA so that CTAs in one lane never overlap."""
    lane = np.zeros(len(sm), dtype=int)
    n_lanes: dict[int, int] = {}
    for s in np.unique(sm):
        idx = np.flatnonzero(sm == s)
        idx = idx[np.lexsort((end[idx], start[idx]))]
        free_at: list[float] = []
        for i in idx:
            for k, t in enumerate(free_at):
                if t <= start[i]:
                    lane[i], free_at[k] = k, end[i]
                    break
            else:
                lane[i] = len(free_at)
                free_at.append(end[i])
        n_lanes[int(s)] = len(free_at)
    return lane, n_lanes


def gantt(result: Any, arch: Any = None, out: str | Path = "gantt.png", *, n_ctas: int | None = None,
          title: str | None = None) -> Path:
    """CTA timeline per SM: each CTA a bar from start to end on its SM's row, coloured by CTA
    index (dispatch order). `result`: a single-configuration `Result` (`n_ctas`: the kernel's
    grid, default the whole trace), the dict of `jaxsched run --json`, or the path of that JSON.
    `arch` (optional): rows for every enabled SM, idle ones included."""
    if isinstance(result, (str, Path)):
        result = load_trace(result)
    if isinstance(result, Mapping):
        trace = result.get("cta_trace", result)
        sm, start, end = (np.asarray(trace[k], dtype=float) for k in ("sm", "start_ns", "end_ns"))
        policies = [f"{what} {value_text(result[key])}" for key, what in (("warp_policy", "warp policy"),
                                                                            ("dispatch", "CTA dispatch")) if key in result]
        title = title or ", ".join([f"{result.get('kernel', '')} on {result.get('arch', '')}", *policies])
    else:
        check(np.ndim(result.cta_sm) == 1, "gantt result", np.shape(result.cta_sm),
              "one configuration (index a batch first: jax.tree.map(lambda x: x[i], batch))")
        n = int(n_ctas) if n_ctas is not None else len(result.cta_sm)
        sm = np.asarray(result.cta_sm, dtype=float)[:n]
        start, end = np.asarray(result.cta_start_ns)[:n], np.asarray(result.cta_end_ns)[:n]
        title = title or f"CTA timeline, makespan {float(result.makespan_ns):.1f} ns"
    keep = (sm >= 0) & np.isfinite(start) & np.isfinite(end)
    cta = np.flatnonzero(keep)
    sm, start, end = sm[keep].astype(int), start[keep], end[keep]
    check(len(cta) > 0, "gantt", "trace", "no dispatched CTAs")
    rows = (np.flatnonzero(np.asarray(arch.sm_enabled)) if arch is not None else np.unique(sm))
    row_of = {int(s): r for r, s in enumerate(rows)}
    check(all(int(s) in row_of for s in np.unique(sm)), "gantt arch", getattr(arch, "name", arch),
          "the trace has CTAs on SMs this arch does not enable")
    lane, n_lanes = _lanes(sm, start, end)
    lanes_of = np.array([n_lanes[int(s)] for s in sm])
    height = 0.9 / lanes_of
    y = np.array([row_of[int(s)] for s in sm]) - 0.45 + (lane + 0.5) * height
    fig, ax = plt.subplots(figsize=(10, min(max(4.0, 0.07 * len(rows) + 1.5), 20.0)), layout="constrained")
    colors = plt.get_cmap("viridis")(cta / max(cta.max(), 1))
    ax.barh(y, end - start, left=start, height=height * 0.92, color=colors, linewidth=0)
    ax.axvline(end.max(), color="crimson", linewidth=0.8, linestyle="--")
    ax.text(end.max(), 1.0, f"makespan {end.max():.1f} ns ", color="crimson", fontsize=8, va="bottom", ha="right",
            transform=ax.get_xaxis_transform())  # just above the axes, clear of the first row
    step = max(1, len(rows) // 24)
    ax.set_yticks(np.arange(0, len(rows), step), [str(s) for s in rows[::step]], fontsize=7)
    ax.set_ylim(len(rows) - 0.5, -1.5)
    ax.set_xlim(0, end.max() * 1.04)
    ax.set_xlabel("time (ns)")
    ax.set_ylabel("SM (%smid)")
    sm_map = plt.cm.ScalarMappable(cmap="viridis", norm=plt.Normalize(0, max(cta.max(), 1)))
    fig.colorbar(sm_map, ax=ax, label="CTA index (dispatch order)", pad=0.01)
    ax.set_title(f"{title}\n{len(cta)} CTAs on {len(np.unique(sm))} SMs, up to {max(n_lanes.values())} "
                 "resident per SM", fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, out)
