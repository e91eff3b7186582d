"""Millisecond kernels: wall time per configuration and the share of ticks the engine steps, with
and without fast-forward (docs/model.md section 11), printed as JSON.

Workload: the H200 preset; 256-thread CTAs at 32 registers (8 per SM); each thread a loop whose
SASS is 16 dependent FFMAs, an IADD3, an ISETP and the branch (`for (...) a = fmaf(a, b, c);`
unrolled 16 times): `--trips 3125` is 50,000 FMAs per thread, about 0.5 ms and 10^6 cycles per
wave on an H200. `--waves 1` launches 1056 CTAs, `--waves 4` 4224. `--kernel mix` puts a
coalesced global load (half from L2) in front of 32 FMAs per trip (1562 trips: the same FMAs),
which keeps DRAM below its bandwidth. Every configuration of the batch has its own random per-SM
clock map in 15 MHz bins over 1.6-1.98 GHz. Compilation (ahead of time) and the run are timed
apart; skipped and fast-forwarded cycles count as simulated: they are simulated exactly.

    python benchmarks/long_kernel.py --batch 1 --waves 1 [--warp-policy lrr] [--no-fast-forward]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import jax
import numpy as np

import jaxsched as js
from jaxsched import clocks
from jaxsched.engine.mechanics.devices import mesh_of
from jaxsched.engine.fast_forward import may_fast_forward
from jaxsched.engine.configure import engine_params
from jaxsched.engine.run import MAX_TICKS, _compiled, default_chunk
from jaxsched.lower import WARP_POLICIES, shapes_for
from jaxsched.params import make_params

_LOOP_TAIL = ["  alu", "  alu dep", "  alu dep"]  # IADD3, ISETP, BRA


def program(kind: str, trips: int) -> str:
    """The loop of `kind` ("fma": 16 FMAs per trip; "mix": a load and 32 FMAs) over `trips`."""
    if kind == "fma":
        body = ["  fma dep"] * 16
    else:
        body = ["  ldg bytes=128"] + ["  fma dep"] * 32
    return "\n".join([f"loop {trips}", *body, *_LOOP_TAIL, "end"])


def workload(batch: int, waves: int, kind: str, trips: int, seed: int = 0):
    arch = js.presets.get("h200")
    kernel = js.make_kernel(program(kind, trips), grid=waves * 8 * arch.sm_count, threads=256, regs=32,
                            l2_hit_rate=0.5)
    rng = np.random.default_rng(seed)
    maps = [clocks.from_array(arch, 15.0 * rng.integers(107, 133, arch.n_sm_slots)) for _ in range(batch)]
    return arch, kernel, maps


def main() -> None:
    js.use_host_cores()  # one CPU device per core (docs/engine_performance.md, "One CPU device per core")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--waves", type=int, default=1, choices=(1, 4))
    parser.add_argument("--kernel", default="fma", choices=("fma", "mix"))
    parser.add_argument("--trips", type=int, default=None, help="loop trips (default 3125 fma, 1562 mix)")
    parser.add_argument("--warp-policy", default="lrr", choices=WARP_POLICIES)
    parser.add_argument("--no-fast-forward", action="store_true")
    parser.add_argument("--lockstep", action="store_true",
                        help="every SM at the chip's tick (fast-forward without SMs on their own time)")
    parser.add_argument("--devices", type=int, default=0, help="devices sharing the batch (default: all local ones)")
    parser.add_argument("--chunk", type=int, default=0, help="configurations per chunk (default: default_chunk)")
    args = parser.parse_args()
    trips = args.trips or (3125 if args.kernel == "fma" else 1562)
    arch, kernel, maps = workload(args.batch, args.waves, args.kernel, trips)
    n = args.batch
    shapes = shapes_for(arch, kernel)
    inputs = js.stack([engine_params(make_params(arch, kernel, m, warp_policy=args.warp_policy), kernel, shapes)
                    for m in maps])
    with jax.enable_x64(True):
        t0 = time.perf_counter()
        shapes = dataclasses.replace(shapes, dvfs=False, closed_loop=False,
                                     fast_forward=not args.no_fast_forward and may_fast_forward(kernel))
        shapes = dataclasses.replace(shapes, free_sms=shapes.fast_forward and not args.lockstep)
        chunk = args.chunk or default_chunk(shapes)
        devices = jax.local_devices()[:args.devices or None]
        compiled = _compiled.lower(inputs, shapes=shapes, max_ticks=MAX_TICKS, batched=True, chunk=chunk,
                                   mesh=mesh_of(devices)).compile()
        compile_seconds = time.perf_counter() - t0
        t0 = time.perf_counter()
        result = jax.device_get(compiled(inputs))
        run_seconds = time.perf_counter() - t0
    sm_cycles = float(np.sum(result.sm_cycles))
    ticks = np.asarray(result.makespan_ticks, np.float64)
    stepped = np.asarray(result.ticks_stepped, np.float64)
    out = {
        "device": str(jax.devices()[0].device_kind),
        "platform": jax.default_backend(),
        "batch": n,
        "devices": len(devices),
        "chunk": chunk,
        "kernel": args.kernel,
        "waves": args.waves,
        "ctas_per_config": int(kernel.grid_ctas),
        "loop_trips": trips,
        "warp_policy": args.warp_policy,
        "fast_forward": shapes.fast_forward,  # compiled in (asked for, and the kernel could use it)
        "own_time": shapes.free_sms,  # SMs on their own time between chip events
        "completed": bool(np.all(result.completed)),
        "mean_makespan_us": float(np.mean(result.makespan_ns)) / 1000.0,
        "mean_makespan_ticks": float(np.mean(ticks)),
        "mean_ticks_stepped": float(np.mean(stepped)),
        "stepped_share": float(np.mean(stepped / ticks)),
        "simulated_sm_cycles": sm_cycles,
        "compile_seconds": round(compile_seconds, 3),
        "run_seconds": round(run_seconds, 3),
        "seconds_per_config": round(run_seconds / n, 4),
        "sm_cycles_per_second": sm_cycles / run_seconds,
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
