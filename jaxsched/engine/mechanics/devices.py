"""The devices a batch runs on: its configuration axis split over them with `shard_map`.

Configurations are independent, so a batch shards along its leading axis with no communication,
and each configuration's result is the same bit for bit however the batch is split
(`tests/test_sharding.py`). On a GPU host the devices are the GPUs. On the CPU, XLA runs one
device's step on the host's cores together, and a step is hundreds of small kernels, so most of
that parallelism is lost to synchronisation: one CPU device per core, each running its own share
of the batch, simulates 1.4-1.5x as many SM-cycles per second on 2 cores
(docs/engine_performance.md, "One CPU device per core"). `use_host_cores` makes XLA's CPU client expose them.
"""

from __future__ import annotations

import os
from typing import Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from ...errors import check

ENV = "JAXSCHED_CPU_DEVICES"  # CPU devices to expose (default: the cores this process may use)
AXIS = "config"
# XLA's CPU devices meet at their collectives (the sharded batch's result) and, by default, abort
# the process when one waits 60 s for another (20 s to the warning, then 40 s). A device whose
# share of the batch runs minutes longer is not stuck: waits are unbounded instead.
WAIT_FLAGS = ("--xla_cpu_collective_call_warn_stuck_timeout_seconds=86400",
              "--xla_cpu_collective_call_terminate_timeout_seconds=86400")


def use_host_cores() -> None:
    """Expose one XLA CPU device per usable core (or `$JAXSCHED_CPU_DEVICES`), unless JAX's
    backends already started or the user chose a count (`jax_num_cpu_devices`,
    `--xla_force_host_platform_device_count`). JAX reads the count once, when it starts, so call
    it before anything runs on JAX; the command line does, before `run`, `sweep` and `fit`
    (importing jaxsched changes nothing in JAX's configuration). With the devices it sets
    `WAIT_FLAGS` in `XLA_FLAGS`, unless they are there: XLA reads them when its CPU client starts.
    A caller that makes several CPU devices itself needs them too."""
    chosen = jax.config.jax_num_cpu_devices >= 0 or "xla_force_host_platform_device_count" in os.environ.get(
        "XLA_FLAGS", "")
    if chosen:
        return
    text = os.environ.get(ENV, "").strip()
    if text:
        check(text.isdigit() and int(text) >= 1, ENV, text, "a count of CPU devices, at least 1")
        count = int(text)
    else:
        count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError:  # JAX's backends already started: it keeps the devices it has
        return
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = " ".join([flags, *(f for f in WAIT_FLAGS if f.split("=")[0] not in flags)]).strip()


def default_devices() -> list:
    """The device of an enclosing `jax.default_device` (the caller chose one), else every local
    device of the default backend."""
    chosen = jax.config.jax_default_device
    if chosen is None:
        return jax.local_devices()
    return [chosen] if isinstance(chosen, jax.Device) else jax.local_devices(backend=chosen)[:1]


def mesh_of(devices: Sequence) -> Mesh | None:
    """A one-axis mesh over `devices`, or None for a single device (no sharding)."""
    return Mesh(np.asarray(list(devices)), (AXIS,)) if len(devices) > 1 else None


def sharded(fn: Callable, mesh: Mesh) -> Callable:
    """`fn` (batched: a leading configuration axis on every argument and output) run on each
    device of `mesh` over its own contiguous slice of the batch."""
    spec = PartitionSpec(AXIS)
    return jax.shard_map(fn, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)
