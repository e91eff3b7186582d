"""No way around the checks: a value set after construction (`replace`, `eqx.tree_at`, a module
built directly) meets the same checks as the constructors, where the module is built and again
where the configuration enters the engine, and the engine's loop never spins.

Every case must raise `JaxschedError` naming the field before anything compiles; a missing check
would instead run the engine (and fail the test by returning a result).
"""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jaxsched as js
from jaxsched import archio
from jaxsched import dvfs as dvfs_mod
from jaxsched.engine.run import simulate_batch
from jaxsched.kernel import load_kernel

from helpers import small_arch

ARCH = small_arch(4)
KERNEL = js.make_kernel("loop 4\n fma dep\n lds\nend\nif 0.5\n fma\nelse\n alu\nend", grid=4, threads=64)
CLOCKS = js.clocks.uniform(ARCH)
DVFS = dvfs_mod.default(ARCH)


def _raises(fn, field: str) -> js.JaxschedError:
    with pytest.raises(js.JaxschedError) as info:
        fn()
    assert field in info.value.field, f"{info.value} does not name {field}"
    assert "\n" not in str(info.value)
    return info.value


# --------------------------------------------------------------------------- the reported cases


@pytest.mark.parametrize("field, value", [("l2_hit_rate", np.float32(np.nan)), ("l2_hit_rate", np.float32(1.5)),
                                          ("l2_hit_rate", np.float32(-1.0)), ("trips", np.int32(-5)),
                                          ("branch_if_probability", np.float32(np.nan)),
                                          ("trips", np.int64(3_000_000_000))])
def test_kernel_values_set_after_construction(field, value):
    """Through `replace` the module's own check raises; through `eqx.tree_at`, which skips it,
    the check where the configuration enters the engine does."""
    _raises(lambda: KERNEL.replace(**{field: value}), f"kernel.{field}")
    bypassed = eqx.tree_at(lambda k: getattr(k, field), KERNEL, value)
    _raises(lambda: js.simulate(ARCH, bypassed, CLOCKS), f"kernel.{field}")


def test_zero_clocks_never_reach_the_loop():
    """`js.Clocks(zeros)` once hung `js.simulate`; now the entry check names the clock."""
    zeros = js.Clocks(sm_freq_mhz=np.zeros(ARCH.n_sm_slots, np.int32))
    err = _raises(lambda: js.simulate(ARCH, KERNEL, zeros), "clocks.sm_freq_mhz")
    assert "1 .. 10000 MHz" in err.limit
    _raises(lambda: js.Clocks(sm_freq_mhz=np.full(ARCH.n_sm_slots, -3, np.int32)), "clocks.sm_freq_mhz")
    _raises(lambda: js.Clocks(sm_freq_mhz=np.full(ARCH.n_sm_slots, 1.5e3)), "clocks.sm_freq_mhz")


@pytest.mark.parametrize("seed", [-1, 1.5, True])
def test_gaussian_clock_seed_is_a_non_negative_integer(seed):
    err = _raises(lambda: js.clocks.gaussian(ARCH, seed, 1.8, 0.05), "seed")
    assert "an integer >= 0" in err.limit


def test_numpy_clock_is_a_clock():
    assert int(js.clocks.uniform(ARCH, np.float32(1.5)).sm_freq_mhz.max()) == 1500


def test_clock_map_of_the_wrong_length_names_both_lengths():
    """Clocks for a 144-slot die on an 8-slot chip: the error says which lengths are accepted and
    what each means; a map per enabled SM is accepted."""
    big = js.clocks.uniform(js.presets.get("h200"))
    err = _raises(lambda: js.simulate(ARCH, KERNEL, big), "clocks.sm_freq_mhz")
    assert "144" in str(err) and f"{ARCH.n_sm_slots}" in err.limit and f"{ARCH.sm_count}" in err.limit
    err = _raises(lambda: js.clocks.from_array(ARCH, np.full(144, 1800.0)), "sm_freq_mhz")
    assert f"{ARCH.n_sm_slots} (one per SM slot" in err.limit and f"{ARCH.sm_count} (one per enabled SM" in err.limit
    per_enabled = js.clocks.from_array(ARCH, np.arange(ARCH.sm_count) + 1500.0)
    expected = np.zeros(ARCH.n_sm_slots, np.int32)
    expected[np.asarray(ARCH.sm_enabled)] = np.arange(ARCH.sm_count) + 1500
    np.testing.assert_array_equal(per_enabled.sm_freq_mhz, expected)


def test_batch_names_the_bad_configuration():
    good = KERNEL
    bad = eqx.tree_at(lambda k: k.l2_hit_rate, KERNEL, np.float32(np.nan))
    err = _raises(lambda: simulate_batch([ARCH] * 3, [good, good, bad], [CLOCKS] * 3, [1] * 3, [0] * 3, [0] * 3),
                  "kernel.l2_hit_rate")
    assert err.field.startswith("configuration 2:")
    bad_dvfs = eqx.tree_at(lambda d: d.period_us, DVFS, np.float32(np.inf))
    err = _raises(lambda: simulate_batch([ARCH] * 2, [good] * 2, [CLOCKS] * 2, [1] * 2, [0] * 2, [0] * 2,
                                         dvfs=[None, bad_dvfs]), "dvfs.period_us")
    assert err.field.startswith("configuration 1:")


def test_stacked_kernels_are_checked_per_configuration():
    stacked = js.stack([KERNEL, KERNEL, KERNEL])
    bad = eqx.tree_at(lambda k: k.trips, stacked, np.asarray([[4], [4], [-1]], np.int32))
    err = _raises(lambda: js.kernel.validate_kernel(bad), "kernel.trips")
    assert err.field == "configuration 2: kernel.trips[0]" and err.value == -1


def test_traced_values_get_a_runtime_error():
    """Inside a user's own `jit` the concrete checks cannot see the values; the engine's guard
    raises at run time instead of returning numbers."""
    from jaxsched.engine.configure import guarded
    from jaxsched.lower import lower

    @jax.jit
    def tick(hit):
        kernel = KERNEL.replace(l2_hit_rate=hit)
        return guarded(lower(ARCH, kernel, CLOCKS, 1, 0, 0), (kernel,)).clocks.tick_mhz

    assert int(tick(jnp.float32(0.5))) == int(CLOCKS.sm_freq_mhz.max())
    with pytest.raises(Exception, match="l2_hit_rate"):
        jax.block_until_ready(tick(jnp.float32(jnp.nan)))


def test_max_ticks_is_checked_and_bounds_the_loop():
    _raises(lambda: js.simulate(ARCH, KERNEL, CLOCKS, max_ticks=0), "max_ticks")
    _raises(lambda: js.simulate(ARCH, KERNEL, CLOCKS, max_ticks=2**40), "max_ticks")
    err = _raises(lambda: js.simulate(ARCH, KERNEL, CLOCKS, max_ticks=5), "max_ticks")
    assert "did not finish" in err.limit


# --------------------------------------------------------------------------- every field, at random

_BAD = [np.nan, np.inf, -np.inf, -1e30, 1e30, -(2**40), 2**40]


def _leaf_fields(module: eqx.Module) -> list[str]:
    return [f.name for f in dataclasses.fields(module) if not f.metadata.get("static")
            and getattr(module, f.name) is not None]


def _with_bad(value: np.ndarray, bad: float, element: int) -> np.ndarray:
    """`value` with one element (or the scalar) set to `bad`: int64 for an integer field given
    an integer out of range, else float64 (a float in an integer or boolean field is bad too)."""
    a = np.asarray(value)
    out = a.astype(np.int64 if a.dtype.kind in "iu" and abs(bad) == 2**40 else np.float64)
    out.reshape(-1)[element % max(out.size, 1)] = bad
    return out


_MODULES = {"arch": ARCH, "kernel": KERNEL, "clocks": CLOCKS, "dvfs": DVFS}


def _run(arch=ARCH, kernel=KERNEL, clocks=CLOCKS, dvfs=DVFS):
    return js.simulate(arch, kernel, clocks, dvfs=dvfs)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_field_refuses_bad_values(data):
    """A random field of a valid configuration (architecture, kernel, clocks, DVFS, a workload's
    overheads and kernels) set to NaN, an infinity, or a value far out of range, through
    `replace` and through `eqx.tree_at`: a `JaxschedError` naming that field, never a result."""
    which = data.draw(st.sampled_from(sorted(_MODULES) + ["workload"]))
    bad = data.draw(st.sampled_from(_BAD))
    element = data.draw(st.integers(0, 10_000))
    if which == "workload":
        field = data.draw(st.sampled_from(["launch_api_ns", "launch_gap_ns", "kernel.l2_hit_rate", "kernel.trips"]))
        if field.startswith("kernel."):
            name = field.split(".")[1]
            kernel = eqx.tree_at(lambda k: getattr(k, name), KERNEL, _with_bad(getattr(KERNEL, name), bad, element))
            workload = js.make_workload([KERNEL, kernel], streams=[0, 1])
            _raises(lambda: js.simulate(ARCH, workload, CLOCKS), field)
            return
        workload = js.make_workload([KERNEL, KERNEL], streams=[0, 1], **{field: 100.0})
        _raises(lambda: dataclasses.replace(workload, **{field: np.float32(bad)}), f"workload.{field}")
        bypassed = eqx.tree_at(lambda w: getattr(w, field), workload, np.float32(bad))
        _raises(lambda: js.simulate(ARCH, bypassed, CLOCKS), f"workload.{field}")
        return
    module = _MODULES[which]
    field = data.draw(st.sampled_from(_leaf_fields(module)))
    value = _with_bad(getattr(module, field), bad, element)
    _raises(lambda: module.replace(**{field: value}), field)
    bypassed = eqx.tree_at(lambda m: getattr(m, field), module, value)
    _raises(lambda: _run(**{which: bypassed}), field)


@pytest.mark.parametrize("field, index", [("warp_policy", 3), ("dispatch", 4), ("dispatch_start", 5)])
@pytest.mark.parametrize("value", [10**22, 1e22, -1, 2.0])
def test_batch_policy_indices_fit_int32(field, index, value):
    """A batch's per-configuration integers are checked before the cast to int32 that would
    overflow (a traceback) or wrap (a different policy or SM order)."""
    args = [[ARCH], [KERNEL], [CLOCKS], [0], [0], [0]]
    args[index] = [value]
    _raises(lambda: simulate_batch(*args), field)


def test_arch_and_kernel_files_name_the_field_and_file(tmp_path):
    """TOML integers past int32 name their field (not "bad value"), and a kernel file's bad
    value names the file."""
    arch_file = tmp_path / "arch.toml"
    arch_file.write_text(archio.dumps(js.presets.get("h200")).replace(
        "max_blocks_per_sm = 32", "max_blocks_per_sm = 10000000000000000000000"))
    error = _raises(lambda: archio.load(arch_file), "limits.max_blocks_per_sm")
    assert str(arch_file) in error.field
    kernel_file = tmp_path / "kernel.toml"
    kernel_file.write_text('[kernel]\ngrid = 4\nthreads = 64\nprogram = "loop 3000000000\\n fma dep\\nend"\n')
    error = _raises(lambda: load_kernel(kernel_file), "kernel.program")
    assert str(kernel_file) in error.field
