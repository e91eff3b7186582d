"""Fit the `h200` preset's issue-rule parameters (docs/model.md sections 3, 7, 9) to the H200's
probe data (docs/calibration.md): `taken_branch_cycles`, `cta_launch_idle_cycles` and the FMA/ALU
issue intervals.

Each target is an experiment of `jaxsched.probe.experiments`, simulated on a cut of the preset
(the first `--sms` SMs, every SM at 1980 MHz, the clock the probe ran at) and reduced the way
`jaxsched.probe.calibrate` reduces the measurement:

- `issue_sweep`: 4-warp CTAs of `work_fma_dep`, `m` per SM (one wave, 32 trips): cycles per warp
  instruction per scheduler (an SM's span over the instructions one scheduler issues);
- `refill`: 2 CTAs per SM, 3 waves, 8 trips, CTAs of `--refill-threads` threads (default: those
  of `REFILL_SHAPES`): median delay from a freed slot to its next CTA, and from that start to the
  next end of the SM's other CTA (`calibrate.refill_delays`). Measured: `calibration.json`, then
  `refill_more.json` (the same experiment at 384-768 threads) for shapes it lacks;
- the suite's `fma_dep_t32_tiny` (1-warp CTAs, 32 per SM, 3 waves): makespan.

Every combination of the candidate values is simulated (one compilation per kernel shape: the
parameters are traced) and printed with its error against the measurement, as JSON.

    python calibration/calibrate_issue_rules.py --sms 4 --branch 0 20 --idle 0 128 256 -o OUT.json
    # the preset's own values, refill delays only, at 1-8 warps per scheduler
    python calibration/calibrate_issue_rules.py --sms 2 --branch 9 --idle 256 --fma-issue 1 \
        --parts refill --refill-threads 128 256 384 512 640 768 1024
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import jaxsched as js  # noqa: E402
from jaxsched.isa import Op  # noqa: E402
from jaxsched.probe import calibrate  # noqa: E402
from jaxsched.probe.experiments import REFILL_SHAPES, REFILL_TRIPS, REFILL_WAVES, SWEEP_TRIPS  # noqa: E402
from jaxsched.probe.suite import ProbeCase, default_suite  # noqa: E402

MHZ = 1980.0
REGS = 13  # work_fma_dep's registers on the H200 (data/h200/summary.json)
LOOP_INSTRUCTIONS = 259  # 256 FFMA + IADD3 + ISETP + BRA (data/h200/sass_work.txt)
SWEEP_M = (1, 4, 8, 16)
REFILL_PER_SM = 2  # every refill shape has 2 CTAs per SM (`REFILL_SHAPES`)


def cut(arch: js.Arch, n_sm: int) -> js.Arch:
    """The preset with only its first `n_sm` SMs enabled (same shapes)."""
    enabled = np.zeros(arch.n_sm_slots, bool)
    enabled[:n_sm] = True
    return arch.replace(sm_enabled=enabled)


def run(arch: js.Arch, case: ProbeCase) -> js.Result:
    kernel = case.sim_kernel(arch, REGS)
    return js.simulate(arch, kernel, js.clocks.uniform(arch, MHZ / 1000.0), warp_policy="gto")


def cycles_per_instruction(arch: js.Arch, n_sm: int, m: int) -> float:
    case = ProbeCase(f"sweep_m{m}", "fma_dep", 128, m * n_sm, trips=SWEEP_TRIPS, ctas_per_sm=m)
    r = run(arch, case)
    sm, start, end = (np.asarray(x) for x in (r.cta_sm, r.cta_start_ns, r.cta_end_ns))
    spans = [(end[sm == s].max() - start[sm == s].min()) * MHZ / 1000.0 for s in np.unique(sm)]
    return float(np.median(spans)) / (m * SWEEP_TRIPS * LOOP_INSTRUCTIONS)


def refill_medians_ns(arch: js.Arch, n_sm: int, threads: int, per_sm: int) -> tuple[float, float]:
    """Median delay from a freed slot to its next CTA, and median time from that start to the
    next end of a CTA still running on the SM (refills with none running left out, as in
    `calibrate.refill`)."""
    case = ProbeCase(f"refill_t{threads}", "fma_dep", threads, REFILL_WAVES * per_sm * n_sm,
                     trips=REFILL_TRIPS, ctas_per_sm=per_sm)
    r = run(arch, case)
    d = calibrate.refill_delays(np.asarray(r.cta_sm), np.asarray(r.cta_start_ns, np.float64),
                                np.asarray(r.cta_end_ns, np.float64), per_sm)
    return float(np.median(d["delay_ns"])), float(np.nanmedian(d["before_other_end_ns"]))


def measured(data: Path, refill_threads: list[int]) -> dict:
    cal = json.loads((data / "calibration.json").read_text())
    summary = json.loads((data / "summary.json").read_text())["cases"]
    sweep = cal["issue_sweep"]["fma_dep"]["warps_per_scheduler"]
    more = data / "refill_more.json"
    refill = {**(json.loads(more.read_text()) if more.exists() else {}), **cal["refill"]}
    keys = {t: f"t{t}_k{REFILL_PER_SM}" for t in refill_threads}
    return {
        "issue_sweep": {str(m): sweep[str(m)]["cycles_per_instruction"] for m in SWEEP_M},
        "refill": {str(t): refill[k]["delay_ns"]["median"] for t, k in keys.items() if k in refill},
        "refill_before_other_end_ns": {str(t): refill[k]["before_other_end_ns"]["median"]
                                       for t, k in keys.items() if k in refill},
        "tiny_ns": summary["fma_dep_t32_tiny"]["makespan_ns_median"],
    }


def simulate_point(arch: js.Arch, n_sm: int, parts: list[str], sweep_m: list[int],
                   refill_threads: list[int]) -> dict:
    out: dict = {}
    if "sweep" in parts:
        out["issue_sweep"] = {str(m): cycles_per_instruction(arch, n_sm, m) for m in sweep_m}
    if "refill" in parts:
        medians = {str(t): refill_medians_ns(arch, n_sm, t, REFILL_PER_SM) for t in refill_threads}
        out["refill"] = {t: m[0] for t, m in medians.items()}
        out["refill_before_other_end_ns"] = {t: m[1] for t, m in medians.items()}
    if "tiny" in parts:
        tiny = {c.name: c for c in default_suite(n_sm)}["fma_dep_t32_tiny"]
        out["tiny_ns"] = float(run(arch, tiny).makespan_ns)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=ROOT / "data" / "h200")
    parser.add_argument("--sms", type=int, default=4)
    parser.add_argument("--branch", type=int, nargs="+", default=[0, 20])
    parser.add_argument("--idle", type=int, nargs="+", default=[0, 128, 256])
    parser.add_argument("--fma-issue", type=float, nargs="+", default=[66 / 64])
    parser.add_argument("--parts", nargs="+", choices=("sweep", "refill", "tiny"),
                        default=["sweep", "refill", "tiny"])
    parser.add_argument("--sweep-m", type=int, nargs="+", default=list(SWEEP_M))
    parser.add_argument("--refill-threads", type=int, nargs="+", default=[t for t, _ in REFILL_SHAPES],
                        help=f"threads per CTA of the refill experiment ({REFILL_PER_SM} CTAs per SM)")
    parser.add_argument("-o", "--out", type=Path, default=None)
    args = parser.parse_args(argv)
    base = cut(js.presets.get("h200"), args.sms)
    target = measured(args.data, args.refill_threads)
    print(json.dumps({"measured": target}))
    points = []
    for branch, idle, fma in itertools.product(args.branch, args.idle, args.fma_issue):
        issue = np.asarray(base.issue_cycles, np.float32).copy()
        issue[Op.FMA], issue[Op.ALU] = fma, 2 * fma  # [cal] LOP3 2.06 = 2 x 1.03
        arch = base.replace(taken_branch_cycles=np.int32(branch), cta_launch_idle_cycles=np.int32(idle),
                            issue_cycles=issue)
        point = {"taken_branch_cycles": branch, "cta_launch_idle_cycles": idle, "fma_issue_cycles": fma,
                 **simulate_point(arch, args.sms, args.parts, args.sweep_m, args.refill_threads)}
        points.append(point)
        print(json.dumps(point), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"measured": target, "points": points}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
