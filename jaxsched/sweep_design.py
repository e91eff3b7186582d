"""Random and Latin-hypercube designs: `samples` points drawn over a few swept paths (factors).

Every factor maps a unit draw u in [0, 1) to a value:

- a float range [low, high]: low + u (high - low), uniform;
- an integer range [low, high]: low + floor(u (high - low + 1)), every integer low..high equally
  likely (a path's type decides: integer fields give integers);
- a list of choices (strings, booleans, or any values under `[design.choices]`):
  choices[floor(u m)], each equally likely.

`random` draws u independently and uniformly. `lhs` draws u from a Latin hypercube
(`scipy.stats.qmc.LatinHypercube`, scrambled, strength 1): for every factor each of the n strata
[k/n, (k+1)/n) holds exactly one draw, so a float range is cut into n equal strata with one
sample in each, and integer and categorical factors are balanced (every value is drawn n/m
times, give or take less than 2). Both are deterministic given the seed (numpy's
`default_rng(seed)` drives them).

The spec table (`jaxsched.sweep` validates paths and values through `sweep_paths`):

    [design]
    kind = "lhs"              # or "random"
    samples = 200
    seed = 1                  # default: the spec's seed
    [design.ranges]           # [low, high] of numbers; strings or booleans: categorical
    "clocks.sigma" = [0.0, 0.2]
    "kernel.trips" = [4, 32]
    "policy.dispatch" = ["hardware", "closed_loop"]
    [design.choices]          # discrete values of any type (e.g. block sizes)
    "kernel.threads" = [128, 256, 512]
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import numpy as np
import xarray as xr
from jaxtyping import Float, Shaped

from .errors import check

KINDS = ("lhs", "random")
CONFIG_DIM = "config"  # the dataset dimension of the samples
_KEYS = ("kind", "samples", "seed", "ranges", "choices")


@dataclasses.dataclass(frozen=True)
class Factor:
    """One sampled path: a float or integer range [low, high], or a tuple of choices."""

    path: str
    kind: str  # "float", "int" or "choice"
    low: float = 0.0
    high: float = 0.0
    choices: tuple = ()

    def values(self, u: Float[np.ndarray, " sample"]) -> Shaped[np.ndarray, " sample"]:
        """The factor's values for unit draws `u` in [0, 1)."""
        if self.kind == "float":
            return self.low + u * (self.high - self.low)
        m = int(self.high - self.low + 1) if self.kind == "int" else len(self.choices)
        index = np.minimum(np.floor(u * m).astype(np.int64), m - 1)
        if self.kind == "int":
            return int(self.low) + index
        return np.asarray(self.choices)[index]

    def describe(self) -> str:
        if self.kind == "choice":
            return "{" + ", ".join(map(str, self.choices)) + "}"
        return f"[{self.low:g}, {self.high:g}]" + (" integers" if self.kind == "int" else "")


@dataclasses.dataclass(frozen=True)
class Design:
    """A random or Latin-hypercube design over `factors` (module docstring)."""

    kind: str
    samples: int
    seed: int
    factors: tuple[Factor, ...]

    def unit(self) -> Float[np.ndarray, "sample factor"]:
        """Unit draws in [0, 1), one row per sample, one column per factor."""
        rng = np.random.default_rng(self.seed)
        if self.kind == "lhs":
            from scipy.stats import qmc  # a dependency of jax; imported here, where it is used

            return qmc.LatinHypercube(len(self.factors), rng=rng).random(self.samples)
        return rng.random((self.samples, len(self.factors)))

    @functools.cached_property
    def values(self) -> dict[str, np.ndarray]:
        """Each factor's sampled values (path -> array of `samples`)."""
        u = self.unit()
        return {f.path: f.values(u[:, j]) for j, f in enumerate(self.factors)}

    def describe(self) -> str:
        return f"{self.kind}, {self.samples} samples, seed {self.seed}"


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def parse(table: object, *, default_seed: int, max_samples: int, kind_of: Callable[[str, object, str], str],
          check_value: Callable[[str, object, str], None], where: str = "design") -> Design:
    """A `Design` from the spec's `[design]` table, of at most `max_samples` samples.

    `kind_of(path, value, where)` gives a path's value type ("float", "int", "bool", "choice"; it
    raises for an unknown path); `check_value(path, value, where)` raises for a bad value. Every
    range end and every choice is checked, so a bad entry fails here, before anything runs.
    """
    check(isinstance(table, dict), where, table, "a table with kind, samples and [design.ranges]")
    for key in table:
        check(key in _KEYS, f"{where}.{key}", table[key], f"unknown key; expected one of {_KEYS}")
    kind = table.get("kind", "lhs")
    check(kind in KINDS, f"{where}.kind", kind, f"one of {KINDS}")
    samples = table.get("samples")
    check(isinstance(samples, int) and not isinstance(samples, bool) and 1 <= samples <= max_samples,
          f"{where}.samples", samples, f"an integer in 1 .. {max_samples} (the number of sampled points)")
    seed = table.get("seed", default_seed)
    check(isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0, f"{where}.seed", seed,
          "an integer >= 0")
    ranges, choices = table.get("ranges", {}), table.get("choices", {})
    for name, part in (("ranges", ranges), ("choices", choices)):
        check(isinstance(part, dict), f"{where}.{name}", part, 'a table of "path" = [...]')
    check(bool(ranges) or bool(choices), where, "no factors",
          "name at least one path under [design.ranges] or [design.choices]")
    factors = []
    for path, spec in ranges.items():
        at = f"{where}.ranges.{path}"
        check(isinstance(spec, list) and len(spec) > 0, at, spec,
              "[low, high] for numbers, or a non-empty list of strings or booleans")
        if all(_is_number(v) for v in spec):
            factors.append(_range(path, spec, kind_of(path, spec, at), check_value, at))
        else:
            factors.append(_choices(path, spec, check_value, at))
    for path, spec in choices.items():
        at = f"{where}.choices.{path}"
        check(isinstance(spec, list) and len(spec) > 0, at, spec, "a non-empty list of values")
        kind_of(path, spec, at)
        factors.append(_choices(path, spec, check_value, at))
    return Design(kind=kind, samples=samples, seed=seed, factors=tuple(factors))


def _range(path: str, spec: list, kind: str, check_value, where: str) -> Factor:
    check(len(spec) == 2, where, spec,
          "a [low, high] range of two numbers (discrete numeric values go under [design.choices])")
    check(kind in ("float", "int"), where, spec, f"{path} takes {kind} values: list them as choices")
    low, high = spec
    for v in spec:
        check_value(path, v, where)
    check(low < high, where, spec, "low < high (a fixed value belongs in the base tables)")
    return Factor(path, kind, low, high)


def _choices(path: str, spec: list, check_value, where: str) -> Factor:
    for v in spec:
        check_value(path, v, where)
    check(len({(type(v), v) for v in spec}) == len(spec), where, spec, "distinct values")
    return Factor(path, "choice", choices=tuple(spec))


def design_coords(ds: xr.Dataset) -> list[str]:
    """The sampled parameters of a design sweep's dataset: its coordinates along `config`."""
    if CONFIG_DIM not in ds.dims:
        return []
    return [str(c) for c in ds.coords if c != CONFIG_DIM and ds[c].dims == (CONFIG_DIM,)]
