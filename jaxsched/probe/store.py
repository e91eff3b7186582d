"""The probe's output folder: raw arrays first, then what is derived from them.

    OUT/device.json        device properties, nvidia-smi before/after, compiler, NVML samples
    OUT/raw.npz            calibration experiments' raw arrays (experiments.py)
    OUT/suite_raw.npz      per case: stamps (launch, cta, 5) and per-warp end clocks
    OUT/sass.txt           cuobjdump -sass of the probe kernels
    OUT/calibration.json   calibrate.derive(raw)
    OUT/summary.json       per case and launch: makespan, clock, per-SM CTA counts, stagger
    OUT/traces/CASE_rK.nc  one trace per launch in jaxsched's trace format (jaxsched.trace)

`rebuild(OUT)` recomputes everything derived from the raw files, on any machine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from .. import trace as trace_mod
from ..arch import Arch
from . import calibrate, metrics
from .gpu import save_json
from .suite import ProbeCase
from .timing import align

SUITE_SEP = "__"
STAGGER_WINDOW = 0.1  # CTAs an SM starts within this fraction of the makespan count as one wave


def save_raw(out: Path, raw: dict[str, np.ndarray], suite_raw: dict[str, dict[str, Any]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out / "raw.npz", **raw)
    flat = {f"{case}{SUITE_SEP}{key}": np.asarray(value) for case, entry in suite_raw.items()
            for key, value in entry.items()}
    np.savez_compressed(out / "suite_raw.npz", **flat)


def load_raw(out: Path) -> tuple[dict[str, np.ndarray], dict[str, dict[str, Any]]]:
    raw = dict(np.load(out / "raw.npz")) if (out / "raw.npz").exists() else {}
    suite_raw: dict[str, dict[str, Any]] = {}
    if (out / "suite_raw.npz").exists():
        for key, value in np.load(out / "suite_raw.npz").items():
            case, field = key.split(SUITE_SEP, 1)
            suite_raw.setdefault(case, {})[field] = value if value.ndim else value.item()
    return raw, suite_raw


def _first_visits(cta_sm: np.ndarray, n_sm: int) -> list[int]:
    """SMs in the order they received their first CTA (grid order): the dispatcher's walk."""
    _, first = np.unique(cta_sm, return_index=True)
    return [int(cta_sm[i]) for i in np.sort(first)][:n_sm]


def launch_summary(rec: np.ndarray, warp_end: np.ndarray, quantum_ns: float, n_sm: int,
                   warps_per_cta: int) -> tuple[dict[str, Any], Any]:
    """One launch's measured numbers (and its aligned times) from its raw stamps."""
    al = align(rec[:, 0], rec[:, 1], rec[:, 2], rec[:, 3], rec[:, 4], quantum_ns)
    st = metrics.first_wave_stagger(rec[:, 0], al.start_ns, al.end_ns, STAGGER_WINDOW * al.makespan_ns)
    # warps of a CTA: spread of their end clocks relative to the CTA's duration (same SM clock)
    we = warp_end.reshape(-1, warps_per_cta).astype(np.float64)
    dur = (rec[:, 4] - rec[:, 3]).astype(np.float64)
    warp_spread = (we.max(axis=1) - we.min(axis=1)) / dur
    sm_mhz = np.full(n_sm, np.nan)
    sm_mhz[al.sm_ids] = al.sm_clock_mhz
    return {
        "makespan_ns": al.makespan_ns,
        "clock_mhz": al.clock_mhz,
        "sm_clock_mhz": [None if np.isnan(f) else round(float(f), 2) for f in sm_mhz],
        "offset_width_ns": al.offset_width_ns,
        "first_sm": int(rec[0, 0]),
        "first_wave_sms": _first_visits(rec[:, 0], n_sm),
        "sm_ctas": metrics.sm_counts(rec[:, 0], n_sm).tolist(),
        "first_wave_start_spread_ns": float(np.sort(al.start_ns)[min(n_sm, len(al.start_ns)) - 1]),
        "stagger_spread": st.spread,
        "stagger_first_over_last": st.first_over_last,
        "warp_end_spread_in_cta": float(np.median(warp_spread)),
        "cta_duration_ns": {"median": float(np.median(al.end_ns - al.start_ns)),
                            "min": float(np.min(al.end_ns - al.start_ns)),
                            "max": float(np.max(al.end_ns - al.start_ns))},
    }, al


def write_derived(out: Path, raw: dict[str, np.ndarray], suite_raw: dict[str, dict[str, Any]],
                  cases: tuple[ProbeCase, ...], arch: Arch, sass_text: str, n_sm: int,
                  arch_name: str) -> dict[str, Any]:
    """calibration.json, summary.json and the traces, from the raw arrays."""
    cal = calibrate.derive(raw, sass_text, n_sm)
    save_json(out / "calibration.json", cal)
    quantum = float(cal.get("timer", {}).get("step_ns", 0.0))
    summary: dict[str, Any] = {"timer_quantum_ns": quantum, "cases": {}}
    for case in cases:
        if case.name not in suite_raw:
            continue
        entry = suite_raw[case.name]
        launches = []
        for k, (rec, warp_end) in enumerate(zip(entry["rec"], entry["warp_end"])):
            info, al = launch_summary(rec, warp_end, quantum, n_sm, case.warps_per_cta)
            launches.append(info)
            mhz = np.full(n_sm, np.nan)
            mhz[al.sm_ids] = al.sm_clock_mhz
            ds = trace_mod.make(
                rec[:, 0], al.start_ns, al.end_ns, mhz, source="probe", arch=arch_name, kernel=case.name,
                threads_per_cta=case.threads, ctas_per_sm=int(entry["driver_ctas_per_sm"])
                if int(entry["driver_ctas_per_sm"]) > 0 else int(entry["jaxsched_ctas_per_sm"]),
                program=case.program(), cta_start_cycles=rec[:, 3], cta_end_cycles=rec[:, 4],
                launch=k, regs_per_thread=int(entry["regs"]), dynamic_smem_bytes=int(entry["smem_bytes"]),
                timer_quantum_ns=quantum)
            trace_mod.save(ds, out / "traces" / f"{case.name}_r{k}.nc")
        makespans = np.asarray([x["makespan_ns"] for x in launches])
        summary["cases"][case.name] = {
            "kernel": case.kernel, "threads": case.threads, "grid": case.grid, "trips": case.trips,
            "cta_spread": case.cta_spread, "warp_spread": case.warp_spread, "seed": case.seed,
            "memory": case.memory, "role": case.role, "note": case.note,
            "regs": int(entry["regs"]), "smem_bytes": int(entry["smem_bytes"]),
            "driver_ctas_per_sm": int(entry["driver_ctas_per_sm"]),
            "jaxsched_ctas_per_sm": int(entry["jaxsched_ctas_per_sm"]),
            "makespan_ns_median": float(np.median(makespans)),
            "makespan_ns_range": [float(makespans.min()), float(makespans.max())],
            "launches": launches,
        }
    save_json(out / "summary.json", summary, indent=None)  # per-SM lists: one line per file keeps it small
    return summary


def rebuild(out: Path, cases: tuple[ProbeCase, ...], arch: Arch) -> dict[str, Any]:
    """Recompute calibration.json, summary.json and traces from OUT's raw files."""
    raw, suite_raw = load_raw(out)
    device = json.loads((out / "device.json").read_text())
    sass_text = (out / "sass.txt").read_text() if (out / "sass.txt").exists() else ""
    return write_derived(out, raw, suite_raw, cases, arch, sass_text, int(device["props"]["multiProcessorCount"]),
                         device["arch"])
