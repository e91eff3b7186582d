"""The CTA launch latency (docs/model.md section 9): a slot freed by a CTA completing at tick `e`
takes its next CTA at tick `e + cta_launch_ticks`, never earlier and, while CTAs remain, never
later (event skipping must stop at the tick the slot becomes usable, section 11).

Every case uses one kernel and one chip shape, so the engine compiles once: `cta_launch_ns`,
the enabled SMs and the clocks are traced."""

from __future__ import annotations

import numpy as np
import pytest

import jaxsched as js
from jaxsched import clocks

from helpers import small_arch

N_CTAS = 8
# One CTA of 1024 threads x 64 registers fills the register file: one CTA slot per SM. DRAM
# loads (~1000 ticks apart) make the running SMs' own events sparse, so a missed usable tick
# would show as a late start.
KERNEL = js.make_kernel("loop 3\n ldg bytes=128\n fma dep\nend", grid=N_CTAS, threads=1024,
                        regs=64, l2_hit_rate=0.0)
TWO_SMS = small_arch(1)  # one TPC: two SMs
FIRST_SM, SECOND_SM = np.flatnonzero(np.asarray(TWO_SMS.sm_enabled))
ONE_SM = TWO_SMS.replace(sm_enabled=np.arange(TWO_SMS.n_sm_slots) == FIRST_SM)


def _launch_ticks(result: js.Result, launch_ns: float) -> int:
    return int(np.rint(np.float32(launch_ns) * (np.float32(int(result.tick_mhz)) / np.float32(1000))))


def _run(arch: js.Arch, launch_ns: float, second_sm_mhz: float = 1980.0) -> js.Result:
    mhz = np.full(arch.n_sm_slots, 1980.0)
    mhz[SECOND_SM] = second_sm_mhz
    return js.simulate(arch.replace(cta_launch_ns=np.float32(launch_ns)), KERNEL,
                       clocks.from_array(arch, mhz))


def _per_sm_chains(result: js.Result) -> list[tuple[np.ndarray, np.ndarray]]:
    """(start, end) ticks of the CTAs each SM ran, in start order."""
    sm = np.asarray(result.cta_sm)
    start, end = np.asarray(result.cta_start_tick), np.asarray(result.cta_end_tick)
    chains = []
    for s in np.unique(sm):
        order = np.argsort(start[sm == s], kind="stable")
        chains.append((start[sm == s][order], end[sm == s][order]))
    return chains


@pytest.mark.parametrize("launch_ns", [0.0, 207.0, 5000.0])
def test_one_slot_chain_starts_launch_latency_after_the_previous_end(launch_ns):
    r = _run(ONE_SM, launch_ns)
    ticks = _launch_ticks(r, launch_ns)
    start, end = np.asarray(r.cta_start_tick), np.asarray(r.cta_end_tick)
    assert np.all(np.asarray(r.cta_sm) == FIRST_SM)
    assert start[0] == 0  # the first wave is not delayed: every slot is usable from tick 0
    np.testing.assert_array_equal(start[1:], end[:-1] + ticks)  # 0 ns: start == previous end


def test_makespan_grows_by_one_latency_per_later_wave():
    base = _run(ONE_SM, 0.0)
    delayed = _run(ONE_SM, 207.0)
    ticks = _launch_ticks(delayed, 207.0)
    assert ticks == 410  # 207 ns at the H200's 1980 MHz tick
    growth = int(delayed.makespan_ticks) - int(base.makespan_ticks)
    # The SM clock is the tick clock, so a CTA's duration does not depend on its start tick.
    assert growth == (N_CTAS - 1) * ticks


@pytest.mark.parametrize("launch_ns", [207.0, 5000.0])
def test_event_skipping_stops_at_the_usable_tick_while_another_sm_runs(launch_ns):
    # Two SMs at different clocks: while one SM's slot waits out the launch latency, the other
    # runs a CTA whose events (DRAM returns) are far apart and rarely on the usable tick.
    r = _run(TWO_SMS, launch_ns, second_sm_mhz=1207.0)
    ticks = _launch_ticks(r, launch_ns)
    chains = _per_sm_chains(r)
    assert len(chains) == 2 and sum(len(s) for s, _ in chains) == N_CTAS
    for start, end in chains:
        assert start[0] == 0
        np.testing.assert_array_equal(start[1:], end[:-1] + ticks)
