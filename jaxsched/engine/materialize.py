"""Two loop-boundary tools for the step: skip work no configuration needs, and compute small
values once rather than once per warp slot that reads them.

`lax.cond` under `vmap` becomes a `select` that runs both branches for every configuration.
A `while_loop` of at most one trip keeps the skip: batched, it runs while *any* configuration
still needs its trip, so a step where none does costs only the test (`when`).

XLA fuses an elementwise producer into each consumer, and a consumer that broadcasts it (a
per-scheduler value read by the 16 warp slots of its scheduler) recomputes the producer's whole
expression per slot. `jax.lax.optimization_barrier` does not stop this: XLA expands it before
fusion. Values that leave a loop or a conditional are materialised, so `once` returns them from
a conditional whose predicate XLA cannot prove (benchmarks/RESULTS.md, "Where the time goes";
a one-trip loop did the same at a few per cent more, session 15).

Both tools pay on the CPU only. On a GPU the loops' carry copies cost more than they save: in
the large batches a GPU runs, some configuration nearly always needs `when`'s work, and the
GPU's fusions recompute less than the CPU's (RESULTS.md, sessions 9 and 10). There both
compute directly.
"""

from __future__ import annotations

from typing import Callable, TypeVar

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

T = TypeVar("T")


def _loops_pay() -> bool:
    """Whether the loop forms pay on this backend: on the CPU only (module docstring)."""
    return jax.default_backend() == "cpu"


def when(pred: Bool[Array, ""], fn: Callable[..., T], x: T, *args) -> T:
    """`fn(x, *args)`, where `fn` must return `x` unchanged when `pred` is false: this only
    skips work. On CPU, `fn` runs (for all) only if some configuration's `pred` holds. XLA
    hoists what does not depend on the loop out of it (and would then run it every time), so
    `args` reach `fn` tied to the loop's trip flag: pass the small arrays the expensive part
    is computed from. Off the CPU `fn` always runs (module docstring)."""
    if not _loops_pay():
        return fn(x, *args)

    def body(carry: tuple[Array, T]) -> tuple[Array, T]:
        tripped, value = carry
        tied = jax.tree.map(lambda a: jnp.where(tripped, jnp.zeros_like(a), a), args)
        return jnp.bool_(True), fn(value, *tied)

    return jax.lax.while_loop(lambda carry: pred & ~carry[0], body, (jnp.bool_(False), x))[1]


def once(values: T, one: Int[Array, ""]) -> T:
    """`values`, materialised (see the module docstring). `one` must be a traced int32 equal to
    1, the caller's proof that the conditional takes its first branch, which XLA cannot see. It
    must not vary over an enclosing `vmap` (the step computes it from the whole batch): a batched
    predicate turns the conditional into a select, which gives the same values unmaterialised.
    Off the CPU `values` are returned as they are (module docstring)."""
    if not _loops_pay():
        return values

    empty = jax.tree.map(lambda v: jnp.zeros(v.shape, v.dtype), values)
    return jax.lax.cond(one == 1, lambda: values, lambda: empty)
