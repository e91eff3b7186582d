"""`fastest_first` dispatch (docs/model.md section 9): the SM with the fastest clock now takes
the CTA, then the one with the most room, then the lowest rank; both engines alike. The random
differential tests (test_engine_vs_reference, test_own_time, test_fast_forward) draw it among
every policy."""

from __future__ import annotations

import numpy as np

import jaxsched as js
from jaxsched import reference

from helpers import simulate_pinned, small_arch

ARCH = small_arch(4)  # 8 SMs x 8 CTA slots of 256-thread CTAs
MHZ = [1200.0, 1980.0, 900.0, 1605.0, 1500.0, 1100.0, 1300.0, 1700.0]  # one per SM slot, all enabled
# The file's runs share one compilation (three before, one per grid): the largest grid below,
# fast-forward's search compiled in.
STATICS = dict(cta_slots=8, max_ctas=200, fast_forward_step=True)


def simulate(arch: js.Arch, kernel, clk: js.Clocks | None = None, **config) -> js.Result:
    """`js.simulate` with the file's `STATICS` (`helpers.simulate_pinned`)."""
    return simulate_pinned(arch, kernel, clk, statics=STATICS, **config)


def _both(kernel: js.Kernel, mhz: list[float]) -> tuple:
    clk = js.clocks.from_array(ARCH, mhz)
    engine = simulate(ARCH, kernel, clk, dispatch="fastest_first")
    plain = reference.simulate(ARCH, kernel, clk, dispatch="fastest_first")
    return engine, plain


def test_one_wave_fills_the_fastest_sms_first():
    """A grid of 3 SMs' worth of CTAs lands on the 3 fastest SMs, each filled before the next;
    hardware dispatch spreads it over every SM (most room first)."""
    per_sm = int(js.occupancy(ARCH, 256, 32, 0).blocks_per_sm)
    kernel = js.make_kernel("loop 4\n fma dep\nend", grid=3 * per_sm, threads=256, regs=32)
    engine, plain = _both(kernel, MHZ)
    order = np.argsort(MHZ)[::-1]
    expected = np.zeros(ARCH.n_sm_slots, int)
    expected[order[:3]] = per_sm
    assert np.asarray(engine.sm_ctas).tolist() == expected.tolist()
    assert np.asarray(plain["sm_ctas"]).tolist() == expected.tolist()
    hardware = simulate(ARCH, kernel, js.clocks.from_array(ARCH, MHZ), dispatch="hardware")
    assert np.count_nonzero(np.asarray(hardware.sm_ctas)) == ARCH.sm_count


def test_equal_clocks_fall_back_to_most_room_then_rank():
    """On a uniform chip the clock term ties everywhere, so the policy is hardware dispatch."""
    kernel = js.make_kernel("loop 6 cta_spread=2\n fma dep\n sfu dep\nend", grid=150, threads=256, regs=32)
    mhz = [1500.0] * ARCH.n_sm_slots
    engine, plain = _both(kernel, mhz)
    hardware = simulate(ARCH, kernel, js.clocks.from_array(ARCH, mhz), dispatch="hardware")
    assert np.asarray(engine.cta_sm).tolist() == np.asarray(hardware.cta_sm).tolist()
    assert np.asarray(engine.cta_sm).tolist() == np.asarray(plain["cta_sm"]).tolist()
    assert int(engine.makespan_ticks) == int(plain["makespan_ticks"])


def test_refills_go_to_the_fastest_sm_with_room():
    """Several waves on unequal clocks: both engines give every CTA the same SM and tick, and
    the fastest SM runs more CTAs than the slowest."""
    kernel = js.make_kernel("loop 8 cta_spread=3\n fma dep\n alu\nend", grid=200, threads=256, regs=32)
    engine, plain = _both(kernel, MHZ)
    for field in ("cta_sm", "cta_start_tick", "cta_end_tick"):
        assert np.asarray(getattr(engine, field)).tolist() == np.asarray(plain[field]).tolist(), field
    ctas = np.asarray(engine.sm_ctas)
    assert ctas[int(np.argmax(MHZ))] > ctas[int(np.argmin(MHZ))]
