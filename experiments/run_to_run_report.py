"""Summarise `sweeps/run_to_run.toml`: the spread of one kernel's time over runs that start from
random power/thermal states, for the short and the long kernel, with DVFS and with clock lock.
Prints a markdown table and draws each run's time relative to the median.

    python experiments/run_to_run_report.py OUT|reduced.nc [--png docs/img/run_to_run.png]
"""

from __future__ import annotations

import argparse

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import xarray as xr  # noqa: E402

from jaxsched import sweep  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out")
    parser.add_argument("--png", default=None)
    args = parser.parse_args()
    ds = xr.open_dataset(args.out, engine="h5netcdf") if args.out.endswith(".nc") else sweep.open_result(args.out)
    fig, ax = plt.subplots(figsize=(7, 4))
    print("| kernel | clocks | runs | median | fastest | slowest | spread (slowest / fastest - 1) |")
    print("|---|---|---|---|---|---|---|")
    x = 0
    labels = []
    for trips in ds.kernel_trips.values:
        for mode in ds.dvfs_mode.values:
            t = np.asarray(ds.makespan_ns.sel(kernel_trips=trips, dvfs_mode=mode))
            med = np.median(t)
            unit, scale = ("ms", 1e6) if med > 1e6 else ("µs", 1e3)
            print(f"| {int(trips)} trips | {mode} | {t.size} | {med / scale:.3f} {unit} | {t.min() / scale:.3f} "
                  f"{unit} | {t.max() / scale:.3f} {unit} | {100 * (t.max() / t.min() - 1):.1f} % |")
            ax.scatter(np.full(t.size, x) + np.linspace(-0.2, 0.2, t.size), t / med, s=10)
            labels.append(f"{med / scale:.3g} {unit}\n{mode}")
            x += 1
    ax.set_xticks(range(x), labels)
    ax.set_ylabel("run time / median")
    ax.set_title("Same kernel, random initial power/thermal state")
    ax.axhline(1.0, color="k", lw=0.5)
    fig.tight_layout()
    if args.png:
        fig.savefig(args.png, dpi=120)


if __name__ == "__main__":
    main()
