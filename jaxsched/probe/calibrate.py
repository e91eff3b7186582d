"""Derive the calibration numbers from the probe's raw arrays (`experiments.py`), on any machine.

Each function takes the raw dictionary (as saved in `raw.npz`) and returns plain JSON values:
the `%globaltimer` quantum, SM clocks under light, heavy and sustained load, dependent-issue
latencies per operation class, issue rates per pipe, the work loops' issue rate against warps per
scheduler, the delay before a freed CTA slot takes its next CTA, the dispatcher's SM order and its
rotation, and the GPC groups seen through thread-block clusters. docs/calibration.md explains each.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from jaxtyping import Float, Int

from . import kernels, layout, sass
from .experiments import (
    REFILL_SHAPES,
    SWEEP_KERNELS,
    SWEEP_TRIPS,
    SWEEP_WARPS_PER_SCHEDULER,
)
from .timing import align, sm_clock_mhz, timer_quantum

# SASS opcode that each latency chain is made of (what the timed loop is divided by)
LATENCY_OPCODES = {"fma": "FFMA", "alu": "IADD3", "sfu": "MUFU", "lds": "LDS", "shfl": "SHFL",
                   "ldg_l1": "LDG", "ldg_l2": "LDG", "dram": "LDG"}
_LATENCY_KERNEL = {"dram": "lat_ldg_l2"}
# repetitions that count: caches are warm from the second on; the DRAM rings are cold in every one
_WARM_REPS = {"ldg_l1": slice(1, None), "ldg_l2": slice(1, None), "dram": slice(0, None)}
THROUGHPUT_OPCODES = {"fma": "FFMA", "alu": "LOP3", "sfu": "MUFU"}


def _stats(x: np.ndarray) -> dict[str, float]:
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return {"n": 0}
    return {"median": float(np.median(x)), "mean": float(np.mean(x)), "min": float(np.min(x)),
            "max": float(np.max(x)), "n": int(x.size)}


def timer(raw: dict[str, np.ndarray]) -> dict[str, float]:
    q = timer_quantum(raw["timer_t"], raw["timer_c"])
    return {"step_ns": q.step_ns, "min_step_ns": q.min_step_ns, "read_period_ns": q.read_period_ns,
            "read_period_cycles": q.read_period_cycles, "samples": q.samples}


def _rec_clock(rec: np.ndarray, n_sm: int) -> np.ndarray:
    return sm_clock_mhz(rec[:, 0], rec[:, 1], rec[:, 2], rec[:, 3], rec[:, 4], n_sm)


def clocks(raw: dict[str, np.ndarray], n_sm: int) -> dict[str, Any]:
    """Per-SM clocks (MHz) under each load, and the sustained series (median over SMs)."""
    out: dict[str, Any] = {}
    for label in ("light_before", "heavy", "light_after"):
        key = f"clock_{label}_rec"
        if key in raw:
            mhz = _rec_clock(raw[key], n_sm)
            rec = raw[key]
            out[label] = {**_stats(mhz), "span_ns": float(rec[:, 2].max() - rec[:, 1].min()),
                          "sm_spread_percent": float(100 * (np.nanmax(mhz) - np.nanmin(mhz)) / np.nanmedian(mhz))}
    if "clock_sustained_sm_mhz" in raw:
        series = np.nanmedian(raw["clock_sustained_sm_mhz"].astype(np.float64), axis=1)
        t = (raw["clock_sustained_t0_ns"] - raw["clock_sustained_t0_ns"][0]) / 1e6
        out["sustained"] = {**_stats(series), "first_mhz": float(series[0]), "last_mhz": float(series[-1]),
                            "duration_ms": float(t[-1]), "launches": int(series.size),
                            "series_mhz": np.round(series, 1).tolist(), "series_t_ms": np.round(t, 3).tolist()}
    return out


def latencies(raw: dict[str, np.ndarray], sass_text: str) -> dict[str, Any]:
    """Cycles per dependent operation, per SM (median of the counted repetitions), summarised;
    global-memory latencies also in ns at each SM's clock during the run."""
    out: dict[str, Any] = {}
    for key, op in LATENCY_OPCODES.items():
        if f"lat_{key}_cycles" not in raw:
            continue
        body = sass.loop_with(sass_text, _LATENCY_KERNEL.get(key, f"lat_{key}"), op) if sass_text else None
        count = int(body[op]) if body else kernels.LAT_N
        reps = raw[f"lat_{key}_cycles"][:, _WARM_REPS.get(key, slice(1, None))].astype(np.float64)
        cycles = np.median(reps, axis=1) / count
        span = raw[f"lat_{key}_span"].astype(np.float64)
        mhz = (span[:, 3] - span[:, 2]) / (span[:, 1] - span[:, 0]) * 1000.0
        entry = {"sass_ops_per_rep": count, "cycles": _stats(cycles), "clock_mhz": _stats(mhz)}
        if key.startswith("ldg") or key == "dram":
            entry["ns"] = _stats(cycles / mhz * 1000.0)
        out[key] = entry
    return out


def throughput(raw: dict[str, np.ndarray], sass_text: str, n_sm: int) -> dict[str, Any]:
    """Warp instructions issued per SM per cycle with 64 warps per SM and 8 chains per thread."""
    out: dict[str, Any] = {}
    for name, op in THROUGHPUT_OPCODES.items():
        key = f"thr_{name}_rec"
        if key not in raw or not sass_text:
            continue
        body = sass.loop_with(sass_text, f"thr_{name}", op)
        if body is None:
            continue
        iterations = kernels.THR_N * 8 / body[op]  # body[op] = chain steps per loop iteration
        per_warp_all = iterations * sum(body.values())
        per_warp_op = iterations * body[op]
        rec = raw[key]
        rates_op, rates_all = [], []
        for s in np.unique(rec[:, 0]):
            on = rec[:, 0] == s
            cycles = float(rec[on, 4].max() - rec[on, 3].min())
            warps = 8 * int(on.sum())  # 256 threads per CTA
            rates_op.append(warps * per_warp_op / cycles)
            rates_all.append(warps * per_warp_all / cycles)
        out[name] = {"opcode": op, "loop_body": dict(body), "op_per_sm_cycle": _stats(rates_op),
                     "instr_per_sm_cycle": _stats(rates_all),
                     "issue_cycles_per_scheduler": 4.0 / float(np.median(rates_op))}
    return out


def dispatch(raw: dict[str, np.ndarray], n_sm: int, gpc_of: dict[int, int] | None) -> dict[str, Any]:
    """The SM order CTAs are handed out in, its rotation, and the "most room" check."""
    if "dispatch_one_rec" not in raw:
        return {}
    recs = raw["dispatch_one_rec"]
    seqs = [r[:, 0] for r in recs]
    cyc = layout.cyclic_order(seqs)
    lead = layout.common_lead(seqs)
    ordered = [float(np.mean(np.diff(r[:, 1]) >= 0)) for r in recs]  # start times follow blockIdx?
    out: dict[str, Any] = {
        "order": cyc.order, "complete_cycle": cyc.complete, "match_per_launch": _stats(cyc.match),
        "lead_sms": lead,
        # what follows the lead block, per launch, and the grid launched just before it
        "after_lead_sm": [int(s[len(lead)]) for s in seqs if len(s) > len(lead)],
        "fillers": raw["dispatch_one_filler"].tolist(),
        "tpc_pairs_adjacent": layout.tpc_pairs_adjacent(cyc.order),
        "start_time_monotonic_in_blockidx": _stats(ordered),
        "first_wave_dispatch_ns": _stats([float(r[:, 1].max() - r[:, 1].min()) for r in recs]),
    }
    if gpc_of:
        out["order_gpcs"] = [gpc_of.get(int(s), -1) for s in cyc.order]
        out["after_lead_gpc"] = [gpc_of.get(s, -1) for s in out["after_lead_sm"]]
    if "dispatch_two_rec" in raw:
        two = raw["dispatch_two_rec"]
        out["two_per_sm_same_order"] = _stats(
            [float(np.mean(r[:n_sm, 0] == r[n_sm:, 0])) for r in two])
        out["two_per_sm_first_half_distinct"] = _stats([float(np.unique(r[:n_sm, 0]).size == n_sm) for r in two])
    if "dispatch_waves_rec" in raw:
        counts = [np.bincount(r[:, 0], minlength=n_sm) for r in raw["dispatch_waves_rec"]]
        out["waves_ctas_per_sm"] = _stats(np.concatenate(counts))
    return out


def gpcs(raw: dict[str, np.ndarray]) -> dict[str, Any]:
    """GPC groups from clusters of every size (union over all launches)."""
    all_clusters: list[list[int]] = []
    out: dict[str, Any] = {}
    for size in kernels.CLUSTER_SIZES:
        key = f"cluster{size}_out"
        if key not in raw:
            continue
        clusters = [c for launch in raw[key] for c in layout.clusters_from_records(launch[:, 0], launch[:, 1])]
        all_clusters += clusters
        groups = layout.gpc_groups(clusters)
        out[f"size{size}"] = {"groups": len(groups), "group_sizes": [len(g) for g in groups],
                              "cluster_sizes_seen": sorted({len(c) for c in clusters})}
        if size == 2:
            out["size2_pairs_are_tpcs"] = float(np.mean([c[0] // 2 == c[-1] // 2 for c in clusters if len(c) == 2]))
    groups = layout.gpc_groups(all_clusters)
    out["groups"] = groups
    out["group_sizes"] = [len(g) for g in groups]
    return out


def derive(raw: dict[str, np.ndarray], sass_text: str, n_sm: int) -> dict[str, Any]:
    """Every calibration number the raw data supports (missing experiments are skipped)."""
    out: dict[str, Any] = {}
    if "timer_t" in raw:
        out["timer"] = timer(raw)
    out["clocks"] = clocks(raw, n_sm)
    out["latency"] = latencies(raw, sass_text)
    out["throughput"] = throughput(raw, sass_text, n_sm)
    out["gpcs"] = gpcs(raw)
    gpc_of = {sm: g for g, members in enumerate(out["gpcs"].get("groups", [])) for sm in members}
    out["dispatch"] = dispatch(raw, n_sm, gpc_of)
    if any(k.startswith("sweep_") for k in raw):
        out["issue_sweep"] = issue_sweep(raw, sass_text)
    if any(k.startswith("refill_") for k in raw):
        out["refill"] = refill(raw, out.get("timer", {}).get("step_ns", 32.0))
    return out


def issue_sweep(raw: dict[str, np.ndarray], sass_text: str) -> dict[str, Any]:
    """Cycles per warp instruction per scheduler of the suite's work loops, against warps per
    scheduler (`experiments.issue_sweep`). Per SM: the span of its CTAs' stamps in clock64
    cycles, over the instructions one scheduler issues (`m` warps, `SWEEP_TRIPS` trips of the
    loop body counted in the SASS); the median over SMs. `cycles_per_fma` counts the loop's
    FFMAs only, `cycles_per_instruction` all of its instructions."""
    out: dict[str, Any] = {}
    for name in SWEEP_KERNELS:
        body = sass.loop_with(sass_text, f"work_{name}", "FFMA") if sass_text else None
        if body is None:
            continue
        per_trip_all, per_trip_fma = sum(body.values()), body["FFMA"]
        rows = {}
        for m in SWEEP_WARPS_PER_SCHEDULER:
            key = f"sweep_{name}_m{m}_rec"
            if key not in raw:
                continue
            rec = raw[key]
            spans = np.asarray([rec[rec[:, 0] == s, 4].max() - rec[rec[:, 0] == s, 3].min()
                                for s in np.unique(rec[:, 0])], dtype=np.float64)
            span = float(np.median(spans))
            rows[str(m)] = {"span_cycles": span,
                            "cycles_per_fma": span / (m * SWEEP_TRIPS * per_trip_fma),
                            "cycles_per_instruction": span / (m * SWEEP_TRIPS * per_trip_all)}
        out[name] = {"loop_body": dict(body), "warps_per_scheduler": rows}
    return out


def refill_delays(cta_sm: Int[np.ndarray, " cta"], start_ns: Float[np.ndarray, " cta"],
                  end_ns: Float[np.ndarray, " cta"], per_sm: int) -> dict[str, Float[np.ndarray, " refill"]]:
    """Per refill (a CTA started after its SM's first `per_sm`): how long after a slot freed it
    started (each refill takes the slot that freed first, FIFO), and how long before the SM's
    next end among the CTAs still running (NaN when none ran)."""
    delay, before_end = [], []
    for s in np.unique(cta_sm):
        on = np.flatnonzero(cta_sm == s)
        on = on[np.argsort(start_ns[on], kind="stable")]
        free = sorted(end_ns[on[:per_sm]].tolist())
        running = list(on[:per_sm])
        for c in on[per_sm:]:
            delay.append(start_ns[c] - free.pop(0))
            later = [end_ns[x] for x in running if end_ns[x] > start_ns[c]]
            before_end.append(min(later) - start_ns[c] if later else np.nan)
            running.append(c)
            free = sorted(free + [end_ns[c]])
    return {"delay_ns": np.asarray(delay, dtype=np.float64),
            "before_other_end_ns": np.asarray(before_end, dtype=np.float64)}


def refill(raw: dict[str, np.ndarray], quantum_ns: float) -> dict[str, Any]:
    """`experiments.refill`: the delay from a freed CTA slot to its next CTA, per CTA shape, with
    the SM's other CTA leaving idle issue cycles (1-2 warps per scheduler) or not (4-8)."""
    out: dict[str, Any] = {}
    for threads, per_sm in REFILL_SHAPES:
        key = f"refill_t{threads}_k{per_sm}_rec"
        if key not in raw:
            continue
        delays, before = [], []
        for rec in raw[key]:
            al = align(rec[:, 0], rec[:, 1], rec[:, 2], rec[:, 3], rec[:, 4], quantum_ns)
            d = refill_delays(rec[:, 0], al.start_ns, al.end_ns, per_sm)
            delays.append(d["delay_ns"])
            before.append(d["before_other_end_ns"])
        d, b = np.concatenate(delays), np.concatenate(before)
        out[f"t{threads}_k{per_sm}"] = {
            "warps_per_scheduler_per_cta": threads // 32 // 4, "delay_ns": _stats(d),
            "delay_ns_p10_p90": np.percentile(d, [10, 90]).tolist(),
            "before_other_end_ns": _stats(b), "refills_with_no_other_running": float(np.mean(np.isnan(b)))}
    return out
