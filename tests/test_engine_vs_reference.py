"""Differential tests: the JAX engine (event skipping, vectorised) equals the tick-by-tick plain
Python reference exactly, on random chips, kernels, clock maps and policies."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from jaxsched import clocks, reference
from jaxsched.engine.run import MAX_TICKS, simulate_batch
from jaxsched.errors import JaxschedError
from jaxsched.kernel import MAX_DEP_SLOTS, make_kernel, pad_program
from jaxsched.lower import WARP_POLICIES

from helpers import (configurations, examples, MAX_GRID, N_INSTR, simulate_padded, small_arch, STRUCTURED_BRANCHES,
                     STRUCTURED_LOOPS)

INT_KEYS = ("sm_cycles", "sm_busy_cycles", "sm_issued", "sm_issued_op", "sm_active_lanes", "sm_warp_cycles",
            "sm_stalls", "sm_ctas")
CTA_KEYS = ("cta_sm", "cta_start_tick", "cta_end_tick")


def assert_same(result, ref: dict, index: int | None = None) -> None:
    pick = (lambda x: np.asarray(x)) if index is None else (lambda x: np.asarray(x)[index])
    assert int(pick(result.makespan_ticks)) == int(ref["makespan_ticks"])
    for key in INT_KEYS:
        np.testing.assert_array_equal(pick(getattr(result, key)), ref[key], err_msg=key)
    n = len(ref["cta_sm"])
    for key in CTA_KEYS:
        np.testing.assert_array_equal(pick(getattr(result, key))[:n], ref[key], err_msg=key)
    np.testing.assert_allclose(pick(result.makespan_ns), ref["makespan_ns"], rtol=1e-12)


def _run_pair(cfg: dict, max_ticks: int = MAX_TICKS, one_form: bool = False):
    """The reference's run and the engine's; `one_form`: the engine's richest form whatever the
    kernel (fast-forward's search and the structured programs' tables compiled in, exact:
    absent entries are never entered, `_batch_kernel`), so that every example shares one
    compilation."""
    run = dict(cfg, max_ticks=max_ticks)
    if one_form:
        run.update(kernel=_batch_kernel(cfg["kernel"]), fast_forward_step=True)
    try:
        ref = reference.simulate(**cfg)
    except JaxschedError:
        with pytest.raises(JaxschedError):
            simulate_padded(**run)
        return None, None
    return simulate_padded(**run), ref


@settings(max_examples=examples(75, fixed=45), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configurations())
def test_engine_equals_reference(cfg: dict) -> None:
    result, ref = _run_pair(cfg)
    event("rejected launch" if ref is None else "simulated")
    if ref is None:
        return
    event(f"makespan >= {10 ** int(np.log10(ref['makespan_ticks']))} ticks")
    assert_same(result, ref)
    # Invariants of the model on top of equality.
    n_ctas = int(cfg["kernel"].grid_ctas)
    assert np.sum(result.sm_ctas) == n_ctas
    assert sorted(np.asarray(result.cta_sm)[:n_ctas] >= 0) == [True] * n_ctas
    assert np.all(np.asarray(result.cta_end_tick)[:n_ctas] >= np.asarray(result.cta_start_tick)[:n_ctas])
    stalls = np.asarray(result.sm_stalls)
    np.testing.assert_array_equal(stalls.sum(axis=1), np.asarray(result.sm_warp_cycles))
    np.testing.assert_array_equal(stalls[:, 0], np.asarray(result.sm_issued))


_BATCH = 4


def _batch_statics(members: list[dict]) -> dict:
    """The batch's static choices, every one at the most the strategies draw, so that one
    compilation serves every example (three or four before: fast-forward, the loop tables, the
    data tables and the dependence slots followed the draws). It is the richest form of the
    engine: fast-forward's search, the structured programs' loop and branch tables, data
    tables and every dependence slot compiled in; test_engine_equals_reference covers the
    others."""
    return dict(closed_loop_step=True, fast_forward_step=True, data_tables=True, dep_slots=MAX_DEP_SLOTS,
                cta_slots=int(members[0]["arch"].max_blocks_per_sm), max_ctas=MAX_GRID)


def _batch_kernel(kernel):
    """`kernel` with its loop and branch tables as long as the structured programs' (exact:
    absent entries are never entered)."""
    return pad_program(kernel, N_INSTR, STRUCTURED_LOOPS, STRUCTURED_BRANCHES)


@settings(max_examples=examples(4), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfgs=st.lists(configurations(), min_size=2, max_size=_BATCH))
def test_batch_equals_single(cfgs: list[dict]) -> None:
    """A batch gives each member exactly what it gets alone (and what the reference gets). The
    batch always has `_BATCH` members (the launchable configurations, then copies of the first)
    and the largest static sizes the strategies draw (`_batch_statics`), so that one
    compilation serves every example."""
    from jaxsched.lower import DISPATCH_POLICIES, WARP_POLICIES

    good = []
    for cfg in cfgs:
        try:
            good.append((cfg, reference.simulate(**cfg)))
        except JaxschedError:
            pass
    if not good:
        return
    members = [c for c, _ in good] + [good[0][0]] * (_BATCH - len(good))
    batch = simulate_batch(
        [c["arch"] for c in members],
        [_batch_kernel(c["kernel"]) for c in members],
        [c["clocks"] for c in members],
        [WARP_POLICIES.index(c["warp_policy"]) for c in members],
        [DISPATCH_POLICIES.index(c["dispatch"]) for c in members],
        [c["dispatch_start"] for c in members],
        dispatch_weight=[c["dispatch_weight"] for c in members],
        ema_alpha=[c["ema_alpha"] for c in members],
        ema_prior_ns=[c["ema_prior_ns"] for c in members],
        hold_margin=[c["hold_margin"] for c in members],
        hold_noise=[c["hold_noise"] for c in members],
        hold_queue=[c["hold_queue"] for c in members],
        hold_left=[c["hold_left"] for c in members],
        **_batch_statics(members),
    )
    refs = [ref for _, ref in good] + [good[0][1]] * (_BATCH - len(good))
    for i, ref in enumerate(refs):
        assert_same(batch, ref, index=i)


# A compiled engine keeps the forms it was traced with, and the tick limit keys its compilation:
# the GPU's forms compile under a limit no other test uses (rather than clearing the caches, which
# made every later test of the worker compile again).
_GPU_FORMS_MAX_TICKS = MAX_TICKS - 1


@pytest.fixture
def gpu_forms(monkeypatch):
    """The forms the step uses off the CPU (`mechanics.forms.gpu_forms`: the issuing warps' write-back by
    scatter, the chained minimum) on this CPU, for runs at `_GPU_FORMS_MAX_TICKS`."""
    from jaxsched.engine.mechanics import forms

    monkeypatch.setattr(forms, "gpu_forms", lambda: True)


@settings(max_examples=examples(5), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])  # set once for all
@given(cfg=configurations())
def test_gpu_forms_equal_reference(gpu_forms, cfg: dict) -> None:
    """The forms the engine uses off the CPU give the reference's results too, so a CPU run of
    the suite checks the GPU's path (the H200 runs it; docs/engine_performance.md, "The H200's step, kernel by
    kernel"). The GPU's forms are in the step of every form of the engine (fast-forward's or
    not, one loop or the structured programs' tables), and test_engine_equals_reference meets
    each of those forms against the reference: here all examples run the richest form, one
    compilation (three before, 10-15 s of CPU each)."""
    result, ref = _run_pair(cfg, _GPU_FORMS_MAX_TICKS, one_form=True)
    if ref is not None:
        assert_same(result, ref)


# About four makespans of the kernel below (6,179-6,303 ticks by policy): one limit, so that the
# three policies share a compilation (the limit keys it).
_FULL_SLOTS_MAX_TICKS = 25_000


@pytest.mark.parametrize("warp_policy", ["lrr", "gto", "oldest"])
def test_gpu_forms_equal_reference_with_every_warp_slot_full(gpu_forms, warp_policy: str) -> None:
    """Two 1024-thread CTAs per SM fill all 64 warp slots, so every scheduler chooses among 16
    warps: the drawn configurations above rarely fill the last slots of a scheduler. A tick
    limit turns a warp that is never chosen into a failure, not a hang."""
    arch = small_arch(1)
    kernel = make_kernel("loop 6 cta_spread=2\n ldg bytes=128\n fma dep\n fma\nend\n", grid=8, threads=1024)
    freq = clocks.from_array(arch, np.linspace(1600, 1980, arch.n_sm_slots))
    ref = reference.simulate(arch, kernel, freq, warp_policy=warp_policy)
    assert np.max(ref["sm_warp_cycles"]) > 32 * np.max(ref["sm_busy_cycles"])  # mostly full
    batch = simulate_batch([arch], [kernel], [freq], [WARP_POLICIES.index(warp_policy)], [0], [0],
                           max_ticks=_FULL_SLOTS_MAX_TICKS)
    assert bool(batch.completed[0])
    assert_same(batch, ref, index=0)
