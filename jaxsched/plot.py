"""Figures from sweep datasets (matplotlib, PNG or SVG by the file suffix)."""

from __future__ import annotations

import itertools
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import xarray as xr  # noqa: E402

from .errors import check  # noqa: E402


def makespan(ds: xr.Dataset, out: str | Path, x: str | None = None) -> Path:
    """Makespan against swept dimension `x` (default: the first numeric one), one line per value
    of the other swept dimensions, median over replicates with an interquartile band."""
    grid_dims = [d for d in ds["makespan_ns"].dims if d != "replicate"]
    numeric = [d for d in grid_dims if np.issubdtype(ds[d].dtype, np.number)]
    x = x or (numeric[0] if numeric else grid_dims[0] if grid_dims else None)
    check(x is not None, "plot x", x, "the dataset has no swept dimension")
    check(x in grid_dims, "plot x", x, f"one of the swept dimensions {grid_dims}")
    others = [d for d in grid_dims if d != x]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = ds[x].values
    xpos = xs if np.issubdtype(ds[x].dtype, np.number) else np.arange(len(xs))
    for combo in itertools.product(*(ds[d].values for d in others)):
        sel = ds["makespan_ns"].sel(dict(zip(others, combo)))
        q = sel.quantile([0.25, 0.5, 0.75], dim="replicate").transpose("quantile", x).values / 1000.0
        label = ", ".join(f"{d}={v}" for d, v in zip(others, combo)) or "makespan"
        (line,) = ax.plot(xpos, q[1], marker="o", label=label)
        ax.fill_between(xpos, q[0], q[2], color=line.get_color(), alpha=0.2)
    if not np.issubdtype(ds[x].dtype, np.number):
        ax.set_xticks(xpos, [str(v) for v in xs])
    ax.set_xlabel(x)
    ax.set_ylabel("makespan (µs): median, IQR over replicates")
    ax.set_title(ds.attrs.get("title", ""), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(out)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
