"""`jaxsched fit`: optax fits through traces and the differentiable surrogate (docs/surrogate.md).

    jaxsched fit speeds TRACE [TRACE ...] -o OUT [--reference REF ...] [--mean-mhz F]
        per-SM clocks of every trace (one vmapped fit per chip) -> OUT/speeds.nc, OUT/speeds.png
    jaxsched fit dispatch SPEC -o OUT
        dispatch parameters fitted through the surrogate, evaluated in the exact engine on
        held-out clock maps -> OUT/dispatch.nc, OUT/dispatch.png, and OUT/policy_FAMILY.toml for
        each fitted family a sweep can run (`[policy] dispatch = "fitted"`, jaxsched.fitted_policy)

The scale of the fitted clocks comes from the traces' clock64() readings when they have them;
else from `--reference` traces of the same kernel on chips of known clocks; else, for
simulator traces that carry their launch, from two uniform-chip runs of the engine made here;
else from `--mean-mhz` (relative speeds scaled to that mean).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .errors import INT32_MAX, check
from .policies import DEFAULT_EMA_ALPHA, DEFAULT_WARP_POLICY

CLOCK_SHARE_WARNING = 0.3  # below this share of clock-bound time the timing barely shows the clock


def add_parser(subparsers: argparse._SubParsersAction) -> Callable[[argparse.Namespace], int]:
    """Register `fit` and its subcommands; returns the handler."""
    p = subparsers.add_parser("fit", help="fit SM clocks from traces, or dispatch parameters through the surrogate",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="fit_command", required=True)
    s = sub.add_parser("speeds", help="per-SM clocks from CTA traces (jaxsched.trace format)")
    s.add_argument("traces", nargs="+", help="trace files (.nc or .zarr), one chip each")
    s.add_argument("-o", "--output", required=True, help="output folder")
    s.add_argument("--reference", nargs="+", default=None, metavar="REF",
                   help="traces of the same kernel on chips with known clocks (sets the scale)")
    s.add_argument("--mean-mhz", type=float, default=None, help="scale relative speeds to this mean clock")
    s.add_argument("--ema-alpha", type=float, default=DEFAULT_EMA_ALPHA, help="smoothing of the EMA estimate compared with")
    s.add_argument("--steps", type=int, default=300, help="Adam steps")
    d = sub.add_parser("dispatch", help="dispatch weights / closed-loop parameters, judged in the exact engine")
    d.add_argument("spec", help="fit spec TOML (see sweeps/fit_dispatch.toml)")
    d.add_argument("-o", "--output", required=True, help="output folder")
    return cmd_fit


def cmd_fit(args: argparse.Namespace) -> int:
    return _speeds(args) if args.fit_command == "speeds" else _dispatch(args)


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _auto_references(traces: list) -> list:
    """Uniform-chip engine runs of a simulator trace's own launch (boost and 3/4 boost)."""
    from . import presets
    from . import trace as trace_mod
    from .surrogate.speeds import reference_traces

    first = traces[0]
    arch_name = str(first.attrs["arch"])
    check(arch_name in presets.names(), "trace arch", arch_name,
          f"a preset ({', '.join(presets.names())}) to rerun the launch; else give --reference or --mean-mhz")
    kernel = trace_mod.kernel(first)
    _say(f"scale: two uniform-chip runs of {kernel.name} on {arch_name} (the engine, here)")
    return reference_traces(presets.get(arch_name), kernel, str(first.attrs["program"]),
                            warp_policy=str(first.attrs.get("warp_policy", DEFAULT_WARP_POLICY)))


def _speeds(args: argparse.Namespace) -> int:
    from . import trace as trace_mod
    from .surrogate import plots, speeds

    check(1 <= args.steps <= INT32_MAX, "--steps", args.steps, f"an integer in 1 .. {INT32_MAX}")
    check(0.0 < args.ema_alpha <= 1.0, "--ema-alpha", args.ema_alpha, "in (0, 1]")
    traces = [trace_mod.load(t) for t in args.traces]
    references = [trace_mod.load(r) for r in args.reference] if args.reference else None
    cycles = all(all(v in t for v in trace_mod.CYCLE_VARS) for t in traces)
    if not cycles and references is None and args.mean_mhz is None:
        check(all(t.attrs["source"] == "jaxsched" for t in traces), "traces", "probe traces without clock64()",
              "need --reference or --mean-mhz to set the scale")
        references = _auto_references(traces)
    ds = speeds.fit_traces(traces, references, mean_mhz=args.mean_mhz, ema_alpha=args.ema_alpha,
                           steps=args.steps, names=[Path(t).stem for t in args.traces])
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    ds.to_netcdf(out / "speeds.nc", engine="h5netcdf")
    png = plots.speeds(ds, out / "speeds.png")
    print(f"wrote {out / 'speeds.nc'} and {png}")
    print(f"scale from {ds.attrs['mode']}; calibration {ds.attrs['calibration_cycles']:.2f} cycles "
          f"+ {ds.attrs['calibration_ns']:.2f} ns per CTA share")
    if ds.attrs["clock_share"] < CLOCK_SHARE_WARNING:
        _say(f"warning: the SM clock explains only {100 * ds.attrs['clock_share']:.0f} % of a CTA's time in this "
             "kernel (memory-bound): its timing hardly shows the clocks, so the fit is not reliable")
    for c, chip in enumerate(ds["chip"].values):
        f, sd = ds["sm_freq_mhz_fit"].values[c], ds["sm_freq_sd_mhz"].values[c]
        line = (f"  {chip}: {int(np.isfinite(f).sum())} SMs, clock {np.nanmin(f):.0f}..{np.nanmax(f):.0f} MHz "
                f"(mean {np.nanmean(f):.0f}), median sd {np.nanmedian(sd):.1f} MHz")
        truth = ds["sm_freq_mhz_true"].values[c]
        if np.isfinite(truth).any():
            line += (f"; RMS error fit {100 * speeds.rms_relative_error(f, truth):.3f} %, EMA "
                     f"{100 * speeds.rms_relative_error(ds['sm_freq_mhz_ema'].values[c], truth):.3f} %")
        print(line)
    return 0


def _dispatch(args: argparse.Namespace) -> int:
    from .surrogate import dispatch_spec, plots

    spec = dispatch_spec.load(args.spec)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    ds = dispatch_spec.run(spec, progress=_say)
    ds.to_netcdf(out / "dispatch.nc", engine="h5netcdf")
    png = plots.dispatch(ds, out / "dispatch.png")
    print(f"wrote {out / 'dispatch.nc'} and {png}")
    for fam, text in dispatch_spec.policy_files(ds).items():
        (out / f"policy_{fam}.toml").write_text(text)
        print(f"wrote {out / f'policy_{fam}.toml'}: [policy] dispatch = \"fitted\", fitted = that file, in a sweep")
    for fam in ds["family"].values:
        params = ", ".join(f"{str(v).removeprefix(f'{fam}_')} {float(ds[v].values[0]):.4g}"
                           for v in ds.data_vars if str(v).startswith(f"{fam}_"))
        print(f"  {fam}: {params}")
    table = (100 * ds["gap_fluid"].mean("map")).to_pandas()
    table["uniform_chip"] = (100 * (ds["uniform_equivalent_ns"] / ds["fluid_ns"] - 1).mean("map")).to_pandas()
    print("mean makespan above the fluid bound, exact engine (%):")
    print(table.round(2).to_string())
    return 0

