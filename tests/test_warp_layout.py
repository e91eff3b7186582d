"""The engine's scheduler-major warp-slot layout (engine/slots.py) and the packed stall-reason
histogram read from it (engine/status.py): checked against plain numpy on the hardware slot
numbering `w = 4q + j` (scheduler `j`)."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxsched.engine.launch_credit import starved_schedulers
from jaxsched.engine.slots import by_scheduler, hardware_slot, per_warp, q_index
from jaxsched.engine.status import MIO_THROTTLE, NOT_SELECTED, PIPE_THROTTLE, per_sm_counts, reason_histogram
from jaxsched.lower import Shapes


def _shapes(schedulers: int, per_scheduler: int) -> Shapes:
    return Shapes(n_sm=3, warp_slots=schedulers * per_scheduler, cta_slots=1, schedulers=schedulers, n_instr=1,
                  max_ctas=1)


@given(st.integers(1, 4), st.integers(1, 24))
@settings(max_examples=30, deadline=None)
def test_positions_hold_each_hardware_slot_once_on_its_scheduler(schedulers, per_scheduler):
    shapes = _shapes(schedulers, per_scheduler)
    w = np.asarray(hardware_slot(shapes))
    assert sorted(w) == list(range(shapes.warp_slots))
    grouped = np.asarray(by_scheduler(np.broadcast_to(w, (3, w.size)), shapes))
    for j in range(schedulers):  # scheduler j's positions hold slots 4q + j, q = 0, 1, ...
        np.testing.assert_array_equal(grouped[0, j], schedulers * np.arange(per_scheduler) + j)
    np.testing.assert_array_equal(np.asarray(q_index(shapes)), w // schedulers)
    value = np.arange(3 * schedulers).reshape(3, schedulers)
    np.testing.assert_array_equal(np.asarray(per_warp(value, shapes)), value[:, w % schedulers])


@given(st.integers(1, 4), st.integers(1, 40), st.data())
@settings(max_examples=40, deadline=None)
def test_histogram_counts_every_reason_without_overflow(schedulers, per_scheduler, data):
    """Reasons -1 (no warp) and 1..7 as a status gives them; up to 40 warps per scheduler share
    one reason, beyond what a 4-bit counter holds, so a scheduler needs several words."""
    shapes = _shapes(schedulers, per_scheduler)
    choices = st.sampled_from([-1, 1, 2, 3, 4, 5, 6, 7])
    if data.draw(st.booleans()):  # every warp of the SM holds one reason
        reason = np.full((3, shapes.warp_slots), data.draw(choices))
    else:
        reason = np.array(data.draw(st.lists(choices, min_size=3 * shapes.warp_slots,
                                             max_size=3 * shapes.warp_slots))).reshape(3, -1)
    hist = reason_histogram(reason, shapes)
    want = np.stack([np.bincount(row[row >= 0], minlength=8) for row in reason])
    np.testing.assert_array_equal(np.asarray(per_sm_counts(hist)), want)
    busy = np.isin(reason, [NOT_SELECTED, MIO_THROTTLE, PIPE_THROTTLE])
    scheduler = np.asarray(hardware_slot(shapes)) % schedulers
    idle = [sum(not busy[s, scheduler == j].any() for j in range(schedulers)) for s in range(3)]
    np.testing.assert_array_equal(np.asarray(starved_schedulers(hist)), idle)
