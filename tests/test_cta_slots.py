"""CTA-slot arrays are sized by occupancy, not the architecture's maximum (lower.cta_slots_for):
padding a batch to its largest occupancy, or further, changes no result."""

import numpy as np
import pytest
from helpers import small_arch

import jaxsched as js
from jaxsched import clocks
from jaxsched.errors import JaxschedError
from jaxsched.lower import cta_slots_for

PROGRAM = "loop 3 cta_spread=1\n ldg bytes=128\n fma dep\nend\nbar\n"


def _kernels():
    arch = small_arch()
    many = js.make_kernel(PROGRAM, grid=40, threads=64, regs=32)  # many small CTAs per SM
    few = js.make_kernel(PROGRAM, grid=12, threads=1024, regs=32)  # one or two large CTAs per SM
    return arch, many, few


def test_occupancy_sizes_the_slots():
    arch, many, few = _kernels()
    assert cta_slots_for(arch, few) < cta_slots_for(arch, many) <= int(arch.max_blocks_per_sm)


@pytest.mark.parametrize("cta_slots", [None, 32])
def test_padded_batch_equals_single_runs(cta_slots):
    arch, many, few = _kernels()
    clk = [clocks.from_array(arch, np.linspace(1400, 1900, arch.n_sm_slots)) for _ in range(2)]
    batch = js.simulate_batch([arch, arch], [many, few], clk, [1, 0], [0, 0], [0, 0], cta_slots=cta_slots)
    assert np.asarray(batch.cta_end_tick).shape[-1] == 40  # by default, the batch's largest grid
    for i, kernel in enumerate((many, few)):
        alone = js.simulate(arch, kernel, clk[i], warp_policy=["gto", "lrr"][i])
        for name in ("makespan_ticks", "sm_issued", "sm_stalls", "sm_ctas", "sm_warp_cycles"):
            np.testing.assert_array_equal(np.asarray(getattr(batch, name))[i], np.asarray(getattr(alone, name)))
        n = int(kernel.grid_ctas)
        np.testing.assert_array_equal(np.asarray(batch.cta_end_tick)[i, :n], np.asarray(alone.cta_end_tick))


def test_too_few_slots_is_refused():
    arch, many, few = _kernels()
    clk = [clocks.uniform(arch)] * 2
    with pytest.raises(JaxschedError, match="cta_slots"):
        js.simulate_batch([arch, arch], [many, few], clk, [0, 0], [0, 0], [0, 0], cta_slots=1)
