"""The blocked-interval arithmetic (engine/status.py, engine/mechanics/exact.py) against the model's
per-cycle rules, cycle by cycle on the phase accumulator (docs/model.md sections 2, 7 and 11):
the cycle at which a memory result arrives, and the long scoreboard / short scoreboard / wait
split of a blocked interval, as the reference would count them."""

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxsched.engine.mechanics.exact import floor_div
from jaxsched.engine.status import blocked_split, cycles_in, mem_cycle


def _cycle_ticks(freq: int, tick_mhz: int, acc: int, first_tick: int, n_ticks: int) -> list[int]:
    """The tick of each cycle an SM at `freq` executes in `n_ticks` ticks from tick `first_tick`
    on, with accumulator `acc` before that tick (section 2: acc += f; a cycle when acc >= F, then
    acc -= F)."""
    ticks = []
    for k in range(first_tick, first_tick + n_ticks):
        acc += freq
        if acc >= tick_mhz:
            acc -= tick_mhz
            ticks.append(k)
    return ticks


@given(tick_mhz=st.integers(300, 2000), data=st.data())
@settings(max_examples=200, deadline=None)
def test_cycles_in_counts_the_accumulator_edges(tick_mhz, data):
    freq = data.draw(st.integers(1, tick_mhz))
    acc = data.draw(st.integers(0, tick_mhz - 1))
    n = data.draw(st.one_of(st.integers(0, 3000), st.integers(0, 1 << 30)))
    if n <= 3000:
        want = len(_cycle_ticks(freq, tick_mhz, acc, 0, n))
    else:  # closed form, exact in Python integers
        want = (acc + n * freq) // tick_mhz
    with jax.enable_x64(True):  # as the engine runs
        assert int(cycles_in(np.int32(freq), np.int32(acc), np.int32(tick_mhz), np.int32(n))) == want


@given(tick_mhz=st.integers(300, 2000), data=st.data())
@settings(max_examples=300, deadline=None)
def test_blocked_split_matches_the_per_cycle_reasons(tick_mhz, data):
    """After tick `k` (the SM has executed `cycle` cycles), a warp with the given ready times and
    dependency bit: each of its cycles from `cycle` on gets the model's first-match reason, until
    the first cycle it is ready (an interval spans at most 700 cycles here, which 8 F / f ticks
    per 8 cycles cover)."""
    freq = data.draw(st.integers(max(1, tick_mhz // 8), tick_mhz))
    acc = data.draw(st.integers(0, tick_mhz - 1))
    k = data.draw(st.integers(0, 200))
    cycle = data.draw(st.integers(0, 300))
    dep = data.draw(st.booleans())
    ready_mem = data.draw(st.integers(0, k + 400))
    ready_mio, ready_fixed, ready_fetch = (data.draw(st.integers(0, cycle + 300)) for _ in range(3))
    ticks = _cycle_ticks(freq, tick_mhz, acc, k + 1, 800 * tick_mhz // freq)  # cycle `cycle + i`: ticks[i]
    counts, c = [0, 0, 0], cycle
    while True:
        t = ticks[c - cycle]
        if dep and t < ready_mem:
            counts[0] += 1
        elif dep and c < ready_mio:
            counts[1] += 1
        elif (dep and c < ready_fixed) or c < ready_fetch:
            counts[2] += 1
        else:
            break
        c += 1
    i32 = np.int32
    with jax.enable_x64(True):  # as the engine runs
        # the ready times of what the instruction waits for (status.waited): none without dep
        m = mem_cycle(i32(ready_mem * dep), i32(k), i32(cycle), i32(freq), i32(acc), i32(tick_mhz))
        b = blocked_split(i32(ready_fixed * dep), i32(ready_mio * dep), i32(ready_fetch), m, i32(cycle))
    assert [int(b.long), int(b.short), int(b.wait)] == counts
    assert int(b.wake) == c


@jax.jit
def _floor_div_in_a_loop(n: jax.Array, d: jax.Array) -> jax.Array:
    """floor_div with a loop-invariant divisor, where XLA turns a float division into a
    multiplication by the hoisted reciprocal."""
    return jax.lax.fori_loop(0, 2, lambda i, q: floor_div(n + 0 * i, d), jnp.zeros(n.shape, jnp.int32))


@given(d=st.integers(1, (1 << 21) - 1), data=st.data())
@settings(max_examples=200, deadline=None)
def test_floor_div_through_float64_is_exact(d, data):
    """`exact.floor_div` equals `//` for numerators below 2^53 and quotients below 2^31,
    eagerly and compiled in a loop; multiples of d and their neighbours included, where a
    rounded quotient would cross an integer."""
    q = data.draw(st.lists(st.integers(0, (1 << 31) - 1).filter(lambda q: q * d + d < 1 << 53), min_size=1, max_size=8))
    n = np.array([x * d + data.draw(st.sampled_from([0, 1, d - 1, d // 2])) for x in q], np.int64)
    n = np.minimum(n, (1 << 31) * d - 1)
    with jax.enable_x64(True):
        want = n // d
        np.testing.assert_array_equal(np.asarray(floor_div(n, np.int64(d))), want)
        np.testing.assert_array_equal(np.asarray(_floor_div_in_a_loop(jnp.asarray(n), jnp.int64(d))), want)
