"""Stacking: equal-shaped configurations (`Params`, or any of its parts) along a new leading batch
axis, the form `simulate_batch` and `jax.vmap` take."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import equinox as eqx
import jax
import numpy as np

from .errors import check


def stack(items: Sequence[eqx.Module]) -> eqx.Module:
    """Stack equal-shaped pytrees (`Params`, or its parts: Arch, Kernel, Clocks, ...) along a new
    leading batch axis.

    Names may differ (the stack is named by joining them); other static fields, which fix
    shapes or rules (compute capability, schedulers per SM), must agree, in every part.
    """
    items = _same_statics(list(items))
    return jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *items)


def _same_statics(items: list) -> list:
    """`items` with their static fields, and those of every module inside them, made one: names
    joined, any other difference an error naming the field."""
    first = items[0]
    if isinstance(first, (tuple, list)) and all(isinstance(x, type(first)) and len(x) == len(first) for x in items):
        columns = [_same_statics([x[j] for x in items]) for j in range(len(first))]
        return [type(first)(col[i] for col in columns) for i in range(len(items))]
    if not (dataclasses.is_dataclass(first) and all(type(x) is type(first) for x in items)):
        return items
    for field in dataclasses.fields(first):
        values = [getattr(x, field.name) for x in items]
        if field.metadata.get("static"):
            if field.name == "name":
                joined = "|".join(dict.fromkeys(values))
                items = [dataclasses.replace(x, name=joined) if x.name != joined else x for x in items]
            else:
                check(len(set(map(str, values))) == 1, field.name, sorted(set(map(str, values))),
                      "configurations in one batch must agree on it")
            continue
        same = _same_statics(values)
        if any(a is not b for a, b in zip(same, values)):
            items = [eqx.tree_at(lambda x, f=field.name: getattr(x, f), x, v) for x, v in zip(items, same)]
    return items
