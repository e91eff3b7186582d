"""Kernels of different CTA shapes sharing SMs (docs/model.md section 13): a CTA of one launch
fits beside the residents of others while the SM's registers, shared memory and a run of free
warp slots hold it. Hand cases, one per resource, in both engines; random mixed workloads are
in test_workload_vs_reference.py."""

from __future__ import annotations

import numpy as np
import pytest

import jaxsched as js
from jaxsched import reference
from jaxsched.workload import make_workload

from helpers import simulate_padded, small_arch
from test_engine_vs_reference import assert_same

ARCH = small_arch(4)  # 64 warp slots, 64 K registers and 228 KiB of shared memory per SM
N_SM = ARCH.sm_count
PAD = 8
QUICK = dict(launch_api_ns=20.0, launch_gap_ns=10.0)


def _long(threads: int, **kw) -> js.Kernel:
    """One CTA per SM that outlives everything launched beside it."""
    return js.make_kernel("loop 400\n fma dep\nend", grid=N_SM, threads=threads, pad_to=PAD, **kw)


def _short(threads: int, grid: int, **kw) -> js.Kernel:
    return js.make_kernel("loop 6\n fma dep\nend", grid=grid, threads=threads, pad_to=PAD, seed=5, **kw)


def _engine(w) -> js.Result:
    """The engine's run of `w`, padded to the sizes the workload tests share (one compilation per
    number of launches)."""
    return simulate_padded(arch=ARCH, kernel=w, clocks=js.clocks.uniform(ARCH))


def _most_beside(out: dict, first: int, second: int) -> int:
    """The most CTAs of launch `second` resident on one SM at once while a CTA of launch
    `first` is resident there, counted at each dispatch: a CTA placed at tick `t` finds the
    CTAs that started by `t` and end after it (one ending at `t` left in `t`'s cycles)."""
    sm, start, end, kernel = (np.asarray(out[k]) for k in ("cta_sm", "cta_start_tick", "cta_end_tick", "cta_kernel"))
    most = 0
    for g in np.flatnonzero(kernel == second):
        t, s = start[g], sm[g]
        host = (kernel == first) & (sm == s) & (start <= t) & (end > t)
        if host.any():
            most = max(most, int(np.sum((kernel == second) & (sm == s) & (start <= t) & (end > t))))
    return most


# Second grids of 5 N: with the first's N, 48 CTAs, the padded trace's length (one compilation).
@pytest.mark.parametrize(("first", "second", "beside"), [
    # warps: 24 of 64 warp slots held, so two CTAs of 16 warps fit beside it (not the five alone)
    (_long(768), _short(512, 5 * N_SM), 2),
    # registers: 8 warps of 128 registers hold half the register file; CTAs of 8 warps of 32
    # registers need 1/8 each: four fit beside it (seven by warp slots, eight alone)
    (_long(256, regs=128), _short(256, 5 * N_SM), 4),
    # shared memory: 150 KB held, a CTA of 100 KB does not fit beside it (two alone)
    (_long(128, smem_bytes=150_000), _short(128, 5 * N_SM, smem_bytes=100_000), 0),
])
def test_a_resource_bounds_the_ctas_beside_another_launch(first: js.Kernel, second: js.Kernel, beside: int) -> None:
    w = make_workload([first, second], streams=[0, 1], **QUICK)
    ref = reference.simulate(ARCH, w)
    assert _most_beside(ref, 0, 1) == beside
    assert_same(_engine(w), ref)


def test_a_launch_that_does_not_fit_waits_and_blocks_the_launches_behind_it() -> None:
    """The leftover policy with shapes: the head launch's next CTA fits nowhere beside the big
    CTAs, so it waits for them, and a later launch that would fit waits behind it."""
    big = _long(128, smem_bytes=150_000)
    blocked = _short(128, N_SM, smem_bytes=100_000)
    small = _short(64, N_SM)
    w = make_workload([big, blocked, small], streams=[0, 1, 2], **QUICK)
    out = reference.simulate(ARCH, w)
    start, end = (np.asarray(out[k]) for k in ("kernel_start_tick", "kernel_end_tick"))
    assert start[1] >= end[0]  # no room until the big CTAs leave (in the cycles of the tick it starts)
    assert start[2] >= start[1]  # behind the blocked launch, though it would fit
    assert_same(_engine(w), out)


def test_one_shape_as_several_launches_keeps_the_static_warp_layout() -> None:
    """Two launches of one shape, ready at once, run exactly as one launch of both grids: the
    engine's per-warp CTA table (several launches) puts CTA slot `j`'s warps on warp slots
    `j W ..`, as the static layout of one launch does, so every SM, tick and counter agrees
    (every CTA does the same work, so the launches' own hashes change nothing)."""
    k = js.make_kernel("loop 9\n fma dep\n lds\n alu\nend", grid=3 * N_SM + 1, threads=384, pad_to=PAD)
    one = js.simulate(ARCH, k.replace(grid_ctas=np.int32(6 * N_SM + 2)))
    zero = dict(launch_api_ns=0.0, launch_gap_ns=0.0)
    two = js.simulate(ARCH, make_workload([k, k], streams=[0, 1], **zero))
    for key in ("makespan_ticks", "sm_issued", "sm_stalls", "sm_warp_cycles", "cta_sm", "cta_start_tick",
                "cta_end_tick"):
        np.testing.assert_array_equal(np.asarray(getattr(one, key)), np.asarray(getattr(two, key)), err_msg=key)
