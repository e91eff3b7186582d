"""Compute small values once rather than once per warp slot that reads them (`once`).

XLA fuses an elementwise producer into each consumer, and a consumer that broadcasts it (a
per-scheduler value read by the 16 warp slots of its scheduler) recomputes the producer's whole
expression per slot. `jax.lax.optimization_barrier` does not stop this: XLA expands it before
fusion. Values that leave a loop or a conditional are materialised, so `once` computes them in
a conditional whose predicate XLA cannot prove (docs/engine_performance.md, "Where the time goes";
a one-trip loop did the same at a few per cent more, "Scatters out of the CPU's loops, the ratio
measured in rounds"). They are computed inside its taken branch: values computed outside and
passed through cost a copy each ("The CPU step's recomputed values, found through a profile
without the per-kernel overhead").

It pays on the CPU only: the GPU's fusions recompute less than the CPU's, and there the
materialising loop cost more than it saved (docs/engine_performance.md, "Per-scheduler issue arithmetic, computed once"
and "Per-scheduler reductions along the minor axis, no 64-bit histogram, CPU chunks"), so on a
GPU `once` returns its values as they are. (Its sibling `when`, a one-trip loop that skipped
work no configuration of a batch needed, is gone: the column pass, `mechanics/columns.py`, skips that work
by its own loop.)
"""

from __future__ import annotations

from typing import Callable, TypeVar

import jax
import jax.numpy as jnp
from jaxtyping import Array, Int

T = TypeVar("T")


def _materialising_pays() -> bool:
    """Whether `once` materialises on this backend: on the CPU only (module docstring)."""
    return jax.default_backend() == "cpu"


def once(values: Callable[[], T], one: Int[Array, ""]) -> T:
    """`values()`, materialised (see the module docstring): computed inside the taken branch of
    a conditional, so that its results are written where the conditional leaves them (values
    computed outside and passed through would be copied there). `one` must be a traced int32
    equal to 1, the caller's proof that the conditional takes that branch, which XLA cannot see.
    It must not vary over an enclosing `vmap` (the step computes it from the whole batch): a
    batched predicate turns the conditional into a select, which gives the same values
    unmaterialised. Off the CPU `values()` is returned as it is (module docstring)."""
    if not _materialising_pays():
        return values()

    def empty() -> T:
        return jax.tree.map(lambda v: jnp.zeros(v.shape, v.dtype), jax.eval_shape(values))

    return jax.lax.cond(one == 1, values, empty)
