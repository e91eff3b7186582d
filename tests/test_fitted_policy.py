"""A fitted dispatch policy's file (`jaxsched.fitted_policy`) and a sweep's `dispatch = "fitted"`:
the file's policy and parameters run exactly as the same values written into the spec, and the
ways to get it wrong are refused by name."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import tiny_sweep_spec

import jaxsched as js
from jaxsched import fitted_policy, reference, sweep
from jaxsched.sweep import store

POLICY = fitted_policy.dumps("closed_loop", {"ema_alpha": 0.5, "ema_prior_ns": 0.0, "hold_margin": 0.0625},
                             "a test policy")


def _spec(grid: str, policy: str = 'fitted = "fit/policy.toml"\n') -> str:
    return tiny_sweep_spec("fitted", 4, grid).replace("[grid]", f"[policy]\n{policy}\n[grid]")


@pytest.fixture
def spec_dir(tmp_path):
    (tmp_path / "fit").mkdir()
    (tmp_path / "fit" / "policy.toml").write_text(POLICY)
    return tmp_path


def test_the_file_reads_back_what_was_written():
    got = fitted_policy.loads(POLICY, "p.toml")
    assert got.dispatch == "closed_loop"
    assert got.values == {"ema_alpha": 0.5, "ema_prior_ns": 0.0, "hold_margin": 0.0625, "hold_noise": 0.0,
                          "hold_queue": 0.0, "hold_left": 1.0}


@pytest.mark.parametrize("old, new, field", [
    ('dispatch = "closed_loop"', 'dispatch = "fitted"', "policy.dispatch"),
    ('dispatch = "closed_loop"', 'dispatch = "fastest"', "policy.dispatch"),
    ("hold_margin = 0.0625", "hold_margin = 1.5", "policy.hold_margin = 1.5"),
    ("ema_alpha = 0.5", "ema_alpha = -0.1", "policy.ema_alpha"),
    ("ema_alpha = 0.5", "alpha = 0.5", "policy.alpha"),
    ("[policy]", "[policies]", "one \\[policy\\] table"),
])
def test_bad_files_are_refused_by_field(old, new, field):
    with pytest.raises(js.JaxschedError, match=field):
        fitted_policy.loads(POLICY.replace(old, new), "p.toml")


def test_fitted_runs_the_files_policy_bit_for_bit(spec_dir):
    """`dispatch = "fitted"` gives what the same policy and parameters written into the spec give."""
    fitted = sweep.loads(_spec('"policy.dispatch" = ["hardware", "fitted"]\n"clocks.sigma" = [0.2]\n'),
                         base_dir=spec_dir)
    assert fitted.fitted is not None and sweep.uses_closed_loop(fitted)
    written = sweep.loads(_spec('"policy.dispatch" = ["hardware", "closed_loop"]\n"clocks.sigma" = [0.2]\n',
                                policy="ema_alpha = 0.5\nhold_margin = 0.0625\n"))
    a, b = sweep.run(fitted), sweep.run(written)
    assert list(a["policy_dispatch"].values) == ["hardware", "fitted"]
    np.testing.assert_array_equal(a["makespan_ns"].values, b["makespan_ns"].values)
    assert a.attrs["fitted_policy"] == POLICY
    configs = list(sweep.configurations(fitted))
    closed = js.DISPATCH_POLICIES.index("closed_loop")
    assert {float(c.params.hold_margin) for c in configs if int(c.params.dispatch) == closed} == {0.0625}


def test_a_parameter_the_file_leaves_out_is_jaxscheds_default_not_the_specs(spec_dir):
    (spec_dir / "fit" / "policy.toml").write_text('[policy]\ndispatch = "closed_loop"\nema_alpha = 0.5\n')
    spec = sweep.loads(_spec('"policy.dispatch" = ["fitted", "closed_loop"]\n', policy='fitted = "fit/policy.toml"\n'
                             "hold_margin = 0.5\n"), base_dir=spec_dir)
    margins = {c.index[0]: float(c.params.hold_margin) for c in sweep.configurations(spec)}
    assert margins == {0: js.policies.DEFAULT_HOLD_MARGIN, 1: 0.5}


def test_the_fingerprint_follows_the_files_content(spec_dir):
    """A resumed store refuses a fitted policy whose file changed since it was made."""
    text = _spec('"policy.dispatch" = ["fitted"]\n')
    before = store.fingerprint(sweep.loads(text, base_dir=spec_dir))
    (spec_dir / "fit" / "policy.toml").write_text(POLICY.replace("0.0625", "0.125"))
    assert store.fingerprint(sweep.loads(text, base_dir=spec_dir)) != before


@pytest.mark.parametrize("grid, policy, field", [
    ('"policy.dispatch" = ["fitted"]\n', "", "policy.fitted"),
    ('"policy.dispatch" = ["fitted"]\n"policy.hold_margin" = [0.0, 0.5]\n', 'fitted = "fit/policy.toml"\n',
     "policy.hold_margin"),
    ('"policy.dispatch" = ["fitted"]\n', 'fitted = "fit/missing.toml"\n', "missing.toml"),
    ('"policy.dispatch" = ["fitted"]\n', "fitted = 3\n", "policy.fitted = 3"),
])
def test_a_fitted_sweep_without_its_file_or_with_swept_parameters_is_refused(spec_dir, grid, policy, field):
    with pytest.raises(js.JaxschedError, match=field):
        sweep.loads(_spec(grid, policy), base_dir=spec_dir)


def test_the_hold_margin_is_checked_where_it_enters():
    kernel = js.make_kernel("loop 2\n fma dep\nend", grid=8, threads=64)
    with pytest.raises(js.JaxschedError, match="hold_margin = 2.0"):
        js.simulate(js.presets.get("h200"), kernel, dispatch="closed_loop", hold_margin=2.0)
    with pytest.raises(js.JaxschedError, match="hold_margin"):
        reference.simulate(js.presets.get("h200"), kernel, dispatch="closed_loop", hold_margin=-0.5)
