"""The step's loop-boundary tools (engine/materialize.py): `when` only skips work, `once` only
materialises; neither may change a value, alone or under vmap with mixed predicates."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxsched.engine.materialize import once, when


def _bump_where(x, mask):
    """Adds 1 where `mask`: leaves `x` unchanged when nothing is masked, as `when` requires."""
    return x + mask.astype(x.dtype)


def test_when_skips_and_runs():
    x = jnp.arange(6, dtype=jnp.int32)
    mask = jnp.array([0, 1, 0, 1, 0, 0], bool)
    np.testing.assert_array_equal(when(jnp.any(mask), _bump_where, x, mask), x + mask)
    none = jnp.zeros(6, bool)
    np.testing.assert_array_equal(when(jnp.any(none), _bump_where, x, none), x)


def test_when_under_vmap_with_mixed_predicates():
    x = jnp.arange(12, dtype=jnp.int32).reshape(3, 4)
    masks = jnp.array([[0, 0, 0, 0], [1, 0, 1, 0], [0, 0, 0, 1]], bool)
    out = jax.jit(jax.vmap(lambda xi, mi: when(jnp.any(mi), _bump_where, xi, mi)))(x, masks)
    np.testing.assert_array_equal(out, x + masks)


def test_once_returns_its_values_under_vmap():
    a = jnp.arange(8, dtype=jnp.int32).reshape(2, 4)
    out = jax.jit(jax.vmap(lambda ai: once({"double": 2 * ai, "neg": -ai}, jnp.minimum(ai[0] + 1, 1))))(a)
    np.testing.assert_array_equal(out["double"], 2 * a)
    np.testing.assert_array_equal(out["neg"], -a)


def test_once_materialises_through_a_conditional_on_the_cpu():
    """With an unbatched `one` the compiled program keeps the conditional whose outputs are
    the materialised values (a batched one would make it a select: the same values, recomputed
    in every consumer)."""
    a = jnp.arange(8, dtype=jnp.int32).reshape(2, 4)

    def f(x, n):
        one = jnp.minimum(n, 1)
        return jax.vmap(lambda xi: once({"double": 2 * xi}, one)["double"] + xi)(x)

    np.testing.assert_array_equal(jax.jit(f)(a, 5), 3 * a)
    assert " conditional(" in jax.jit(f).lower(a, 5).compile().as_text()
