"""The ceiling benchmarks run the rules they claim: the on-chip (Pallas) step, in Pallas's
interpreter, equals the dense XLA step of `dense_step_ceiling.py` on the same chips, and with
its extra fields and the chip-wide queue equals its own XLA twin (benchmarks/RESULTS.md,
session 21)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import onchip_step_ceiling  # noqa: E402


@pytest.mark.parametrize("fields, coupled", [(0, False), (2, False), (1, True)])
def test_onchip_step_equals_its_xla_forms(fields: int, coupled: bool) -> None:
    checked = onchip_step_ceiling.check(batch=2, sms=5, steps=40, fields=fields, coupled=coupled)
    assert checked and all(checked.values()), checked
