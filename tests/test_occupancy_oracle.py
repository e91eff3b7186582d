"""`jaxsched.occupancy` against NVIDIA's own calculator, `cuda_occupancy.h`.

Live checks compile `oracle/occ_oracle.cpp` once per session and skip where the toolkit header
or a C++ compiler is missing; the stored table (`data/occupancy_cases.npz`, written by
`data/make_occupancy_table.py`) and the DOMAIN.md limits are checked everywhere.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import oracle  # noqa: E402  (tests/oracle.py)

from jaxsched import presets  # noqa: E402
from jaxsched.occupancy import NO_LIMIT, occupancy  # noqa: E402

TABLE = Path(__file__).resolve().parent / "data" / "occupancy_cases.npz"
COMPARED = ("blocks_per_sm", "limit_warps", "limit_registers", "limit_shared_memory",
            "limit_blocks", "limit_barriers", "limiting_factors", "regs_per_block_allocated",
            "smem_per_block_allocated_bytes")
PRESETS = presets.names()

# DOMAIN.md, "Per-SM limits by compute capability" (CUDA programming guide, cuda_occupancy.h).
DOMAIN = {
    (7, 0): dict(max_threads_per_sm=2048, max_blocks_per_sm=32, regs_per_sm=65536,
                 smem_per_sm_bytes=96 * 1024, smem_per_block_optin_bytes=96 * 1024,
                 reserved_smem_per_block_bytes=0),
    (8, 0): dict(max_threads_per_sm=2048, max_blocks_per_sm=32, regs_per_sm=65536,
                 smem_per_sm_bytes=164 * 1024, smem_per_block_optin_bytes=163 * 1024,
                 reserved_smem_per_block_bytes=1024),
    (8, 6): dict(max_threads_per_sm=1536, max_blocks_per_sm=16, regs_per_sm=65536,
                 smem_per_sm_bytes=100 * 1024, smem_per_block_optin_bytes=99 * 1024,
                 reserved_smem_per_block_bytes=1024),
    (9, 0): dict(max_threads_per_sm=2048, max_blocks_per_sm=32, regs_per_sm=65536,
                 smem_per_sm_bytes=233472, smem_per_block_optin_bytes=232448,
                 reserved_smem_per_block_bytes=1024),
}


@pytest.fixture(scope="session")
def cuda_oracle(tmp_path_factory) -> oracle.Oracle:
    try:
        return oracle.build(tmp_path_factory.mktemp("occ_oracle"))
    except oracle.OracleUnavailable as exc:
        pytest.skip(f"CUDA occupancy oracle unavailable: {exc}")


def assert_matches(arch, case: dict, expected: dict) -> None:
    """jaxsched's `occupancy` equals `expected` in every compared field, for every case."""
    got = occupancy(arch, case["threads"], case["regs"], case["dynamic_smem"], case["static_smem"],
                    carveout_percent=case["carveout"], block_barriers=case["barriers"])
    report = []
    for field in COMPARED:
        mine = np.ravel(np.broadcast_to(np.asarray(getattr(got, field)), np.shape(case["threads"])))
        theirs = np.ravel(expected[field])
        bad = np.flatnonzero(mine != theirs)
        for i in bad[:5]:
            inputs = ", ".join(f"{k}={int(np.ravel(v)[i])}" for k, v in case.items())
            report.append(f"{arch.name} {field}: {inputs}: jaxsched {mine[i]}, CUDA {theirs[i]}")
        if bad.size > 5:
            report.append(f"{arch.name} {field}: ... {bad.size} mismatches in {mine.size} cases")
    assert not report, "\n".join(report)


def live_check(cuda_oracle, arch, case: dict) -> None:
    case = {k: np.ravel(np.broadcast_to(v, np.broadcast_shapes(*(np.shape(x) for x in case.values()))))
            for k, v in case.items()}
    expected = cuda_oracle.occupancy(arch, case["threads"], case["regs"], case["dynamic_smem"],
                                     case["static_smem"], case["carveout"], case["barriers"])
    assert np.all(expected["status"] == 0), "cuda_occupancy.h refused a launch jaxsched accepts"
    assert_matches(arch, case, expected)


@pytest.mark.parametrize("name", PRESETS)
def test_every_block_size_and_register_count(cuda_oracle, name):
    """All 1024 block sizes x all 256 register counts (0..255), no shared memory."""
    arch = presets.get(name)
    threads, regs = np.meshgrid(np.arange(1, 1025), np.arange(0, 256), indexing="ij")
    live_check(cuda_oracle, arch, dict(threads=threads, regs=regs, static_smem=0, dynamic_smem=0,
                                       carveout=-1, barriers=1))


@pytest.mark.parametrize("name", PRESETS)
def test_shared_memory_grid(cuda_oracle, name):
    """Shared memory every 128 B up to the opt-in limit plus every rule's edges (48 KiB with and
    without the reserved bytes, carveout sizes, opt-in exactly), x block sizes x register counts x
    carveouts; static/dynamic split and barrier count vary from case to case."""
    arch = presets.get(name)
    rng = np.random.default_rng(1)
    totals = oracle.smem_totals(arch, step=128)
    t, r, c, tot = (g.ravel() for g in np.meshgrid(
        [1, 32, 96, 256, 640, 1024], [0, 32, 64, 168], oracle.CARVEOUT_EDGES, totals, indexing="ij"))
    static, dynamic = oracle.split_smem(arch, tot, rng)
    live_check(cuda_oracle, arch, dict(threads=t, regs=r, static_smem=static, dynamic_smem=dynamic,
                                       carveout=c, barriers=rng.integers(0, 3, t.size)))


@pytest.mark.parametrize("name", PRESETS)
def test_every_carveout(cuda_oracle, name):
    """Every carveout -1..100 against the shared-memory edges (the carveout picks the SM size)."""
    arch = presets.get(name)
    rng = np.random.default_rng(2)
    c, tot = (g.ravel() for g in np.meshgrid(np.arange(-1, 101), oracle.smem_totals(arch, step=1024),
                                             indexing="ij"))
    static, dynamic = oracle.split_smem(arch, tot, rng)
    live_check(cuda_oracle, arch, dict(threads=128, regs=32, static_smem=static,
                                       dynamic_smem=dynamic, carveout=c, barriers=1))


@pytest.mark.parametrize("name", PRESETS)
def test_random_launches(cuda_oracle, name):
    """100k random valid launches, every input varied at once (barriers 0..16 included)."""
    arch = presets.get(name)
    live_check(cuda_oracle, arch, oracle.random_launches(arch, 100_000, np.random.default_rng(3)))


@pytest.fixture(scope="module")
def table() -> dict[str, np.ndarray]:
    with np.load(TABLE) as data:
        return {k: data[k] for k in data.files}


@pytest.mark.parametrize("name", PRESETS)
def test_stored_table(table, name):
    """The stored cuda_occupancy.h answers (no toolkit needed)."""
    arch = presets.get(name)
    names = table["preset_names"].tolist()
    assert name in names, f"{name} missing from {TABLE.name}: rerun data/make_occupancy_table.py"
    index = names.index(name)
    stored = dict(zip(table["device_fields"].tolist(), table["device_props"][index].tolist()))
    assert stored == oracle.device_props(arch), (
        f"{name}'s limits changed since {TABLE.name} was written: check the change against "
        "cuda_occupancy.h, then rerun data/make_occupancy_table.py")
    rows = table["preset"] == index
    inputs = ("threads", "regs", "static_smem", "dynamic_smem", "carveout", "barriers")
    case = {k: table[k][rows].astype(np.int64) for k in inputs}
    assert case["threads"].size > 10_000
    assert_matches(arch, case, {k: table[k][rows].astype(np.int64) for k in COMPARED})


def test_stored_table_is_current(table, cuda_oracle):
    """The live header still gives the stored answers (else the table is stale: regenerate)."""
    for index, name in enumerate(table["preset_names"].tolist()):
        rows = table["preset"] == index
        props = dict(zip(table["device_fields"].tolist(), table["device_props"][index].tolist()))
        n = int(rows.sum())
        rows_table = np.zeros((n, len(oracle.ROW_FIELDS)), dtype=np.int64)
        columns = dict(props, func_maxThreadsPerBlock=1024, numRegs=table["regs"][rows],
                       sharedSizeBytes=table["static_smem"][rows], partitionedGCConfig=0,
                       shmemLimitConfig=oracle.FUNC_SHMEM_LIMIT_OPTIN,
                       maxDynamicSharedSizeBytes=table["dynamic_smem"][rows],
                       numBlockBarriers=table["barriers"][rows], virtualResourceCount=0,
                       cacheConfig=0, carveoutConfig=table["carveout"][rows],
                       blockSize=table["threads"][rows], dynamicSmemSize=table["dynamic_smem"][rows])
        for j, field in enumerate(oracle.ROW_FIELDS):
            rows_table[:, j] = columns[field]
        live = cuda_oracle.run_table(rows_table)
        for field in COMPARED:
            stale = np.flatnonzero(live[field] != table[field][rows])
            assert stale.size == 0, (
                f"{name} {field}: {stale.size} stored answers differ from {cuda_oracle.header} "
                f"(table made from {table['header_path']}); rerun data/make_occupancy_table.py")


@pytest.mark.parametrize("name", PRESETS)
def test_preset_matches_header_rules(cuda_oracle, name):
    """Blocks/SM, allocation units, sub-partitions, carveout sizes and CTA barriers per CC."""
    arch = presets.get(name)
    rules = cuda_oracle.rules([arch.compute_capability])[arch.compute_capability]
    assert int(arch.max_blocks_per_sm) == rules["max_blocks_per_sm"]
    assert int(arch.smem_alloc_unit_bytes) == rules["smem_alloc_unit_bytes"]
    assert int(arch.reg_alloc_unit) == rules["reg_alloc_unit"]
    assert arch.schedulers_per_sm == rules["schedulers_per_sm"]
    assert int(arch.barriers_per_block_slot) * int(arch.max_blocks_per_sm) == rules["barriers_per_sm"]
    assert sorted(set(np.asarray(arch.smem_carveout_kib).tolist())) == rules["carveouts_kib"]
    # jaxsched refuses > 255 registers (ptxas's limit); the header only zeroes occupancy above its own.
    assert int(arch.max_regs_per_thread) <= rules["reg_max_per_thread"]


@pytest.mark.parametrize("name", PRESETS)
def test_preset_matches_domain_table(name):
    """threads/SM, blocks/SM, registers/SM, shared memory/SM, opt-in, reserved (DOMAIN.md)."""
    arch = presets.get(name)
    expected = DOMAIN[arch.compute_capability]
    assert {k: int(getattr(arch, k)) for k in expected} == expected
    assert int(arch.max_threads_per_block) == 1024
    assert int(arch.smem_per_block_bytes) == 48 * 1024
    assert int(arch.warp_size) == 32


def test_no_limit_is_cuda_int_max():
    assert NO_LIMIT == oracle.INT_MAX == 2**31 - 1
