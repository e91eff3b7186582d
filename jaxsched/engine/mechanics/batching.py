"""How a batch of configurations is cut for the devices that run it: chunks of a size that keeps
a CPU step's arrays in cache (`default_chunk`), padding to a multiple of the chunk or of the
devices (`padded_batch`), and the chunks run one `lax.map` step each (`chunked`)."""

from __future__ import annotations

from typing import Callable, TypeVar

import jax
import jax.numpy as jnp

from ...lower import Shapes
from ..result import Result

Batch = TypeVar("Batch")  # a pytree with a leading configuration axis on every leaf

# Configurations x SM slots x warp slots per vmapped chunk on each CPU device (one per core): a
# step reads and writes some thirty [configuration, SM, warp] arrays, and past the core's own
# cache the CPU waits on memory. One H200 configuration keeps them within a 2 MiB L2; a batch
# also waits on its slowest member. An 8-SM chip runs 18 at a time, where per-kernel overheads
# weigh more (docs/engine_performance.md, "Per-scheduler reductions along the minor axis, no 64-bit histogram,
# CPU chunks" and "One CPU device per core").
_CPU_CHUNK_WARP_SLOTS = 144 * 64


def default_chunk(shapes: Shapes) -> int | None:
    """Configurations per vmapped chunk: on the CPU as many as keep a step's arrays in cache,
    elsewhere the whole batch (None)."""
    if jax.default_backend() != "cpu":
        return None
    return max(1, _CPU_CHUNK_WARP_SLOTS // (shapes.n_sm * shapes.warp_slots))


def padded_batch(config: Batch, multiple: int) -> tuple[Batch, int]:
    """`config` padded to a multiple of `multiple`
    configurations with copies of the first, whose results the caller drops; and the original
    count."""
    n = jax.tree.leaves(config)[0].shape[0]
    pad = -n % multiple
    if pad == 0:
        return config, n
    return jax.tree.map(lambda x: jnp.concatenate([x, jnp.repeat(x[:1], pad, axis=0)]), config), n


def _in_chunks(fn: Callable[[Batch], Result], config: Batch, chunk: int) -> Result:
    """`fn` (batched) over the leading axis of `config`, `chunk` configurations at a time (one
    `lax.map` step each)."""
    padded, n = padded_batch(config, chunk)
    n_chunks = -(-n // chunk)  # explicit: a leaf may have a zero-sized axis (no clock trace)
    grouped = jax.tree.map(lambda x: x.reshape(n_chunks, chunk, *x.shape[1:]), padded)
    out = jax.lax.map(fn, grouped)
    return jax.tree.map(lambda y: y.reshape(n_chunks * chunk, *y.shape[2:])[:n], out)


def chunked(fn: Callable[[Batch], Result], config: Batch, chunk: int | None) -> Result:
    """`fn` (batched) over `config`, `chunk` configurations at a time where the batch is larger
    (None: all at once)."""
    if chunk is not None and jax.tree.leaves(config)[0].shape[0] > chunk:
        return _in_chunks(fn, config, chunk)
    return fn(config)
