"""Build the SM hierarchy arrays of an `Arch`: GPC/TPC membership, `%smid` numbering,
floorplan positions and the GigaThread engine's dispatch order.

Rules (sources in `docs/model.md`):
- `%smid` numbers TPCs round-robin over GPCs: TPC t of the chip (SMs 2t, 2t+1) sits in GPC
  t mod (GPCs with TPCs left). On an H100/H200 this puts SMs 0, 16, 32, 48, ... in GPC 0, as
  reported (DOMAIN.md).
- The hardware-like dispatch order walks the TPC pairs GPC by GPC (0,1,16,17,32,33,... on an
  H200, as measured); the starting point is a dispatch parameter.
- The floorplan is schematic: GPCs tile the die in `gpc_rows` rows, each GPC stacks its TPCs
  (two SMs side by side) in a column. Good enough for distances (IR drop, spatial correlation).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .errors import check


def build_hierarchy(
    gpc_tpcs_full: Sequence[int],
    gpc_tpcs_enabled: Sequence[int],
    die_mm: tuple[float, float],
    gpc_rows: int = 2,
) -> dict[str, np.ndarray]:
    """SM arrays for a die with `gpc_tpcs_full[g]` TPC sites in GPC g, the first
    `gpc_tpcs_enabled[g]` of them enabled. Returns the `Arch` hierarchy fields."""
    check(len(gpc_tpcs_full) == len(gpc_tpcs_enabled), "gpc_tpcs_enabled", list(gpc_tpcs_enabled),
          f"one count per GPC ({len(gpc_tpcs_full)})")
    check(len(die_mm) == 2 and all(float(v) > 0 for v in die_mm), "die_mm", list(die_mm),
          "two positive sizes (width, height) in mm")
    check(int(gpc_rows) >= 1, "gpc_rows", gpc_rows, ">= 1")
    check(len(gpc_tpcs_full) >= 1, "gpc_tpcs_full", list(gpc_tpcs_full), "at least one GPC")
    for g, (full, on) in enumerate(zip(gpc_tpcs_full, gpc_tpcs_enabled)):
        check(0 <= on <= full, f"gpc_tpcs_enabled[{g}]", on, f"between 0 and {full} TPC sites")

    # Enabled TPCs get %smid pairs round-robin over the GPCs that still have TPCs.
    remaining = list(gpc_tpcs_enabled)
    enabled_tpcs: list[tuple[int, int]] = []  # (gpc, site within gpc) in %smid order
    site = [0] * len(remaining)
    while any(remaining):
        for g in range(len(remaining)):
            if remaining[g]:
                enabled_tpcs.append((g, site[g]))
                site[g] += 1
                remaining[g] -= 1
    disabled_tpcs = [
        (g, s) for g, full in enumerate(gpc_tpcs_full) for s in range(gpc_tpcs_enabled[g], full)
    ]
    tpcs = enabled_tpcs + disabled_tpcs
    n_sm = 2 * len(tpcs)

    sm_gpc = np.repeat([g for g, _ in tpcs], 2).astype(np.int32)
    sm_tpc = np.repeat(np.arange(len(tpcs)), 2).astype(np.int32)
    sm_enabled = np.zeros(n_sm, dtype=bool)
    sm_enabled[: 2 * len(enabled_tpcs)] = True

    # Floorplan: GPC g is cell (g // cols, g % cols) of a rows x cols grid over the die.
    n_gpc = len(gpc_tpcs_full)
    cols = -(-n_gpc // gpc_rows)
    cell_w, cell_h = die_mm[0] / cols, die_mm[1] / gpc_rows
    xy = np.zeros((n_sm, 2), dtype=np.float32)
    for i, (g, s) in enumerate(tpcs):
        row, col = divmod(g, cols)
        pitch = cell_h / gpc_tpcs_full[g]
        y = row * cell_h + (s + 0.5) * pitch
        for half in (0, 1):
            xy[2 * i + half] = (col * cell_w + (half + 0.5) * cell_w / 2, y)

    # Dispatch order: GPC by GPC, each GPC's enabled TPC pairs in %smid order, then floorswept.
    order = [
        2 * i + half
        for g in range(n_gpc)
        for i, (tg, _) in enumerate(enabled_tpcs)
        if tg == g
        for half in (0, 1)
    ]
    order += list(range(2 * len(enabled_tpcs), n_sm))
    return dict(
        sm_enabled=sm_enabled,
        sm_gpc=sm_gpc,
        sm_tpc=sm_tpc,
        sm_xy_mm=xy,
        dispatch_order=np.asarray(order, dtype=np.int32),
        die_mm=np.asarray(die_mm, dtype=np.float32),
    )
