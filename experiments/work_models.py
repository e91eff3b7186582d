"""How well each work model of `jaxsched.bounds` stands for the engine, on a dispatch study's
chips, and what it does to the clairvoyant reference (docs/bounds.md section 8).

The clairvoyant schedule is computed on a work model, not in the engine, so its gap to hardware
dispatch holds the model's own error. The only schedule both the model and the engine run is
hardware dispatch's rule (a freed slot takes the next CTA, on the SM with the most room:
`known_speeds.online_ns`, "greedy"), so each model is judged by how close its greedy makespan
comes to the engine's hardware dispatch on the study's chips (mean and standard deviation over
the chips of `T_hardware / T_greedy - 1`). Three models, from the kernel's runs on uniform chips:
- *two clocks*: `work_from_uniform` at 1980 and 1188 MHz, each CTA's time affine in the period;
- *table, per CTA*: `work_table_from_uniform(split="cta")` at `--table-clocks` clocks from the
  boost clock to the slowest SM of the study (`die_scaling_report.table_runs`), each CTA's own
  occupancy at each clock;
- *table* (the report's): `work_table_from_uniform()`, the fastest run's shares, each run's total.
Per model and spread: that error, the model's own gap from greedy to the clairvoyant schedule,
and the last policy's mean recovered share against the model's clairvoyant schedule.

    python experiments/work_models.py OUT|reduced.nc --spec sweeps/dispatch_recovery_clock.toml
"""

from __future__ import annotations

import argparse

import numpy as np
import xarray as xr

from jaxsched import bounds, sweep

from die_scaling_report import cases, clock_maps, per_map, policies_by_parameters, table_runs, uniform_runs
from known_speeds import online_ns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--spec", required=True, help="the sweep spec OUT ran (its arch and kernels)")
    parser.add_argument("--table-clocks", type=int, default=8)
    args = parser.parse_args()
    ds = xr.open_dataset(args.out, engine="h5netcdf") if args.out.endswith(".nc") else sweep.open_result(args.out)
    ds = policies_by_parameters(ds)
    spec = sweep.load(args.spec)
    arch = spec.arch
    policies = list(ds.policy_dispatch.values)
    sigmas = [float(s) for s in ds.clocks_sigma.values]
    launch_ns = float(arch.cta_launch_ns)
    print("| kernel | work model | " + " | ".join(f"σ = {s:g}" for s in sigmas) + " |")
    print("|---|---|" + "---|" * len(sigmas))
    for label, sel, kernel in cases(ds, spec):
        maps, shape = clock_maps(ds, arch, {**sel, "policy_dispatch": "hardware"})  # every policy's chips
        table = table_runs(arch, kernel, float(np.min(maps[maps > 0])), args.table_clocks)
        models = {"two clocks": bounds.work_from_uniform(*uniform_runs(arch, kernel)),
                  "table, per CTA": bounds.work_table_from_uniform(*table, split="cta"),
                  "table": bounds.work_table_from_uniform(*table)}
        make = np.asarray(ds.makespan_ns.sel(sel))
        hw, best = make[policies.index("hardware")], make[-1]
        for name, work in models.items():
            cv = per_map(lambda f: bounds.clairvoyant_ns(work, f, launch_ns), maps, shape)
            greedy = per_map(lambda f: online_ns(work, f, launch_ns, 0.0, knows_speeds=False), maps, shape)
            cells = []
            for j, sigma in enumerate(sigmas):
                error = hw[j] / greedy[j] - 1.0
                cell = (f"{100 * error.mean():+.2f} ± {100 * error.std():.2f} %, "
                        f"{100 * np.mean(greedy[j] / cv[j] - 1):.2f} %")
                if sigma > 0:
                    cell += f", {100 * np.nanmean(bounds.recovered(hw[j], best[j], cv[j])):.0f} %"
                cells.append(cell)
            print(f"| {label} | {name} | " + " | ".join(cells) + " |", flush=True)
    print(f"\nPer cell: hardware dispatch over the model's greedy schedule (mean ± sd over chips), the model's "
          f"greedy over its clairvoyant schedule (mean), {policies[-1]}'s mean share of hardware dispatch's gap to "
          "the model's clairvoyant schedule won back.")


if __name__ == "__main__":
    main()
