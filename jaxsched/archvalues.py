"""An architecture's numbers without JAX: the dtype of every field, the rules the numbers must
satisfy, and `ArchValues`, a validated set of them.

`jaxsched.arch.Arch` is the pytree the engine traces, built from the same fields by the same
`cast` and checked by the same `validate`; defining it imports JAX (equinox), which takes a
second or more to start. The commands that only read an architecture (`jaxsched arch`,
`jaxsched occupancy`) work on `ArchValues` and answer without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from . import once
from .errors import INT32_MAX, check, check_bools, check_floats, check_ints
from .isa import N_OPS, OP_NAMES

if TYPE_CHECKING:
    from .arch import Arch

# Every field of an architecture, in `Arch`'s order (tests/test_arch.py checks that they agree).
FIELDS = (
    "name", "compute_capability", "schedulers_per_sm", "warp_size",
    "sm_enabled", "sm_gpc", "sm_tpc", "sm_xy_mm", "dispatch_order", "die_mm",
    "max_threads_per_block", "max_threads_per_sm", "max_blocks_per_sm", "regs_per_sm", "regs_per_block",
    "max_regs_per_thread", "reg_alloc_unit", "smem_per_sm_bytes", "smem_per_block_bytes",
    "smem_per_block_optin_bytes", "reserved_smem_per_block_bytes", "smem_alloc_unit_bytes", "smem_carveout_kib",
    "barriers_per_block_slot",
    "issue_width", "latency_cycles", "issue_cycles", "taken_branch_cycles",
    "l2_hit_latency_ns", "dram_latency_ns", "l2_bytes_per_ns", "dram_bytes_per_ns", "smem_bytes_per_cycle",
    "mio_queue_depth",
    "base_clock_ghz", "boost_clock_ghz", "power_limit_w", "clock_step_mhz",
    "cta_launch_ns", "cta_launch_idle_cycles", "launch_api_ns", "launch_gap_ns", "graph_api_ns", "graph_gap_ns",
)

# Supported shared-memory carveout sizes are padded to this length (CC 9.0 has 10 sizes).
N_CARVEOUTS = 10

_INT_FIELDS = (
    "max_threads_per_block",
    "max_threads_per_sm",
    "max_blocks_per_sm",
    "regs_per_sm",
    "regs_per_block",
    "max_regs_per_thread",
    "reg_alloc_unit",
    "smem_per_sm_bytes",
    "smem_per_block_bytes",
    "smem_per_block_optin_bytes",
    "reserved_smem_per_block_bytes",
    "smem_alloc_unit_bytes",
    "barriers_per_block_slot",
    "issue_width",
    "smem_bytes_per_cycle",
    "mio_queue_depth",
    "taken_branch_cycles",
    "cta_launch_idle_cycles",
)
# integer fields for which 0 means "off"
_INT_FIELDS_ZERO_OK = ("reserved_smem_per_block_bytes", "taken_branch_cycles", "cta_launch_idle_cycles")
# issue_cycles is lowered to 1/64 cycle (docs/model.md section 3)
ISSUE_UNITS_PER_CYCLE = 64
_FLOAT_FIELDS = (
    "l2_hit_latency_ns",
    "dram_latency_ns",
    "l2_bytes_per_ns",
    "dram_bytes_per_ns",
    "base_clock_ghz",
    "boost_clock_ghz",
    "power_limit_w",
    "cta_launch_ns",
    "launch_api_ns",
    "launch_gap_ns",
    "graph_api_ns",
    "graph_gap_ns",
    "clock_step_mhz",
)

# (low, high, unit) of the positive float fields: the lowering's integer units stay inside int32
# (a latency of 1e6 ns is 1e7 ticks at 10 GHz; a queue cost of 4096 B at 1 B/ns is 4e7)
_FLOAT_RANGES = {
    "l2_hit_latency_ns": (0, 1e6, "ns"),
    "dram_latency_ns": (0, 1e6, "ns"),
    "l2_bytes_per_ns": (1, 1e7, "B/ns"),
    "dram_bytes_per_ns": (1, 1e7, "B/ns"),
    "base_clock_ghz": (0, 10, "GHz"),
    "boost_clock_ghz": (0, 10, "GHz"),
    "power_limit_w": (0, 1e5, "W"),
    "clock_step_mhz": (0, 1000, "MHz"),
}


def cast(fields: dict) -> dict:
    """Architecture fields from plain Python values, each leaf cast to its canonical dtype (numpy)."""
    out = dict(fields)
    for key in _INT_FIELDS:
        if key in out:
            out[key] = np.asarray(out[key], dtype=np.int32)
    for key in _FLOAT_FIELDS:
        if key in out:
            out[key] = np.asarray(out[key], dtype=np.float32)
    for key in ("sm_gpc", "sm_tpc", "dispatch_order", "latency_cycles"):
        if key in out:
            out[key] = np.asarray(out[key], dtype=np.int32)
    if "issue_cycles" in out:
        out["issue_cycles"] = np.asarray(out["issue_cycles"], dtype=np.float32)
    if "smem_carveout_kib" in out:
        out["smem_carveout_kib"] = pad_carveouts(out["smem_carveout_kib"])
    for key in ("sm_xy_mm", "die_mm"):
        if key in out:
            out[key] = np.asarray(out[key], dtype=np.float32)
    if "sm_enabled" in out:
        out["sm_enabled"] = np.asarray(out["sm_enabled"], dtype=bool)
    if "compute_capability" in out:
        out["compute_capability"] = tuple(int(v) for v in out["compute_capability"])
    return out


def pad_carveouts(sizes_kib: object) -> np.ndarray:
    """Sorted carveout sizes padded to `N_CARVEOUTS` by repeating the largest."""
    sizes = sorted(int(v) for v in np.ravel(np.asarray(sizes_kib)))
    check(
        0 < len(sizes) <= N_CARVEOUTS,
        "smem_carveout_kib",
        sizes,
        f"between 1 and {N_CARVEOUTS} sizes",
    )
    sizes += [sizes[-1]] * (N_CARVEOUTS - len(sizes))
    return np.asarray(sizes, dtype=np.int32)


def validate(arch: Arch | ArchValues) -> None:
    """Check an architecture's internal consistency; raise `JaxschedError` naming the field. An
    arch that passed, unchanged since, is not checked again (`jaxsched.once`)."""
    if once.passed(arch, "arch"):
        return
    _validate(arch)
    once.remember(arch, "arch")


def _validate(arch: Arch | ArchValues) -> None:
    for key in _INT_FIELDS:
        if key in _INT_FIELDS_ZERO_OK:
            check_ints(getattr(arch, key), key, 0, 1_000_000, "must be in [0, 1e6] (0: off)")
        else:
            check_ints(getattr(arch, key), key, 1, INT32_MAX, "must be a positive integer")
    check_ints(arch.max_blocks_per_sm, "max_blocks_per_sm", 1, 1024, "CTA slots per SM in 1 .. 1024")
    for key in _FLOAT_FIELDS:
        if key == "cta_launch_ns":
            check_floats(getattr(arch, key), key, 0, 1e5, "a CTA launch latency in [0, 1e5] ns")
        elif key in ("launch_api_ns", "launch_gap_ns", "graph_api_ns", "graph_gap_ns"):
            check_floats(getattr(arch, key), key, 0, 1e6, "a kernel launch overhead in [0, 1e6] ns")
        else:
            low, high, unit = _FLOAT_RANGES[key]
            check_floats(getattr(arch, key), key, low, high, f"a finite number in ({low:g}, {high:g}] {unit}",
                         low_open=low == 0)
    for key in ("sm_gpc", "sm_tpc"):
        check_ints(getattr(arch, key), key, 0, INT32_MAX, "an index >= 0", rank=1)
    check_floats(arch.sm_xy_mm, "sm_xy_mm", -1e4, 1e4, "finite positions in mm", rank=2)
    check_floats(arch.die_mm, "die_mm", 0, 1e4, "a finite die size in mm", rank=1, low_open=True)
    check_bools(arch.sm_enabled, "sm_enabled", rank=1)
    check_ints(arch.dispatch_order, "dispatch_order", 0, INT32_MAX, "a permutation of the SM slots", rank=1)
    check_ints(arch.smem_carveout_kib, "smem_carveout_kib", 0, 2**20, "shared-memory sizes in KiB", rank=1)
    n = arch.sm_enabled.shape[-1]
    for key in ("sm_gpc", "sm_tpc", "dispatch_order"):
        shape = np.shape(getattr(arch, key))
        check(shape == (n,), key, f"shape {shape}", f"must have one entry per SM slot ({n},)")
    check(np.shape(arch.sm_xy_mm) == (n, 2), "sm_xy_mm", np.shape(arch.sm_xy_mm), f"shape ({n}, 2)")
    check(
        sorted(np.asarray(arch.dispatch_order).tolist()) == list(range(n)),
        "dispatch_order",
        np.asarray(arch.dispatch_order).tolist(),
        f"must be a permutation of the SM slots 0..{n - 1}",
    )
    check(bool(np.any(arch.sm_enabled)), "sm_enabled", "all False", "at least one SM must be enabled")
    enabled = np.asarray(arch.sm_enabled)
    k = int(enabled.sum())
    check(
        bool(np.all(enabled[:k])),
        "sm_enabled",
        enabled.astype(int).tolist(),
        "enabled SMs come first (slot i is %smid i), floorswept slots last",
    )
    tpc = np.asarray(arch.sm_tpc)
    gpc = np.asarray(arch.sm_gpc)
    for t in np.unique(tpc):
        members = np.flatnonzero(tpc == t)
        check(len(members) <= 2, "sm_tpc", int(t), "a TPC holds at most 2 SMs")
        check(len(set(gpc[members])) == 1, "sm_gpc", gpc[members].tolist(), f"TPC {t} spans GPCs")
    check(
        int(arch.max_threads_per_sm) % arch.warp_size == 0,
        "max_threads_per_sm",
        int(arch.max_threads_per_sm),
        f"must be a multiple of the warp size {arch.warp_size}",
    )
    check(
        int(arch.max_threads_per_block) <= int(arch.max_threads_per_sm),
        "max_threads_per_block",
        int(arch.max_threads_per_block),
        f"<= max_threads_per_sm ({int(arch.max_threads_per_sm)})",
    )
    check(
        int(arch.smem_per_block_optin_bytes) + int(arch.reserved_smem_per_block_bytes)
        <= int(arch.smem_per_sm_bytes),
        "smem_per_block_optin_bytes",
        int(arch.smem_per_block_optin_bytes),
        f"opt-in + reserved must fit in smem_per_sm_bytes ({int(arch.smem_per_sm_bytes)})",
    )
    carve = np.asarray(arch.smem_carveout_kib)
    check(
        int(carve[-1]) * 1024 == int(arch.smem_per_sm_bytes),
        "smem_carveout_kib",
        carve.tolist(),
        f"the largest carveout must equal smem_per_sm_bytes ({int(arch.smem_per_sm_bytes)} B)",
    )
    check(bool(np.all(np.diff(carve) >= 0)), "smem_carveout_kib", carve.tolist(), "ascending")
    for key in ("latency_cycles", "issue_cycles"):
        arr = np.asarray(getattr(arch, key))
        check(arr.shape == (N_OPS,), key, arr.tolist(), f"one entry per op class {OP_NAMES}")
    check_ints(arch.latency_cycles, "latency_cycles", 1, 10_000, "every entry a number of cycles in [1, 1e4]", rank=1)
    check_floats(arch.issue_cycles, "issue_cycles", 1, 1e4, "every entry a number of cycles in [1, 1e4]", rank=1)
    check(
        float(arch.base_clock_ghz) <= float(arch.boost_clock_ghz),
        "base_clock_ghz",
        float(arch.base_clock_ghz),
        f"<= boost_clock_ghz ({float(arch.boost_clock_ghz)})",
    )
    check(arch.schedulers_per_sm > 0, "schedulers_per_sm", arch.schedulers_per_sm, "positive")
    check(arch.warp_size == 32, "warp_size", arch.warp_size, "every NVIDIA GPU so far uses 32")


class ArchValues:
    """An architecture's fields as numpy values (attributes named as `Arch`'s), cast and validated
    like an `Arch`, without JAX. `jaxsched.arch.make_arch(**vars(values))` is the same chip as an
    `Arch`."""

    def __init__(self, **fields: object) -> None:
        missing = [f for f in FIELDS if f not in fields]
        check(not missing, "arch", f"missing {missing}", "every field of an architecture is required")
        unknown = [f for f in fields if f not in FIELDS]
        check(not unknown, "arch", f"unknown {unknown}", f"fields are {list(FIELDS)}")
        vars(self).update(cast(fields))
        validate(self)

    @property
    def n_sm_slots(self) -> int:
        """SM slots on the die, enabled or not."""
        return int(self.sm_enabled.shape[-1])

    @property
    def sm_count(self) -> int:
        """Enabled SMs."""
        return int(np.sum(self.sm_enabled))
