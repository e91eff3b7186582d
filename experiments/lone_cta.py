"""How much faster a CTA runs when it has its SM to itself (docs/studies.md, "Clock regression").

The clock regression's tail hold and the clairvoyant schedule of `jaxsched.bounds` both treat an
SM's CTA slots as independent machines: a CTA takes as long in one slot whatever the other slots
hold. In the engine the co-resident CTAs share the SM's four schedulers, so a CTA left alone
(the other slot empty, as after a hold or in the last wave) can run much faster. This prints, per
kernel, the makespan of one wave with one CTA per SM (132 CTAs) and with every slot full
(132 x CTAs per SM), on the uniform H200 at 1.8 GHz, hardware dispatch.

    python experiments/lone_cta.py [sweeps/kernels/few_long_ctas.toml ...]
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import jaxsched as js
from jaxsched.cli import load_arch
from jaxsched.kernel import load_kernel
from jaxsched.occupancy import occupancy

KERNELS = Path(__file__).resolve().parent.parent / "sweeps" / "kernels"
DEFAULT = [str(KERNELS / "few_long_ctas.toml"), str(KERNELS / "few_long_ldg.toml")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("kernels", nargs="*", default=DEFAULT)
    args = parser.parse_args()
    arch = load_arch("h200")
    clocks = js.clocks.uniform(arch, 1.8)
    print("| kernel | CTAs per SM | one CTA per SM | every slot full | alone, faster by |")
    print("|---|---|---|---|---|")
    for path in args.kernels:
        kernel = load_kernel(path)
        per_sm = int(occupancy(arch, kernel.threads_per_cta, kernel.regs_per_thread, kernel.dynamic_smem_bytes,
                               kernel.static_smem_bytes).blocks_per_sm)
        alone, full = (float(js.simulate(arch, dataclasses.replace(kernel, grid_ctas=arch.sm_count * n),
                                         clocks).makespan_ns) for n in (1, per_sm))
        print(f"| {Path(path).stem} | {per_sm} | {alone:.0f} ns | {full:.0f} ns | {full / alone:.2f}x |")


if __name__ == "__main__":
    main()
