"""Figures of the fits (matplotlib, PNG or SVG by suffix): the speed fit and the dispatch fit."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import xarray as xr


def _save(fig: plt.Figure, out: str | Path) -> Path:
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def speeds(ds: xr.Dataset, out: str | Path) -> Path:
    """Fitted clocks (with 2-sigma bars) and the EMA estimate against the truth where known (else
    per SM), every chip; the loss curves."""
    fig, (ax, ax_loss) = plt.subplots(1, 2, figsize=(11, 4.2))
    truth = ds["sm_freq_mhz_true"].values
    known = np.isfinite(truth).any()
    for c, chip in enumerate(ds["chip"].values):
        fit, sd = ds["sm_freq_mhz_fit"].values[c], ds["sm_freq_sd_mhz"].values[c]
        ema = ds["sm_freq_mhz_ema"].values[c]
        x = truth[c] if known else ds["sm"].values
        ok = np.isfinite(fit)
        label = f"fit ({chip})" if len(ds["chip"]) > 1 else "fit"
        ax.errorbar(x[ok], fit[ok], yerr=2 * np.nan_to_num(sd[ok], nan=0.0), fmt="o", ms=3, lw=0.6, label=label)
        ax.plot(x[ok], ema[ok], "x", ms=3, alpha=0.6, label="EMA estimate" if c == 0 else None)
        ax_loss.plot(ds["step"].values, ds["loss"].values[c], lw=1, label=str(chip))
    if known:
        lo, hi = np.nanmin(truth), np.nanmax(truth)
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8, label="truth")
        ax.set_xlabel("true SM clock (MHz)")
        title = f"RMS error: fit {100 * ds.attrs.get('rms_error_fit', np.nan):.2f} %, " \
                f"EMA {100 * ds.attrs.get('rms_error_ema', np.nan):.2f} %"
    else:
        ax.set_xlabel("SM (%smid)")
        title = "no true clocks in the trace"
    ax.set_ylabel("SM clock (MHz)")
    ax.set_title(f"{ds.attrs.get('kernel', '')}, scale from {ds.attrs.get('mode', '')}\n{title}", fontsize=9)
    ax.legend(fontsize=7)
    ax_loss.set_xlabel("Adam step")
    ax_loss.set_ylabel("mean Cauchy loss")
    ax_loss.set_title("loss per chip", fontsize=9)
    if len(ds["chip"]) <= 8:
        ax_loss.legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, out)


def dispatch(ds: xr.Dataset, out: str | Path) -> Path:
    """Loss curves per family (per candidate with `method = "engine"`); mean exact-engine gap to
    the fluid bound per kernel and policy, with the uniform-equivalent chip's gap as a marker."""
    fig, (ax_loss, ax) = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [1, 1.6]})
    for fam in ds["family"].values:
        curve = ds["loss"].sel(family=fam).mean("chip")
        ax_loss.plot(ds["step"].values, curve.values, label=str(fam))
    if ds.attrs.get("method") == "engine":  # one exact-engine loss per candidate of the grid
        ax_loss.set_xlabel("candidate (grid order)")
        ax_loss.set_ylabel({"fluid": "makespan / fluid bound", "recovered": "- recovered share"}[ds.attrs["objective"]])
        ax_loss.set_title("training loss (exact engine)", fontsize=9)
    else:
        ax_loss.set_xlabel("Adam step")
        ax_loss.set_ylabel("surrogate makespan / fluid bound")
        ax_loss.set_title(f"training loss (soft surrogate, T = {ds.attrs.get('temperature')})", fontsize=9)
    ax_loss.legend(fontsize=8)
    gap = 100 * ds["gap_fluid"].mean("map")
    uni = 100 * (ds["uniform_equivalent_ns"] / ds["fluid_ns"] - 1).mean("map")
    kernels, policies = list(ds["kernel"].values), list(ds["policy"].values)
    width = 0.8 / len(policies)
    for j, pol in enumerate(policies):
        xs = np.arange(len(kernels)) + (j - (len(policies) - 1) / 2) * width
        ax.bar(xs, gap.sel(policy=pol).values, width=width, label=str(pol))
    ax.plot(np.arange(len(kernels)), uni.values, "k_", ms=30, mew=2, label="uniform chip, same mean clock")
    ax.set_xticks(np.arange(len(kernels)), kernels, fontsize=8)
    ax.set_ylabel("makespan above the fluid bound (%)")
    where = "each training chip under its own fit" if ds.attrs.get("per_chip") else "held-out maps"
    ax.set_title(f"exact engine, {where} (mean)", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(ds.attrs.get("title", ""), fontsize=10)
    fig.tight_layout()
    return _save(fig, out)
