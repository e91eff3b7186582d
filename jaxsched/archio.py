"""Read and write an `Arch` as TOML, so users can describe their own chip.

Schema (every section optional when `base` names a preset to start from):

    base = "h200"                     # optional: start from a preset, override below
    name = "my-chip"
    compute_capability = [9, 0]
    schedulers_per_sm = 4
    warp_size = 32

    [hierarchy]                       # compact form: GPCs of TPC sites (2 SMs each) ...
    gpc_tpcs_full = [9, 9, 9, 9, 9, 9, 9, 9]
    gpc_tpcs_enabled = [9, 9, 8, 8, 8, 8, 8, 8]
    die_mm = [33.0, 24.7]
    gpc_rows = 2

    [sm]                              # ... or explicit per-SM-slot arrays (what `save` writes)
    enabled = "0-131"                 # the enabled slots (%smid): ranges "0-63,66-67", a list
                                      # of slot numbers [0, 1, ...] or one boolean per slot
    gpc = [...]; tpc = [...]; x_mm = [...]; y_mm = [...]; dispatch_order = [...]; die_mm = [33.0, 24.7]

    [limits]   max_threads_per_sm = 2048 ... smem_carveout_kib = [0, 8, ...]
    [pipes]    issue_width = 1, latency_cycles = {fma = 4, ...}, issue_cycles = {fma = 1, ...}
    [memory]   l2_hit_latency_ns = 120.0 ...
    [clocks]   base_clock_ghz = 1.59 ...

`save` writes every number as given where it was defined: a float32 field by the shortest
decimal that reads back as the same float32 (1.59, not 1.590000033378601), so `load(save(arch))`
is `arch`, field by field.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from . import presets, tomldoc
from .archvalues import FIELDS, ArchValues
from .errors import JaxschedError, check
from .hierarchy import build_hierarchy
from .isa import OP_NAMES

if TYPE_CHECKING:
    from .arch import Arch

_TOP = ("name", "compute_capability", "schedulers_per_sm", "warp_size")
_SECTIONS = {
    "limits": (
        "max_threads_per_block", "max_threads_per_sm", "max_blocks_per_sm", "regs_per_sm",
        "regs_per_block", "max_regs_per_thread", "reg_alloc_unit", "smem_per_sm_bytes",
        "smem_per_block_bytes", "smem_per_block_optin_bytes", "reserved_smem_per_block_bytes",
        "smem_alloc_unit_bytes", "smem_carveout_kib", "barriers_per_block_slot",
    ),
    "pipes": ("issue_width", "latency_cycles", "issue_cycles", "taken_branch_cycles"),
    "memory": (
        "l2_hit_latency_ns", "dram_latency_ns", "l2_bytes_per_ns", "dram_bytes_per_ns",
        "smem_bytes_per_cycle", "mio_queue_depth",
    ),
    "clocks": ("base_clock_ghz", "boost_clock_ghz", "power_limit_w", "clock_step_mhz"),
    "dispatch": ("cta_launch_ns", "cta_launch_idle_cycles", "launch_api_ns", "launch_gap_ns", "graph_api_ns",
                 "graph_gap_ns"),
}
_SM_KEYS = ("enabled", "gpc", "tpc", "x_mm", "y_mm", "dispatch_order", "die_mm")
_HIERARCHY_KEYS = ("gpc_tpcs_full", "gpc_tpcs_enabled", "die_mm", "gpc_rows")
_PER_OP = ("latency_cycles", "issue_cycles")


def to_dict(arch: Arch | ArchValues) -> dict:
    """The TOML document of `arch` as a plain dict (explicit per-SM arrays)."""
    doc: dict = {key: _plain(getattr(arch, key)) for key in _TOP}
    xy = np.asarray(arch.sm_xy_mm)
    doc["sm"] = {
        "enabled": slot_ranges(np.asarray(arch.sm_enabled)),
        "gpc": _plain(arch.sm_gpc),
        "tpc": _plain(arch.sm_tpc),
        "x_mm": _plain(xy[:, 0]),
        "y_mm": _plain(xy[:, 1]),
        "dispatch_order": _plain(arch.dispatch_order),
        "die_mm": _plain(arch.die_mm),
    }
    for section, keys in _SECTIONS.items():
        doc[section] = {}
        for key in keys:
            value = _plain(getattr(arch, key))
            if key in _PER_OP:
                value = dict(zip(OP_NAMES, value))
            doc[section][key] = value
    carve = doc["limits"]["smem_carveout_kib"]
    doc["limits"]["smem_carveout_kib"] = sorted(set(carve))
    return doc


def dumps(arch: Arch | ArchValues) -> str:
    """TOML text of `arch`."""
    return tomldoc.dumps(to_dict(arch), header=(
        f"{arch.name}: jaxsched's architecture description (docs/model.md). Edit it and pass the file as --arch.\n"
        "[sm] has one entry per SM slot of the die, in %smid order: the enabled SMs first, then the floorswept slots."))


def save(arch: Arch, path: str | Path) -> None:
    """Write `arch` as TOML."""
    Path(path).write_text(dumps(arch))


def loads(text: str, source: str = "<string>") -> Arch:
    """Parse TOML text into a validated `Arch`."""
    return from_dict(tomldoc.parse(text, source), source)


def load(path: str | Path) -> Arch:
    """Read an `Arch` from a TOML file."""
    return from_dict(tomldoc.read(path, "arch file"), str(path))


def load_values(path: str | Path) -> ArchValues:
    """Read an architecture from a TOML file as numpy values, without JAX (`ArchValues`)."""
    return _build(ArchValues, fields_from_dict(tomldoc.read(path, "arch file"), str(path)), str(path))


def from_dict(doc: dict, source: str = "<dict>") -> Arch:
    """Build an `Arch` from a parsed TOML document (see module docstring for the schema)."""
    from .arch import make_arch  # imports JAX; `load_values` reads a file without it

    return _build(make_arch, fields_from_dict(doc, source), source)


def fields_from_dict(doc: dict, source: str = "<dict>") -> dict:
    """The architecture fields a parsed TOML document describes, as plain values (every field,
    from `base` where the document leaves it out)."""
    doc = dict(doc)
    base_name = doc.pop("base", None)
    fields: dict = {}
    if base_name is not None:
        check(str(base_name).lower() in presets.names(), f"{source}: base", base_name,
              f"unknown preset; known presets: {', '.join(presets.names())}")
        fields = presets.fields(str(base_name))
    known = set(_TOP) | set(_SECTIONS) | {"sm", "hierarchy"}
    for key in doc:
        check(key in known, f"{source}: {key}", doc[key], f"unknown key; expected one of {sorted(known)}")
    for key in _TOP:
        if key in doc:
            fields[key] = _fits_int32(doc[key], f"{source}: {key}")
    if "sm" in doc and "hierarchy" in doc:
        raise JaxschedError(f"{source}: sm", "both [sm] and [hierarchy]", "give one of them")
    try:
        if "hierarchy" in doc:
            fields.update(_hierarchy(doc["hierarchy"], source))
        if "sm" in doc:
            fields.update(_sm(doc["sm"], source))
    except JaxschedError:
        raise
    except (TypeError, ValueError, IndexError, ZeroDivisionError, OverflowError) as exc:
        raise JaxschedError(f"{source}: hierarchy", "bad value", str(exc)) from None
    for section, keys in _SECTIONS.items():
        table = doc.get(section, {})
        check(isinstance(table, dict), f"{source}: [{section}]", table, "must be a table")
        for key, value in table.items():
            check(key in keys, f"{source}: {section}.{key}", value, f"unknown key; expected one of {list(keys)}")
            _fits_int32(value, f"{source}: {section}.{key}")
            if key in _PER_OP:
                value = _per_op(value, f"{source}: {section}.{key}")
            fields[key] = value
    missing = [f for f in FIELDS if f not in fields]
    check(not missing, f"{source}", f"missing {missing}", "every field is required unless `base` names a preset")
    return fields


def _fits_int32(value: object, field: str) -> object:
    """`value`, after checking that every integer in it (in lists and tables too) fits the int32
    the arch holds: a larger one would overflow in numpy and be reported without its field."""
    if isinstance(value, dict):
        for v in value.values():
            _fits_int32(v, field)
    elif isinstance(value, list):
        for v in value:
            _fits_int32(v, field)
    elif isinstance(value, int) and not isinstance(value, bool):
        check(-(2**31) <= value <= 2**31 - 1, field, value, "an integer in -2^31 .. 2^31 - 1 (int32)")
    return value


def _build(make: Callable[..., Arch | ArchValues], fields: dict, source: str) -> Arch | ArchValues:
    """`make(**fields)`, its errors named after `source`."""
    try:
        return make(**fields)
    except (TypeError, ValueError, OverflowError) as exc:
        if isinstance(exc, JaxschedError):
            raise JaxschedError(f"{source}: {exc.field}", exc.value, exc.limit) from None
        raise JaxschedError(source, "bad value", str(exc)) from None


def _hierarchy(table: object, source: str) -> dict:
    check(isinstance(table, dict), f"{source}: hierarchy", table, "must be a table")
    assert isinstance(table, dict)
    for key in table:
        check(key in _HIERARCHY_KEYS, f"{source}: hierarchy.{key}", table[key], f"expected one of {_HIERARCHY_KEYS}")
    for key in ("gpc_tpcs_full", "die_mm"):
        check(key in table, f"{source}: hierarchy.{key}", None, "required")
    full = [int(v) for v in table["gpc_tpcs_full"]]
    enabled = [int(v) for v in table.get("gpc_tpcs_enabled", full)]
    return build_hierarchy(full, enabled, tuple(table["die_mm"]), int(table.get("gpc_rows", 2)))


def _sm(table: dict, source: str) -> dict:
    for key in _SM_KEYS:
        check(key in table, f"{source}: sm.{key}", None, "required in [sm]")
    for key in table:
        check(key in _SM_KEYS, f"{source}: sm.{key}", table[key], f"expected one of {_SM_KEYS}")
    return dict(
        sm_enabled=_enabled(table["enabled"], len(table["gpc"]), f"{source}: sm.enabled"),
        sm_gpc=table["gpc"],
        sm_tpc=table["tpc"],
        sm_xy_mm=np.stack([table["x_mm"], table["y_mm"]], axis=-1),
        dispatch_order=table["dispatch_order"],
        die_mm=table["die_mm"],
    )


def _per_op(value: object, field: str) -> list:
    check(isinstance(value, dict), field, value, f"a table with keys {OP_NAMES}")
    assert isinstance(value, dict)
    for key in value:
        check(key in OP_NAMES, f"{field}.{key}", value[key], f"unknown op class; expected {OP_NAMES}")
    missing = [op for op in OP_NAMES if op not in value]
    check(not missing, field, f"missing {missing}", f"every op class {OP_NAMES} is required")
    return [value[op] for op in OP_NAMES]


def slot_ranges(enabled: np.ndarray) -> str:
    """The enabled SM slots as ranges of `%smid`: "0-131", "0-3,6-7"."""
    slots = np.flatnonzero(enabled)
    runs = np.split(slots, np.flatnonzero(np.diff(slots) != 1) + 1) if slots.size else []
    return ",".join(f"{r[0]}" if r.size == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def _enabled(value: object, n_slots: int, field: str) -> list[bool]:
    """`[sm] enabled` in any of its forms as one boolean per slot: ranges ("0-131,140"), slot
    numbers ([0, 1, 2]) or booleans ([true, true, false])."""
    if isinstance(value, list) and value and all(isinstance(v, bool) for v in value):
        return value
    limit = f"the enabled SM slots: ranges like \"0-131\", a list of slot numbers, or one boolean per slot ({n_slots})"
    if isinstance(value, str):
        slots = []
        for part in value.replace(" ", "").split(","):
            m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
            check(m is not None, field, value, limit)
            low, high = int(m[1]), int(m[2] or m[1])
            check(low <= high, field, value, limit)
            slots += range(low, high + 1)
    else:
        check(isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value),
              field, value, limit)
        slots = value
    check(all(0 <= s < n_slots for s in slots), field, value, f"slot numbers in 0 .. {n_slots - 1}")
    mask = [False] * n_slots
    for s in slots:
        mask[s] = True
    return mask


def _plain(value: object) -> object:
    """numpy scalars/arrays -> Python scalars/lists that TOML can hold; float32 values as the
    shortest decimals that read back as the same float32."""
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, (np.ndarray, np.generic)):
        a = np.asarray(value)
        if a.dtype == np.float32:  # str(np.float32) is the shortest round-trip decimal
            return np.array([float(str(v)) for v in a.ravel()], dtype=object).reshape(a.shape).tolist()
        return a.tolist()
    return value
