"""How far dispatch policies stay from the oracle bounds on the H200 preset, printed as JSON.

Workload: the H200 preset (132 SMs), a 4-wave kernel (256 threads, 32 registers: 8 CTAs per SM,
4224 CTAs; by default the throughput benchmark's mix of global loads and FMA chains), GTO warp
scheduling. Clock maps: independent Gaussian per-SM clocks, mean 1.8 GHz, sigma 0, 5, 10, 20 %
(capped at the 1.98 GHz boost clock; `--maps` chips per sigma > 0). For every map: the makespan
of hardware, round_robin and closed_loop dispatch, and the fluid bound and clairvoyant schedules
(jaxsched/bounds.py) of the two-part work model measured from uniform runs at 1980 and 1386 MHz,
with both work attributions: "slot" (per-CTA split; a strict bound in every measurement so far)
and "sm" (per-kernel split; tighter, not strict), and the issue-slot bound
(jaxsched/issue_bound.py: instructions and launch credit over the schedulers' issue cycles;
`gap_lower` is the gap to the larger of it and the slot fluid bound). See docs/bounds.md.
Everything runs in one `simulate_batch` call (about 15 s on an H200; tens of minutes on a
2-core CPU).

    python experiments/bounds_gap.py [--maps 3] [--program mixed|compute] [--warp-policy gto] > gaps.json
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import numpy as np

import jaxsched as js
from jaxsched import bounds, issue_bound

PROGRAMS = {
    "mixed": "loop 4 cta_spread=2\n ldg bytes=128\n fma\n fma dep\n fma dep\n fma dep\nend",
    "compute": "loop 30 cta_spread=3\n fma dep\n fma dep\n sfu dep\nend",
}
SIGMAS = (0.0, 0.05, 0.10, 0.20)
POLICIES = ("hardware", "round_robin", "closed_loop")
WORK_MHZ = (1980.0, 1386.0)
WORK_MODELS = {"slot": dict(attribution="slot", split="cta"), "sm": dict(attribution="sm", split="kernel")}


def _row(result: js.Result, i: int) -> js.Result:
    return jax.tree.map(lambda x: x[i], result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--maps", type=int, default=3, help="random chips per sigma > 0")
    parser.add_argument("--program", choices=sorted(PROGRAMS), default="mixed")
    parser.add_argument("--warp-policy", choices=js.WARP_POLICIES, default="gto")
    args = parser.parse_args()

    arch = js.presets.get("h200")
    kernel = js.make_kernel(PROGRAMS[args.program], grid=4 * 8 * arch.sm_count, threads=256, regs=32,
                            l2_hit_rate=0.6)
    maps = [(s, seed, js.clocks.gaussian(arch, seed, 1.8, s))
            for s in SIGMAS for seed in range(1 if s == 0 else args.maps)]
    clocks = [js.clocks.uniform(arch, m / 1000) for m in WORK_MHZ]
    clocks += [c for _, _, c in maps for _ in POLICIES]
    dispatch = [0, 0] + [js.DISPATCH_POLICIES.index(p) for _ in maps for p in POLICIES]
    n = len(clocks)
    t0 = time.perf_counter()
    runs = js.simulate_batch([arch] * n, [kernel] * n, clocks, [js.WARP_POLICIES.index(args.warp_policy)] * n,
                             dispatch, [0] * n)
    wall_s = time.perf_counter() - t0

    works = {name: bounds.work_from_uniform(_row(runs, 0), _row(runs, 1), **model)
             for name, model in WORK_MODELS.items()}
    demand = issue_bound.issue_demand(_row(runs, 0), arch, kernel)
    rows = []
    for m, (sigma, seed, clk) in enumerate(maps):
        makespan = {p: float(runs.makespan_ns[2 + 3 * m + j]) for j, p in enumerate(POLICIES)}
        ms = np.asarray([makespan[p] for p in POLICIES])
        row = {"sigma": sigma, "seed": seed, "mhz_min_mean_max": [
                   float(f(np.asarray(clk.sm_freq_mhz)[np.asarray(arch.sm_enabled)])) for f in (np.min, np.mean, np.max)],
               "makespan_ns": makespan}
        for a, work in works.items():
            ref = bounds.bounds(work, clk.sm_freq_mhz)
            gap = bounds.gaps(ms, ref)
            row[f"bounds_{a}_ns"] = {k: float(v) for k, v in vars(ref).items()}
            row[f"gap_{a}"] = {k: dict(zip(POLICIES, np.round(np.asarray(v), 4).tolist())) for k, v in vars(gap).items()}
        issue = float(issue_bound.issue_ns(demand, clk.sm_freq_mhz))
        lower = max(issue, row["bounds_slot_ns"]["fluid_ns"])
        row["bounds_issue_ns"], row["bounds_lower_ns"] = issue, lower
        row["gap_issue"] = dict(zip(POLICIES, np.round(ms / issue - 1, 4).tolist()))
        row["gap_lower"] = dict(zip(POLICIES, np.round(ms / lower - 1, 4).tolist()))
        rows.append(row)
    summary = {}
    for sigma in SIGMAS:
        sel = [r for r in rows if r["sigma"] == sigma]
        summary[str(sigma)] = {
            f"mean_gap_{a}_{b}": {p: round(float(np.mean([r[f"gap_{a}"][b][p] for r in sel])), 4) for p in POLICIES}
            for a in WORK_MODELS for b in ("fluid_ns", "clairvoyant_ns", "clairvoyant_lpt_ns")} | {
            f"mean_gap_{b}": {p: round(float(np.mean([r[f"gap_{b}"][p] for r in sel])), 4) for p in POLICIES}
            for b in ("issue", "lower")}
    print(json.dumps({
        "arch": arch.name, "program": args.program, "grid_ctas": int(kernel.grid_ctas), "warp_policy": args.warp_policy,
        "work_mhz": WORK_MHZ, "work_models": WORK_MODELS, "configurations": n, "simulate_wall_s": round(wall_s, 1),
        "device": str(jax.devices()[0].platform), "summary_by_sigma": summary, "maps": rows}, indent=1))


if __name__ == "__main__":
    main()
