"""`Params`: one configuration as one pytree; `simulate(params)` and `simulate_batch(stack)` run
what the keyword forms run, bit for bit, and bad fields are refused on construction."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import jaxsched as js

from helpers import small_arch

ARCH = small_arch(4)
KERNEL = js.make_kernel("loop 6 cta_spread=2\n fma dep\n sfu dep\nend", grid=120, threads=256, regs=32)
FIELDS = ("makespan_ticks", "cta_sm", "cta_start_tick", "cta_end_tick", "sm_issued")


def _clocks(seed: int) -> js.Clocks:
    return js.clocks.gaussian(ARCH, seed, 1.6, 0.15)


def _same(a: js.Result, b: js.Result) -> None:
    for field in FIELDS:
        assert np.asarray(getattr(a, field)).tolist() == np.asarray(getattr(b, field)).tolist(), field


def test_defaults_are_resolved_once():
    p = js.make_params(ARCH, KERNEL)
    assert int(p.warp_policy) == js.WARP_POLICIES.index("gto") and int(p.dispatch) == 0
    assert np.asarray(p.dispatch_weight).tolist() == np.asarray(js.clocks.uniform(ARCH).sm_freq_mhz).astype(int).tolist()
    assert int(np.asarray(p.dvfs.mode)) == js.dvfs.MODES.index("off")


@pytest.mark.parametrize("dispatch", ["hardware", "closed_loop", "fastest_first"])
def test_simulate_params_equals_the_keyword_form(dispatch):
    p = js.make_params(ARCH, KERNEL, _clocks(3), dispatch=dispatch, warp_policy="lrr")
    _same(js.simulate(p), js.simulate(ARCH, KERNEL, _clocks(3), dispatch=dispatch, warp_policy="lrr"))


def test_a_stack_of_params_equals_the_batch_of_parts():
    configs = [(1, "hardware", 0.25), (2, "closed_loop", 0.5), (3, "weighted", 0.25)]
    params = [js.make_params(ARCH, KERNEL, _clocks(s), dispatch=d, ema_alpha=a) for s, d, a in configs]
    stacked = js.simulate_batch(js.stack(params))
    parts = js.simulate_batch([ARCH] * 3, [KERNEL] * 3, [_clocks(s) for s, _, _ in configs], np.ones(3, int),
                              np.asarray([js.DISPATCH_POLICIES.index(d) for _, d, _ in configs]), np.zeros(3, int),
                              ema_alpha=[a for _, _, a in configs])
    _same(stacked, parts)
    listed = js.simulate_batch(params)
    assert np.asarray(listed.makespan_ticks).tolist() == np.asarray(stacked.makespan_ticks).tolist()


@pytest.mark.parametrize("change, field", [
    ({"dispatch": "no_such_policy"}, "dispatch"),
    ({"warp_policy": 7}, "warp_policy"),
    ({"dispatch_start": -1}, "dispatch_start"),
    ({"ema_alpha": 1.5}, "ema_alpha"),
    ({"dispatch_weight": np.zeros(3)}, "dispatch_weight"),
])
def test_bad_fields_are_refused_with_their_name(change, field):
    with pytest.raises(js.JaxschedError, match=field):
        js.make_params(ARCH, KERNEL, **change)


def test_a_params_built_directly_is_checked_too():
    p = js.make_params(ARCH, KERNEL)
    with pytest.raises(js.JaxschedError, match="dispatch"):
        js.Params(**{**{f.name: getattr(p, f.name) for f in dataclasses.fields(p)}, "dispatch": np.int32(99)})


def test_params_alone():
    p = js.make_params(ARCH, KERNEL)
    with pytest.raises(js.JaxschedError, match="simulate"):
        js.simulate(p, KERNEL)
    with pytest.raises(js.JaxschedError, match="simulate_batch"):
        js.simulate_batch(p)  # one configuration, not a stack
