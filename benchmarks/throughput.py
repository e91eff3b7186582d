"""Engine throughput in simulated SM-cycles per second, printed as JSON.

Workload (issue 3): the H200 preset (132 SMs), 4 waves of 256-thread CTAs (8 CTAs per SM at
32 registers, so 4224 CTAs), each warp looping (`--trips`, default 4) over a mix of global loads and FMAs. The batch
varies the per-SM clock maps (random, 1.6-1.98 GHz) and the warp policy, so every member is a
different configuration. Compilation (ahead of time) and the run are timed separately.

    python benchmarks/throughput.py --batch 256 [--reference-configs 3] [--rounds 3] [--dvfs] [--no-fast-forward]

The speed-up over the plain-Python reference (`--reference-configs`) is only as good as the two
timings are comparable, and this machine's speed drifts by 20 % over minutes. With `--rounds R`
the engine's run and the reference's alternate R times; the JSON gives each round's rates, the
speed-up of the summed rates and the median of the rounds' speed-ups.

`--dvfs` turns on the power, thermal and clock-controller model (docs/model.md section 12) with a
0.5 us controller period, so that several samples and clock changes fall inside each run, and a
power cap of 50 % of the preset's (this workload draws ~425 W of the H200's 700 W), so that the
controller really moves clocks during each run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import jax
import numpy as np

import jaxsched as js
from jaxsched import clocks, dvfs, reference
from jaxsched.engine.mechanics.devices import mesh_of
from jaxsched.engine.fast_forward import may_fast_forward
from jaxsched.engine.configure import engine_params
from jaxsched.engine.run import MAX_TICKS, _compiled, default_chunk, uses_closed_loop
from jaxsched.lower import shapes_for
from jaxsched.kernel import make_kernel
from jaxsched.params import make_params

PROGRAM = """
loop {trips} cta_spread=2
  ldg bytes=128
  fma
  fma dep
  fma dep
  fma dep
end
"""


def workload(batch: int, trips: int = 4, seed: int = 0):
    arch = js.presets.get("h200")
    kernel = make_kernel(PROGRAM.format(trips=trips), grid=4 * 8 * arch.sm_count, threads=256, regs=32, l2_hit_rate=0.6)
    rng = np.random.default_rng(seed)
    maps = [clocks.from_array(arch, rng.uniform(1600, 1980, arch.n_sm_slots)) for _ in range(batch)]
    policies = np.arange(batch) % 3
    return arch, kernel, maps, policies


def _timed(fn) -> dict:
    """`fn()`'s value and its wall time in seconds."""
    t0 = time.perf_counter()
    value = fn()
    return {"value": value, "seconds": time.perf_counter() - t0}


def _reference_cycles(arch, kernel, maps, policies, dvfs_params, round_index: int, n_configs: int) -> int:
    """SM cycles the plain-Python reference simulates for `n_configs` of the batch's
    configurations (the next slice each round). The warp policy cycles with the configuration
    index, so 3 configurations per round cover the batch's mix."""
    total = 0
    for j in range(n_configs):
        i = (round_index * n_configs + j) % len(maps)
        r = reference.simulate(arch, kernel, maps[i], warp_policy=int(policies[i]), dvfs=dvfs_params)
        total += int(np.sum(r["sm_cycles"]))
    return total


def main() -> None:
    js.use_host_cores()  # one CPU device per core (docs/engine_performance.md, "One CPU device per core")
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--trips", type=int, default=4, help="loop trips per warp")
    parser.add_argument("--dvfs", action="store_true", help="DVFS on (section 12)")
    parser.add_argument("--no-fast-forward", action="store_true", help="compile the engine without fast-forward")
    parser.add_argument("--devices", type=int, default=0,
                        help="devices sharing the batch (default: all local ones, as simulate_batch)")
    parser.add_argument("--chunk", type=int, default=0, help="configurations per chunk (default: default_chunk)")
    parser.add_argument("--reference-configs", type=int, default=0,
                        help="also time the plain-Python reference on this many configurations per round")
    parser.add_argument("--rounds", type=int, default=1,
                        help="repeat the engine run (and the reference's) this many times, alternating, so that "
                             "the speed-up compares runs minutes apart at most: the machine's speed drifts")
    args = parser.parse_args()
    arch, kernel, maps, policies = workload(args.batch, args.trips)
    n = args.batch
    mode = "dvfs" if args.dvfs else "off"
    dvfs_params = dvfs.default(arch, mode=mode, period_us=0.5, latency_us=0.25,
                               power_cap_w=0.5 * float(arch.power_limit_w))
    shapes = shapes_for(arch, kernel)
    inputs = js.stack([engine_params(make_params(arch, kernel, m, warp_policy=int(wp), dvfs=dvfs_params), kernel, shapes)
                    for m, wp in zip(maps, policies)])
    with jax.enable_x64(True):
        t0 = time.perf_counter()
        shapes = dataclasses.replace(shapes, dvfs=args.dvfs,  # as simulate_batch decides
                                     closed_loop=uses_closed_loop(inputs.dispatch),
                                     fast_forward=not args.no_fast_forward and may_fast_forward(kernel))
        chunk = args.chunk or default_chunk(shapes)  # as simulate_batch decides
        devices = jax.local_devices()[:args.devices or None]
        compiled = _compiled.lower(inputs, shapes=shapes, max_ticks=MAX_TICKS,
                                   batched=True, chunk=chunk, mesh=mesh_of(devices)).compile()
        compile_seconds = time.perf_counter() - t0
        engine_runs = []
        for r in range(args.rounds):
            engine_runs.append(_timed(lambda: jax.device_get(compiled(inputs))))
            if args.reference_configs:
                engine_runs[-1]["reference"] = _timed(lambda: _reference_cycles(
                    arch, kernel, maps, policies, dvfs_params if args.dvfs else None, r, args.reference_configs))
    result = engine_runs[0]["value"]
    if any(not np.array_equal(e["value"].makespan_ticks, result.makespan_ticks) for e in engine_runs):
        raise SystemExit("the engine's rounds differ: results must be deterministic")
    sm_cycles = float(np.sum(result.sm_cycles))
    run_seconds = sum(e["seconds"] for e in engine_runs)
    out = {
        "device": str(jax.devices()[0].device_kind),
        "platform": jax.default_backend(),
        "batch": n,
        "devices": len(devices),  # sharing the batch
        "chunk": chunk,  # configurations per vmapped chunk on each device (None: all at once)
        "sm_count": arch.sm_count,
        "ctas_per_config": int(kernel.grid_ctas),
        "loop_trips": args.trips,
        "dvfs": mode,
        "fast_forward": shapes.fast_forward,  # compiled in (asked for, and the kernel could use it)
        "mean_ticks_stepped": float(np.mean(result.ticks_stepped)),
        "mean_makespan_ns": float(np.mean(result.makespan_ns)),
        "mean_makespan_ticks": float(np.mean(result.makespan_ticks)),
        "simulated_sm_cycles": sm_cycles,
        "rounds": args.rounds,
        "run_seconds": round(run_seconds / args.rounds, 3),  # per round
        "compile_seconds": round(compile_seconds, 3),
        "sm_cycles_per_second": sm_cycles * args.rounds / run_seconds,
    }
    if args.reference_configs:
        rates = [(sm_cycles / e["seconds"], e["reference"]["value"] / e["reference"]["seconds"]) for e in engine_runs]
        out["per_round"] = [{"sm_cycles_per_second": a, "reference_sm_cycles_per_second": b, "speedup": a / b}
                            for a, b in rates]
        ref_seconds = sum(e["reference"]["seconds"] for e in engine_runs)
        out["reference_sm_cycles_per_second"] = sum(e["reference"]["value"] for e in engine_runs) / ref_seconds
        out["speedup_vs_reference"] = out["sm_cycles_per_second"] / out["reference_sm_cycles_per_second"]
        out["speedup_median_of_rounds"] = float(np.median([r["speedup"] for r in out["per_round"]]))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
