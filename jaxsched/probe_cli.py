"""`jaxsched probe`: measure the GPU of this machine (CuPy and a CUDA GPU needed).

    jaxsched probe -o OUT [--cases NAME ...] [--repeats N] [--no-calibration]
    jaxsched probe --list-cases

Writes OUT/traces/*.nc in the simulator's trace format, OUT/summary.json (per case and launch:
makespan, clock, per-SM CTA counts, completion stagger), OUT/calibration.json (timer quantum,
clocks, latencies, issue rates, dispatch order, GPC groups) and the raw arrays they come from.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable

from .errors import INT32_MAX, check


def add_parser(subparsers: argparse._SubParsersAction) -> Callable[[argparse.Namespace], int]:
    """Register `probe`; returns its handler."""
    p = subparsers.add_parser("probe", help="measure this machine's GPU into traces (needs CuPy, a CUDA GPU)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-o", "--output", default=None, help="output folder (required unless --list-cases)")
    p.add_argument("--cases", nargs="+", default=None, metavar="NAME", help="suite cases to run (default: all)")
    p.add_argument("--repeats", type=int, default=6, help="recorded launches per case (default 6)")
    p.add_argument("--no-calibration", action="store_true",
                   help="skip the calibration experiments (timer, clocks, latencies, dispatch, clusters)")
    p.add_argument("--list-cases", action="store_true", help="print the suite and exit (no GPU needed)")
    return cmd_probe


def _keep_jax_off_the_gpu() -> None:
    """The probe uses JAX only for small occupancy numbers; on the GPU, JAX would take most of the
    memory that CuPy's kernels measure. Pins JAX to the CPU unless a backend already started."""
    import jax

    try:
        jax.config.update("jax_platforms", "cpu")
    except RuntimeError:  # a backend is already initialised: leave it
        pass


def cmd_probe(args: argparse.Namespace) -> int:
    from .probe import default_suite, run, select

    if args.list_cases:
        for case in select(default_suite(), args.cases):
            print(f"{case.name:24s} {case.kernel:8s} threads={case.threads:<5d} grid={case.grid:<6d} "
                  f"trips={case.trips} {case.role:11s} {case.note}")
        return 0
    check(args.output is not None, "--output", None, "required: the folder the probe writes into")
    check(1 <= args.repeats <= INT32_MAX, "--repeats", args.repeats, f"an integer in 1 .. {INT32_MAX}")
    _keep_jax_off_the_gpu()
    summary = run(Path(args.output), args.cases, args.repeats, not args.no_calibration)
    print(f"{'case':24s} {'makespan (ns), median':>22s} {'clock (MHz)':>12s} {'CTAs/SM':>8s}")
    for name, case in summary["cases"].items():
        clock = sorted(x["clock_mhz"] for x in case["launches"])[len(case["launches"]) // 2]
        print(f"{name:24s} {case['makespan_ns_median']:22.1f} {clock:12.1f} {case['driver_ctas_per_sm']:8d}")
    print(f"wrote {args.output}")
    return 0
