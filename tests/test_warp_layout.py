"""The engine's scheduler-major warp-slot layout (engine/slots.py) and the per-warp pass read
from it (engine/status.py): checked against plain numpy on the hardware slot numbering
`w = 4q + j` (scheduler `j`)."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxsched.engine.slots import by_scheduler, hardware_slot, per_warp, q_index
from jaxsched.engine.state import INF
from jaxsched.engine.status import CLS_MIO, CLS_NONE, N_CLASSES, class_counts, ready_counts, scan
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
    grouped = np.asarray(by_scheduler(np.broadcast_to(w[:, None], (w.size, 3)), shapes))  # [sched, q, sm]
    for j in range(schedulers):  # scheduler j's positions hold slots 4q + j, q = 0, 1, ...
        np.testing.assert_array_equal(grouped[j, :, 0], schedulers * np.arange(per_scheduler) + j)
    np.testing.assert_array_equal(np.asarray(q_index(shapes)), w // schedulers)
    value = np.arange(3 * schedulers).reshape(schedulers, 3)
    np.testing.assert_array_equal(np.asarray(per_warp(value, shapes)), value[w % schedulers, :])


@given(st.integers(1, 4), st.integers(1, 31), st.data())
@settings(max_examples=40, deadline=None)
def test_scan_counts_ready_warps_per_class(schedulers, per_scheduler, data):
    """Up to 31 warps of one scheduler (127 slots over 4), all of one class or not: the packed
    per-class counts, the eligible set, the earliest wake and the derived per-SM counts equal
    plain numpy on the hardware numbering."""
    shapes = _shapes(schedulers, per_scheduler)
    n = 3 * shapes.warp_slots
    cycle = np.array([5, 0, 9], np.int32)
    draw = lambda values: np.array(data.draw(st.lists(values, min_size=n, max_size=n)), np.int32)  # noqa: E731
    wake = draw(st.sampled_from([0, 3, 5, 6, 9, 12, int(INF)])).reshape(3, -1)  # [sm, warp] here
    if data.draw(st.booleans()):
        cls = np.full((3, shapes.warp_slots), data.draw(st.integers(0, N_CLASSES - 1)), np.int32)
    else:
        cls = draw(st.integers(0, N_CLASSES - 1)).reshape(3, -1)
    throttle = np.array(data.draw(st.lists(st.integers(0, (1 << CLS_NONE) - 1), min_size=3 * schedulers,
                                           max_size=3 * schedulers)), np.int32).reshape(3, schedulers)
    sc = scan(wake.T, cls.T, throttle.T, cycle, shapes)  # the engine's layout: SMs last
    scheduler = np.asarray(hardware_slot(shapes)) % schedulers
    ready = wake <= cycle[:, None]
    held = (throttle[np.arange(3)[:, None], scheduler[None, :]] >> cls) & 1 > 0
    np.testing.assert_array_equal(np.asarray(sc.eligible).T, ready & ~held)
    counts = np.asarray(class_counts(sc.ready))  # [cls, sched, sm]
    for s in range(3):
        for j in range(schedulers):
            mine = ready[s] & (scheduler == j)
            np.testing.assert_array_equal(counts[:, j, s], np.bincount(cls[s, mine], minlength=N_CLASSES))
    np.testing.assert_array_equal(np.asarray(sc.next_wake), np.where(ready, INF, wake).min(axis=1))
    r = ready_counts(sc.ready, throttle.T)
    np.testing.assert_array_equal(np.asarray(r.eligible), (ready & ~held).sum(axis=1))
    np.testing.assert_array_equal(np.asarray(r.mio_throttle), (ready & held & (cls == CLS_MIO)).sum(axis=1))
    np.testing.assert_array_equal(np.asarray(r.pipe_throttle), (ready & held & (cls < CLS_MIO)).sum(axis=1))
    starved = [sum(not ready[s, scheduler == j].any() for j in range(schedulers)) for s in range(3)]
    np.testing.assert_array_equal(np.asarray(r.starved), starved)
