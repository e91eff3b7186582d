"""jaxsched's occupancy against the CUDA driver's, on hundreds of compiled kernels (issue 8).

Compiles kernel variants with NVRTC through CuPy: register demand (live values per thread),
register caps (`-maxrregcount`), `__launch_bounds__(threads, min blocks)`, static shared
memory. For each compiled kernel and each block size it accepts and each dynamic shared-memory
size that fits, it asks the driver (`cuOccupancyMaxActiveBlocksPerMultiprocessor`, with the
kernel opted in to exactly that dynamic size) and `jaxsched.occupancy` (with the kernel's
registers and static shared memory as compiled) for the CTAs per SM, and counts disagreements.

    python calibration/occupancy_driver.py -o occupancy_driver.json    # on a machine with a GPU
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import numpy as np

SOURCE = r"""
#ifndef LIVE
#define LIVE 16
#endif
#ifndef STATIC_FLOATS
#define STATIC_FLOATS 0
#endif
#ifndef LAUNCH_BOUNDS
#define LAUNCH_BOUNDS
#endif
extern "C" __global__ void LAUNCH_BOUNDS occ_kernel(float* out, const float* in, int n) {
    extern __shared__ float dyn[];
    float v[LIVE];
#pragma unroll
    for (int i = 0; i < LIVE; ++i) v[i] = in[threadIdx.x + i * n];
    __syncthreads();
    float acc = 0.f;
#pragma unroll
    for (int k = 0; k < 3; ++k) {
#pragma unroll
        for (int i = 0; i < LIVE; ++i) { acc = fmaf(v[i], acc, v[(i + k + 1) % LIVE]); v[i] *= acc; }
    }
#if STATIC_FLOATS > 0
    __shared__ float s[STATIC_FLOATS];
    s[threadIdx.x % STATIC_FLOATS] = acc;
    __syncthreads();
    acc += s[(threadIdx.x + 1) % STATIC_FLOATS];
#endif
    if (n < 0) dyn[threadIdx.x] = acc;
    float sum = acc;
#pragma unroll
    for (int i = 0; i < LIVE; ++i) sum += v[i];
    out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}
"""

LIVE = (4, 16, 40, 72, 120, 200)
REG_CAPS = (None, 16, 24, 32, 40, 48, 56, 64, 72, 80, 96, 128, 168, 232, 255)
STATIC_FLOATS = (0, 768, 5000)  # 0, 3 KiB, ~19.5 KiB of static shared memory
BOUNDS = ((128, 0), (256, 2), (512, 1), (1024, 1), (96, 5), (192, 3), (384, 2), (640, 1))
BOUNDS_LIVE = (16, 72, 200)
BLOCK_SIZES = (32, 64, 96, 128, 160, 192, 256, 288, 384, 480, 512, 640, 768, 896, 1024)
DYN_SMEM = (0, 1000, 4096, 12000, 40000, 49152, 60000, 100000, 150000, 200000, 232448)


def variants() -> list[dict]:
    """Every compiled variant: register demand x cap x static smem, plus launch-bounds ones."""
    out = [dict(live=live, cap=cap, static=static, bounds=None)
           for live, cap, static in itertools.product(LIVE, REG_CAPS, STATIC_FLOATS)]
    out += [dict(live=live, cap=None, static=0, bounds=b) for live in BOUNDS_LIVE for b in BOUNDS]
    return out


def compile_variant(cp, v: dict):
    opts = [f"-DLIVE={v['live']}", f"-DSTATIC_FLOATS={v['static']}"]
    if v["cap"] is not None:
        opts.append(f"--maxrregcount={v['cap']}")
    if v["bounds"] is not None:
        t, m = v["bounds"]
        opts.append(f"-DLAUNCH_BOUNDS=__launch_bounds__({t}{', ' + str(m) if m else ''})")
    return cp.RawModule(code=SOURCE, options=tuple(opts)).get_function("occ_kernel")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-o", "--output", default="occupancy_driver.json")
    parser.add_argument("--arch", default="h200", help="jaxsched preset to compare with")
    parser.add_argument("--limit", type=int, default=None, help="first N variants only")
    args = parser.parse_args(argv)

    import jax

    jax.config.update("jax_platforms", "cpu")  # keep JAX's allocator off the GPU under test
    import jaxsched as js
    from jaxsched.probe.gpu import load_cupy

    cp = load_cupy()
    arch = js.presets.get(args.arch)
    optin = int(cp.cuda.runtime.getDeviceProperties(0)["sharedMemPerBlockOptin"])
    todo = variants()[: args.limit]
    kernels, rows, failures = [], [], []
    t0 = time.time()
    for i, v in enumerate(todo):
        try:
            fn = compile_variant(cp, v)
            regs, static, max_threads = int(fn.num_regs), int(fn.shared_size_bytes), int(fn.max_threads_per_block)
        except Exception as exc:  # a variant that does not compile is reported, not fatal
            failures.append({**v, "error": repr(exc)})
            continue
        kernels.append({**v, "regs": regs, "static_smem": static, "max_threads": max_threads})
        queries = [(t, d) for t in BLOCK_SIZES if t <= max_threads for d in DYN_SMEM if static + d <= optin]
        driver = []
        for threads, dyn in queries:
            fn.max_dynamic_shared_size_bytes = dyn  # opted in to exactly what the launch asks
            driver.append(int(cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.kernel.ptr, threads, dyn)))
        q = np.asarray(queries, dtype=np.int64).reshape(-1, 2)
        ours = np.asarray(js.occupancy(arch, q[:, 0], regs, q[:, 1], static).blocks_per_sm)
        rows += [(i, t, d, regs, static, dr, int(o)) for (t, d), dr, o in zip(queries, driver, ours)]
    elapsed = time.time() - t0
    table = np.asarray(rows, dtype=np.int64).reshape(-1, 7)
    bad = table[table[:, 5] != table[:, 6]]
    report = {
        "arch": args.arch, "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
        "kernels_compiled": len(kernels), "compile_failures": failures, "queries": int(len(table)),
        "mismatches": int(len(bad)), "distinct_regs": sorted({k["regs"] for k in kernels}),
        "distinct_static_smem": sorted({k["static_smem"] for k in kernels}),
        "seconds": round(elapsed, 1),
        "columns": ["kernel", "threads", "dynamic_smem", "regs", "static_smem", "driver", "jaxsched"],
        "mismatch_rows": bad[:200].tolist(), "kernels": kernels,
        "blocks_per_sm_histogram": {int(k): int(c) for k, c in zip(*np.unique(table[:, 5], return_counts=True))},
    }
    Path(args.output).write_text(json.dumps(report, indent=1))
    print(f"{len(kernels)} kernels ({len(failures)} failed to compile), {len(table)} queries, "
          f"{len(bad)} mismatches, registers {report['distinct_regs']}, {elapsed:.0f} s")
    return 0 if len(bad) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
