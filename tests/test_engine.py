"""The JAX engine on full-size presets: hand-checkable cases (docs/model.md), the clock
response of memory- and compute-bound kernels, policies, determinism and bad kernels."""

from __future__ import annotations

import numpy as np
import pytest

import jaxsched as js
from jaxsched import clocks
from jaxsched.kernel import pad_program

from helpers import RULES_OFF, simulate_pinned

H200 = js.presets.get("h200")
FMA_LAT = int(H200.latency_cycles[js.Op.FMA])
# The runs of up to 8 CTAs per SM share one compilation (six before, one per occupancy, grid,
# program length and fast-forward on or off): 8 CTA slots, the largest grid below (fma_ldg's
# 4224 CTAs, as the engine rounds it), programs padded to 16 instructions, fast-forward's
# search compiled in.
STATICS = dict(cta_slots=8, max_ctas=5120, fast_forward_step=True)
PAD = 16


def simulate(arch: js.Arch, kernel: js.Kernel, clk: js.Clocks | None = None, **config) -> js.Result:
    """`js.simulate` with the file's `STATICS`, the program padded to `PAD` instructions
    (`helpers.simulate_pinned`)."""
    return simulate_pinned(arch, pad_program(kernel, max(PAD, kernel.n_instr)), clk, statics=STATICS, **config)


def test_one_warp_of_n_dependent_fmas_takes_n_latencies():
    n = 40
    kernel = js.make_kernel("\n".join(["fma dep"] * n), grid=1, threads=32)
    r = js.simulate(H200, kernel)
    # dispatch at tick 0; FMA k issues at cycle 1 + 4(k-1); EXIT one cycle after the last FMA.
    assert int(r.makespan_ticks) == n * FMA_LAT - 1
    assert int(np.sum(r.sm_issued)) == n + 1
    assert int(np.sum(r.sm_stalls[:, r.stall_reasons.index("wait")])) == (n - 1) * (FMA_LAT - 1)


def test_sixteen_warps_per_scheduler_are_issue_bound():
    # 2 CTAs of 1024 threads on one SM: 64 warps, 16 per scheduler, dependent FMA chains. The
    # H200's launch credit (the second CTA waits for idle issue cycles) and taken-branch refetch
    # are off here, so that the bound is the plain issue bound; tests/test_issue_rules.py
    # checks those rules.
    arch = H200.replace(sm_enabled=np.arange(H200.n_sm_slots) < 1, **RULES_OFF)
    trips = 50
    kernel = js.make_kernel(f"loop {trips}\n fma dep\nend", grid=2, threads=1024)
    r = simulate(arch, kernel, warp_policy="lrr")
    issued = int(r.sm_issued[0])
    assert issued == 64 * (trips + 1)
    # 4 schedulers issue every cycle once the pipeline is full: makespan ~ issued / 4.
    assert issued / 4 <= int(r.makespan_ticks) <= issued / 4 + 2 * FMA_LAT
    assert float(r.ipc[0]) > 3.9


def _makespan_ns(kernel_text: str, ghz: float, **kw) -> float:
    kernel = js.make_kernel(kernel_text, grid=264, threads=256, **kw)
    return float(simulate(H200, kernel, clocks.uniform(H200, ghz)).makespan_ns)


def test_memory_bound_ignores_clock_compute_bound_scales():
    mem = "loop 8\n ldg bytes=512\n fma dep\nend"
    comp = "loop 64\n fma dep\nend"
    mem_ratio = _makespan_ns(mem, 1.0, l2_hit_rate=0.0) / _makespan_ns(mem, 2.0, l2_hit_rate=0.0)
    comp_ratio = _makespan_ns(comp, 1.0) / _makespan_ns(comp, 2.0)
    assert mem_ratio < 1.1  # DRAM time is in nanoseconds
    assert comp_ratio == pytest.approx(2.0, rel=0.02)


def test_gto_staggers_coresident_ctas_lrr_keeps_them_together():
    # CTAs that start together: without launch credit all 8 start at tick 0 (with it, one per
    # tick while the SM idles). The loop body is unrolled, as compiled loops are: a one-FMA
    # body would pay the taken branch's refetch on every instruction.
    arch = H200.replace(sm_enabled=np.arange(H200.n_sm_slots) < 1, cta_launch_idle_cycles=np.int32(0))
    kernel = js.make_kernel("loop 5\n" + " fma dep\n" * 8 + "end", grid=8, threads=256)
    spread = {}
    for policy in ("gto", "lrr"):
        r = simulate(arch, kernel, warp_policy=policy)
        end = np.asarray(r.cta_end_tick)
        spread[policy] = (end.min() / end.max(), end)
    first_over_last_gto, end_gto = spread["gto"]
    first_over_last_lrr, _ = spread["lrr"]
    assert first_over_last_gto < 0.4  # measured on an H200: the first ends at ~1/4 of the last
    assert first_over_last_lrr > 0.9
    assert np.all(np.diff(end_gto) >= 0)  # oldest first: grid order


def test_every_cta_runs_once_and_hardware_dispatch_balances():
    kernel = js.load_kernel("sweeps/kernels/divergent.toml")
    for dispatch in ("hardware", "round_robin"):
        r = simulate(H200, kernel, dispatch=dispatch, dispatch_start=17)
        n = int(kernel.grid_ctas)
        assert int(np.sum(r.sm_ctas)) == n
        assert np.all(np.asarray(r.cta_sm)[:n] >= 0)
        assert np.all(np.asarray(r.cta_sm)[:n] < H200.sm_count)
        assert np.all(np.asarray(r.cta_end_tick) >= np.asarray(r.cta_start_tick))


def test_makespan_at_least_the_obvious_lower_bounds():
    kernel = js.load_kernel("sweeps/kernels/fma_ldg.toml")
    r = simulate(H200, kernel)
    enabled = np.asarray(H200.sm_enabled)
    # Issue bound: no SM issues more than 4 instructions per cycle.
    assert np.all(np.asarray(r.sm_issued)[enabled] <= 4 * np.asarray(r.sm_cycles)[enabled])
    # DRAM bound: bytes that miss L2 / bandwidth. 4224 CTAs x 8 warps x >= 2 trips (4 +- 2)
    # x 128 B x (1 - 0.6 hit rate).
    dram_bytes_min = 4224 * 8 * 2 * 128 * (1 - 0.6)
    assert float(r.makespan_ns) >= dram_bytes_min / float(H200.dram_bytes_per_ns)
    # Latency bound: every warp waits for >= 2 dependent loads in sequence.
    assert float(r.makespan_ns) >= 2 * float(H200.l2_hit_latency_ns)


def test_results_are_bit_identical_across_runs():
    kernel = js.load_kernel("sweeps/kernels/divergent.toml")
    rng = np.random.default_rng(1)
    clk = clocks.from_array(H200, rng.uniform(1500, 1980, H200.n_sm_slots))
    a = simulate(H200, kernel, clk, warp_policy="oldest")
    b = simulate(H200, kernel, clk, warp_policy="oldest")
    for name in a.__dataclass_fields__:
        assert np.array_equal(np.asarray(getattr(a, name)), np.asarray(getattr(b, name))), name


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: js.make_kernel("fma", grid=10, threads=1024, regs=255), "kernel"),
        (lambda: js.make_kernel("fma", grid=10, threads=-5), "threads"),
        (lambda: js.make_kernel("fma", grid=10, threads=1025), "threads_per_block"),
        (lambda: js.make_kernel("fma", grid=0, threads=32), "grid"),
        (lambda: js.make_kernel("", grid=1, threads=32), "program"),
        (lambda: js.make_kernel("fma", grid=1, threads=32, smem_bytes=10**6), "dynamic_smem_bytes"),
    ],
)
def test_bad_kernels_get_clear_errors(make, field):
    with pytest.raises(js.JaxschedError) as info:
        js.simulate(H200, make())
    assert field in str(info.value)


def test_too_many_resources_message_names_registers():
    kernel = js.make_kernel("fma", grid=10, threads=1024, regs=255)
    with pytest.raises(js.JaxschedError, match="too many resources requested for launch.*registers"):
        js.simulate(H200, kernel)


def test_max_ticks_too_small_is_an_error():
    kernel = js.make_kernel("loop 100\n fma dep\nend", grid=1, threads=32)
    with pytest.raises(js.JaxschedError, match="max_ticks"):
        js.simulate(H200, kernel, max_ticks=50)
