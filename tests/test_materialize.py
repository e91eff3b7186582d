"""`materialize.once` only materialises: it changes no value, under vmap or not, and on the CPU
the compiled program keeps the conditional that materialises, computing the values inside it
(no copy of values passed through)."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxsched.engine.mechanics.materialize import once


def test_once_returns_its_values_under_vmap():
    a = jnp.arange(8, dtype=jnp.int32).reshape(2, 4)
    out = jax.jit(jax.vmap(lambda ai: once(lambda: {"double": 2 * ai, "neg": -ai}, jnp.minimum(ai[0] + 1, 1))))(a)
    np.testing.assert_array_equal(out["double"], 2 * a)
    np.testing.assert_array_equal(out["neg"], -a)


def test_once_materialises_through_a_conditional_on_the_cpu():
    """With an unbatched `one` the compiled program keeps the conditional whose outputs are
    the materialised values (a batched one would make it a select: the same values, recomputed
    in every consumer)."""
    a = jnp.arange(8, dtype=jnp.int32).reshape(2, 4)

    def f(x, n):
        one = jnp.minimum(n, 1)
        return jax.vmap(lambda xi: once(lambda: {"double": 2 * xi}, one)["double"] + xi)(x)

    np.testing.assert_array_equal(jax.jit(f)(a, 5), 3 * a)
    assert " conditional(" in jax.jit(f).lower(a, 5).compile().as_text()


def test_once_computes_inside_the_conditional_without_copies():
    """The values are computed in the taken branch and written where the conditional leaves
    them: values computed outside and passed through would each cost a copy (docs/engine_performance.md,
    "The CPU step's recomputed values, found through a profile without the per-kernel overhead")."""
    a = jnp.arange(8, dtype=jnp.int32).reshape(2, 4)

    def f(x, n):
        one = jnp.minimum(n, 1)
        return jax.vmap(lambda xi: once(lambda: {"double": 2 * xi, "sq": xi * xi}, one)["double"] + xi)(x)

    hlo = jax.jit(f).lower(a, 5).compile().as_text()
    assert " conditional(" in hlo
    assert " copy(" not in hlo
