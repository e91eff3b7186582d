"""Bit-identity across devices: run a fixed set of configurations and save every output.

Run it on each device and compare the files (`--compare A B`): results must be bit-identical
between CPU and GPU (the engine is integer arithmetic apart from the lowering's float32 unit
conversions, which XLA evaluates identically).

    python benchmarks/cross_device.py --out results_cpu.npz
    python benchmarks/cross_device.py --compare results_cpu.npz results_gpu.npz
"""

from __future__ import annotations

import argparse

import jax
import numpy as np

from jaxsched import clocks
from jaxsched.cli import load_arch
from jaxsched.engine.run import simulate_batch
from jaxsched.kernel import make_kernel

TEMPLATES = [
    "loop 10 cta_spread=3\n ldg bytes=128\n fma dep\n fma dep\nend\n",
    "loop 6 warp_spread=4\n lds ways=4\n fma dep\n shfl\n alu dep\nend\nbar\n",
    "if 0.3\n sfu dep\n sfu dep\nelse\n fma dep\nend\nloop 4\n ldg bytes=512\n fma dep\nend\n",
    "loop 20 cta_spread=10\n fma\n fma dep\nend\nbar\nexit dep\n",
]
PAD = 12


def configurations(n: int, seed: int = 0, arch: str = "h200"):
    """`n` configurations on `arch` (a preset name or an arch TOML file): grids of 1-599 CTAs
    on the H200's 132 SMs, scaled to the chip's SMs, so that a cut-down chip runs as many waves."""
    rng = np.random.default_rng(seed)
    arch = load_arch(arch)
    kernels, maps = [], []
    for i in range(n):
        kernels.append(make_kernel(
            TEMPLATES[i % len(TEMPLATES)], grid=max(1, int(rng.integers(1, 600)) * arch.sm_count // 132),
            threads=int(rng.choice([64, 96, 256, 500, 1024])), regs=int(rng.choice([32, 64])),
            l2_hit_rate=float(rng.uniform()), seed=int(rng.integers(0, 2**31)), pad_to=PAD))
        maps.append(clocks.from_array(arch, rng.uniform(900, 1980, arch.n_sm_slots)))
    return ([arch] * n, kernels, maps, rng.integers(0, 3, n), rng.integers(0, 2, n),
            rng.integers(0, arch.sm_count, n))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out")
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--arch", default="h200", help="a preset name or an arch TOML file")
    parser.add_argument("--compare", nargs=2)
    args = parser.parse_args()
    if args.compare:
        a, b = (np.load(p) for p in args.compare)
        bad = [k for k in a.files if k != "device" and not np.array_equal(a[k], b[k])]
        print(f"{str(a['device'])} vs {str(b['device'])}: {len(a.files) - 1} arrays compared; differing: {bad or 'none'}")
        raise SystemExit(1 if bad else 0)
    result = simulate_batch(*configurations(args.n, arch=args.arch))
    arrays = {name: np.asarray(getattr(result, name)) for name in result.__dataclass_fields__
              if name != "max_warps_per_sm"}
    np.savez(args.out, device=str(jax.devices()[0]), **arrays)
    print(f"saved {len(arrays)} arrays for {args.n} configurations from {jax.devices()[0]}; "
          f"makespans {arrays['makespan_ticks'][:6]}")


if __name__ == "__main__":
    main()
