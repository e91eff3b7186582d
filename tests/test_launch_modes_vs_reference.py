"""Differential test of the launch modes: cooperative kernels with grid barriers and persistent
kernels with a global work queue. The JAX engine equals the reference exactly on random small
chips, programs, clock maps and policies (with and without DVFS)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import jaxsched as js
from jaxsched import reference
from jaxsched.errors import JaxschedError
from jaxsched.kernel import make_kernel, resident_grid

from helpers import configurations, examples, N_INSTR, simulate_padded
from test_engine_vs_reference import assert_same

_OPS = ["fma", "alu", "sfu", "lds", "ldg", "shfl"]


@st.composite
def loop_program(draw, barrier: str) -> str:
    """A loop of random instructions with an optional barrier line (`gsync` or `bar`) inside."""
    body = [draw(st.sampled_from(_OPS)) + (" dep" if draw(st.booleans()) else "")
            for _ in range(draw(st.integers(1, 4)))]
    if barrier and draw(st.booleans() | st.just(True)):
        body.insert(draw(st.integers(0, len(body))), barrier)
    head = f"loop {draw(st.integers(0, 5))} cta_spread={draw(st.integers(0, 2))} warp_spread={draw(st.integers(0, 2))}"
    tail = [draw(st.sampled_from(_OPS))] if draw(st.booleans()) else []
    return "\n".join([head, *body, "end", *tail, "exit dep" if draw(st.booleans()) else "exit"])


@st.composite
def launch_mode_configurations(draw) -> dict:
    cfg = draw(configurations())
    arch, kernel = cfg["arch"], cfg["kernel"]
    mode = draw(st.sampled_from(["cooperative", "persistent"]))
    program = draw(loop_program("gsync" if mode == "cooperative" else draw(st.sampled_from(["", "bar"]))))
    threads = int(kernel.threads_per_cta)
    base = make_kernel(program, grid=1, threads=threads, regs=int(kernel.regs_per_thread),
                       l2_hit_rate=float(kernel.l2_hit_rate), seed=int(kernel.seed), pad_to=N_INSTR,
                       cooperative=mode == "cooperative",
                       grid_sync_ns=float(draw(st.sampled_from([0.0, 3.0, 150.0]))))
    fit = resident_grid(arch, base)
    if fit == 0:
        return {**cfg, "kernel": base}  # rejected by both
    grid = draw(st.integers(1, fit)) if mode == "cooperative" else draw(st.integers(1, 2 * fit))
    items = draw(st.integers(0, 400)) if mode == "persistent" else 0
    event(mode)
    kernel = base.replace(grid_ctas=np.int32(grid), work_items=np.int32(items))
    extra = {"trace_len": 4}  # with or without DVFS, so that every example shares one compilation
    if draw(st.booleans()):
        extra["dvfs"] = js.dvfs.default(arch, period_us=0.05, latency_us=0.02, power_cap_w=draw(
            st.floats(1.0, 30.0)), min_mhz=300.0)
    return {**cfg, "kernel": kernel, **extra}


@settings(max_examples=examples(15, fixed=10), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=launch_mode_configurations())
def test_engine_equals_reference_for_launch_modes(cfg: dict) -> None:
    try:
        ref = reference.simulate(**cfg)
    except JaxschedError:
        return
    result = simulate_padded(**cfg)
    assert_same(result, ref)
    np.testing.assert_array_equal(result.sm_items, ref["sm_items"], err_msg="sm_items")
    items = int(cfg["kernel"].work_items)
    if items:
        assert int(np.sum(result.sm_items)) <= items
