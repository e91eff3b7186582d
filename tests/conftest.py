"""Test-session settings that must precede the first `import jaxsched`."""

import gc
import os
import shutil
import tempfile

import pytest
from hypothesis import settings

# xdist already runs one worker per core (`make test`), so each worker takes one CPU device
# rather than one per core (`jaxsched.engine.mechanics.devices`); subprocesses inherit it.
# tests/test_sharding.py and tests/test_batch_chunks.py check the multi-device paths.
os.environ.setdefault("JAXSCHED_CPU_DEVICES", "1")

# The command line keeps compiled simulations in the user's cache folder; tests neither read nor
# write it (a test run must not load what another run or version compiled: the run's own XLA
# cache below starts empty). tests/test_compile_cache.py uses folders of its own.
os.environ["JAXSCHED_CACHE_DIR"] = "off"

# Compilation is most of the suite's time, and most of the suite's runs are short. XLA's CPU
# fusion emitters off, LLVM at -O0 and its expensive passes off cut a small chip's compile from
# 10 s to 3-5 s for a slower run (about 1.5x): the suite went from 1,075 s to 645 s on two cores.
# Results do not depend on it: tests/test_compiler_flags.py compares a varied batch against
# XLA's defaults bit for bit. Subprocesses inherit it.
SUITE_XLA_FLAGS = ("--xla_cpu_use_fusion_emitters=false --xla_backend_optimization_level=0 "
                   "--xla_llvm_disable_expensive_passes=true")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + SUITE_XLA_FLAGS).strip()

# One JAX persistent compilation cache for the run, in a fresh folder: the process that starts
# the run makes it (and removes it at the end), its xdist workers and the subprocesses of the
# tests inherit it, so that a program one worker compiled is loaded by the other, and by a
# worker again after `_bounded_compile_memory` dropped it. Nothing outlives the run: every run
# compiles what it runs once. Executables are the same either way (JAX keys them on the lowered
# program, XLA's flags and the devices).
SUITE_XLA_CACHE_ENV = "JAXSCHED_SUITE_XLA_CACHE"
_OWN_XLA_CACHE = SUITE_XLA_CACHE_ENV not in os.environ
if _OWN_XLA_CACHE:
    os.environ[SUITE_XLA_CACHE_ENV] = tempfile.mkdtemp(prefix="jaxsched-suite-xla-")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.environ[SUITE_XLA_CACHE_ENV])
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")


def pytest_unconfigure(config):
    if _OWN_XLA_CACHE:
        shutil.rmtree(os.environ[SUITE_XLA_CACHE_ENV], ignore_errors=True)

# Fixed draws by default, so that the suite's time does not depend on luck: a rare draw (a
# chip whose DRAM serves 5 B/ns, say) runs the reference for 20-30 s and hypothesis then
# explores around it. HYPOTHESIS_PROFILE=explore draws anew each run.
settings.register_profile("fixed", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fixed"))

# Hypothesis (6.1xx) also draws, about one number in forty, a literal of a local module it has
# seen imported (every file of jaxsched/ and tests/). The fixed draws then change with any edit
# of a number anywhere in either, and with the order in which a worker first imports jaxsched's
# modules (worksteal decides it), and one draw can move a file's time by a minute
# (test_dvfs_vs_reference: 83 s in the suite, 146 s alone, on the same commit). The fixed
# profile draws from the strategies alone; hypothesis' own pool of notable numbers stays.
if os.environ.get("HYPOTHESIS_PROFILE", "fixed") == "fixed":
    from hypothesis.internal.conjecture import providers as _providers

    if hasattr(_providers, "_get_local_constants"):
        _providers._get_local_constants = lambda: _providers.Constants()


# Every compiled simulation stays in JAX's caches for the worker's life (about 50-100 MB each at
# -O0), which took a worker to 5.8 GB by the end of the suite. Past 4 GB a finished test file's
# programs are dropped (CI's runner has 24 GiB for its two workers); below it the next file
# runs the shapes it shares with earlier ones (the differential tests' padded shapes,
# helpers.simulate_padded) at once, where after a drop it traces them again (3-5 s each) to
# load them from the run's XLA cache.
WORKER_RSS_LIMIT_BYTES = 4 << 30


def _rss_bytes() -> int:
    """This process's resident size (0 where /proc is absent: nothing is dropped)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


@pytest.fixture(autouse=True, scope="module")
def _bounded_compile_memory():
    yield
    if _rss_bytes() > WORKER_RSS_LIMIT_BYTES:
        import jax

        jax.clear_caches()
        gc.collect()
