"""The bounds `jaxsched run` names (jaxsched.run_bounds): which programs wait for their loads, the
launch bound of a workload by hand, and every bound at or below the engine's makespan on random
memory-heavy kernels, the bandwidth bound within a few per cent where it binds."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from helpers import small_arch

import jaxsched as js
from jaxsched import run_bounds


@pytest.mark.parametrize("program, waits", [
    ("ldg\nfma dep", True),
    ("fma\nldg\nexit dep", True),
    ("loop 4\n ldg\n fma dep\nend", True),
    ("loop 4\n fma dep\n ldg\nend", False),  # the last trip's load is never waited for
    ("ldg\nfma", False),
    ("ldg\nif 0.5\n fma dep\nelse\n alu\nend", False),  # the else path does not wait
    ("ldg\nif 0.5\n fma dep\nelse\n alu\nend\nalu dep", True),
    ("fma dep\nalu", True),  # no loads
])
def test_waits_for_loads(program, waits):
    assert run_bounds.waits_for_loads(js.make_kernel(program, grid=1, threads=32)) is waits


@pytest.mark.parametrize("mode", ["stream", "graph"])
def test_launch_bound_of_a_chain_by_hand(mode):
    """Four launches on one stream: in stream mode launch l is submitted by the (l + 1)-th host
    call, in graph mode all at once by one; each then waits for the one before it and a gap."""
    arch = js.presets.get("h200")
    kernel = js.make_kernel("fma", grid=1, threads=32)
    chain = js.make_workload([kernel] * 4, mode=mode, launch_api_ns=1000.0, launch_gap_ns=100.0,
                             graph_api_ns=3000.0, graph_gap_ns=10.0)
    bound = run_bounds._launch_ns(chain, arch, tick_mhz=1000.0)
    assert bound == (4 * 1000.0 + 100.0 if mode == "stream" else 3000.0 + 4 * 10.0)
    two_streams = js.make_workload([kernel] * 4, streams=[0, 1, 0, 1], mode="stream", launch_api_ns=1000.0,
                                   launch_gap_ns=100.0)
    assert run_bounds._launch_ns(two_streams, arch, tick_mhz=1000.0) == 4 * 1000.0 + 100.0


N_RANDOM = 10


def _random_config(rng: np.random.Generator) -> tuple[js.Arch, js.Kernel, js.Clocks]:
    """A kernel of global loads waited for, on 2 or 4 SMs whose DRAM serves 20-400 B/ns (the
    H200's share per SM and much less), on unequal clocks."""
    body = [f"ldg bytes={int(rng.choice([128, 256, 512]))}",
            *rng.choice(["ldg bytes=128", "fma dep", "alu", "ldg bytes=512\n fma dep"], size=int(rng.integers(0, 3)))]
    program = f"loop {int(rng.integers(2, 12))} cta_spread={int(rng.integers(0, 3))}\n" + "\n".join(body) + \
        "\nend\nexit dep"
    arch = small_arch(int(rng.integers(1, 3)), dram_bytes_per_ns=np.float32(rng.uniform(20, 400)),
                      l2_bytes_per_ns=np.float32(rng.uniform(100, 2000)))
    threads = int(rng.choice([64, 256]))
    slots = int(js.occupancy(arch, threads, 32, 0).blocks_per_sm)
    grid = int(rng.integers(1, 4)) * slots * int(np.sum(arch.sm_enabled)) + int(rng.integers(0, slots))
    kernel = js.make_kernel(program, grid=grid, threads=threads, l2_hit_rate=float(rng.uniform(0.0, 0.9)),
                            seed=int(rng.integers(1 << 30)), pad_to=16)
    mhz = np.clip(1800 * (1 + 0.2 * rng.standard_normal(arch.n_sm_slots)), 600, 1980)
    return arch, kernel, js.clocks.from_array(arch, mhz)


@pytest.fixture(scope="module")
def runs() -> list[tuple[js.Arch, js.Kernel, js.Clocks, js.Result]]:
    rng = np.random.default_rng(5)
    configs = [_random_config(rng) for _ in range(N_RANDOM)]
    n = len(configs)
    # one configuration at a time: a chunk steps until its longest member ends (28 s as one chunk, 12 s so)
    result = js.simulate_batch(*(list(x) for x in zip(*configs)), [1] * n, [0] * n, [0] * n, chunk=1)
    return [(a, k, c, jax.tree.map(lambda leaf, i=i: leaf[i], result)) for i, (a, k, c) in enumerate(configs)]


def test_no_run_beats_a_bound_and_bandwidth_binds_tightly(runs):
    tight = 0
    for i, (arch, kernel, clk, result) in enumerate(runs):
        bounds = run_bounds.bounds_ns(result, arch, kernel, np.asarray(clk.sm_freq_mhz))
        assert set(bounds) == {"issue_slots", "dram_bandwidth", "l2_bandwidth"}, i
        assert list(bounds.values()) == sorted(bounds.values(), reverse=True)
        makespan = float(result.makespan_ns)
        assert all(0 < b <= makespan for b in bounds.values()), (i, bounds, makespan)
        if next(iter(bounds)) == "dram_bandwidth":
            tight += makespan <= 1.05 * bounds["dram_bandwidth"]
    assert tight >= 3  # the DRAM queue is the limit of several of them, and then the bound is close
