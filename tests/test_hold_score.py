"""The closed loop's hold score (docs/model.md section 9): a better slot counts 1 plus
`hold_queue` for each later CTA it is expected to finish before the candidate would, against
`hold_left` times the CTAs left. Both engines, the defaults' rule, what the weights change, and
bad values."""

from pathlib import Path

import numpy as np
import pytest

import jaxsched as js
from jaxsched import reference
from jaxsched.errors import JaxschedError
from jaxsched.reference_dispatch.closed_loop import queued

from helpers import simulate_padded

ARCH = js.archio.load(Path(__file__).parents[1] / "sweeps" / "arches" / "h200_8sm.toml")
# 8 unequal SMs, 4 waves of few long CTAs (2 per SM): the tail hold acts
KERNEL = js.make_kernel("loop 24 cta_spread=6\n fma dep\n fma dep\nend", grid=64, threads=512, regs=64)
CLOCKS = js.clocks.gaussian(ARCH, 2, 1.8, 0.2)
WEIGHTS = [(0.0, 1.0), (1.0, 1.0), (0.5, 0.5), (1.0, 2.5), (0.0, 0.0)]


def test_queued_counts_the_ctas_a_slot_finishes_with_the_margin_to_spare():
    # a slot free at 100 with CTAs of 30 ticks, candidate finishing at 200 with margin 10:
    # 100 + k * 30 + 10 < 200 for k = 1, 2 (190 is not < 200 for k = 3: 100 + 90 + 10 = 200)
    assert queued(100, 30, 200, 10) == 2
    assert queued(100, 30, 201, 10) == 3
    assert queued(100, 30, 140, 10) == 0  # 100 + 30 + 10 = 140: not strictly earlier
    assert queued(0, 1, 10**6, 0) == js.policies.HOLD_QUEUE_CTAS  # capped
    assert queued(100, 0, 111, 10) == js.policies.HOLD_QUEUE_CTAS and queued(100, 0, 110, 10) == 0


@pytest.mark.parametrize("dispatch", ["closed_loop", "clock_regression"])
def test_both_engines_hold_alike_under_every_weight(dispatch):
    runs = {}
    for queue, left in WEIGHTS:
        config = dict(dispatch=dispatch, hold_margin=0.0625, hold_queue=queue, hold_left=left)
        fast = simulate_padded(arch=ARCH, kernel=KERNEL, clocks=CLOCKS, **config)
        plain = reference.simulate(ARCH, KERNEL, CLOCKS, **config)
        assert int(fast.makespan_ticks) == int(plain["makespan_ticks"]), (queue, left)
        for field in ("cta_sm", "cta_start_tick", "cta_end_tick"):
            np.testing.assert_array_equal(np.asarray(getattr(fast, field))[:64], np.asarray(plain[field]),
                                          err_msg=f"{field} at {(queue, left)}")
        runs[queue, left] = (int(plain["makespan_ticks"]), tuple(plain["cta_start_tick"]))
    # the weights change decisions: the schedules are not all the default's
    assert len({starts for _, starts in runs.values()}) >= 3, runs
    # holding whenever a better slot exists (hold_left = 0) starts CTAs later than the default
    assert sum(runs[0.0, 0.0][1]) > sum(runs[0.0, 1.0][1])


@pytest.mark.parametrize(("field", "value", "limit"), [
    ("hold_queue", 1.5, "[0, 1]"), ("hold_queue", -0.1, "[0, 1]"), ("hold_left", 4.5, "[0, 4]"),
    ("hold_left", float("nan"), "[0, 4]")])
def test_weights_out_of_range_are_refused_by_name(field, value, limit):
    for run in (js.make_params, reference.simulate):
        with pytest.raises(JaxschedError, match=rf"{field}.*{value!s}.*{limit[1:-1]}"):
            run(ARCH, KERNEL, CLOCKS, dispatch="closed_loop", **{field: value})
