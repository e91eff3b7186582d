"""A batch run in chunks (simulate_batch's `chunk`, on the CPU by default) gives every
configuration the results of the batch run at once, bit for bit, including a padded last chunk.
The devices a batch runs on: one CPU device per core by default, and bad device lists refused
(tests/test_sharding.py checks results over 8 devices against one)."""

import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import small_arch

import jaxsched as js
from jaxsched import clocks
from jaxsched.engine.mechanics.devices import WAIT_FLAGS
from jaxsched.errors import JaxschedError

PROGRAM = "loop 3 cta_spread=2\n ldg bytes=128\n fma dep\nend\nbar\n"


def _batch(**kwargs):
    arch = small_arch()
    kernels = [js.make_kernel(PROGRAM, grid=g, threads=128, regs=32) for g in (9, 14, 20, 6, 11)]
    clk = [clocks.from_array(arch, np.linspace(1300 + 50 * i, 1900, arch.n_sm_slots)) for i in range(5)]
    return js.simulate_batch([arch] * 5, kernels, clk, [0, 1, 2, 1, 0], [0, 1, 4, 0, 3], [0, 2, 0, 1, 0],
                             **kwargs)


def test_chunks_change_no_result():
    # The batch mixes the closed loop (configuration 2) with the other dispatch policies: in
    # chunks of 2, configurations 0, 1 and 4 share no chunk with it, so they run by the step's
    # open-loop branch (`step._dispatch`), the whole batch by the closed-loop one.
    whole, chunked = _batch(chunk=5), _batch(chunk=2)
    for name, value in vars(whole).items():
        if hasattr(value, "shape"):
            np.testing.assert_array_equal(np.asarray(getattr(chunked, name)), np.asarray(value), err_msg=name)


def test_no_devices_is_refused():
    with pytest.raises(JaxschedError, match="devices"):
        _batch(devices=[])


def _in_fresh_process(env: dict, code: str = "import jaxsched as js, jax; js.use_host_cores(); print(len(jax.devices()))") -> str:
    """What `code` prints in a fresh process with `env` added (by default the CPU devices after
    `use_host_cores`), or its error."""
    full = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAXSCHED_CPU_DEVICES")}
    full.update(JAX_PLATFORMS="cpu", **env)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=120)
    return proc.stdout.strip() if proc.returncode == 0 else proc.stderr


def test_host_cores_become_cpu_devices():
    """`use_host_cores` exposes one CPU device per core; `import jaxsched` neither imports JAX nor
    configures it, and importing the engine leaves JAX's device count as it is."""
    assert _in_fresh_process({}, "import jaxsched, sys; print('jax' in sys.modules)") == "False"
    assert _in_fresh_process({"JAXSCHED_CPU_DEVICES": "3"}, "import jaxsched.engine.run, jax; print(len(jax.devices()))") == "1"
    assert _in_fresh_process({}) == str(len(os.sched_getaffinity(0)))
    assert _in_fresh_process({"JAXSCHED_CPU_DEVICES": "3"}) == "3"
    assert _in_fresh_process({"XLA_FLAGS": "--xla_force_host_platform_device_count=5"}) == "5"  # the user's choice
    assert "JAXSCHED_CPU_DEVICES = 'none': a count of CPU devices" in _in_fresh_process({"JAXSCHED_CPU_DEVICES": "none"})


def test_host_cores_wait_for_each_other_without_a_deadline():
    """With several CPU devices `use_host_cores` lifts XLA's 60 s limit on a device's wait at a
    collective (a device whose share runs longer is not stuck; XLA aborted the process), XLA
    accepts the flags, and a limit the user set is kept. (The abort itself takes a minute to
    show: checked by hand with one device's share sleeping 75 s.)"""
    code = ("import os, jaxsched, jax, jax.numpy as jnp; jaxsched.use_host_cores(); "
            "print(int(jnp.arange(4).sum()), os.environ['XLA_FLAGS'])")
    out = _in_fresh_process({"JAXSCHED_CPU_DEVICES": "2"}, code)
    assert out == "6 " + " ".join(WAIT_FLAGS)
    mine = "--xla_cpu_collective_call_terminate_timeout_seconds=600"
    out = _in_fresh_process({"JAXSCHED_CPU_DEVICES": "2", "XLA_FLAGS": mine}, code)
    assert out == f"6 {mine} {WAIT_FLAGS[0]}"


@pytest.mark.parametrize("chunk", [0, -1, 2.5])
def test_bad_chunk_is_refused(chunk):
    with pytest.raises(JaxschedError, match="chunk"):
        _batch(chunk=chunk)


@pytest.mark.parametrize("field, policies", [("warp_policy", [0, 1, 3, 1, 0]), ("warp_policy", [-1] * 5),
                                              ("dispatch", [0, 1, len(js.DISPATCH_POLICIES), 0, 3])])
def test_policy_indices_out_of_range_are_refused(field, policies):
    """An index past the known policies would run as some other policy: refused, with the field,
    the bad indices and the known names."""
    arch = small_arch()
    kernels = [js.make_kernel(PROGRAM, grid=6, threads=128, regs=32)] * 5
    given = {"warp_policy": [0] * 5, "dispatch": [0] * 5, field: policies}
    with pytest.raises(JaxschedError, match=field) as err:
        js.simulate_batch([arch] * 5, kernels, [clocks.uniform(arch)] * 5, given["warp_policy"],
                          given["dispatch"], [0] * 5)
    known = js.WARP_POLICIES if field == "warp_policy" else js.DISPATCH_POLICIES
    assert str(sorted(p for p in set(policies) if not 0 <= p < len(known))) in str(err.value)


def test_default_devices_respect_a_chosen_default_device():
    code = ("import jaxsched, jax; from jaxsched.engine.mechanics.devices import default_devices as d\n"
            "jaxsched.use_host_cores()\n"
            "with jax.default_device(jax.devices()[1]):\n    inner = d()\n"
            "print(d() == jax.devices(), inner == [jax.devices()[1]])")
    assert _in_fresh_process({"JAXSCHED_CPU_DEVICES": "2"}, code) == "True True"
