"""Per-SM clock frequencies.

A `Clocks` holds one frequency per SM slot in integer MHz (DVFS moves clocks in bins of about
15 MHz, so 1 MHz resolution loses nothing, and integer arithmetic keeps the time base exact).
The simulation's global tick runs at the fastest enabled SM's clock (docs/model.md, "Time").

Per-SM arrays come in two lengths: one entry per SM slot of the die (`arch.n_sm_slots`: the
enabled SMs first in `%smid` order, then the floorswept slots, whose entries are ignored), or
one per enabled SM (`arch.sm_count`, in `%smid` order).
"""

from __future__ import annotations

import dataclasses

import equinox as eqx
import numpy as np
from jaxtyping import Array, ArrayLike, Int

from .arch import Arch
from .errors import JaxschedError, check, check_ints, check_values

MAX_MHZ = 10_000  # keeps tick arithmetic inside int32 (docs/model.md, "Time")


class Clocks(eqx.Module):
    """Static per-SM clock map (MHz, one entry per SM slot; floorswept slots are ignored)."""

    sm_freq_mhz: Int[Array, " sm"]

    def __check_init__(self) -> None:
        check_ints(self.sm_freq_mhz, "clocks.sm_freq_mhz", 0, MAX_MHZ,
                   f"an integer clock in 1 .. {MAX_MHZ} MHz (0 only on floorswept slots)", rank=1)

    def replace(self, **changes: object) -> "Clocks":
        """A copy with some fields changed (validated)."""
        return dataclasses.replace(self, **changes)


def lengths_hint(arch: Arch) -> str:
    """The per-SM array lengths `arch` accepts, and what each means."""
    return (f"{arch.n_sm_slots} (one per SM slot of the {arch.name} die: the {arch.sm_count} enabled SMs in "
            f"%smid order, then the floorswept slots) or {arch.sm_count} (one per enabled SM, in %smid order)")


def per_slot(arch: Arch, values: ArrayLike, field: str, fill: float = 0.0) -> np.ndarray:
    """A per-SM array as one entry per SM slot: given per slot, or per enabled SM (the floorswept
    slots then get `fill`)."""
    v = np.asarray(values)
    if v.shape == (arch.sm_count,) and arch.sm_count != arch.n_sm_slots:
        out = np.full(arch.n_sm_slots, fill, dtype=np.result_type(v.dtype, np.asarray(fill).dtype))
        out[np.asarray(arch.sm_enabled)] = v
        return out
    if v.shape != (arch.n_sm_slots,):
        raise JaxschedError(field, f"{v.size} entries" if v.ndim == 1 else f"shape {v.shape}",
                            f"needs {lengths_hint(arch)}")
    return v


def validate_clocks(arch: Arch, clocks: Clocks, field: str = "clocks.sm_freq_mhz") -> None:
    """`clocks` fits `arch`: one clock per SM slot, every enabled SM's in 1 .. MAX_MHZ MHz (a
    zero or negative clock never reaches the engine's loop). Stacked clocks are checked per
    configuration."""
    f = np.asarray(clocks.sm_freq_mhz)
    n = arch.n_sm_slots
    check(f.ndim >= 1 and f.shape[-1] == n, field, f"{f.shape[-1] if f.ndim else 0} entries per configuration",
          f"one clock per SM slot: {n} for {arch.name} ({arch.sm_count} enabled SMs in %smid order, then the "
          f"floorswept slots; clocks.from_array also takes {arch.sm_count}, one per enabled SM)")
    enabled = np.asarray(arch.sm_enabled)
    check_ints(f, field, 0, MAX_MHZ, rank=1)
    check_values(f, field, lambda v: ~enabled | (v >= 1), f"every enabled SM needs a clock in 1 .. {MAX_MHZ} MHz",
                 rank=1)


def uniform(arch: Arch, ghz: float | None = None) -> Clocks:
    """Every SM at `ghz` (default: the architecture's boost clock)."""
    ghz = float(arch.boost_clock_ghz) if ghz is None else ghz
    check(isinstance(ghz, (int, float, np.integer, np.floating)) and np.isfinite(ghz) and 0 < ghz * 1000 <= MAX_MHZ, "clock_ghz", ghz,
          f"a clock in (0, {MAX_MHZ / 1000:g}] GHz")
    return from_array(arch, np.full(arch.n_sm_slots, ghz * 1000.0))


def from_array(arch: Arch, sm_freq_mhz: ArrayLike) -> Clocks:
    """A clock map from per-SM frequencies in MHz (rounded to integer MHz), validated: one per SM
    slot or one per enabled SM (`lengths_hint`)."""
    given = np.asarray(sm_freq_mhz)
    check(given.dtype.kind in "iuf", "sm_freq_mhz", f"dtype {given.dtype}", "numbers (MHz)")
    f = np.rint(per_slot(arch, given.astype(np.float64), "sm_freq_mhz"))
    enabled = np.asarray(arch.sm_enabled)
    bad = enabled & ~((f >= 1) & (f <= MAX_MHZ))
    check(not np.any(bad), "sm_freq_mhz",
          f"{f[bad][0] if np.any(bad) else ''} (SM {int(np.argmax(bad))})",
          f"every enabled SM needs a clock in 1..{MAX_MHZ} MHz")
    return Clocks(sm_freq_mhz=np.where(enabled, f, 0).astype(np.int32))


def gaussian(arch: Arch, seed: int, mean_ghz: float, sigma: float) -> Clocks:
    """Independent per-SM clocks `mean (1 + sigma z)`, z ~ N(0, 1), capped at the boost clock.

    The simplest die-variation model (no spatial correlation): a baseline for dispatch studies.
    """
    check(isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) and seed >= 0, "seed", seed,
          "an integer >= 0 (numpy's default_rng)")
    check(np.isfinite(sigma) and sigma >= 0, "clocks.sigma", sigma, "a relative standard deviation >= 0")
    check(np.isfinite(mean_ghz) and mean_ghz > 0, "clocks.mean_ghz", mean_ghz, "a positive frequency")
    z = np.random.default_rng(seed).standard_normal(arch.n_sm_slots)
    boost_mhz = float(arch.boost_clock_ghz) * 1000.0
    mhz = np.clip(mean_ghz * 1000.0 * (1.0 + sigma * z), 0.1 * boost_mhz, boost_mhz)
    return from_array(arch, mhz)
