"""Checks done once per value. A module whose check passed is remembered by identity, with a
digest of its arrays' bytes and its other fields: where the same object comes back unchanged,
its check is not run again (an arch is checked where it is built, by `make_params`, by
`Params` and where it enters the engine: once is enough). A module rebuilt around the checks
(`eqx.tree_at`, `jax.tree.map`: a new object) or changed in place (a new digest) is checked
again, and so is one holding a traced value, whose check skips what it cannot see. Pure Python
and numpy, so that the checks run without JAX."""

from __future__ import annotations

import dataclasses
import hashlib
import weakref

import numpy as np

from .errors import is_traced

_PASSED: dict[tuple[str, int], tuple[weakref.ref, bytes]] = {}


def _feed(h: "hashlib._Hash", x: object) -> bool:
    """Add `x` to the digest `h`; False if it holds a traced value."""
    if isinstance(x, (np.ndarray, np.generic)):
        h.update(x.dtype.str.encode() + repr(x.shape).encode())
        h.update(x.tobytes())
        return True
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        h.update(type(x).__qualname__.encode())
        return all(_feed(h, getattr(x, f.name)) for f in dataclasses.fields(x))
    if isinstance(x, (tuple, list)):
        h.update(b"(%d" % len(x))
        return all(_feed(h, v) for v in x)
    if x is None or isinstance(x, (str, bool, int, float)):
        h.update(repr(x).encode())
        return True
    if is_traced(x):
        return False
    return _feed(h, np.asarray(x))


def _digest(module: object) -> bytes | None:
    h = hashlib.blake2b(digest_size=16)
    return h.digest() if _feed(h, module) else None


def passed(module: object, kind: str) -> bool:
    """Whether `module`'s check of this `kind` passed on this very object, unchanged since."""
    entry = _PASSED.get((kind, id(module)))
    return entry is not None and entry[0]() is module and entry[1] == _digest(module)


def remember(module: object, kind: str) -> None:
    """Record that `module`'s check of this `kind` passed (nothing where it holds a traced value
    or cannot be referenced weakly)."""
    digest = _digest(module)
    if digest is None:
        return
    key = (kind, id(module))

    def forget(ref: weakref.ref) -> None:
        if _PASSED.get(key, (None,))[0] is ref:
            del _PASSED[key]

    try:
        ref = weakref.ref(module, forget)
    except TypeError:
        return
    _PASSED[key] = (ref, digest)
