"""The engine's results do not depend on XLA's CPU code generation.

The suite compiles with the CPU fusion emitters off and LLVM at -O0 (conftest.py: a third of the
compile time). This
runs a varied batch (`benchmarks/cross_device.py`: four programs, grids, clock maps, policies
and dispatch rotations on the H200 cut to 8 SMs: the same SM and the same operations, on
arrays of 8 SMs rather than 132, in 37 s rather than 94 s) once under the suite's flags and
once in a subprocess under XLA's defaults, and compares every output bit for bit.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from conftest import SUITE_XLA_FLAGS
from cross_device import configurations  # benchmarks/, on pytest's pythonpath (pyproject.toml)

from jaxsched.engine.run import simulate_batch

ROOT = Path(__file__).resolve().parents[1]

N_CONFIGS = 4
ARCH = str(ROOT / "sweeps" / "arches" / "h200_8sm.toml")


def test_default_code_generation_gives_the_same_results(tmp_path):
    assert SUITE_XLA_FLAGS in os.environ["XLA_FLAGS"]
    out = tmp_path / "default.npz"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cross_device.py"), "--n", str(N_CONFIGS),
                    "--arch", ARCH, "--out", str(out)], env=env, check=True, capture_output=True)
    default = np.load(out)
    result = simulate_batch(*configurations(N_CONFIGS, arch=ARCH))
    names = [name for name in result.__dataclass_fields__ if name != "max_warps_per_sm"]
    assert sorted(names) == sorted(k for k in default.files if k != "device")
    for name in names:
        np.testing.assert_array_equal(np.asarray(getattr(result, name)), default[name], err_msg=name)
