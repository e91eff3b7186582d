"""The probe's measurements on a GPU: each function launches kernels and returns raw arrays.

Raw data only (stamps, cycle counts, SM ids): `calibrate.py` derives the numbers from them on
any machine, so a measurement is never lost to a mistake in its analysis. Launches of one
experiment are queued back to back and synchronised once, so the GPU stays busy and its clock
stays where the load puts it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..arch import Arch
from . import kernels
from .gpu import Gpu, unpack_records
from .suite import ProbeCase
from .timing import sm_clock_mhz

TIMER_SAMPLES = 8192
LINE_BYTES = 128
SPIN_LONG_CYCLES = 20_000  # keeps a recorded launch's CTAs co-resident
SPIN_SHORT_CYCLES = 1_000
# grids launched between two recorded launches (0: none): how the start of the order moves
FILLER_GRIDS = (0, 1, 2, 3, 5, 8, 13, 21, 34, 55, 66, 100, 131, 132, 133, 264)
HEAVY_TRIPS = 2000  # work_fma_dep trips per warp for the clock-under-load kernel (~4 ms)
SUSTAINED_LAUNCHES = 200
LIGHT_SPIN_CYCLES = 20_000_000  # one warp per SM spinning ~10 ms


def _stack(recs: list[dict[str, np.ndarray]]) -> np.ndarray:
    """Records of several launches as one (launch, cta, 5) int64 array."""
    return np.stack([np.stack([r["sm"], r["t0"], r["t1"], r["c0"], r["c1"]], axis=1) for r in recs])


def timer(gpu: Gpu) -> dict[str, np.ndarray]:
    """Consecutive `%globaltimer` and `clock64` reads by one thread."""
    cp = gpu.cp
    t = cp.zeros(TIMER_SAMPLES, dtype=cp.uint64)
    c = cp.zeros(TIMER_SAMPLES, dtype=cp.int64)
    gpu.launch("timer_samples", 1, 1, (t, c, np.int32(TIMER_SAMPLES)))
    gpu.sync()
    return {"timer_t": t.get().astype(np.int64), "timer_c": c.get()}


def _heavy(gpu: Gpu, trips: Any, grid: int) -> Any:
    cp = gpu.cp
    rec = gpu.records(grid)
    warp_end = cp.zeros(grid * 8, dtype=cp.int64)
    sink = cp.zeros(1, dtype=cp.float32)
    gpu.launch("work_fma_dep", grid, 256, (rec, warp_end, sink, trips, np.float32(0.999), np.float32(1e-3)))
    return rec


def clocks(gpu: Gpu, sampler: Any) -> dict[str, np.ndarray]:
    """Clock under light load (one spinning warp per SM), heavy load (8 FMA-bound CTAs per SM),
    and over ~1 s of sustained heavy load, from clock64 against %globaltimer per SM."""
    cp = gpu.cp
    n = gpu.n_sm
    out: dict[str, np.ndarray] = {}
    grid = 8 * n
    trips = cp.full(grid * 8, HEAVY_TRIPS, dtype=cp.int32)
    for label in ("light_before", "heavy", "light_after"):
        sampler.mark(f"clock:{label}")
        if label.startswith("light"):
            rec = gpu.records(n)
            gpu.launch("stamp_spin", n, 32, (rec, np.int64(LIGHT_SPIN_CYCLES)), smem=gpu.one_per_sm_smem)
            g = n
        else:
            rec, g = _heavy(gpu, trips, grid), grid
        gpu.sync()
        out[f"clock_{label}_rec"] = _stack([unpack_records(rec, g)])[0]
        if label == "heavy":
            sampler.mark("clock:sustained")
            recs = [_heavy(gpu, trips, grid) for _ in range(SUSTAINED_LAUNCHES)]
            gpu.sync()
            per_sm, starts = [], []
            for rec in recs:
                r = unpack_records(rec, grid)
                per_sm.append(sm_clock_mhz(r["sm"], r["t0"], r["t1"], r["c0"], r["c1"], n))
                starts.append(r["t0"].min())
            out["clock_sustained_sm_mhz"] = np.asarray(per_sm, dtype=np.float32)
            out["clock_sustained_t0_ns"] = np.asarray(starts, dtype=np.int64)
    return out


def _rings(gpu: Gpu, rng: np.random.Generator, rings: int, lines: int, footprint: int) -> tuple[Any, Any]:
    """Pointer-chase rings: `rings` cycles of `lines` random 128-B lines inside `footprint` bytes."""
    cp = gpu.cp
    total = footprint // LINE_BYTES
    pick = rng.choice(total, rings * lines, replace=False).reshape(rings, lines).astype(np.uint64)
    buf = cp.zeros(footprint // 8, dtype=cp.uint64)
    base = np.uint64(buf.data.ptr)
    nxt = np.roll(pick, -1, axis=1)
    words = LINE_BYTES // 8
    word_index = (pick.ravel() * np.uint64(words)).astype(np.int64)
    buf[cp.asarray(word_index)] = cp.asarray(base + nxt.ravel() * np.uint64(LINE_BYTES))
    starts = cp.asarray(base + pick[:, 0] * np.uint64(LINE_BYTES))
    return buf, starts


def latencies(gpu: Gpu, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Dependent-issue latency per operation class, one warp on every SM at once (one CTA per
    SM), LAT_REPS repetitions of LAT_N dependent operations timed with clock64."""
    cp = gpu.cp
    n = gpu.n_sm
    smem = gpu.one_per_sm_smem
    sink = cp.zeros(1, dtype=cp.float32)
    f32, u32 = np.float32, np.uint32
    l1_buf, l1_start = _rings(gpu, rng, n, 64, 16 << 20)
    l2_buf, l2_start = _rings(gpu, rng, n, 512, 64 << 20)
    dram_buf, dram_start = _rings(gpu, rng, n, kernels.LAT_REPS * kernels.LAT_N, 2 << 30)
    flush = cp.empty(1 << 29, dtype=cp.uint8)  # 512 MiB written after the rings: evicts them from L2
    runs = {
        "fma": ("lat_fma", (f32(0.999), f32(1e-3))),
        "alu": ("lat_alu", (u32(3), u32(5))),
        "sfu": ("lat_sfu", (f32(1e-3), f32(0.0))),
        "lds": ("lat_lds", (u32(0), u32(0))),
        "shfl": ("lat_shfl", (u32(0), u32(0))),
        "ldg_l1": ("lat_ldg_l1", (l1_start, u32(0))),
        "ldg_l2": ("lat_ldg_l2", (l2_start, u32(0))),
        "dram": ("lat_ldg_l2", (dram_start, u32(0))),
    }
    out: dict[str, np.ndarray] = {}
    for key, (name, params) in runs.items():
        if key == "dram":
            flush.fill(1)
        cyc = cp.zeros(n * kernels.LAT_REPS, dtype=cp.int64)
        sm = cp.zeros(n, dtype=cp.uint32)
        span = cp.zeros(4 * n, dtype=cp.uint64)
        gpu.launch(name, n, 32, (*params, cyc, sm, span, sink), smem=smem)
        gpu.sync()
        out[f"lat_{key}_cycles"] = cyc.get().reshape(n, kernels.LAT_REPS)
        out[f"lat_{key}_sm"] = sm.get().astype(np.int32)
        out[f"lat_{key}_span"] = span.get().astype(np.int64).reshape(n, 4)
    del l1_buf, l2_buf, dram_buf, flush
    return out


def throughput(gpu: Gpu) -> dict[str, np.ndarray]:
    """Issue rate per pipe: 8 CTAs of 256 threads per SM, 8 independent chains per thread."""
    cp = gpu.cp
    grid = 8 * gpu.n_sm
    sink = cp.zeros(1, dtype=cp.float32)
    out: dict[str, np.ndarray] = {}
    for name, spec in kernels.THROUGHPUT_KERNELS.items():
        cast = np.float32 if spec["ctype"] == "float" else np.uint32
        args = (cast(0.999), cast(1e-3)) if spec["ctype"] == "float" else (cast(3), cast(5))
        recs = []
        for _ in range(2):  # the first launch warms the instruction cache
            rec = gpu.records(grid)
            gpu.launch(f"thr_{name}", grid, 256, (rec, sink, *args))
            recs.append(rec)
        gpu.sync()
        out[f"thr_{name}_rec"] = _stack([unpack_records(recs[-1], grid)])[0]
    return out


def dispatch(gpu: Gpu) -> dict[str, np.ndarray]:
    """Where CTA i goes: grids of one CTA per SM (one per SM resident), after filler grids of
    various sizes; grids of two per SM; and a grid of 8 waves of short CTAs."""
    n = gpu.n_sm
    one, two = gpu.one_per_sm_smem, gpu.two_per_sm_smem
    spin_long, spin_short = np.int64(SPIN_LONG_CYCLES), np.int64(SPIN_SHORT_CYCLES)
    recs, fillers = [], []
    for _ in range(3):
        for g in FILLER_GRIDS:
            if g:
                gpu.launch("stamp_spin", g, 32, (gpu.records(g), spin_short), smem=one)
            rec = gpu.records(n)
            gpu.launch("stamp_spin", n, 32, (rec, spin_long), smem=one)
            recs.append(rec)
            fillers.append(g)
    two_recs = []
    for _ in range(8):
        rec = gpu.records(2 * n)
        gpu.launch("stamp_spin", 2 * n, 32, (rec, spin_long), smem=two)
        two_recs.append(rec)
    waves_recs = []
    for _ in range(4):
        rec = gpu.records(8 * n)
        gpu.launch("stamp_spin", 8 * n, 32, (rec, np.int64(2 * SPIN_SHORT_CYCLES)), smem=one)
        waves_recs.append(rec)
    gpu.sync()
    return {
        "dispatch_one_rec": _stack([unpack_records(r, n) for r in recs]),
        "dispatch_one_filler": np.asarray(fillers, dtype=np.int32),
        "dispatch_two_rec": _stack([unpack_records(r, 2 * n) for r in two_recs]),
        "dispatch_waves_rec": _stack([unpack_records(r, 8 * n) for r in waves_recs]),
    }


def clusters(gpu: Gpu, launches: int = 12) -> dict[str, np.ndarray]:
    """SM ids of thread-block clusters (sizes `kernels.CLUSTER_SIZES`), one CTA per SM, with
    filler grids in between so that clusters land on different SMs each time."""
    cp = gpu.cp
    n = gpu.n_sm
    one = gpu.one_per_sm_smem
    out: dict[str, np.ndarray] = {}
    for size in kernels.CLUSTER_SIZES:
        grid = n // size * size
        bufs = []
        for i in range(launches):
            g = FILLER_GRIDS[i % len(FILLER_GRIDS)]
            if g:
                gpu.launch("stamp_spin", g, 32, (gpu.records(g), np.int64(SPIN_SHORT_CYCLES)), smem=one)
            buf = cp.zeros(2 * grid, dtype=cp.uint32)
            gpu.launch(f"cluster_smid_{size}", grid, 32, (buf, np.int64(2 * SPIN_SHORT_CYCLES)), smem=one)
            bufs.append(buf)
        gpu.sync()
        out[f"cluster{size}_out"] = np.stack([b.get().reshape(grid, 2) for b in bufs]).astype(np.int32)
    return out


def _driver_occupancy(gpu: Gpu, name: str, threads: int, smem: int) -> int:
    try:
        return gpu.driver_occupancy(name, threads, smem)
    except Exception:  # an older CuPy without the driver binding: recorded as unknown
        return -1


def run_case(gpu: Gpu, case: ProbeCase, arch: Arch, repeats: int, buffers: dict[str, Any]) -> dict[str, Any]:
    """One suite case: a warm-up launch, then `repeats` recorded launches back to back."""
    cp = gpu.cp
    name = f"work_{case.kernel}"
    smem = case.smem_bytes(arch)
    fn = gpu.kernel(name, smem)
    regs = int(fn.num_regs)
    trips = cp.asarray(case.trip_counts())
    warps = case.grid * case.warps_per_cta
    sink = cp.zeros(1, dtype=cp.float32)
    sizes = {"l2": 1 << 22, "dram": 1 << 29}  # floats: a 16 MiB L2-resident, a 2 GiB streamed buffer
    if case.memory is not None:
        if case.memory not in buffers:
            buffers[case.memory] = cp.ones(sizes[case.memory], dtype=cp.float32)
        src = buffers[case.memory]
    if case.memory == "dram":
        cp.empty(1 << 29, dtype=cp.uint8).fill(1)  # 512 MiB written: the L2 holds none of src
    recs, ends = [], []
    for r in range(repeats + 1):
        rec = gpu.records(case.grid)
        warp_end = cp.zeros(warps, dtype=cp.int64)
        head = (rec, warp_end, sink, trips)
        if case.kernel == "ldg":
            # each launch starts 64 MiB further on: a DRAM launch never reads what the last one read
            offset = np.uint32(((r + 1) << 24) % src.size)
            args = head + (src, np.uint32(src.size), offset, np.float32(1e-3))
        else:
            args = head + (np.float32(0.999), np.float32(1e-3))
        gpu.launch(name, case.grid, case.threads, args, smem=smem)
        if r:
            recs.append(rec)
            ends.append(warp_end)
    gpu.sync()
    return {
        "rec": _stack([unpack_records(r, case.grid) for r in recs]),
        "warp_end": np.stack([e.get() for e in ends]),
        "regs": regs,
        "smem_bytes": smem,
        "driver_ctas_per_sm": _driver_occupancy(gpu, name, case.threads, smem),
        "jaxsched_ctas_per_sm": case.occupancy(arch, regs),
    }


SWEEP_KERNELS = ("fma_dep", "fma_dep_bank", "fma_ilp")
SWEEP_WARPS_PER_SCHEDULER = (1, 2, 4, 8, 16)
SWEEP_TRIPS = 32


def issue_sweep(gpu: Gpu) -> dict[str, np.ndarray]:
    """Issue rate of the suite's work loops against the number of warps per scheduler: CTAs of
    4 warps (one per scheduler), `m` of them per SM (forced through dynamic shared memory, grid
    `m * n_sm`: one wave), every warp `SWEEP_TRIPS` trips. Per SM, the span of its stamps in
    clock64 cycles over the warp instructions each scheduler issued is the cycles per
    instruction, without the suite's short-launch ramps."""
    cp = gpu.cp
    n = gpu.n_sm
    sink = cp.zeros(1, dtype=cp.float32)
    out: dict[str, np.ndarray] = {}
    for name in SWEEP_KERNELS:
        for m in SWEEP_WARPS_PER_SCHEDULER:
            grid = m * n
            smem = gpu.smem_per_sm // m - gpu.reserved_smem
            smem = min(smem, gpu.smem_optin) // 128 * 128
            trips = cp.full(grid * 4, SWEEP_TRIPS, dtype=cp.int32)
            recs = []
            for _ in range(2):  # the first launch warms the instruction cache
                rec = gpu.records(grid)
                warp_end = cp.zeros(grid * 4, dtype=cp.int64)
                gpu.launch(f"work_{name}", grid, 128, (rec, warp_end, sink, trips, np.float32(0.999),
                                                        np.float32(1e-3)), smem=smem)
                recs.append(rec)
            gpu.sync()
            out[f"sweep_{name}_m{m}_rec"] = _stack([unpack_records(recs[-1], grid)])[0]
    return out


# (threads per CTA, CTAs per SM): 1, 2, 4 and 8 warps per scheduler per CTA, two CTAs per SM
REFILL_SHAPES = ((128, 2), (256, 2), (512, 2), (1024, 2))
REFILL_WAVES = 3
REFILL_TRIPS = 8


def refill(gpu: Gpu) -> dict[str, np.ndarray]:
    """When does a freed CTA slot take its next CTA while the SM's other CTA still runs?
    `work_fma_dep` with two CTAs per SM (forced through shared memory), `REFILL_WAVES` waves,
    for CTAs of 1, 2, 4 and 8 warps per scheduler: from one CTA the other still leaves the
    schedulers idle cycles (latency-bound) or it keeps them busy (issue-bound)."""
    cp = gpu.cp
    n = gpu.n_sm
    sink = cp.zeros(1, dtype=cp.float32)
    out: dict[str, np.ndarray] = {}
    for threads, per_sm in REFILL_SHAPES:
        grid = REFILL_WAVES * per_sm * n
        warps = threads // 32
        smem = min(gpu.smem_per_sm // per_sm - gpu.reserved_smem, gpu.smem_optin) // 128 * 128
        trips = cp.full(grid * warps, REFILL_TRIPS, dtype=cp.int32)
        recs = []
        for _ in range(3):  # the first launch warms the instruction cache
            rec = gpu.records(grid)
            warp_end = cp.zeros(grid * warps, dtype=cp.int64)
            gpu.launch("work_fma_dep", grid, threads, (rec, warp_end, sink, trips, np.float32(0.999),
                                                        np.float32(1e-3)), smem=smem)
            recs.append(rec)
        gpu.sync()
        out[f"refill_t{threads}_k{per_sm}_rec"] = _stack([unpack_records(r, grid) for r in recs[1:]])
    return out
