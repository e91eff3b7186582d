"""CUDA C source of the probe's microbenchmarks, as one translation unit (`SOURCE`).

Every kernel stamps, per CTA, `%smid`, `%globaltimer` and `clock64` after a `__syncthreads()` at
entry and again after a `__syncthreads()` before exit (thread 0 writes `RECORD_WORDS` words per
CTA: smid, start ns, end ns, start cycles, end cycles). Work kernels run per-warp trip counts from
an array the host fills with the simulator's own hash (`jaxsched.reference.warp_trips`, docs/model.md
section 4), so a hardware CTA and a simulated CTA of the same index do the same work. Each warp
reads its count with one load at entry, which the simulated program mirrors with an `ldg`.
Compile-time sizes are macros; `defines()` passes the values the host side assumes.
"""

from __future__ import annotations

RECORD_WORDS = 5  # smid, globaltimer start, globaltimer end, clock64 start, clock64 end
FMA_UNROLL = 256  # dependent FMAs per loop trip in `work_fma_dep` (one trip = 256 `fma dep`)
ILP_CHAINS = 4  # independent FMA chains per thread in `work_fma_ilp`
ILP_UNROLL = 64  # FMAs per chain per trip in `work_fma_ilp` (one trip = 256 FMAs)
LDG_UNROLL = 8  # independent coalesced loads per trip in `work_ldg`, then 8 dependent FMAs
LAT_N = 512  # dependent operations timed per repetition in the latency kernels
LAT_REPS = 4  # repetitions (the first warms caches; the minimum is kept)
THR_N = 256  # operations per chain in the throughput kernels (8 independent chains)

_HEADER = r"""
#ifndef FMA_UNROLL
#define FMA_UNROLL 256
#endif
#ifndef ILP_UNROLL
#define ILP_UNROLL 64
#endif
#ifndef LDG_UNROLL
#define LDG_UNROLL 8
#endif
#ifndef LAT_N
#define LAT_N 512
#endif
#ifndef LAT_REPS
#define LAT_REPS 4
#endif
#ifndef THR_N
#define THR_N 256
#endif
typedef unsigned long long u64;
typedef long long i64;
"""

_STAMPS = r"""
__device__ __forceinline__ unsigned js_smid() {
    unsigned r; asm volatile("mov.u32 %0, %%smid;" : "=r"(r)); return r;
}
__device__ __forceinline__ u64 js_gtimer() {
    u64 t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t;
}
__device__ __forceinline__ i64 js_clock() {
    i64 c; asm volatile("mov.u64 %0, %%clock64;" : "=l"(c)); return c;
}
/* thread 0 only: smid, globaltimer, clock64 of this CTA's start (end = 1) */
__device__ __forceinline__ void js_stamp(u64* rec, int end) {
    i64 c = js_clock();
    u64 t = js_gtimer();
    u64* r = rec + 5ull * blockIdx.x;
    if (!end) { r[0] = js_smid(); r[1] = t; r[3] = (u64)c; }
    else { r[2] = t; r[4] = (u64)c; }
}
/* this warp's index in the grid: trips[] and warp_end[] are indexed by it */
__device__ __forceinline__ unsigned js_gwarp() {
    return blockIdx.x * ((blockDim.x + 31) >> 5) + (threadIdx.x >> 5);
}
"""

_WORK = r"""
/* One dependent FMA chain per thread, FMA_UNROLL per trip (the simulator's `fma dep`). `x * x + b`
   compiles to FFMA Rx, Rx, Rx, URb: one vector register read, no register-bank conflict. */
extern "C" __global__ void work_fma_dep(u64* rec, i64* warp_end, float* sink, const int* __restrict__ trips, float a, float b) {
    extern __shared__ float dyn_smem[];
    __syncthreads();
    if (threadIdx.x == 0) js_stamp(rec, 0);
    int n = trips[js_gwarp()];
    float x = 1e-4f * (float)(threadIdx.x & 31);
    for (int i = 0; i < n; ++i) {
#pragma unroll
        for (int j = 0; j < FMA_UNROLL; ++j) x = fmaf(x, x, b);
    }
    if ((threadIdx.x & 31) == 0) warp_end[js_gwarp()] = js_clock();
    __syncthreads();
    if (threadIdx.x == 0) js_stamp(rec, 1);
    if (x == a) { sink[0] = x; dyn_smem[0] = x; }
}

/* The same chain as `x * a + b` with a and b in registers: FFMA Rx, Rx, Ra, Rb where Rx and Ra
   sit in the same register bank, without operand reuse (a register-bank conflict, SASS-checked). */
extern "C" __global__ void work_fma_dep_bank(u64* rec, i64* warp_end, float* sink, const int* __restrict__ trips, float a, float b) {
    extern __shared__ float dyn_smem[];
    __syncthreads();
    if (threadIdx.x == 0) js_stamp(rec, 0);
    int n = trips[js_gwarp()];
    float x = 1e-3f * (float)threadIdx.x;
    for (int i = 0; i < n; ++i) {
#pragma unroll
        for (int j = 0; j < FMA_UNROLL; ++j) x = fmaf(x, a, b);
    }
    if ((threadIdx.x & 31) == 0) warp_end[js_gwarp()] = js_clock();
    __syncthreads();
    if (threadIdx.x == 0) js_stamp(rec, 1);
    if (x == -1.0f) { sink[0] = x; dyn_smem[0] = x; }
}

/* Four independent FMA chains per thread, interleaved (instruction-level parallelism 4). */
extern "C" __global__ void work_fma_ilp(u64* rec, i64* warp_end, float* sink, const int* __restrict__ trips, float a, float b) {
    extern __shared__ float dyn_smem[];
    __syncthreads();
    if (threadIdx.x == 0) js_stamp(rec, 0);
    int n = trips[js_gwarp()];
    float x0 = 1e-3f * threadIdx.x, x1 = x0 + 1.f, x2 = x0 + 2.f, x3 = x0 + 3.f;
    for (int i = 0; i < n; ++i) {
#pragma unroll
        for (int j = 0; j < ILP_UNROLL; ++j) {
            x0 = fmaf(x0, a, b); x1 = fmaf(x1, a, b); x2 = fmaf(x2, a, b); x3 = fmaf(x3, a, b);
        }
    }
    if ((threadIdx.x & 31) == 0) warp_end[js_gwarp()] = js_clock();
    __syncthreads();
    if (threadIdx.x == 0) js_stamp(rec, 1);
    float x = x0 + x1 + x2 + x3;
    if (x == -1.0f) { sink[0] = x; dyn_smem[0] = x; }
}

/* Global loads: per trip each warp reads LDG_UNROLL consecutive 128-byte lines (one coalesced
   fp32 load per lane each, all in flight), then one dependent FMA per loaded value. Warps walk
   `src` (`elems` floats, a multiple of 32 * LDG_UNROLL) from `offset`, wrapping around. */
extern "C" __global__ void work_ldg(u64* rec, i64* warp_end, float* sink, const int* __restrict__ trips,
                                    const float* __restrict__ src, unsigned elems, unsigned offset, float b) {
    extern __shared__ float dyn_smem[];
    __syncthreads();
    if (threadIdx.x == 0) js_stamp(rec, 0);
    int n = trips[js_gwarp()];
    const unsigned chunk = 32u * LDG_UNROLL;
    const unsigned step = gridDim.x * ((blockDim.x + 31) >> 5) * chunk;
    unsigned pos = (offset + js_gwarp() * chunk) % elems;
    float x = 1e-3f * (float)threadIdx.x;
    for (int i = 0; i < n; ++i) {
        const float* p = src + pos + (threadIdx.x & 31);
        float v[LDG_UNROLL];
#pragma unroll
        for (int j = 0; j < LDG_UNROLL; ++j) v[j] = p[32 * j];
#pragma unroll
        for (int j = 0; j < LDG_UNROLL; ++j) x = fmaf(x, v[j], b);
        pos += step;
        if (pos >= elems) pos -= elems;
    }
    if ((threadIdx.x & 31) == 0) warp_end[js_gwarp()] = js_clock();
    __syncthreads();
    if (threadIdx.x == 0) js_stamp(rec, 1);
    if (x == -1.0f) { sink[0] = x; dyn_smem[0] = x; }
}

/* Stamps only, after spinning `spin` cycles: dispatch order, rotation and clocks. */
extern "C" __global__ void stamp_spin(u64* rec, i64 spin) {
    extern __shared__ float dyn_smem[];
    __syncthreads();
    if (threadIdx.x == 0) js_stamp(rec, 0);
    i64 c0 = js_clock();
    while (js_clock() - c0 < spin) { }
    __syncthreads();
    if (threadIdx.x == 0) js_stamp(rec, 1);
    if (spin < 0) dyn_smem[0] = 0.f;
}

/* Tight %globaltimer / clock64 sampling by one thread: the timer's update quantum. */
extern "C" __global__ void timer_samples(u64* t, i64* c, int n) {
    for (int i = 0; i < n; ++i) { c[i] = js_clock(); t[i] = js_gtimer(); }
}
"""

# Latency kernels: one warp per CTA (one CTA per SM through dynamic shared memory), LAT_N
# dependent operations between two clock64 reads, LAT_REPS times; lane 0 writes the cycles of
# each repetition to cyc[LAT_REPS * blockIdx.x + r], its smid to sm[blockIdx.x], and globaltimer
# and clock64 around all repetitions to span[4 * blockIdx.x ...] (the SM clock during the run).
_LAT_TEMPLATE = r"""
extern "C" __global__ void lat_{name}({params}, i64* cyc, unsigned* sm, u64* span, float* sink) {{
    extern __shared__ float dyn_smem[];
    {setup}
    i64 cb = js_clock();
    u64 tb = js_gtimer();
    for (int r = 0; r < LAT_REPS; ++r) {{
        i64 c0 = js_clock();
#pragma unroll
        for (int j = 0; j < LAT_N; ++j) {{ {step} }}
        i64 c1 = js_clock();
        if (threadIdx.x == 0) cyc[LAT_REPS * blockIdx.x + r] = c1 - c0;
    }}
    u64 te = js_gtimer();
    i64 ce = js_clock();
    if (threadIdx.x == 0) {{
        sm[blockIdx.x] = js_smid();
        span[4 * blockIdx.x] = tb; span[4 * blockIdx.x + 1] = te;
        span[4 * blockIdx.x + 2] = (u64)cb; span[4 * blockIdx.x + 3] = (u64)ce;
    }}
    if ({sink_cond}) {{ sink[0] = (float)({sink_val}); dyn_smem[0] = 0.f; }}
}}
"""

LATENCY_KERNELS: dict[str, dict[str, str]] = {
    # FFMA chain
    "fma": dict(params="float a, float b", setup="float x = 1e-3f * threadIdx.x;",
                step="x = fmaf(x, a, b);", sink_cond="x == -1.0f", sink_val="x"),
    # IADD3 chain (integer add of distinct operands; ptxas may fuse pairs, so SASS is counted)
    "alu": dict(params="unsigned a, unsigned b",
                setup="unsigned x = threadIdx.x, y0 = a, y1 = b, y2 = a ^ b, y3 = a + b;",
                step='asm volatile("add.u32 %0, %0, %1;" : "+r"(x) : "r"((j & 3) == 0 ? y0 : (j & 3) == 1 ? y1 : (j & 3) == 2 ? y2 : y3));',
                sink_cond="x == 0xdeadbeefu", sink_val="x"),
    # MUFU.RSQ chain (SFU); converges to 1, stays finite
    "sfu": dict(params="float a, float b", setup="float x = 2.0f + a * threadIdx.x;",
                step='asm volatile("rsqrt.approx.ftz.f32 %0, %0;" : "+f"(x));',
                sink_cond="x == -1.0f", sink_val="x"),
    # shared-memory pointer chase (LDS with the loaded byte offset as address)
    "lds": dict(params="unsigned a, unsigned b",
                setup=("unsigned* s = (unsigned*)dyn_smem; for (unsigned i = threadIdx.x; i < 1024; i += 32) "
                       "s[i] = 4u * ((i + 1u + a) & 1023u); __syncthreads(); unsigned x = 4u * threadIdx.x;"),
                step='asm volatile("ld.shared.u32 %0, [%0];" : "+r"(x));',
                sink_cond="x == 0xdeadbeefu", sink_val="x"),
    # shuffle chain
    "shfl": dict(params="unsigned a, unsigned b", setup="unsigned x = threadIdx.x + a;",
                 step="x = __shfl_xor_sync(0xffffffffu, x, 1u << (j % 5)) + 0u;",
                 sink_cond="x == 0xdeadbeefu", sink_val="x"),
    # global pointer chases, one ring per CTA: L1 (.ca, small ring), L2 (.cg, ring inside L2);
    # lat_ldg_l2 over rings spread across a large cold footprint gives the DRAM latency
    "ldg_l1": dict(params="const u64* start, unsigned b", setup="u64 p = start[blockIdx.x];",
                   step='asm volatile("ld.global.ca.u64 %0, [%0];" : "+l"(p));',
                   sink_cond="p == 1ull", sink_val="p"),
    "ldg_l2": dict(params="const u64* start, unsigned b", setup="u64 p = start[blockIdx.x];",
                   step='asm volatile("ld.global.cg.u64 %0, [%0];" : "+l"(p));',
                   sink_cond="p == 1ull", sink_val="p"),
}

# Throughput kernels: 8 independent chains per thread, THR_N operations each, timed per CTA with
# the usual stamps; at full occupancy the SM's issue rate per pipe follows.
_THR_TEMPLATE = r"""
extern "C" __global__ void thr_{name}(u64* rec, float* sink, {ctype} a, {ctype} b) {{
    extern __shared__ float dyn_smem[];
    {ctype} x0 = ({ctype})threadIdx.x, x1 = x0 + 1, x2 = x0 + 2, x3 = x0 + 3, x4 = x0 + 4, x5 = x0 + 5, x6 = x0 + 6, x7 = x0 + 7;
    __syncthreads();
    if (threadIdx.x == 0) js_stamp(rec, 0);
#pragma unroll 32
    for (int j = 0; j < THR_N; ++j) {{
        {step}
    }}
    __syncthreads();
    if (threadIdx.x == 0) js_stamp(rec, 1);
    {ctype} x = x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7;
    if (x == ({ctype})12345) {{ sink[0] = (float)x; dyn_smem[0] = 0.f; }}
}}
"""

# Clusters of `size` CTAs are co-scheduled inside one GPC, so the %smid set of a cluster names SMs
# of one GPC. Lane 0 writes smid and %clusterid.x per CTA.
CLUSTER_SIZES = (2, 4, 8)  # the portable cluster sizes
_CLUSTER_TEMPLATE = r"""
extern "C" __global__ void __cluster_dims__({size}, 1, 1) cluster_smid_{size}(unsigned* out, i64 spin) {{
    extern __shared__ float dyn_smem[];
    unsigned cid; asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(cid));
    i64 c0 = js_clock();
    while (js_clock() - c0 < spin) {{ }}
    if (threadIdx.x == 0) {{ out[2 * blockIdx.x] = js_smid(); out[2 * blockIdx.x + 1] = cid; }}
    if (spin < 0) dyn_smem[0] = 0.f;
}}
"""

THROUGHPUT_KERNELS: dict[str, dict[str, str]] = {
    "fma": dict(ctype="float", step=" ".join(f"x{i} = fmaf(x{i}, a, b);" for i in range(8))),
    # xor then add with two runtime operands: LOP3 + IADD3 per step (SASS-checked, not fused)
    "alu": dict(ctype="unsigned", step=" ".join(
        f'asm volatile("xor.b32 %0, %0, %1;" : "+r"(x{i}) : "r"(a)); '
        f'asm volatile("add.u32 %0, %0, %1;" : "+r"(x{i}) : "r"(b));' for i in range(8))),
    "sfu": dict(ctype="float", step=" ".join(
        f'asm volatile("rsqrt.approx.ftz.f32 %0, %0;" : "+f"(x{i}));' for i in range(8))),
}


def source() -> str:
    """The whole translation unit: header, stamps, work, latency, throughput, cluster kernels."""
    parts = [_HEADER, _STAMPS, _WORK]
    parts += [_LAT_TEMPLATE.format(name=name, **spec) for name, spec in LATENCY_KERNELS.items()]
    parts += [_THR_TEMPLATE.format(name=name, **spec) for name, spec in THROUGHPUT_KERNELS.items()]
    parts += [_CLUSTER_TEMPLATE.format(size=size) for size in CLUSTER_SIZES]
    return "\n".join(parts)


def defines() -> dict[str, int]:
    """The compile-time sizes the host side assumes (passed as -D so source and host agree)."""
    return dict(FMA_UNROLL=FMA_UNROLL, ILP_UNROLL=ILP_UNROLL, LDG_UNROLL=LDG_UNROLL,
                LAT_N=LAT_N, LAT_REPS=LAT_REPS, THR_N=THR_N)
