"""CUDA's own occupancy calculator (`cuda_occupancy.h`) as a test oracle for `jaxsched.occupancy`.

`build(directory)` compiles `oracle/occ_oracle.cpp` against the toolkit header with the host C++
compiler and returns an `Oracle`; it raises `OracleUnavailable` (tests turn that into a skip) when
there is no header or no compiler. `Oracle.occupancy` feeds a whole table of launches through one
process call and returns numpy columns named like `jaxsched.occupancy.Occupancy`'s fields.

The launch is described to the header as `cudaOccFuncAttributes(cudaFuncAttributes)` would: the
function opted in (FUNC_SHMEM_LIMIT_OPTIN) to exactly the dynamic shared memory it asks for,
partitioned global caching off, no virtual resources; the device state is the default cache
preference with the given carveout.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SOURCE = Path(__file__).with_name("oracle") / "occ_oracle.cpp"
HEADER = "cuda_occupancy.h"
INT_MAX = 2**31 - 1

# Row layout of occ_oracle.cpp (see its header comment), in order.
DEVICE_FIELDS = (
    "computeMajor", "computeMinor", "maxThreadsPerBlock", "maxThreadsPerMultiprocessor",
    "regsPerBlock", "regsPerMultiprocessor", "warpSize", "sharedMemPerBlock",
    "sharedMemPerMultiprocessor", "numSms", "sharedMemPerBlockOptin", "reservedSharedMemPerBlock",
)
FUNC_FIELDS = (
    "func_maxThreadsPerBlock", "numRegs", "sharedSizeBytes", "partitionedGCConfig",
    "shmemLimitConfig", "maxDynamicSharedSizeBytes", "numBlockBarriers", "virtualResourceCount",
)
STATE_FIELDS = ("cacheConfig", "carveoutConfig")
LAUNCH_FIELDS = ("blockSize", "dynamicSmemSize")
ROW_FIELDS = DEVICE_FIELDS + FUNC_FIELDS + STATE_FIELDS + LAUNCH_FIELDS

# Output columns, named after the matching `Occupancy` fields (status: the cudaOccError code).
RESULT_FIELDS = (
    "blocks_per_sm", "limit_warps", "limit_registers", "limit_shared_memory", "limit_blocks",
    "limit_barriers", "limiting_factors", "status", "regs_per_block_allocated",
    "smem_per_block_allocated_bytes",
)
RULE_FIELDS = (
    "max_blocks_per_sm", "smem_alloc_unit_bytes", "reg_alloc_unit", "schedulers_per_sm",
    "reg_max_per_thread", "barriers_per_sm",
)

FUNC_SHMEM_LIMIT_OPTIN = 1
PARTITIONED_GC_OFF = 0
CACHE_PREFER_NONE = 0


class OracleUnavailable(RuntimeError):
    """No `cuda_occupancy.h` or no C++ compiler on this machine (the message says which)."""


def find_header() -> Path | None:
    """`cuda_occupancy.h`: $CUDA_OCCUPANCY_H, $CUDA_HOME/$CUDA_PATH, /usr/local/cuda*, /opt, /usr."""
    candidates: list[Path] = []
    if os.environ.get("CUDA_OCCUPANCY_H"):
        candidates.append(Path(os.environ["CUDA_OCCUPANCY_H"]))
    for var in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"):
        if os.environ.get(var):
            candidates.append(Path(os.environ[var]) / "include" / HEADER)
    candidates.append(Path("/usr/local/cuda/include") / HEADER)

    def version(path: str) -> tuple[int, ...]:
        return tuple(int(v) for v in re.findall(r"\d+", Path(path).parent.parent.name))

    versioned = sorted(glob.glob(f"/usr/local/cuda*/include/{HEADER}"), key=version, reverse=True)
    candidates += [Path(p) for p in versioned]
    candidates += [Path("/opt/cuda/include") / HEADER, Path("/usr/include") / HEADER]
    return next((p for p in candidates if p.is_file()), None)


def find_compiler() -> str | None:
    """The host C++ compiler: $CXX, else g++, c++ or clang++ on PATH."""
    names = [os.environ["CXX"]] if os.environ.get("CXX") else []
    return next((shutil.which(n) for n in names + ["g++", "c++", "clang++"] if shutil.which(n)), None)


def header_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def device_props(arch) -> dict[str, int]:
    """`cudaOccDeviceProp` of a jaxsched `Arch`."""
    major, minor = arch.compute_capability
    return dict(
        computeMajor=major,
        computeMinor=minor,
        maxThreadsPerBlock=int(arch.max_threads_per_block),
        maxThreadsPerMultiprocessor=int(arch.max_threads_per_sm),
        regsPerBlock=int(arch.regs_per_block),
        regsPerMultiprocessor=int(arch.regs_per_sm),
        warpSize=int(arch.warp_size),
        sharedMemPerBlock=int(arch.smem_per_block_bytes),
        sharedMemPerMultiprocessor=int(arch.smem_per_sm_bytes),
        numSms=arch.sm_count,
        sharedMemPerBlockOptin=int(arch.smem_per_block_optin_bytes),
        reservedSharedMemPerBlock=int(arch.reserved_smem_per_block_bytes),
    )


def launch_table(arch, threads, regs, dynamic_smem, static_smem=0, carveout=-1, barriers=1) -> np.ndarray:
    """The (n, 24) int64 row table for launches of `arch`, broadcast and flattened."""
    t, r, d, s, c, b = (np.ravel(x) for x in np.broadcast_arrays(
        *(np.asarray(x, dtype=np.int64) for x in (threads, regs, dynamic_smem, static_smem,
                                                  carveout, barriers))))
    columns = dict(device_props(arch))
    columns.update(
        func_maxThreadsPerBlock=1024,
        numRegs=r,
        sharedSizeBytes=s,
        partitionedGCConfig=PARTITIONED_GC_OFF,
        shmemLimitConfig=FUNC_SHMEM_LIMIT_OPTIN,
        maxDynamicSharedSizeBytes=d,
        numBlockBarriers=b,
        virtualResourceCount=0,
        cacheConfig=CACHE_PREFER_NONE,
        carveoutConfig=c,
        blockSize=t,
        dynamicSmemSize=d,
    )
    table = np.empty((t.size, len(ROW_FIELDS)), dtype=np.int64)
    for j, name in enumerate(ROW_FIELDS):
        table[:, j] = columns[name]
    return table


def encode(table: np.ndarray) -> bytes:
    """Integer table -> whitespace-separated text, vectorised (fixed width per column)."""
    table = np.asarray(table, dtype=np.int64)
    n, k = table.shape
    pieces = []
    for j in range(k):
        col = table[:, j]
        neg = col < 0
        mag = np.abs(col)
        digits = len(str(int(mag.max()))) if n else 1
        width = digits + int(neg.any())
        field = np.empty((n, width + 1), dtype=np.uint8)
        rest = mag.copy()
        for pos in range(width - 1, width - 1 - digits, -1):
            field[:, pos] = ord("0") + rest % 10
            rest //= 10
        if width > digits:
            field[:, 0] = np.where(neg, ord("-"), ord("0"))
        field[:, width] = ord("\n") if j == k - 1 else ord(" ")
        pieces.append(field)
    return np.concatenate(pieces, axis=1).tobytes() if n else b""


@dataclass(frozen=True)
class Oracle:
    """A compiled occ_oracle and the header it was built from."""

    executable: Path
    header: Path

    def _run(self, stdin: bytes) -> bytes:
        proc = subprocess.run([str(self.executable)], input=stdin, capture_output=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"occ_oracle failed ({proc.returncode}): {proc.stderr.decode()}")
        return proc.stdout

    def run_table(self, table: np.ndarray) -> dict[str, np.ndarray]:
        """Rows in `ROW_FIELDS` order -> one array per `RESULT_FIELDS` entry."""
        out = self._run(encode(table))
        values = np.array(out.split(), dtype=np.int64).reshape(-1, len(RESULT_FIELDS))
        if values.shape[0] != table.shape[0]:
            raise RuntimeError(f"occ_oracle answered {values.shape[0]} rows for {table.shape[0]}")
        return {name: values[:, j] for j, name in enumerate(RESULT_FIELDS)}

    def occupancy(self, arch, threads, regs, dynamic_smem, static_smem=0, carveout=-1,
                  barriers=1) -> dict[str, np.ndarray]:
        """`cudaOccMaxActiveBlocksPerMultiprocessor` for each (broadcast, flattened) launch."""
        return self.run_table(launch_table(arch, threads, regs, dynamic_smem, static_smem,
                                           carveout, barriers))

    def rules(self, compute_capabilities) -> dict[tuple[int, int], dict]:
        """The header's per-CC rules (`RULE_FIELDS`, plus `carveouts_kib`); -1 where unknown."""
        ccs = [tuple(int(v) for v in cc) for cc in compute_capabilities]
        text = "rules " + " ".join(f"{a} {b}" for a, b in ccs)
        rules = {}
        for line in self._run(text.encode()).decode().splitlines():
            v = [int(x) for x in line.split()]
            entry = dict(zip(RULE_FIELDS, v[2:8]))
            entry["carveouts_kib"] = v[9:9 + v[8]]
            rules[(v[0], v[1])] = entry
        return rules


def build(directory: Path | str) -> Oracle:
    """Compile occ_oracle into `directory`; raise `OracleUnavailable` without header or compiler."""
    header = find_header()
    if header is None:
        raise OracleUnavailable(f"{HEADER} not found (set CUDA_HOME or CUDA_OCCUPANCY_H)")
    compiler = find_compiler()
    if compiler is None:
        raise OracleUnavailable("no C++ compiler (g++, c++, clang++ or $CXX) on PATH")
    exe = Path(directory) / "occ_oracle"
    cmd = [compiler, "-O2", "-std=c++17", f"-I{header.parent}", str(SOURCE), "-o", str(exe)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:  # a header that no longer compiles is a failure, not a skip
        raise RuntimeError(f"compiling the occupancy oracle failed:\n{' '.join(cmd)}\n{proc.stderr}")
    return Oracle(executable=exe, header=header)


# --- cases: launch grids that reach every rule's boundaries -------------------------------------

THREAD_EDGES = (1, 2, 31, 32, 33, 63, 64, 65, 96, 127, 128, 129, 160, 192, 255, 256, 257, 288,
                320, 352, 384, 416, 448, 480, 511, 512, 513, 544, 640, 672, 704, 768, 896, 992,
                1023, 1024)
REG_EDGES = (0, 1, 2, 7, 8, 9, 16, 24, 31, 32, 33, 40, 48, 56, 63, 64, 65, 72, 80, 96, 104, 112,
             128, 168, 200, 232, 248, 254, 255)
CARVEOUT_EDGES = (-1, 0, 25, 50, 100)


def smem_totals(arch, step: int = 128) -> np.ndarray:
    """Valid static + dynamic shared-memory totals: every `step` bytes from 0 to the opt-in limit,
    plus each rule's edges +-1 and +-one allocation unit: the 48 KiB default limit (with and
    without the reserved bytes), every carveout size, SM fractions, the opt-in limit itself."""
    optin = int(arch.smem_per_block_optin_bytes)
    reserved = int(arch.reserved_smem_per_block_bytes)
    unit = int(arch.smem_alloc_unit_bytes)
    default = int(arch.smem_per_block_bytes)
    sm = int(arch.smem_per_sm_bytes)
    edges = [0, unit, default, default - reserved, optin, optin - reserved]
    for kib in np.unique(np.asarray(arch.smem_carveout_kib)):
        edges += [int(kib) * 1024, int(kib) * 1024 - reserved]
    edges += [sm // k - reserved for k in range(2, 33)]
    near = np.add.outer(np.asarray(edges), [-unit - 1, -unit, -1, 0, 1, unit, unit + 1]).ravel()
    totals = np.concatenate([np.arange(0, optin + 1, step), near])
    return np.unique(totals[(totals >= 0) & (totals <= optin)])


def split_smem(arch, totals, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Split totals into (static, dynamic): a third all-dynamic, a sixth with as much static as
    allowed (48 KiB), the rest a random static part."""
    totals = np.asarray(totals, dtype=np.int64)
    cap = np.minimum(totals, int(arch.smem_per_block_bytes))
    u = rng.random(totals.shape)
    static = np.where(u < 1 / 3, 0, np.where(u < 0.5, cap, (rng.random(totals.shape) * (cap + 1)).astype(np.int64)))
    static = np.minimum(static, cap)
    return static, totals - static


def random_launches(arch, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """`n` valid launches for `arch`, half drawn from each rule's edges, half uniformly."""
    def pick(edges, low, high):
        uniform = rng.integers(low, high + 1, n)
        return np.where(rng.random(n) < 0.5, rng.choice(np.asarray(edges), n), uniform)

    totals = pick(smem_totals(arch, step=10**9), 0, int(arch.smem_per_block_optin_bytes))
    static, dynamic = split_smem(arch, totals, rng)
    barriers = np.where(rng.random(n) < 0.8, rng.integers(0, 3, n), rng.integers(3, 17, n))
    return dict(
        threads=pick(THREAD_EDGES, 1, 1024),
        regs=pick(REG_EDGES, 0, 255),
        static_smem=static,
        dynamic_smem=dynamic,
        carveout=pick(CARVEOUT_EDGES, -1, 100),
        barriers=barriers,
    )
