"""Checks done once per value (`jaxsched.once`): the same object, unchanged, is not checked again;
one rebuilt around the checks or changed in place is."""

from __future__ import annotations

import equinox as eqx
import numpy as np
import pytest

import jaxsched as js
from jaxsched import archvalues
from jaxsched.params import checked

ARCH = js.presets.get("h200")
KERNEL = js.make_kernel("loop 4\n  fma dep\nend", grid=132, threads=128)


def _fresh_arch():
    """An arch whose `regs_per_sm` is a writeable array of its own."""
    return eqx.tree_at(lambda a: a.regs_per_sm, ARCH, np.array(int(ARCH.regs_per_sm), np.int32))


def test_an_unchanged_arch_is_checked_once(monkeypatch):
    arch = _fresh_arch()
    archvalues.validate(arch)
    calls = []
    real = archvalues._validate
    monkeypatch.setattr(archvalues, "_validate", lambda a: calls.append(a) or real(a))
    archvalues.validate(arch)
    js.make_params(arch, KERNEL)
    assert calls == []


def test_an_arch_changed_in_place_is_checked_again():
    arch = _fresh_arch()
    archvalues.validate(arch)
    arch.regs_per_sm[...] = -5
    with pytest.raises(js.JaxschedError, match="regs_per_sm = -5"):
        archvalues.validate(arch)
    with pytest.raises(js.JaxschedError, match="regs_per_sm = -5"):
        js.simulate(arch, KERNEL)


def test_an_arch_rebuilt_around_its_check_is_checked():
    bad = eqx.tree_at(lambda a: a.regs_per_sm, _fresh_arch(), np.int32(-5))
    with pytest.raises(js.JaxschedError, match="regs_per_sm = -5"):
        js.make_params(bad, KERNEL)


def test_params_changed_in_place_anywhere_inside_are_checked_again():
    params = js.make_params(_fresh_arch(), KERNEL)
    assert checked(params) is params
    params.clocks.sm_freq_mhz[3] = 0
    with pytest.raises(js.JaxschedError, match=r"clocks.sm_freq_mhz\[3\] = 0"):
        checked(params)
    with pytest.raises(js.JaxschedError, match=r"clocks.sm_freq_mhz\[3\] = 0"):
        js.simulate_batch([params])


def test_a_kernel_changed_in_place_is_checked_again():
    kernel = js.make_kernel("loop 4\n  fma dep\nend", grid=132, threads=128)
    js.make_params(ARCH, kernel)
    kernel.trips[...] = -1
    with pytest.raises(js.JaxschedError, match="trips"):
        js.simulate(ARCH, kernel)
