"""Write `occupancy_cases.npz`: CUDA's occupancy results (cuda_occupancy.h) for every preset.

    .venv/bin/python tests/data/make_occupancy_table.py

The table lets `tests/test_occupancy_oracle.py` check `jaxsched.occupancy` on machines without
the CUDA toolkit. Per preset: random valid launches (half drawn from each rule's edges), the
shared-memory edges at three block sizes and every listed carveout, and a block-size x register
grid. Alongside the cases it stores each preset's `cudaOccDeviceProp` (so a changed preset is
caught rather than compared against stale answers) and the header it came from. Rerun after a
preset's limits change; the output is deterministic for a given header.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import oracle  # noqa: E402  (tests/oracle.py)

from jaxsched import presets  # noqa: E402

OUT = HERE / "occupancy_cases.npz"
N_RANDOM = 20000
INPUTS = ("threads", "regs", "static_smem", "dynamic_smem", "carveout", "barriers")
OUTPUTS = tuple(f for f in oracle.RESULT_FIELDS if f != "status")


def cases(arch, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random launches, then the shared-memory edges, then a coarse threads x registers grid."""
    parts = [oracle.random_launches(arch, N_RANDOM, rng)]

    totals = oracle.smem_totals(arch, step=10**9)  # edges only
    t, c, tot = (g.ravel() for g in np.meshgrid([32, 256, 1024], oracle.CARVEOUT_EDGES, totals,
                                                 indexing="ij"))
    static, dynamic = oracle.split_smem(arch, tot, rng)
    parts.append(dict(threads=t, regs=np.full_like(t, 32), static_smem=static,
                      dynamic_smem=dynamic, carveout=c, barriers=rng.integers(0, 3, t.size)))

    t, r = (g.ravel() for g in np.meshgrid(oracle.THREAD_EDGES, oracle.REG_EDGES, indexing="ij"))
    zero = np.zeros_like(t)
    parts.append(dict(threads=t, regs=r, static_smem=zero, dynamic_smem=zero, carveout=zero - 1,
                      barriers=zero + 1))
    return {k: np.concatenate([p[k] for p in parts]) for k in INPUTS}


def main() -> None:
    rng = np.random.default_rng(20240607)
    with tempfile.TemporaryDirectory() as tmp:
        orc = oracle.build(tmp)
        columns: dict[str, list[np.ndarray]] = {k: [] for k in ("preset",) + INPUTS + OUTPUTS}
        props = []
        for index, name in enumerate(presets.names()):
            arch = presets.get(name)
            case = cases(arch, rng)
            res = orc.occupancy(arch, case["threads"], case["regs"], case["dynamic_smem"],
                                case["static_smem"], case["carveout"], case["barriers"])
            bad = np.flatnonzero(res["status"] != 0)
            if bad.size:
                raise SystemExit(f"{name}: cuda_occupancy.h refused case {bad[0]}: "
                                 f"{ {k: int(v[bad[0]]) for k, v in case.items()} }")
            columns["preset"].append(np.full(case["threads"].size, index))
            for k in INPUTS:
                columns[k].append(case[k])
            for k in OUTPUTS:
                columns[k].append(res[k])
            props.append([oracle.device_props(arch)[f] for f in oracle.DEVICE_FIELDS])
            print(f"{name}: {case['threads'].size} cases")
        dtypes = dict(preset=np.int8, threads=np.int16, regs=np.int16, carveout=np.int8,
                      barriers=np.int8, limiting_factors=np.int8)
        arrays = {k: np.concatenate(v).astype(dtypes.get(k, np.int32)) for k, v in columns.items()}
        np.savez_compressed(
            OUT,
            preset_names=np.array(presets.names()),
            device_fields=np.array(oracle.DEVICE_FIELDS),
            device_props=np.array(props, dtype=np.int64),
            header_path=np.array(str(orc.header.resolve())),
            header_sha256=np.array(oracle.header_sha256(orc.header)),
            **arrays,
        )
    print(f"wrote {OUT} ({OUT.stat().st_size / 1e6:.2f} MB, {arrays['threads'].size} cases)")


if __name__ == "__main__":
    main()
