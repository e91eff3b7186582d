"""Compiled sizes (engine/mechanics/sizes.py): kernels that differ in grid size within one bucket,
program length within one multiple of 8, or name share one compilation, and each gets its own
exact results, its per-CTA trace cut back to its own grid; data tables compiled in on request
change no result, and left out of a kernel that reads data are refused."""

import numpy as np
import pytest

import jaxsched as js
from jaxsched import reference
from jaxsched.engine import run as engine_run
from jaxsched.engine.mechanics.sizes import quarter_octave
from jaxsched.lower import WARP_POLICIES

from helpers import small_arch
from test_engine_vs_reference import assert_same

PROGRAMS = ["loop 2 cta_spread=1\n ldg bytes=128\n fma dep\nend",
            "loop 2 cta_spread=1\n ldg bytes=128\n fma dep\n fma\n sfu dep\nend"]


def test_grid_program_and_name_changes_share_one_compilation():
    arch = small_arch(3)
    clk = js.clocks.from_array(arch, np.linspace(900, 1900, arch.n_sm_slots))
    kernels = [js.make_kernel(p, grid=g, threads=96, regs=32, name=f"k{i}")
               for i, (p, g) in enumerate([(PROGRAMS[0], 33), (PROGRAMS[1], 36), (PROGRAMS[0], 40)])]
    before = engine_run._compiled._cache_size()
    for kernel in kernels:
        result = js.simulate(arch, kernel, clk, warp_policy="lrr")
        assert result.cta_sm.shape == (int(kernel.grid_ctas),)
        assert_same(result, reference.simulate(arch=arch, kernel=kernel, clocks=clk, warp_policy="lrr"))
    assert engine_run._compiled._cache_size() - before <= 1  # 0 if an earlier test compiled it


def test_a_batch_trace_has_the_batch_s_largest_grid():
    arch = small_arch(3)
    clk = js.clocks.from_array(arch, np.linspace(900, 1900, arch.n_sm_slots))
    kernels = [js.make_kernel(PROGRAMS[0], grid=g, threads=96, regs=32) for g in (5, 37)]
    batch = js.simulate_batch([arch] * 2, kernels, [clk] * 2, [0, 1], [0, 0], [0, 0])
    assert batch.cta_end_tick.shape == (2, 37)
    for i, kernel in enumerate(kernels):
        ref = reference.simulate(arch=arch, kernel=kernel, clocks=clk, warp_policy=["lrr", "gto"][i])
        assert_same(batch, ref, index=i)
        np.testing.assert_array_equal(batch.cta_sm[i, int(kernel.grid_ctas):], -1)


@pytest.mark.parametrize("n, bucket", [(1, 1), (7, 7), (8, 8), (9, 10), (33, 40), (48, 48), (61, 64), (65, 80),
                                       (4224, 5120), (5121, 6144)])
def test_trace_buckets_are_quarter_octaves(n, bucket):
    assert quarter_octave(n) == bucket
    assert n <= bucket < 1.25 * n or bucket == n


def test_data_tables_compiled_in_for_a_kernel_without_data_change_no_result():
    """`simulate_batch(data_tables=True)` compiles in data tables a kernel does not read (as the
    differential tests do, so that kernels with and without data share a compilation): the
    results stay the kernel's own."""
    arch = small_arch(2)
    clk = js.clocks.from_array(arch, np.linspace(900, 1900, arch.n_sm_slots))
    kernel = js.make_kernel(PROGRAMS[0], grid=20, threads=96, regs=32)
    padded = js.simulate_batch([arch], [kernel], [clk], [0], [0], [0], data_tables=True)
    assert_same(padded, reference.simulate(arch=arch, kernel=kernel, clocks=clk, warp_policy=WARP_POLICIES[0]),
                index=0)


def test_data_tables_left_out_of_a_kernel_that_reads_data_are_refused():
    arch = small_arch(2)
    kernel = js.make_kernel("loop @work\n fma dep\nend", grid=4, threads=32, arrays={"work": np.full((4, 1), 3)})
    with pytest.raises(js.JaxschedError, match="^data_tables = False: True: a program of the batch reads data"):
        js.simulate_batch([arch], [kernel], [js.clocks.uniform(arch)], [0], [0], [0], data_tables=False)
