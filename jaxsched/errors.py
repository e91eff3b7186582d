"""The one exception type users see, with the field, the value and the limit in its message, and
the value checks every configuration passes where it is built and where it enters the engine.

CUDA says "too many resources requested for launch"; jaxsched says which resource, how much was
asked for, and what the limit is, so a sweep that fails tells the user which knob to turn.

The value checks (`check_ints`, `check_floats`, `check_bools`) take a field's own rank: any
leading axes beyond it are the configurations of a stacked batch, and the error names the first
bad configuration and element. Traced values (inside `jit` or `vmap`) are not checked here; the
engine guards what could reach its loop (`engine.run`).
"""

from __future__ import annotations

import os
import sys
from typing import Callable

import numpy as np

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


class JaxschedError(ValueError):
    """Bad input: names the offending field, the value given and the limit it breaks."""

    def __init__(self, field: str, value: object, limit: str, hint: str = ""):
        self.field = field
        self.value = value
        self.limit = limit
        self.hint = hint
        message = f"{field} = {value!r}: {limit}"
        if hint:
            message += f" ({hint})"
        super().__init__(message)


def check(ok: bool, field: str, value: object, limit: str, hint: str = "") -> None:
    """Raise `JaxschedError(field, value, limit)` unless `ok`."""
    if not ok:
        raise JaxschedError(field, value, limit, hint)


def os_error(exc: OSError) -> str:
    """An operating-system error in one line: its message and errno ("No space left on device
    [errno 28]"); h5py's own messages span several lines."""
    if exc.errno:
        return f"{os.strerror(exc.errno)} [errno {exc.errno}]"
    lines = str(exc).splitlines()
    return lines[0] if lines else type(exc).__name__


def is_traced(x: object) -> bool:
    """Whether `x` is a JAX tracer (inside `jit`, `vmap` or `grad`): its value is unknown here.
    Without JAX imported nothing can be traced, so checks run without importing it."""
    if "jax" not in sys.modules:
        return False
    from jax.core import Tracer

    return isinstance(x, Tracer)


def _name(field: str, index: tuple[int, ...], rank: int) -> str:
    """`field`, with the batch configuration and the element of the first bad value."""
    batch, inner = index[:len(index) - rank], index[len(index) - rank:]
    name = field + (f"[{', '.join(map(str, inner))}]" if inner else "")
    if batch:
        name = f"configuration {', '.join(map(str, batch))}: {name}"
    return name


def _scalar(x: np.ndarray) -> object:
    v = x.item()
    return float(f"{v:.6g}") if isinstance(v, float) and np.isfinite(v) else v


def check_values(x: object, field: str, ok: Callable[[np.ndarray], np.ndarray], limit: str, rank: int = 0) -> None:
    """Raise `JaxschedError` naming the first element of `x` (and its batch configuration)
    where `ok` is False. Leading axes beyond `rank` are configurations of a batch."""
    if is_traced(x):
        return
    a = np.asarray(x)
    check(a.ndim >= rank, field, f"shape {a.shape}", f"an array of rank {rank}")
    good = np.broadcast_to(np.asarray(ok(a), dtype=bool), a.shape)
    if not good.all():
        index = tuple(int(i) for i in np.argwhere(~good)[0])
        raise JaxschedError(_name(field, index, rank), _scalar(a[index]), limit)


def check_rows(x: object, ok: np.ndarray, field: str, limit: str, rank: int) -> None:
    """Raise `JaxschedError` for the first configuration whose whole `x` (its last `rank` axes)
    breaks a rule: `ok` holds one boolean per configuration (the leading axes of `x`)."""
    a = np.asarray(x)
    good = np.asarray(ok, dtype=bool)
    if not good.all():
        batch = tuple(int(i) for i in np.argwhere(~good)[0]) if good.ndim else ()
        name = f"configuration {', '.join(map(str, batch))}: {field}" if batch else field
        row = a[batch]
        raise JaxschedError(name, row.tolist() if row.ndim else _scalar(row), limit)


def check_ints(x: object, field: str, low: int, high: int, limit: str = "", rank: int = 0) -> None:
    """Every element of `x` an integer in `low .. high` (within int32 unless the limits say)."""
    if is_traced(x):
        return
    a = np.asarray(x)
    what = limit or f"an integer in {low} .. {high}"
    check(a.dtype.kind in "iu", field, a.tolist() if a.size <= 8 else f"dtype {a.dtype}", what)
    check_values(a, field, lambda v: (v >= low) & (v <= high), what, rank)


def check_floats(x: object, field: str, low: float, high: float, limit: str = "", rank: int = 0,
                 low_open: bool = False) -> None:
    """Every element of `x` a finite number in `[low, high]` (`(low, high]` with `low_open`)."""
    if is_traced(x):
        return
    a = np.asarray(x)
    what = limit or f"a finite number in {'(' if low_open else '['}{low:g}, {high:g}]"
    check(a.dtype != object and a.dtype.kind in "iuf", field, a.tolist() if a.ndim == 0 else f"dtype {a.dtype}", what)
    above = (lambda v: v > low) if low_open else (lambda v: v >= low)
    check_values(a, field, lambda v: np.isfinite(v) & above(v) & (v <= high), what, rank)


def check_bools(x: object, field: str, rank: int = 0) -> None:
    """`x` holds booleans (true or false)."""
    if is_traced(x):
        return
    a = np.asarray(x)
    check(a.dtype == bool, field, a.tolist() if a.ndim == 0 else f"dtype {a.dtype}", "true or false")
