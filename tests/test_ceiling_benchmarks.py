"""The ceiling benchmarks run the rules they claim: the on-chip (Pallas) step, in Pallas's
interpreter, equals the dense XLA step of `dense_step_ceiling.py` on the same chips, and with
its extra fields, the chip-wide queue and its SMs split into column groups equals its own XLA twin (docs/engine_performance.md,
"The ceiling of a step that keeps the warp state on chip (`experiments/onchip_step_ceiling.py`)")."""

from __future__ import annotations

import numpy as np
import pytest

import onchip_step_ceiling  # experiments/, on pytest's pythonpath (pyproject.toml)


@pytest.mark.parametrize("fields, coupled, split", [(0, False, False), (0, False, True), (2, False, False),
                                                    (1, True, True)])
def test_onchip_step_equals_its_xla_forms(fields: int, coupled: bool, split: bool) -> None:
    checked = onchip_step_ceiling.check(batch=2, sms=5, steps=40, fields=fields, coupled=coupled, split=split)
    assert checked and all(checked.values()), checked


def test_column_groups_split_the_sms_without_padding() -> None:
    assert onchip_step_ceiling.column_groups(132, split=True) == [128, 4]
    assert onchip_step_ceiling.column_groups(132, split=False) == [256]


def test_the_chip_queue_is_the_same_in_column_groups() -> None:
    """The queue's (SM, scheduler) order runs across the groups as across one block."""
    split = onchip_step_ceiling.twin(2, 7, 60, 1, coupled=True, split=True)()
    whole = onchip_step_ceiling.twin(2, 7, 60, 1, coupled=True, split=False)()
    assert np.array_equal(split[0], whole[0])
