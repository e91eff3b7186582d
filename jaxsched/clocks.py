"""Per-SM clock frequencies.

A `Clocks` holds one frequency per SM slot in integer MHz (DVFS moves clocks in bins of about
15 MHz, so 1 MHz resolution loses nothing, and integer arithmetic keeps the time base exact).
The simulation's global tick runs at the fastest enabled SM's clock (docs/model.md, "Time").
"""

from __future__ import annotations

import equinox as eqx
import numpy as np
from jaxtyping import Array, ArrayLike, Int

from .arch import Arch
from .errors import check

MAX_MHZ = 10_000  # keeps tick arithmetic inside int32 (docs/model.md, "Time")


class Clocks(eqx.Module):
    """Static per-SM clock map (MHz, one entry per SM slot; floorswept slots are ignored)."""

    sm_freq_mhz: Int[Array, " sm"]


def uniform(arch: Arch, ghz: float | None = None) -> Clocks:
    """Every SM at `ghz` (default: the architecture's boost clock)."""
    ghz = float(arch.boost_clock_ghz) if ghz is None else ghz
    return from_array(arch, np.full(arch.n_sm_slots, ghz * 1000.0))


def from_array(arch: Arch, sm_freq_mhz: ArrayLike) -> Clocks:
    """A clock map from per-SM frequencies in MHz (rounded to integer MHz), validated."""
    f = np.rint(np.asarray(sm_freq_mhz, dtype=np.float64))
    check(f.shape == (arch.n_sm_slots,), "sm_freq_mhz", f"shape {f.shape}",
          f"one frequency per SM slot ({arch.n_sm_slots},)")
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
    check(sigma >= 0, "clocks.sigma", sigma, "a relative standard deviation >= 0")
    check(mean_ghz > 0, "clocks.mean_ghz", mean_ghz, "a positive frequency")
    z = np.random.default_rng(seed).standard_normal(arch.n_sm_slots)
    boost_mhz = float(arch.boost_clock_ghz) * 1000.0
    mhz = np.clip(mean_ghz * 1000.0 * (1.0 + sigma * z), 0.1 * boost_mhz, boost_mhz)
    return from_array(arch, mhz)
