"""`jaxsched.occupancy` by hand: worked examples, vmap/jit/broadcasting, input errors, properties.

The exhaustive comparison with CUDA's own calculator is in `test_occupancy_oracle.py`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxsched import JaxschedError, presets
from jaxsched.occupancy import NO_LIMIT, Limiter, max_active_blocks, occupancy

PRESETS = presets.names()


def random_valid(arch, n: int, rng: np.random.Generator):
    """n valid (threads, regs, dynamic smem) launches, dynamic smem up to the opt-in limit."""
    threads = rng.integers(1, 1025, n)
    regs = rng.integers(0, 256, n)
    smem = rng.integers(0, int(arch.smem_per_block_optin_bytes) + 1, n)
    return threads, regs, smem


# --- worked examples (DOMAIN.md: "Worked check") -------------------------------------------------

@pytest.mark.parametrize(
    "regs, blocks, fraction, limiters",
    [(32, 8, 1.0, ["warps", "registers"]), (64, 4, 0.5, ["registers"]), (96, 2, 0.25, ["registers"])],
)
def test_a100_256_threads(regs, blocks, fraction, limiters):
    occ = occupancy(presets.get("a100"), 256, regs, 0)
    assert int(occ.blocks_per_sm) == blocks
    assert int(occ.warps_per_block) == 8
    assert int(occ.active_warps) == blocks * 8
    assert float(occ.occupancy) == pytest.approx(fraction)
    assert occ.limiters() == limiters
    assert int(occ.limit_registers) == blocks
    assert int(occ.limit_warps) == 8
    assert int(occ.limit_blocks) == 32
    # 1 KiB reserved per block: 164 KiB / 1 KiB.
    assert int(occ.limit_shared_memory) == 164
    assert int(occ.smem_per_block_allocated_bytes) == 1024
    assert int(occ.limit_barriers) == NO_LIMIT  # CTA barriers limit only from CC 9.0


def test_limits_without_resources():
    """No registers and no shared memory: those limits are INT_MAX, as in cuda_occupancy.h."""
    occ = occupancy(presets.get("v100"), 32, 0, 0)
    assert int(occ.limit_registers) == NO_LIMIT == 2**31 - 1
    assert int(occ.limit_shared_memory) == NO_LIMIT
    assert int(occ.blocks_per_sm) == 32
    assert occ.limiters() == ["blocks"]


def test_hopper_barriers():
    """CC 9.0: 64 CTA barriers per SM; 2 per block allow 32 blocks, 3 allow 21, 0 no limit."""
    h100 = presets.get("h100")
    occ = occupancy(h100, 32, 0, 0, block_barriers=np.array([0, 1, 2, 3, 16]))
    assert occ.limit_barriers.tolist() == [NO_LIMIT, 64, 32, 21, 4]
    assert occ.blocks_per_sm.tolist() == [32, 32, 32, 21, 4]
    bits = occ.limiting_factors.tolist()
    assert bits[2] == Limiter.BLOCKS | Limiter.BARRIERS
    assert bits[3] & Limiter.BARRIERS and not bits[1] & Limiter.BARRIERS


# --- vmap, jit, broadcasting ---------------------------------------------------------------------

@pytest.mark.parametrize("name", PRESETS)
def test_vmap_equals_broadcast_and_scalar_calls(name):
    arch = presets.get(name)
    rng = np.random.default_rng(sum(map(ord, name)))
    t, r, s = random_valid(arch, 100_000, rng)
    vmapped = np.asarray(jax.vmap(lambda t, r, s: max_active_blocks(arch, t, r, s))(t, r, s))
    broadcast = np.asarray(max_active_blocks(arch, t, r, s))
    np.testing.assert_array_equal(vmapped, broadcast)
    assert vmapped.shape == (100_000,)
    assert len(np.unique(vmapped)) > 10  # the sample reaches many different answers
    for i in rng.choice(t.size, 60, replace=False):  # 300 scalar calls over the five presets
        assert int(max_active_blocks(arch, int(t[i]), int(r[i]), int(s[i]))) == vmapped[i]


def test_jit():
    """Concrete inputs run in numpy (also on an `ArchValues`, without JAX), traced ones in
    jax.numpy: the same numbers and dtypes in every field."""
    arch = presets.get("h100")
    t, r, s = random_valid(arch, 5000, np.random.default_rng(5))
    jitted = jax.jit(lambda t, r, s: occupancy(arch, t, r, s))(t, r, s)
    for eager in (occupancy(arch, t, r, s), occupancy(presets.values("h100"), t, r, s)):
        assert isinstance(eager.blocks_per_sm, np.ndarray)
        for field, value in eager._asdict().items():
            np.testing.assert_array_equal(np.asarray(getattr(jitted, field)), value, err_msg=field)
            assert np.asarray(getattr(jitted, field)).dtype == value.dtype, field
    # The architecture itself can be a traced argument (one compiled function, many GPUs).
    by_arch = jax.jit(lambda a, t, r, s: max_active_blocks(a, t, r, s))
    for name in ("a100", "rtx3090"):
        other = presets.get(name)
        np.testing.assert_array_equal(np.asarray(by_arch(other, t, r, np.minimum(s, 99 * 1024))),
                                      np.asarray(max_active_blocks(other, t, r, np.minimum(s, 99 * 1024))))


def test_jit_impossible_launch_gives_zero_blocks():
    """Under tracing nothing is validated: launches CUDA refuses come out as 0 blocks."""
    arch = presets.get("a100")
    f = jax.jit(lambda t, r, s: max_active_blocks(arch, t, r, s))
    out = f(jnp.array([256, 0, 1025, 256, 256]), jnp.array([32, 32, 32, 256, 32]),
            jnp.array([0, 0, 0, 0, int(arch.smem_per_block_optin_bytes) + 1]))
    assert out.tolist() == [8, 0, 0, 0, 0]


def test_broadcasting_shapes():
    arch = presets.get("a100")
    threads = np.array([[64], [256], [1024]])  # (3, 1)
    regs = np.array([16, 32, 64, 128])  # (4,)
    occ = occupancy(arch, threads, regs, 4096)
    for field in ("blocks_per_sm", "limit_warps", "limit_registers", "limit_shared_memory",
                  "limit_blocks", "limit_barriers", "limiting_factors", "occupancy",
                  "warps_per_block", "smem_per_sm_bytes"):
        assert getattr(occ, field).shape == (3, 4), field
    for i, t in enumerate(threads[:, 0]):
        for j, r in enumerate(regs):
            assert int(occ.blocks_per_sm[i, j]) == int(max_active_blocks(arch, int(t), int(r), 4096))
    carve = occupancy(arch, threads, regs, 4096, carveout_percent=np.array([0, 50, 100]).reshape(3, 1, 1))
    assert carve.blocks_per_sm.shape == (3, 3, 4)
    assert max_active_blocks(arch, 256, 32, np.zeros((2, 5), dtype=int)).shape == (2, 5)
    assert max_active_blocks(arch, 256, 32, 0).shape == ()


# --- errors --------------------------------------------------------------------------------------

A100_OPTIN = 166912


@pytest.mark.parametrize(
    "kwargs, field, value, limit",
    [
        (dict(threads_per_block=0), "threads_per_block", "0", "1"),
        (dict(threads_per_block=1025), "threads_per_block", "1025", "1024"),
        (dict(regs_per_thread=256), "regs_per_thread", "256", "255"),
        (dict(regs_per_thread=-1), "regs_per_thread", "-1", "0"),
        (dict(dynamic_smem_bytes=A100_OPTIN + 1), "dynamic_smem_bytes", str(A100_OPTIN + 1), str(A100_OPTIN)),
        (dict(dynamic_smem_bytes=A100_OPTIN - 49152 + 1, static_smem_bytes=49152), "dynamic_smem_bytes",
         str(A100_OPTIN - 49152 + 1), str(A100_OPTIN)),
        (dict(dynamic_smem_bytes=-1), "dynamic_smem_bytes", "-1", "0"),
        (dict(static_smem_bytes=-8), "static_smem_bytes", "-8", "0"),
        (dict(static_smem_bytes=49153), "static_smem_bytes", "49153", "49152"),
        (dict(carveout_percent=101), "carveout_percent", "101", "100"),
        (dict(carveout_percent=-2), "carveout_percent", "-2", "100"),
        (dict(block_barriers=17), "block_barriers", "17", "16"),
        (dict(threads_per_block=np.array([32, 2000, 64])), "threads_per_block", "2000", "1024"),
    ],
)
def test_bad_input_names_field_value_and_limit(kwargs, field, value, limit):
    args = dict(threads_per_block=256, regs_per_thread=32, dynamic_smem_bytes=0)
    args.update(kwargs)
    with pytest.raises(JaxschedError) as info:
        occupancy(presets.get("a100"), **args)
    message = str(info.value)
    assert info.value.field == field
    assert message.startswith(f"{field} = "), message
    assert value in message and limit in message, message
    if np.ndim(kwargs.get("threads_per_block", 0)):
        assert "index" in message, message


@pytest.mark.parametrize("name", PRESETS)
def test_opt_in_limit_is_inclusive(name):
    arch = presets.get(name)
    optin = int(arch.smem_per_block_optin_bytes)
    assert int(max_active_blocks(arch, 32, 32, optin)) == 1
    assert int(max_active_blocks(arch, 32, 32, optin - 49152, 49152)) == 1
    with pytest.raises(JaxschedError, match="dynamic_smem_bytes"):
        max_active_blocks(arch, 32, 32, optin + 1)
    with pytest.raises(JaxschedError, match="threads_per_block"):
        max_active_blocks(arch, 1025, 32, 0)


def test_max_active_blocks_also_validates():
    with pytest.raises(JaxschedError, match="regs_per_thread = 300"):
        max_active_blocks(presets.get("v100"), 128, 300, 0)


# --- properties ----------------------------------------------------------------------------------

@st.composite
def launches(draw):
    name = draw(st.sampled_from(PRESETS))
    arch = presets.get(name)
    static = draw(st.integers(0, 49152))
    return dict(
        arch=arch,
        threads=draw(st.integers(1, 1024)),
        regs=draw(st.integers(0, 255)),
        static=static,
        dynamic=draw(st.integers(0, int(arch.smem_per_block_optin_bytes) - static)),
        carveout=draw(st.integers(-1, 100)),
        barriers=draw(st.integers(0, 16)),
    )


def _occ(case, **overrides):
    c = dict(case, **overrides)
    return occupancy(c["arch"], c["threads"], c["regs"], c["dynamic"], c["static"],
                     carveout_percent=c["carveout"], block_barriers=c["barriers"])


@settings(max_examples=60, deadline=None)
@given(launches())
def test_more_resources_never_raise_occupancy(case):
    arch = case["arch"]
    by_regs = np.asarray(_occ(case, regs=np.arange(256)).blocks_per_sm)
    assert np.all(np.diff(by_regs) <= 0), by_regs
    room = int(arch.smem_per_block_optin_bytes) - case["static"]
    dyn = np.linspace(0, room, 257).astype(np.int64)
    by_smem = np.asarray(_occ(case, dynamic=dyn).blocks_per_sm)
    assert np.all(np.diff(by_smem) <= 0), by_smem
    by_barriers = np.asarray(_occ(case, barriers=np.arange(17)).blocks_per_sm)
    assert np.all(np.diff(by_barriers) <= 0), by_barriers
    by_threads = np.asarray(_occ(case, threads=np.arange(1, 1025)).warps_per_block)
    assert np.all(np.diff(by_threads) >= 0)
    # A larger carveout never lowers occupancy, and the default is the largest.
    by_carveout = np.asarray(_occ(case, carveout=np.arange(-1, 101)).blocks_per_sm)
    assert np.all(np.diff(by_carveout[1:]) >= 0), by_carveout
    assert by_carveout[0] == by_carveout[-1]


@settings(max_examples=100, deadline=None)
@given(launches())
def test_resident_blocks_fit_the_sm(case):
    arch = case["arch"]
    occ = _occ(case)
    blocks = int(occ.blocks_per_sm)
    warps = int(occ.warps_per_block)
    assert warps == -(-case["threads"] // 32)
    assert blocks * warps <= int(arch.max_threads_per_sm) // 32
    assert int(occ.active_warps) == blocks * warps
    assert float(occ.occupancy) == pytest.approx(blocks * warps / (int(arch.max_threads_per_sm) // 32))
    assert blocks <= int(arch.max_blocks_per_sm)
    assert blocks * int(occ.regs_per_block_allocated) <= int(arch.regs_per_sm)
    assert blocks * int(occ.smem_per_block_allocated_bytes) <= int(occ.smem_per_sm_bytes)
    assert int(occ.smem_per_sm_bytes) <= int(arch.smem_per_sm_bytes)
    # Every valid launch runs unless its registers cannot fit (the hardware's per-CTA check).
    regs_per_warp = -(-case["regs"] * 32 // 256) * 256
    fits = regs_per_warp * (-(-warps // 4) * 4) <= int(arch.regs_per_block)
    assert (blocks >= 1) == fits
    # The limiting factors are exactly the limits equal to the result.
    limits = {Limiter.WARPS: occ.limit_warps, Limiter.REGISTERS: occ.limit_registers,
              Limiter.SHARED_MEMORY: occ.limit_shared_memory, Limiter.BLOCKS: occ.limit_blocks}
    first = min(int(v) for v in limits.values())
    for bit, value in limits.items():
        assert bool(int(occ.limiting_factors) & bit) == (int(value) == first)
    assert blocks == min(first, int(occ.limit_barriers))
