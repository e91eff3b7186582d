"""Differential test of workloads (docs/model.md section 13): the JAX engine equals the
tick-by-tick reference exactly on random small chips, clock maps and policies running 1-4
kernel launches with random programs, CTA shapes, grids, memory behaviour and seeds, launch overheads (the
architecture's or the workload's) and CTA launch latencies (0 included).

The engine compiles one program per number of launches (the tests pad the CTA slots and the
per-CTA trace, `helpers.simulate_padded`), so that the test stays within its CI budget the
structures come from `STRUCTURES` (a single launch; a chain beside a concurrent stream joined by
an event; a graph of four launches with events across three streams), each with a fixed total
grid split at random between its launches.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, HealthCheck, event, given, settings
from hypothesis import strategies as st

from jaxsched import reference, workload
from jaxsched.errors import JaxschedError
from jaxsched.kernel import make_kernel

from helpers import configurations, examples, N_INSTR, programs, simulate_padded
from test_engine_vs_reference import assert_same

LAUNCH_KEYS = ("kernel_ready_tick", "kernel_start_tick", "kernel_end_tick")
_OVERHEAD_NS = st.sampled_from([0.0, 0.0, 1.3, 10.0, 80.0, 300.0])

# (streams, after, mode, total CTAs): see the module docstring
STRUCTURES = (
    ((0,), ((),), "stream", 10),
    ((0, 1, 0), ((), (), (1,)), "stream", 16),
    ((0, 1, 2, 1), ((), (), (0,), (1, 2)), "graph", 20),
)


@st.composite
def workload_configurations(draw) -> dict:
    """`helpers.configurations` (chip, clocks, policies, the first kernel's CTA shape) turned
    into a workload of one of `STRUCTURES`, every launch with its own program, grid, memory
    behaviour and seed, and half of them with their own CTA shape; the architecture's overheads and CTA launch latency small
    (the reference executes every tick), some overheads overridden by the workload."""
    cfg = draw(configurations())
    first = cfg["kernel"]
    arch = cfg["arch"].replace(
        cta_launch_ns=np.float32(draw(st.sampled_from([0.0, 0.0, 2.0, 15.0, 60.0]))),
        **{key: np.float32(draw(_OVERHEAD_NS)) for key in workload.OVERHEAD_FIELDS})
    streams, after, mode, total = draw(st.sampled_from(STRUCTURES))
    n = len(streams)
    cuts = sorted(draw(st.lists(st.integers(1, total - 1), min_size=n - 1, max_size=n - 1, unique=True)))
    grids = np.diff([0, *cuts, total]).tolist()
    # a kernel whose work comes from data has a row per CTA of its own grid
    from_data = bool(np.any(first.trips_from_data) or np.any(first.if_from_data))
    assume(not from_data or grids[0] <= int(first.grid_ctas))
    kernels = [first.replace(grid_ctas=np.int32(grids[0]))]
    for grid in grids[1:]:
        # half the launches keep the first's CTA shape, the others draw their own (section 13:
        # CTAs of different shapes share an SM by registers, shared memory and warp slots)
        same = draw(st.booleans())
        kernels.append(make_kernel(
            draw(programs()), grid=grid,
            threads=int(first.threads_per_cta) if same else draw(st.integers(1, 1024)),
            regs=int(first.regs_per_thread) if same else draw(st.sampled_from([16, 32, 40, 64, 128])),
            smem_bytes=int(first.dynamic_smem_bytes) if same else draw(st.sampled_from([0, 1000, 30000, 100000])),
            l2_hit_rate=draw(st.floats(0.0, 1.0)), seed=draw(st.integers(-(2**31), 2**31 - 1)),
            pad_to=N_INSTR))
    event("mixed CTA shapes" if len({(int(k.threads_per_cta), int(k.regs_per_thread), int(k.dynamic_smem_bytes))
                                     for k in kernels}) > 1 else "one CTA shape")
    overrides = {key: draw(_OVERHEAD_NS) for key in workload.OVERHEAD_FIELDS if draw(st.booleans())}
    wl = workload.make_workload(kernels, streams, after, mode, **overrides)
    event(f"{n} launch(es), {mode}")
    return {**cfg, "arch": arch, "kernel": wl}


@settings(max_examples=examples(20, fixed=12), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=workload_configurations())
def test_engine_equals_reference_for_workloads(cfg: dict) -> None:
    try:
        ref = reference.simulate(**cfg)
    except JaxschedError:
        event("rejected launch")
        with pytest.raises(JaxschedError):
            simulate_padded(**cfg)
        return
    result = simulate_padded(**cfg)
    assert_same(result, ref)
    np.testing.assert_array_equal(np.asarray(result.sm_items), ref["sm_items"], err_msg="sm_items")
    n_ctas = len(ref["cta_sm"])
    np.testing.assert_array_equal(np.asarray(result.cta_kernel)[:n_ctas], ref["cta_kernel"],
                                  err_msg="cta_kernel")
    n_launches = cfg["kernel"].n_launches
    for key in LAUNCH_KEYS:
        np.testing.assert_array_equal(np.asarray(getattr(result, key))[:n_launches], ref[key], err_msg=key)
    # Invariants of section 13 on top of equality: a launch starts no earlier than it is ready,
    # and after every dependency's end; the makespan is one past the last launch's end.
    ready, start, end = (np.asarray(ref[key]) for key in LAUNCH_KEYS)
    assert np.all(start >= ready)
    for l, deps in enumerate(cfg["kernel"].dependencies()):
        assert all(ready[l] > end[d] for d in deps)
    assert ref["makespan_ticks"] == int(end.max()) + 1
