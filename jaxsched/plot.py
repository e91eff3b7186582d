"""Figures from sweep datasets and single runs (matplotlib; PNG or SVG by the file suffix).

- `makespan(ds, out, x=...)`: makespan against any swept dimension, one line per combination of
  the other swept dimensions (e.g. per policy), median over replicates with an interquartile
  band and a fainter min-max band. On a random or Latin-hypercube design sweep, `x` is one of
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
  resident together on one SM are stacked in lanes), from a `Result` or from the JSON of
  `jaxsched run --json`.
"""

from __future__ import annotations

import itertools
import json
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
from .sweep_design import CONFIG_DIM, design_coords  # noqa: E402

KINDS = ("makespan", "floorplan", "stalls", "gantt")
_MAX_PANELS = 12
_MAX_BINS = 12


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


def _sel_label(sel: Mapping[str, Any] | None) -> str:
    return ", ".join(f"{k}={v}" for k, v in (sel or {}).items())


def makespan(ds: xr.Dataset, out: str | Path, x: str | None = None) -> Path:
    """Makespan against swept dimension `x` (default: the first numeric one), one line per value
    of the other swept dimensions, median over replicates (and design samples) with an
    interquartile band (and a lighter min-max band). On a design sweep `x` defaults to a
    sampled parameter: see `makespan_scatter`."""
    params, grid = design_coords(ds), _grid_dims(ds)
    if params and x not in grid:
        check(x is None or x in params, "plot x", x, f"one of the sampled parameters {params} or the grid dimensions {grid}")
        return makespan_scatter(ds, out, _pick_x(ds, x, params))
    x = _pick_x(ds, x, grid)
    others = [d for d in grid if d != x]
    spread = ["replicate"] + ([CONFIG_DIM] if params else [])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = ds[x].values
    numeric = np.issubdtype(ds[x].dtype, np.number)
    xpos = xs if numeric else np.arange(len(xs))
    for combo in itertools.product(*(ds[d].values for d in others)):
        sel = ds["makespan_ns"].sel(dict(zip(others, combo)))
        with warnings.catch_warnings():  # infeasible points: all-NaN slices give NaN, drawn as gaps
            warnings.simplefilter("ignore", RuntimeWarning)
            q = sel.quantile([0.0, 0.25, 0.5, 0.75, 1.0], dim=spread).transpose("quantile", x).values / 1000.0
        label = ", ".join(f"{d}={v}" for d, v in zip(others, combo)) or "makespan"
        (line,) = ax.plot(xpos, q[2], marker="o", label=label)
        ax.fill_between(xpos, q[1], q[3], color=line.get_color(), alpha=0.25, linewidth=0)
        ax.fill_between(xpos, q[0], q[4], color=line.get_color(), alpha=0.08, linewidth=0)
    if not numeric:
        ax.set_xticks(xpos, [str(v) for v in xs])
    ax.set_xlabel(x)
    ax.set_ylabel("makespan (µs): median, IQR, min-max" + (" over samples and replicates" if params else ""))
    ax.ticklabel_format(axis="y", useOffset=False, style="plain")
    ax.set_title(ds.attrs.get("title", ""), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
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
    fig, ax = plt.subplots(figsize=(7, 4.5))
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
        label = ", ".join(f"{d}={v}" for d, v in zip(others, combo)) or "makespan"
        ax.plot(centres[np.isfinite(med)], med[np.isfinite(med)], color=color, marker="o" if numeric else "D",
                linestyle="-" if numeric else "none", label=f"{label}: {'binned ' if numeric else ''}median")
    if not numeric:
        ax.set_xticks(np.arange(len(categories)), [str(v) for v in categories])
    ax.set_xlabel(f"{x} ({ds[x].attrs.get('path', 'sampled')})")
    ax.set_ylabel("makespan (µs): every configuration, binned median")
    ax.ticklabel_format(axis="y", useOffset=False, style="plain")
    note = f"{total - missing} configurations" + (f"; {missing} infeasible (NaN) not shown" if missing else "")
    ax.set_title(f"{ds.attrs.get('title', '')}\n{note}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
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
    fig, ax = plt.subplots(figsize=(8, 8 * die[1] / die[0] + 0.8))
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
            ax.text(x0, y1, f"GPC {g}", fontsize=6, va="bottom", color="0.3")
    fig.colorbar(tiles, ax=ax, shrink=0.8, label=f"{var} [{ds[var].attrs.get('units', '')}]")
    ax.set_xlim(-0.02 * die[0], 1.02 * die[0])
    ax.set_ylim(1.04 * die[1], -0.02 * die[1])  # y grows downwards, like a die photo
    ax.set_aspect("equal")
    ax.set_xlabel("x (mm)")
    ax.set_ylabel("y (mm)")
    how = f"mean over {', '.join(rest)}" if rest else "one configuration"
    fixed = _sel_label(sel)
    ax.set_title(f"{ds.attrs.get('title', '')}\n{ds[var].attrs.get('long_name', var)}: {how}"
                 + (f" at {fixed}" if fixed else "")
                 + f"\nmin {np.nanmin(values):.3g}, mean {np.nanmean(values):.3g}, max {np.nanmax(values):.3g}",
                 fontsize=9)
    fig.tight_layout()
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
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.2 * ncols + 2.2, 3.2 * nrows + 0.8), sharey=True, squeeze=False)
    xs = [str(v) for v in da[x].values]
    for ax, combo in zip(axes.flat, combos):
        part = da.sel(dict(zip(others, combo))).transpose(x, "stall_reason").values
        bottom = np.zeros(len(xs))
        for k, reason in enumerate(reasons):
            ax.bar(np.arange(len(xs)), part[:, k], bottom=bottom, color=colors[k], label=reason, width=0.7)
            bottom += np.nan_to_num(part[:, k])
        ax.set_xticks(np.arange(len(xs)), xs, rotation=30 if max(map(len, xs)) > 5 else 0, fontsize=8)
        ax.set_xlabel(x, fontsize=8)
        ax.set_title(", ".join(f"{d}={v}" for d, v in zip(others, combo)) or "all", fontsize=8)
        ax.set_ylim(0, 1)
    for ax in list(axes.flat)[len(combos):]:
        ax.set_visible(False)
    axes[0, 0].set_ylabel("share of warp-cycles")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles[::-1], labels[::-1], loc="center right", fontsize=8, frameon=False)
    fixed = _sel_label(sel)
    fig.suptitle(f"{ds.attrs.get('title', '')}\nwarp states (Nsight stall reasons), mean over replicates"
                 + (f" at {fixed}" if fixed else ""), fontsize=9)
    fig.tight_layout(rect=(0, 0, 1 - 2.0 / fig.get_figwidth(), 1))
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
        title = title or (f"{result.get('kernel', '')} on {result.get('arch', '')}, warp policy "
                          f"{result.get('warp_policy', '')}, dispatch {result.get('dispatch', '')}")
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
    fig, ax = plt.subplots(figsize=(10, min(max(4.0, 0.07 * len(rows) + 1.5), 20.0)))
    colors = plt.get_cmap("viridis")(cta / max(cta.max(), 1))
    ax.barh(y, end - start, left=start, height=height * 0.92, color=colors, linewidth=0)
    ax.axvline(end.max(), color="crimson", linewidth=0.8, linestyle="--")
    ax.text(end.max(), -1.0, f"makespan {end.max():.1f} ns ", color="crimson", fontsize=8, va="center", ha="right")
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
    fig.tight_layout()
    return _save(fig, out)
