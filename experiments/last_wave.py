"""The last CTAs of a launch under hardware dispatch and the clock regression, chip by chip
(docs/studies.md, "Clock regression").

On Gaussian chips (seeds 100, 101, ..., mean 1.8 GHz, spread `--sigma`) it runs the kernel with
hardware dispatch and with the clock regression at `--margin`, and prints per chip both
makespans, the clairvoyant schedule (`jaxsched.bounds`, on the work model tabulated from
uniform runs as `die_scaling_report.py` does) and the share of hardware dispatch's gap to it won
back; then, for chip `--show`, the last `--last` CTAs each policy started: SM, its clock, start,
end and duration in ticks. It shows whether the tail is set by the SMs' speeds or by the CTAs' own work.

    python experiments/last_wave.py sweeps/kernels/few_long_ldg.toml --grid 2112 --sigma 0.1 --chips 6
"""

from __future__ import annotations

import argparse

import numpy as np

import jaxsched as js
from jaxsched import bounds
from jaxsched.cli import load_arch
from jaxsched.kernel import load_kernel

from die_scaling_report import table_runs

POLICIES = ("hardware", "clock_regression")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("kernel")
    parser.add_argument("--grid", type=int, default=2112)
    parser.add_argument("--sigma", type=float, default=0.1)
    parser.add_argument("--chips", type=int, default=6)
    parser.add_argument("--margin", type=float, default=1 / 16)
    parser.add_argument("--show", type=int, default=0, help="the chip whose last CTAs are listed")
    parser.add_argument("--last", type=int, default=14)
    args = parser.parse_args()
    arch = load_arch("h200")
    kernel = load_kernel(args.kernel).replace(grid_ctas=np.asarray(args.grid, np.int32))
    chips = [js.clocks.gaussian(arch, 100 + i, 1.8, args.sigma) for i in range(args.chips)]
    n = len(chips)
    runs = js.simulate_batch([arch] * 2 * n, [kernel] * 2 * n, chips * 2, [js.WARP_POLICIES.index("gto")] * 2 * n,
                             [js.DISPATCH_POLICIES.index(p) for p in POLICIES for _ in chips], [0] * 2 * n,
                             hold_margin=args.margin)
    maps = [np.asarray(chip.sm_freq_mhz, np.float32) for chip in chips]  # every SM slot, 0 where disabled
    work = bounds.work_table_from_uniform(*table_runs(arch, kernel, min(float(m[m > 0].min()) for m in maps), 8))
    make = np.asarray(runs.makespan_ns)
    print("| chip | hardware | clock regression | clairvoyant | won back |")
    print("|---|---|---|---|---|")
    for i, mhz in enumerate(maps):
        ref = float(bounds.clairvoyant_ns(work, mhz, float(arch.cta_launch_ns)))
        share = float(bounds.recovered(make[i], make[n + i], ref))
        print(f"| {i} | {make[i]:.0f} ns | {make[n + i]:.0f} ns | {ref:.0f} ns | {100 * share:.0f} % |")
    freq = np.asarray(chips[args.show].sm_freq_mhz)
    for k, policy in enumerate(POLICIES):
        r = k * n + args.show
        sm, start, end = (np.asarray(x[r]) for x in (runs.cta_sm, runs.cta_start_tick, runs.cta_end_tick))
        placed = np.flatnonzero(sm >= 0)
        print(f"\n{policy}, chip {args.show}: the last {args.last} CTAs started (ticks)")
        print("| CTA | SM | MHz | start | end | duration |")
        print("|---|---|---|---|---|---|")
        for c in placed[np.argsort(start[placed], kind="stable")][-args.last:]:
            print(f"| {c} | {sm[c]} | {freq[sm[c]]} | {start[c]} | {end[c]} | {end[c] - start[c]} |")


if __name__ == "__main__":
    main()
