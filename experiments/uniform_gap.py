"""Hardware dispatch's gap to the clairvoyant schedule on a uniform chip (docs/bounds.md section 8).

On a chip whose SMs share one clock a dispatch policy that tells SMs apart by speed has nothing
to act on, yet hardware dispatch sits above `jaxsched.bounds`' clairvoyant schedule: the schedule
knows every CTA's own work, and its slots are independent where co-resident CTAs share an SM's
schedulers. `bounds.clairvoyant_with_uniform_gap` raises the clairvoyant schedule by this gap to
leave the spread-induced loss alone. This prints the gap per kernel and grid on the uniform
H200 at 1.8 GHz, and again with the kernel's per-CTA trip-count spread (`cta_spread`) removed,
which shows how much of it is foresight of each CTA's work.

    python experiments/uniform_gap.py [sweeps/kernels/few_long_ctas.toml ...] [--grids 1056 2112 4224]
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np

import jaxsched as js
from jaxsched import bounds, tomldoc
from jaxsched.cli import load_arch
from jaxsched.kernel import kernel_from_dict

from die_scaling_report import uniform_runs

KERNELS = Path(__file__).resolve().parent.parent / "sweeps" / "kernels"
DEFAULT = [str(KERNELS / "few_long_ctas.toml"), str(KERNELS / "few_long_ldg.toml")]


def clairvoyant_ns(arch: js.Arch, work: bounds.Work, clocks: js.Clocks) -> float:
    """The clairvoyant schedule of `work` on the chip `clocks`, with the launch latency between a
    slot's CTAs (as `die_scaling_report.oracle_bounds`)."""
    mhz = np.asarray(clocks.sm_freq_mhz, np.float32)  # every SM slot, 0 where disabled
    return float(bounds.bounds(work, mhz, float(arch.cta_launch_ns)).clairvoyant_ns)


def gap(arch: js.Arch, kernel: js.Kernel) -> float:
    """Hardware dispatch's makespan on the uniform chip at 1.8 GHz over the clairvoyant
    schedule's (work from the dispatch studies' two uniform runs, `uniform_runs`)."""
    work = bounds.work_from_uniform(*uniform_runs(arch, kernel))
    chip = js.clocks.uniform(arch, 1.8)
    return float(js.simulate(arch, kernel, chip).makespan_ns) / clairvoyant_ns(arch, work, chip) - 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("kernels", nargs="*", default=DEFAULT)
    parser.add_argument("--grids", type=int, nargs="+", default=[1056, 2112, 4224])
    args = parser.parse_args()
    arch = load_arch("h200")
    print("| kernel | grid | gap | without per-CTA spread |")
    print("|---|---|---|---|")
    for path in args.kernels:
        table = tomldoc.read(path, "kernel file")
        flat = {**table, "kernel": {**table["kernel"], "program": re.sub(r"\s*cta_spread=\d+", "",
                                                                         table["kernel"]["program"])}}
        kernels = [kernel_from_dict(t, str(path), Path(path).parent) for t in (table, flat)]
        for grid in args.grids:
            cells = [gap(arch, k.replace(grid_ctas=np.asarray(grid, np.int32))) for k in kernels]
            print(f"| {Path(path).stem} | {grid} | " + " | ".join(f"{100 * c:+.2f} %" for c in cells) + " |")


if __name__ == "__main__":
    main()
