"""`jaxsched.arch`, `hierarchy`, `presets` and `archio`: the presets' SM hierarchy, clocks and
floorplan, the H200 `%smid` layout and numbers measured in docs/calibration.md, TOML round trips,
`Arch` under jit/vmap, and bad input naming the field and the value.

Per-CC limits (threads/SM, blocks/SM, shared memory, opt-in, reserved) are checked in
`test_occupancy_oracle.py` and are not repeated here.
"""

from __future__ import annotations

import copy
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tomli_w
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxsched as js
from jaxsched import archio, archvalues, presets
from jaxsched.arch import Arch
from jaxsched.hierarchy import build_hierarchy
from jaxsched.isa import N_OPS, OP_NAMES, Op

PRESETS = presets.names()

# name: (enabled SMs, SM slots on the die, enabled SMs per GPC)
EXPECTED = {
    "v100": (80, 84, [14, 14, 14, 14, 12, 12]),
    "a100": (108, 128, [14, 14, 14, 14, 14, 14, 12, 12]),
    "h100": (132, 144, [18, 18, 16, 16, 16, 16, 16, 16]),
    "h200": (132, 144, [16, 16, 16, 16, 16, 16, 18, 18]),  # docs/calibration.md: 6 x 16 + 2 x 18
    "rtx3090": (82, 84, [12, 12, 12, 12, 12, 12, 10]),
}


@pytest.fixture(scope="module")
def arch_cache() -> dict[str, js.Arch]:
    return {name: presets.get(name) for name in PRESETS}


def assert_same_arch(a: js.Arch, b: js.Arch) -> None:
    """Identical static fields and identical leaves (values and dtypes)."""
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb  # the treedef carries the static fields (name, CC, schedulers, warp size)
    for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0], lb):
        x, y = np.asarray(x), np.asarray(y)
        key = jax.tree_util.keystr(path)
        assert x.dtype == y.dtype, f"{key}: {x.dtype} != {y.dtype}"
        assert x.shape == y.shape, f"{key}: {x.shape} != {y.shape}"
        np.testing.assert_array_equal(x, y, err_msg=key)
    for field in ("name", "compute_capability", "schedulers_per_sm", "warp_size"):
        assert getattr(a, field) == getattr(b, field), field
    assert len(la) == len(lb)


# --------------------------------------------------------------------------- presets


def test_preset_names():
    assert sorted(PRESETS) == sorted(EXPECTED)
    assert presets.get("H200").name == "h200"  # case-insensitive


@pytest.mark.parametrize("name", PRESETS)
def test_preset_sm_counts(arch_cache, name):
    arch = arch_cache[name]
    n_enabled, n_slots, per_gpc = EXPECTED[name]
    enabled = np.asarray(arch.sm_enabled)
    gpc = np.asarray(arch.sm_gpc)
    assert arch.name == name
    assert arch.n_sm_slots == n_slots == enabled.shape[0]
    assert arch.sm_count == n_enabled == int(enabled.sum())
    n_gpc = int(gpc.max()) + 1
    assert n_gpc == len(per_gpc)
    assert sorted(np.unique(gpc).tolist()) == list(range(n_gpc))
    got = [int(np.sum(enabled & (gpc == g))) for g in range(n_gpc)]
    assert got == per_gpc
    assert sum(got) == arch.sm_count


@pytest.mark.parametrize("name", PRESETS)
def test_preset_tpcs_hold_two_sms_of_one_gpc(arch_cache, name):
    arch = arch_cache[name]
    tpc = np.asarray(arch.sm_tpc)
    gpc = np.asarray(arch.sm_gpc)
    enabled = np.asarray(arch.sm_enabled)
    ids, counts = np.unique(tpc, return_counts=True)
    assert ids.tolist() == list(range(arch.n_sm_slots // 2))
    assert np.all(counts == 2)
    for t in ids:
        members = np.flatnonzero(tpc == t)
        assert len(set(gpc[members].tolist())) == 1, f"TPC {t} spans GPCs"
        # a TPC is enabled or floorswept as a whole
        assert len(set(enabled[members].tolist())) == 1, f"TPC {t} half enabled"
    # every enabled TPC holds exactly 2 enabled SMs
    _, en_counts = np.unique(tpc[enabled], return_counts=True)
    assert np.all(en_counts == 2)
    assert len(en_counts) * 2 == arch.sm_count


@pytest.mark.parametrize("name", PRESETS)
def test_preset_dispatch_order_and_enabled_first(arch_cache, name):
    arch = arch_cache[name]
    order = np.asarray(arch.dispatch_order)
    enabled = np.asarray(arch.sm_enabled)
    k = arch.sm_count
    assert order.dtype == np.int32
    assert sorted(order.tolist()) == list(range(arch.n_sm_slots))
    assert np.all(enabled[:k]) and not np.any(enabled[k:])  # enabled slots first
    # the hardware order visits every enabled SM before any floorswept slot
    assert sorted(order[:k].tolist()) == list(range(k))
    # ... GPC by GPC: each GPC's enabled SMs are contiguous in the order
    gpc_seq = np.asarray(arch.sm_gpc)[order[:k]]
    changes = np.flatnonzero(np.diff(gpc_seq)) + 1
    runs = np.split(gpc_seq, changes)
    assert len(runs) == len(set(gpc_seq.tolist())), "a GPC appears in two separate runs"


@pytest.mark.parametrize("name", PRESETS)
def test_preset_clocks_bandwidths_latencies(arch_cache, name):
    arch = arch_cache[name]
    base, boost = float(arch.base_clock_ghz), float(arch.boost_clock_ghz)
    assert 0 < base <= boost < 5.0
    for key in ("l2_bytes_per_ns", "dram_bytes_per_ns", "smem_bytes_per_cycle",
                "l2_hit_latency_ns", "dram_latency_ns", "power_limit_w", "clock_step_mhz"):
        assert float(getattr(arch, key)) > 0, key
    # L2 is faster than DRAM in both latency and bandwidth
    assert float(arch.l2_hit_latency_ns) < float(arch.dram_latency_ns)
    assert float(arch.l2_bytes_per_ns) > float(arch.dram_bytes_per_ns)
    for key in ("latency_cycles", "issue_cycles"):
        arr = np.asarray(getattr(arch, key))
        assert arr.shape == (N_OPS,) == (len(Op),), key
        assert arr.dtype == (np.float32 if key == "issue_cycles" else np.int32), key
        assert np.all(arr >= 1), key
    lat = np.asarray(arch.latency_cycles)
    assert lat[Op.FMA] == 4  # DOMAIN.md: dependent FMA 4 cycles on V100/A100/H100
    assert arch.schedulers_per_sm == 4 and arch.warp_size == 32


@pytest.mark.parametrize("name", PRESETS)
def test_preset_floorplan_inside_die(arch_cache, name):
    arch = arch_cache[name]
    xy = np.asarray(arch.sm_xy_mm)
    die = np.asarray(arch.die_mm)
    assert die.shape == (2,) and np.all(die > 0)
    assert xy.shape == (arch.n_sm_slots, 2)
    assert np.all(xy > 0) and np.all(xy < die), "an SM centre lies outside the die"
    assert len(np.unique(xy, axis=0)) == arch.n_sm_slots, "two SM slots share a position"
    # the two SMs of a TPC sit side by side
    tpc = np.asarray(arch.sm_tpc)
    for t in range(0, arch.n_sm_slots // 2, 5):
        a, b = np.flatnonzero(tpc == t)
        assert xy[a, 1] == xy[b, 1]


# --------------------------------------------------------------------------- H200 %smid layout


# docs/calibration.md, "SM layout": TPC t holds %smid 2t, 2t+1; TPCs 0-31 go round robin over
# GPCs 0-7, TPCs 32-59 round robin over GPCs 1-7, TPC 60 to GPC 6, TPC 61 to GPC 7, TPCs 62-65 to
# GPC 0 (GPC g numbered so that it holds TPC g).
H200_TPC_GPC = {t: t % 8 for t in range(32)} | {t: 1 + (t - 32) % 7 for t in range(32, 60)} | {
    60: 6, 61: 7, 62: 0, 63: 0, 64: 0, 65: 0}
# TPCs seen together in thread-block clusters (so in one GPC), measured, run 1
H200_CLUSTER_GROUPS = [
    [0, 8, 16, 24], [1, 9, 17, 25, 32, 39, 46, 53], [2, 10, 18, 26, 33, 40, 47, 54],
    [3, 11, 19, 27, 34, 41, 48, 55], [4, 12, 20, 28, 35, 42, 49, 56],
    [6, 14, 22, 30, 37, 44, 51, 58, 60],
]


def test_h200_smid_layout(arch_cache):
    arch = arch_cache["h200"]
    gpc = np.asarray(arch.sm_gpc)
    tpc = np.asarray(arch.sm_tpc)
    enabled = np.asarray(arch.sm_enabled)
    for t, g in H200_TPC_GPC.items():
        assert tpc[2 * t] == tpc[2 * t + 1] == t
        assert gpc[2 * t] == gpc[2 * t + 1] == g, f"TPC {t}"
    assert enabled[:132].all() and not enabled[132:].any()
    # each cluster group lies in one GPC, and different groups in different GPCs
    group_gpc = [{int(gpc[2 * t]) for t in group} for group in H200_CLUSTER_GROUPS]
    assert all(len(g) == 1 for g in group_gpc), group_gpc
    assert len(set.union(*group_gpc)) == len(H200_CLUSTER_GROUPS)
    gpc0 = np.flatnonzero(enabled & (gpc == 0)).tolist()
    assert gpc0 == [0, 1, 16, 17, 32, 33, 48, 49, 124, 125, 126, 127, 128, 129, 130, 131]
    per_gpc = [int(np.sum(enabled & (gpc == g))) for g in range(8)]
    assert per_gpc == [16, 16, 16, 16, 16, 16, 18, 18]
    # 9 TPC sites per GPC (GH100): the 6 floorswept TPCs fill GPCs 0-5 up to 9
    sites = [int(np.sum(gpc == g)) // 2 for g in range(8)]
    assert sites == [9] * 8


def test_h200_dispatch_order(arch_cache):
    """docs/calibration.md, "CTA dispatch": GPC by GPC, TPC pairs in %smid order, GPC 0 led by
    %smid 124-131 (TPCs 62-65), which every measured launch began with."""
    order = np.asarray(arch_cache["h200"].dispatch_order).tolist()
    assert order[:16] == [124, 125, 126, 127, 128, 129, 130, 131, 0, 1, 16, 17, 32, 33, 48, 49]
    # the measured run through GPC 5 into GPC 6
    run = [10, 11, 26, 27, 42, 43, 58, 59, 72, 73, 86, 87, 100, 101, 114, 115, 12, 13]
    i = order.index(run[0])
    assert order[i:i + len(run)] == run
    # every GPC's TPCs after the lead block come in %smid order, as whole pairs
    expected = [2 * t + h for g in range(8)
                for t in sorted(t for t, tg in H200_TPC_GPC.items() if tg == g and t < 62)
                for h in (0, 1)]
    assert order[8:132] == expected
    assert order[132:] == list(range(132, 144))


def test_gh100_calibrated_numbers(arch_cache):
    """docs/calibration.md: numbers measured on an H200; the pipeline latencies, L2 and clock
    are GH100's and the H100 preset shares them, DRAM is the H200's alone."""
    h100, h200 = arch_cache["h100"], arch_cache["h200"]
    for arch in (h100, h200):
        lat = dict(zip(OP_NAMES, np.asarray(arch.latency_cycles).tolist()))
        assert (lat["fma"], lat["alu"], lat["sfu"], lat["lds"], lat["ldg"], lat["shfl"]) == (
            4, 4, 17, 23, 34, 24), arch.name
        issue = dict(zip(OP_NAMES, np.asarray(arch.issue_cycles).tolist()))
        assert (issue["fma"], issue["alu"], issue["sfu"]) == (1, 2, 8), arch.name
        assert float(arch.l2_hit_latency_ns) == 143.0
        assert float(arch.l2_bytes_per_ns) == 7400.0
        assert float(arch.boost_clock_ghz) == np.float32(1.98)
        assert float(arch.cta_launch_ns) == 207.0  # median CTA end -> next start on a freed SM
    assert float(h200.dram_bytes_per_ns) == 3700.0
    assert float(h200.dram_latency_ns) == 352.0


def test_build_hierarchy_small():
    h = build_hierarchy([2, 2], [2, 1], die_mm=(10.0, 10.0))
    assert h["sm_enabled"].tolist() == [True] * 6 + [False] * 2
    assert h["sm_gpc"].tolist() == [0, 0, 1, 1, 0, 0, 1, 1]
    assert h["sm_tpc"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert h["dispatch_order"].tolist() == [0, 1, 4, 5, 2, 3, 6, 7]


@pytest.mark.parametrize("full,enabled,field", [
    ([2, 2], [2], "gpc_tpcs_enabled"),
    ([2, 2], [3, 1], "gpc_tpcs_enabled[0]"),
    ([2, 2], [2, -1], "gpc_tpcs_enabled[1]"),
])
def test_build_hierarchy_bad(full, enabled, field):
    with pytest.raises(js.JaxschedError) as exc:
        build_hierarchy(full, enabled, die_mm=(10.0, 10.0))
    assert field in str(exc.value)


# --------------------------------------------------------------------------- TOML


@pytest.mark.parametrize("name", PRESETS)
def test_toml_round_trip(arch_cache, name):
    arch = arch_cache[name]
    text = archio.dumps(arch)
    back = archio.loads(text)
    assert_same_arch(arch, back)
    assert archio.dumps(back) == text  # a fixed point


def test_toml_reads_like_its_source():
    """`jaxsched arch h200 --toml`: about a hundred lines, the enabled SMs as a range, every number
    as written in the preset (1.59, not float32's 1.590000033378601)."""
    text = archio.dumps(presets.get("h200"))
    assert len(text.splitlines()) < 130 and max(map(len, text.splitlines())) <= 120
    assert 'enabled = "0-131"' in text
    for line in ("base_clock_ghz = 1.59", "boost_clock_ghz = 1.98", "die_mm = [33.0, 24.7]",
                 "latency_cycles = {fma = 4, alu = 4, sfu = 17, lds = 23, ldg = 34, shfl = 24, bar = 1, exit = 1}"):
        assert line in text.splitlines(), line
    assert "00000" not in text and "99999" not in text


@pytest.mark.parametrize("form", ["0-131", "0-63,64-131", list(range(132)), [True] * 132 + [False] * 12])
def test_enabled_forms(arch_cache, form):
    arch = archio.loads(_doc_enabled(form)())
    assert_same_arch(arch_cache["h200"], arch)


@settings(max_examples=25, deadline=None)
@given(launch_ns=st.one_of(st.just(0.0), st.floats(0.0, 1e5, width=32)))
def test_cta_launch_ns_round_trip(arch_cache, launch_ns):
    """`cta_launch_ns` (0 allowed) survives TOML text and a `[dispatch]` override on a base."""
    arch = arch_cache["h200"].replace(cta_launch_ns=np.float32(launch_ns))
    back = archio.loads(archio.dumps(arch))
    assert back.cta_launch_ns.dtype == np.float32
    assert float(back.cta_launch_ns) == float(np.float32(launch_ns))
    over = archio.loads(f'base = "h100"\n[dispatch]\ncta_launch_ns = {float(np.float32(launch_ns))!r}\n')
    assert float(over.cta_launch_ns) == float(np.float32(launch_ns))


def test_save_load(arch_cache, tmp_path):
    arch = arch_cache["rtx3090"]
    path = tmp_path / "chip.toml"
    archio.save(arch, path)
    assert_same_arch(arch, archio.load(path))
    assert_same_arch(arch, js.load_arch(str(path)))


def test_base_with_overrides(arch_cache):
    h200 = arch_cache["h200"]
    lat = {op: 10 + i for i, op in enumerate(OP_NAMES)}
    text = tomli_w.dumps({
        "base": "h200",
        "name": "h200-slow",
        "clocks": {"boost_clock_ghz": 1.8, "base_clock_ghz": 1.2},
        "limits": {"max_blocks_per_sm": 16, "smem_carveout_kib": [0, 100, 228]},
        "memory": {"dram_latency_ns": 500.0},
        "pipes": {"latency_cycles": lat},
    })
    arch = archio.loads(text)
    assert arch.name == "h200-slow"
    assert float(arch.boost_clock_ghz) == np.float32(1.8)
    assert float(arch.base_clock_ghz) == np.float32(1.2)
    assert int(arch.max_blocks_per_sm) == 16
    assert np.asarray(arch.smem_carveout_kib).tolist() == [0, 100] + [228] * 8
    assert float(arch.dram_latency_ns) == 500.0
    assert np.asarray(arch.latency_cycles).tolist() == list(lat.values())
    assert arch.boost_clock_ghz.dtype == np.float32
    assert arch.max_blocks_per_sm.dtype == np.int32
    # everything else is the base's
    for key in ("sm_enabled", "sm_gpc", "dispatch_order", "sm_xy_mm", "issue_cycles",
                "dram_bytes_per_ns", "max_threads_per_sm", "smem_per_sm_bytes"):
        np.testing.assert_array_equal(getattr(arch, key), getattr(h200, key), err_msg=key)
    assert arch.compute_capability == (9, 0)


def test_compact_hierarchy_form(arch_cache):
    arch = archio.loads(
        'base = "h200"\nname = "tiny"\n[hierarchy]\ngpc_tpcs_full = [2, 2]\n'
        'gpc_tpcs_enabled = [2, 1]\ndie_mm = [10.0, 10.0]\n'
    )
    assert arch.n_sm_slots == 8 and arch.sm_count == 6
    ref = build_hierarchy([2, 2], [2, 1], die_mm=(10.0, 10.0))
    for key, value in ref.items():
        np.testing.assert_array_equal(getattr(arch, key), value, err_msg=key)
        assert getattr(arch, key).dtype == value.dtype, key
    # gpc_tpcs_enabled defaults to every site
    full = archio.loads('base = "h200"\n[hierarchy]\ngpc_tpcs_full = [3]\ndie_mm = [5.0, 5.0]\n')
    assert full.n_sm_slots == full.sm_count == 6


def test_compact_hierarchy_reproduces_gh100_without_base(arch_cache):
    """A complete document with [hierarchy] instead of [sm] rebuilds the preset exactly (the
    H100 keeps the schematic round-robin layout; the H200's is measured, see calibration.md)."""
    h100 = arch_cache["h100"]
    doc = archio.to_dict(h100)
    del doc["sm"]
    doc["hierarchy"] = {"gpc_tpcs_full": [9] * 8, "gpc_tpcs_enabled": [9, 9, 8, 8, 8, 8, 8, 8],
                        "die_mm": [33.0, 24.7], "gpc_rows": 2}
    assert_same_arch(h100, archio.loads(tomli_w.dumps(doc)))


def test_arch_under_jit(arch_cache):
    @jax.jit
    def summary(a: js.Arch):
        n = jnp.sum(a.sm_enabled.astype(jnp.int32))
        peak = n * a.schedulers_per_sm * a.issue_width * a.boost_clock_ghz  # warp instr / ns
        return n, peak, jnp.sum(a.latency_cycles), jnp.max(a.sm_xy_mm[:, 0])

    for name in ("h200", "a100"):
        a = arch_cache[name]
        n, peak, lat, xmax = summary(a)
        assert int(n) == a.sm_count
        np.testing.assert_allclose(float(peak), a.sm_count * 4 * float(a.boost_clock_ghz), rtol=1e-6)
        assert int(lat) == int(np.sum(a.latency_cycles))
        assert float(xmax) == float(np.max(a.sm_xy_mm[:, 0]))


def test_arch_under_vmap_of_stack(arch_cache):
    h100, h200 = arch_cache["h100"], arch_cache["h200"]
    # `stack` needs equal static fields, so the second preset takes the first one's name
    stacked = js.stack([h100, h200.replace(name=h100.name)])
    assert stacked.sm_enabled.shape == (2, 144)
    assert stacked.dram_bytes_per_ns.shape == (2,)

    def dram_per_sm(a: js.Arch):
        return a.dram_bytes_per_ns / jnp.sum(a.sm_enabled.astype(jnp.float32))

    got = jax.jit(jax.vmap(dram_per_sm))(stacked)
    np.testing.assert_allclose(np.asarray(got), [3350.0 / 132, 3700.0 / 132], rtol=1e-6)


def test_stack_presets_with_different_names(arch_cache):
    stacked = js.stack([arch_cache["h100"], arch_cache["h200"]])
    assert np.asarray(stacked.dram_bytes_per_ns).tolist() == [3350.0, 3700.0]
    assert np.asarray(stacked.cta_launch_ns).tolist() == [207.0, 207.0]


# --------------------------------------------------------------------------- bad input


def _h200_doc() -> dict:
    return copy.deepcopy(archio.to_dict(presets.get("h200")))


def _doc_bad_dispatch() -> str:
    doc = _h200_doc()
    doc["sm"]["dispatch_order"][0] = 125  # 125 twice, 124 missing (the order starts 124, 125)
    return tomli_w.dumps(doc)


def _doc_enabled_not_first() -> str:
    doc = _h200_doc()
    doc["sm"]["enabled"] = "1-132"
    return tomli_w.dumps(doc)


def _doc_enabled(value: object) -> Callable[[], str]:
    def text() -> str:
        doc = _h200_doc()
        doc["sm"]["enabled"] = value
        return tomli_w.dumps(doc)
    return text


def _doc_sm_and_hierarchy() -> str:
    doc = _h200_doc()
    doc["hierarchy"] = {"gpc_tpcs_full": [2, 2], "die_mm": [10.0, 10.0]}
    return tomli_w.dumps(doc)


BAD_TOML = {
    "unknown key": ('base = "h200"\nfrequency = 3\n', ["frequency", "3", "unknown key"]),
    "unknown section": ('base = "h200"\n[power]\nwatts = 7\n', ["power", "watts"]),
    "unknown section key": ('base = "h200"\n[limits]\nmax_warps = 64\n',
                            ["limits.max_warps", "64"]),
    "unknown hierarchy key": ('base = "h200"\n[hierarchy]\ngpc_tpcs_full = [2]\n'
                              'die_mm = [1.0, 1.0]\nrows = 3\n', ["hierarchy.rows", "3"]),
    "unknown op class": ('base = "h200"\n[pipes]\nlatency_cycles = {fma = 4, tensor = 8}\n',
                         ["latency_cycles.tensor", "8"]),
    "missing op class": ('base = "h200"\n[pipes]\nissue_cycles = {fma = 4}\n',
                         ["issue_cycles", "alu"]),
    "missing fields without base": ('name = "x"\n', ["missing", "max_threads_per_sm",
                                                     "compute_capability"]),
    "negative limit": ('base = "h200"\n[limits]\nmax_blocks_per_sm = -4\n',
                       ["max_blocks_per_sm", "-4"]),
    "negative reserved": ('base = "h200"\n[limits]\nreserved_smem_per_block_bytes = -1\n',
                          ["reserved_smem_per_block_bytes", "-1"]),
    "zero latency": ('base = "h200"\n[pipes]\nlatency_cycles = {fma = 0, alu = 4, sfu = 18, '
                     'lds = 29, ldg = 39, shfl = 24, bar = 1, exit = 1}\n',
                     ["latency_cycles[0]", "= 0"]),
    "base clock above boost": ('base = "h200"\n[clocks]\nbase_clock_ghz = 2.5\n',
                               ["base_clock_ghz", "2.5"]),
    "negative launch latency": ('base = "h200"\n[dispatch]\ncta_launch_ns = -1.0\n',
                                ["cta_launch_ns", "-1.0"]),
    "unknown dispatch key": ('base = "h200"\n[dispatch]\nlaunch_ns = 5.0\n',
                             ["dispatch.launch_ns", "5.0"]),
    "non-finite bandwidth": ('base = "h200"\n[memory]\ndram_bytes_per_ns = nan\n',
                             ["dram_bytes_per_ns", "nan"]),
    "carveout max != smem": ('base = "h200"\n[limits]\nsmem_carveout_kib = [0, 100]\n',
                             ["smem_carveout_kib", "[0, 100"]),
    "section not a table": ('base = "h200"\nlimits = 3\n', ["limits", "3"]),
    "unknown base": ('base = "b200"\n', ["b200"]),
    "dispatch_order not a permutation": (_doc_bad_dispatch, ["dispatch_order", "[125, 125, 126"]),
    "enabled SMs not first": (_doc_enabled_not_first, ["sm_enabled", "[0, 1, 1"]),
    "[sm] and [hierarchy]": (_doc_sm_and_hierarchy, ["sm", "hierarchy"]),
    "enabled range backwards": (_doc_enabled("0-131,140-135"), ["sm.enabled", "140-135", "ranges"]),
    "enabled slot past the die": (_doc_enabled([0, 1, 144]), ["sm.enabled", "0 .. 143"]),
    "enabled words": (_doc_enabled("all"), ["sm.enabled", "'all'"]),
}


@pytest.mark.parametrize("case", list(BAD_TOML))
def test_bad_toml(case):
    text, fragments = BAD_TOML[case]
    text = text() if callable(text) else text
    with pytest.raises(js.JaxschedError) as exc:
        archio.loads(text)
    message = str(exc.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert "<string>" in message or case == "unknown base"  # names the source


def test_malformed_toml(tmp_path):
    with pytest.raises(js.JaxschedError) as exc:
        archio.loads("name = = 3\n")
    assert "malformed TOML" in str(exc.value) and "line 1" in str(exc.value)
    path = tmp_path / "bad.toml"
    path.write_text('name = "x"\n[limits\n')
    with pytest.raises(js.JaxschedError) as exc:
        archio.load(path)
    assert str(path) in str(exc.value) and "malformed TOML" in str(exc.value)


def test_missing_arch_file(tmp_path):
    path = tmp_path / "nope.toml"
    with pytest.raises(js.JaxschedError) as exc:
        archio.load(path)
    assert "arch file" in str(exc.value) and str(path) in str(exc.value)


def test_unknown_preset():
    with pytest.raises(js.JaxschedError) as exc:
        presets.get("b200")
    message = str(exc.value)
    assert "arch" in message and "'b200'" in message
    assert "h200" in message  # lists the known ones


def test_validate_via_replace(arch_cache):
    h200 = arch_cache["h200"]
    with pytest.raises(js.JaxschedError, match="dispatch_order"):
        h200.replace(dispatch_order=np.zeros(144, dtype=np.int32))
    with pytest.raises(js.JaxschedError, match="sm_enabled"):
        h200.replace(sm_enabled=np.zeros(144, dtype=bool))
    with pytest.raises(js.JaxschedError, match="base_clock_ghz"):
        h200.replace(base_clock_ghz=np.float32(3.0))
    with pytest.raises(js.JaxschedError, match="max_threads_per_block"):
        h200.replace(max_threads_per_block=np.int32(4096))


@pytest.mark.parametrize("text", [
    'base = "h200"\n[hierarchy]\ngpc_tpcs_full = [2, 2]\ndie_mm = [10.0, 10.0]\ngpc_rows = 0\n',
    'base = "h200"\n[hierarchy]\ngpc_tpcs_full = [2, 2]\ndie_mm = [10.0]\n',
    'base = "h200"\nhierarchy = 3\n',
    'base = "h200"\n[limits]\nmax_blocks_per_sm = 10000000000\n',
], ids=["gpc_rows-0", "die_mm-short", "hierarchy-not-table", "int32-overflow"])
def test_bad_toml_values_raise_jaxsched_error(text):
    with pytest.raises(js.JaxschedError):
        archio.loads(text)


def test_arch_values_are_the_arch_without_jax():
    """`ArchValues` has `Arch`'s fields, cast to the same dtypes, and is checked by the same rules."""
    import dataclasses

    assert archvalues.FIELDS == tuple(f.name for f in dataclasses.fields(Arch))
    for name in PRESETS:
        values, arch = presets.values(name), presets.get(name)
        assert (values.n_sm_slots, values.sm_count) == (arch.n_sm_slots, arch.sm_count)
        for field in archvalues.FIELDS:
            a, v = getattr(arch, field), getattr(values, field)
            assert type(a) is type(v), field
            if isinstance(a, np.ndarray):
                assert a.dtype == v.dtype, field
            np.testing.assert_array_equal(a, v, err_msg=field)
    fields = presets.fields("h200")
    with pytest.raises(js.JaxschedError, match="max_blocks_per_sm"):
        archvalues.ArchValues(**{**fields, "max_blocks_per_sm": 0})
    with pytest.raises(js.JaxschedError, match="missing"):
        archvalues.ArchValues(**{k: v for k, v in fields.items() if k != "warp_size"})

