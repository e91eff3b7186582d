"""The marked-SM passes of the step (engine/mechanics/columns.py): every marked SM's column is worked on
exactly once, the first `k` of each configuration per pass, in SM order."""

import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxsched.engine.mechanics import columns

_MARKS = st.integers(1, 2).flatmap(
    lambda batch: st.integers(1, 8).flatmap(
        lambda sm: st.lists(st.lists(st.booleans(), min_size=sm, max_size=sm), min_size=batch, max_size=batch)))


@settings(max_examples=30, deadline=None)
@given(marks=_MARKS, k=st.integers(1, 4))
def test_first_marked_are_the_nonzero_indices_in_order(marks, k):
    m = np.array(marks)
    got = np.asarray(columns._first_marked(jnp.asarray(m), k)[0])
    for row, cols in zip(m, got):
        want = np.flatnonzero(row)[:k]
        np.testing.assert_array_equal(cols, np.concatenate([want, np.full(k - len(want), m.shape[1])]))


@settings(max_examples=30, deadline=None)
@given(marks=_MARKS, k=st.integers(1, 4))
def test_every_marked_column_is_worked_on_once(marks, k):
    m = jnp.asarray(np.array(marks))
    x = jnp.zeros((m.shape[0], 2, m.shape[1]), jnp.int32)  # [batch, row, sm]

    def bump(cols, x):
        return columns.put(x, cols, columns.take(x, cols) + 1)

    out = np.asarray(columns.for_marked_sms(m, bump, x, k))
    np.testing.assert_array_equal(out, np.broadcast_to(np.asarray(m, np.int32)[:, None, :], out.shape))
