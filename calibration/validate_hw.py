"""The simulator against the H200 (issue 8): each probe case, simulated and measured.

For every case of the probe suite (`jaxsched.probe.suite`) and its measured launch with the
median makespan (or every launch, `--launches all`), simulate the same kernel on the `h200`
preset with every SM at the clock it ran that launch at, the hardware dispatcher's order rotated
to agree best with the SMs the launch gave its first CTAs, and GTO warp scheduling. Compare:

- makespan (error in %, simulated over measured);
- per-SM CTA counts (fraction of SMs with the same count, largest difference);
- completion stagger of each SM's first-wave CTAs (first end over last end, medians).

    python calibration/validate_hw.py --data data/h200 -o data/h200/validate_hw_sass.json [--cases NAME ...]
    python calibration/validate_hw.py --program hand -o data/h200/validate_hw.json

It simulates the programs imported from the probe kernels' own SASS (`jaxsched.probe.imported`);
`--program hand` the hand-written ones of `jaxsched/probe/suite.py` instead.

`--batch N` runs N launches per `js.simulate_batch` call (programs padded to one length, one
compilation). That pays on a GPU; on a CPU the vmapped batch steps every configuration until
the longest is done and runs both sides of every branch, so one launch per `js.simulate` call
(`--batch 1`, the default) was faster there (2 launches: 67 s batched against 42 s one by one).

Prints a Markdown table (the README's) with the mean and worst absolute makespan error, over the
cases used for calibration and over the others (predictions), separately.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import jaxsched as js
from jaxsched.lower import WARP_POLICIES, policy_index
from jaxsched.probe import imported, metrics, store
from jaxsched.probe.suite import default_suite


def prepare(job: dict, pad_to: int | None = None) -> dict:
    """The simulator's inputs for one case and launch: arch, kernel (the hand-written program, or
    with `job["sass"]` the program imported from that SASS listing), clocks, dispatch start."""
    case = {c.name: c for c in default_suite()}[job["case"]]
    launch = job["launch"]
    base = js.presets.get(job["arch"])
    changes = {k: np.asarray(v, dtype=np.asarray(getattr(base, k)).dtype) for k, v in job.get("arch_set", {}).items()}
    arch = case.sim_arch(base.replace(**changes))
    if job.get("sass"):
        kernel = imported.kernel(case, job["sass"], arch, job["regs"], pad_to=pad_to)
    else:
        kernel = js.make_kernel(case.program(), grid=case.grid, threads=case.threads, regs=job["regs"],
                                smem_bytes=case.smem_bytes(arch), l2_hit_rate=case.l2_hit_rate(),
                                seed=case.seed, name=case.name, pad_to=pad_to)
    n_enabled = int(np.sum(arch.sm_enabled))
    # each SM at the clock it ran this launch at (clock64 against %globaltimer); SMs that ran
    # nothing at the launch's median clock
    mhz = np.full(arch.n_sm_slots, launch["clock_mhz"])
    measured = np.asarray([np.nan if f is None else f for f in launch["sm_clock_mhz"]], dtype=np.float64)
    mhz[: measured.size] = np.where(np.isnan(measured), launch["clock_mhz"], measured)
    start = metrics.dispatch_start(launch["first_wave_sms"], np.asarray(arch.dispatch_order), n_enabled)
    return {"case": case, "arch": arch, "kernel": kernel, "clocks": js.clocks.from_array(arch, mhz),
            "start": start}


def compare(job: dict, case, makespan_ns: float, cta_sm, start_ns, end_ns, start: int, wall_s: float) -> dict:
    """One row: the simulated launch against the measured one."""
    launch = job["launch"]
    n = case.grid
    cta_sm = np.asarray(cta_sm)[:n]
    st = metrics.first_wave_stagger(cta_sm, np.asarray(start_ns)[:n], np.asarray(end_ns)[:n],
                                    store.STAGGER_WINDOW * makespan_ns)
    hw_counts = np.asarray(launch["sm_ctas"])
    sim_counts = metrics.sm_counts(cta_sm, hw_counts.size)
    return {
        "case": case.name, "role": case.role, "launch": job["index"], "clock_mhz": launch["clock_mhz"],
        "dispatch_start": start, "hw_makespan_ns": launch["makespan_ns"], "sim_makespan_ns": makespan_ns,
        "error_percent": 100.0 * (makespan_ns - launch["makespan_ns"]) / launch["makespan_ns"],
        "sm_counts_equal": float(np.mean(sim_counts == hw_counts)),
        "sm_counts_max_diff": int(np.max(np.abs(sim_counts - hw_counts))),
        "hw_first_over_last": launch["stagger_first_over_last"], "sim_first_over_last": st.first_over_last,
        "hw_spread": launch["stagger_spread"], "sim_spread": st.spread, "sim_wall_s": wall_s,
    }


def simulate_one(job: dict) -> dict:
    """One case and launch through `js.simulate`."""
    p = prepare(job)
    t = time.time()
    r = js.simulate(p["arch"], p["kernel"], p["clocks"], warp_policy=job["warp_policy"], dispatch="hardware",
                    dispatch_start=p["start"])
    wall = time.time() - t
    return compare(job, p["case"], float(r.makespan_ns), r.cta_sm, r.cta_start_ns, r.cta_end_ns, p["start"], wall)


def simulate_many(jobs: list[dict]) -> list[dict]:
    """Several launches through one `js.simulate_batch` call (programs padded to one length)."""
    first = [prepare(j)["kernel"] for j in jobs]
    pad = max(k.n_instr for k in first)
    loops, branches = (max(np.shape(getattr(k, f))[-1] for k in first) for f in ("loop_start", "branch_start"))
    ps = [prepare(j, pad_to=pad) for j in jobs]
    for p in ps:
        p["kernel"] = js.kernel.pad_program(p["kernel"], pad, loops, branches)
    n = len(jobs)
    policies = [policy_index(j["warp_policy"], WARP_POLICIES, "warp_policy") for j in jobs]
    t = time.time()
    r = js.simulate_batch([p["arch"] for p in ps], [p["kernel"] for p in ps], [p["clocks"] for p in ps],
                          policies, [0] * n, [p["start"] for p in ps])
    wall = (time.time() - t) / n
    return [compare(j, p["case"], float(r.makespan_ns[i]), r.cta_sm[i], r.cta_start_ns[i], r.cta_end_ns[i],
                    p["start"], wall) for i, (j, p) in enumerate(zip(jobs, ps))]


def markdown(rows: list[dict]) -> str:
    lines = [("| case | role | measured (ns) | simulated (ns) | error | SMs with equal CTA count | "
              "first/last CTA end, hw vs sim |"), "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['role']} | {r['hw_makespan_ns']:.0f} | {r['sim_makespan_ns']:.0f} | "
                     f"{r['error_percent']:+.1f} % | {100 * r['sm_counts_equal']:.0f} % "
                     f"(max diff {r['sm_counts_max_diff']}) | "
                     f"{r['hw_first_over_last']:.2f} vs {r['sim_first_over_last']:.2f} |")
    return "\n".join(lines)


def error_stats(rows: list[dict]) -> dict:
    err = np.abs([r["error_percent"] for r in rows])
    worst = rows[int(np.argmax(err))]["case"] if len(err) else ""
    return {"n": len(err), "mean_abs_percent": float(np.mean(err)) if len(err) else float("nan"),
            "worst_abs_percent": float(np.max(err)) if len(err) else float("nan"), "worst_case": worst}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(ROOT / "data" / "h200"), help="folder with the probe's summary.json")
    parser.add_argument("-o", "--output", default=None, help="JSON with every row and the error statistics")
    parser.add_argument("--arch", default="h200")
    parser.add_argument("--warp-policy", default="gto")
    parser.add_argument("--cases", nargs="+", default=None, help="only these cases (default: all)")
    parser.add_argument("--launches", choices=("median", "all"), default="median")
    parser.add_argument("--batch", type=int, default=1, help="launches per simulate_batch call (1: simulate)")
    parser.add_argument("--program", choices=("sass", "hand"), default="sass",
                        help="programs imported from the kernels' SASS (--sass; "
                             "jaxsched.probe.imported), or the probe suite's hand-written ones")
    parser.add_argument("--sass", default=str(ROOT / "data" / "h200" / "sass_work.txt"),
                        help="cuobjdump -sass of the probe's work kernels (default: the committed H200 listing, "
                             "nvcc 13.0 -arch=sm_90)")
    parser.add_argument("--set", nargs="+", default=[], metavar="FIELD=NUMBER",
                        help="change scalar Arch fields of the preset, e.g. cta_launch_idle_cycles=96")
    args = parser.parse_args(argv)
    arch_set = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not hasattr(js.presets.get(args.arch), key):
            parser.error(f"--set {item!r}: expected FIELD=NUMBER with FIELD an Arch field")
        arch_set[key] = float(value)

    summary = json.loads((Path(args.data) / "summary.json").read_text())
    unknown = set(args.cases or []) - set(summary["cases"])
    if unknown:
        parser.error(f"unknown case(s) {sorted(unknown)}; known: {', '.join(summary['cases'])}")
    sass = Path(args.sass).read_text() if args.program == "sass" else ""
    jobs = []
    for name, case in summary["cases"].items():
        if args.cases and name not in args.cases:
            continue
        launches = case["launches"]
        order = np.argsort([x["makespan_ns"] for x in launches])
        picks = range(len(launches)) if args.launches == "all" else [int(order[len(order) // 2])]
        jobs += [{"case": name, "launch": launches[k], "index": k, "regs": case["regs"], "arch": args.arch,
                  "arch_set": arch_set, "warp_policy": args.warp_policy, "sass": sass} for k in picks]
    rows: list[dict] = []
    for i in range(0, len(jobs), max(1, args.batch)):
        chunk = jobs[i:i + max(1, args.batch)]
        rows += [simulate_one(chunk[0])] if len(chunk) == 1 else simulate_many(chunk)
        print(f"{len(rows)}/{len(jobs)} done", file=sys.stderr, flush=True)
    stats = {"prediction": error_stats([r for r in rows if r["role"] == "prediction"]),
             "calibration": error_stats([r for r in rows if r["role"] == "calibration"]),
             "all": error_stats(rows)}
    print(markdown(rows))
    for key, s in stats.items():
        print(f"{key}: {s['n']} launches, mean |error| {s['mean_abs_percent']:.2f} %, "
              f"worst {s['worst_abs_percent']:.2f} % ({s['worst_case']})")
    if args.output:
        Path(args.output).write_text(json.dumps({"rows": rows, "stats": stats, "arch": args.arch,
                                                 "arch_set": arch_set, "warp_policy": args.warp_policy,
                                                 "program": args.program}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
