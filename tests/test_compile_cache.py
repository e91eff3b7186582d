"""`jaxsched.compile_cache`: the cache folder from the environment, the engine store's keys,
entries and fallbacks on a small jitted function, and `jaxsched run` through the console script
with the cache on, off and moved (same output; an entry written, then used)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsched import compile_cache

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(sys.executable).parent / "jaxsched"


def test_default_folder(monkeypatch, tmp_path):
    monkeypatch.delenv(compile_cache.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compile_cache.default_folder() == tmp_path / "xdg" / "jaxsched"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert compile_cache.default_folder() == Path.home() / ".cache" / "jaxsched"
    monkeypatch.setenv(compile_cache.ENV, str(tmp_path / "mine"))
    assert compile_cache.default_folder() == tmp_path / "mine"
    monkeypatch.setenv(compile_cache.ENV, "OFF")
    assert compile_cache.default_folder() is None


class Scaled(eqx.Module):
    """An equinox module with a static field, like the engine's `Arch` and `Result`."""

    values: jax.Array
    label: str = eqx.field(static=True)


@pytest.fixture
def store(monkeypatch, tmp_path):
    """The engine store in `tmp_path` (JAX's own cache left alone), a jitted function that
    records its traces, and the store's reads (True: an executable loaded from a file)."""
    monkeypatch.setattr(compile_cache, "_engine_folder", tmp_path)
    monkeypatch.setattr(compile_cache, "_loaded", {})
    read, reads = compile_cache._read, []

    def spied(key: str):
        compiled = read(key)
        reads.append(compiled is not None)
        return compiled

    monkeypatch.setattr(compile_cache, "_read", spied)
    traced = []

    @functools.partial(jax.jit, static_argnames=("power",))
    def raise_to(m: Scaled, offset, *, power: int) -> Scaled:
        traced.append(power)
        return Scaled(m.values ** power + offset, m.label + "!")

    return compile_cache.stored(raise_to), traced, reads, tmp_path


def test_stored_program_is_reused_across_processes(store):
    fn, traced, reads, folder = store
    m = Scaled(np.arange(4, dtype=np.float32), "x")
    first = fn(m, np.float32(1), power=2)
    assert traced == [2] and reads == [False] and len(list(folder.glob("*.exp"))) == 1
    fn(m, np.float32(1), power=2)
    assert reads == [False], "kept in memory"
    compile_cache._loaded.clear()  # as in a new process: only the file is left
    again = fn(m, np.float32(1), power=2)
    assert reads == [False, True]
    assert again.label == first.label == "x!"
    np.testing.assert_array_equal(again.values, [1, 2, 5, 10])
    np.testing.assert_array_equal(again.values, first.values)


def test_keys_follow_static_arguments_shapes_and_dtypes(store):
    fn, traced, reads, folder = store
    m = Scaled(np.arange(4, dtype=np.float32), "x")
    fn(m, np.float32(1), power=2)
    fn(m, np.float32(1), power=3)  # another static argument
    fn(Scaled(np.arange(5, dtype=np.float32), "x"), np.float32(1), power=2)  # another shape
    fn(Scaled(np.arange(4, dtype=np.int32), "x"), np.float32(1), power=2)  # another dtype
    fn(Scaled(np.arange(4, dtype=np.float32), "y"), np.float32(1), power=2)  # another static field
    assert traced == [2, 3, 2, 2, 2] and reads == [False] * 5
    assert len(list(folder.glob("*.exp"))) == 5
    fn(m, np.float32(7), power=2)  # another value: the same executable
    assert len(traced) == 5 and len(reads) == 5


def test_unreadable_entry_is_compiled_anew(store):
    fn, traced, reads, folder = store
    m = Scaled(np.ones(3, np.float32), "x")
    fn(m, np.float32(0), power=2)
    (entry,) = folder.glob("*.exp")
    entry.write_bytes(b"not a pickle")
    compile_cache._loaded.clear()
    np.testing.assert_array_equal(fn(m, np.float32(0), power=2).values, [1, 1, 1])
    assert reads == [False, False] and entry.read_bytes() != b"not a pickle"  # compiled and written again
    compile_cache._loaded.clear()
    fn(m, np.float32(0), power=2)
    assert reads == [False, False, True]


def test_traced_arguments_and_a_disabled_store_bypass_it(store, monkeypatch):
    fn, traced, reads, folder = store
    m = Scaled(np.ones(3, np.float32), "x")
    out = jax.jit(lambda o: fn(m, o, power=2).values)(jnp.float32(2))
    np.testing.assert_array_equal(out, [3, 3, 3])
    monkeypatch.setattr(compile_cache, "_engine_folder", None)
    fn(m, np.float32(0), power=4)
    assert traced == [2, 4] and reads == [] and not list(folder.glob("*.exp"))


def test_entries_beyond_the_limit_are_dropped(store, monkeypatch):
    fn, traced, reads, folder = store
    monkeypatch.setattr(compile_cache, "ENGINE_ENTRIES", 2)
    m = Scaled(np.ones(3, np.float32), "x")
    for power in (2, 3, 4):
        fn(m, np.float32(0), power=power)
    assert len(list(folder.glob("*.exp"))) == 2


SHARDED = """
import functools, sys
from pathlib import Path
import jax, numpy as np
from jax.sharding import Mesh, PartitionSpec
from jaxsched import compile_cache

compile_cache._engine_folder = Path(sys.argv[1])
read = compile_cache._read
compile_cache._read = lambda key: print("read", read(key) is not None) or read(key)


@functools.partial(jax.jit, static_argnames=("mesh",))
def double(x, *, mesh):
    spec = PartitionSpec("config")
    return jax.shard_map(lambda y: 2 * y, mesh=mesh, in_specs=spec, out_specs=spec)(x)


mesh = Mesh(np.asarray(jax.devices()), ("config",))
print(np.asarray(compile_cache.stored(double)(np.arange(4, dtype=np.float32), mesh=mesh)).tolist())
"""


def test_program_sharded_over_devices_is_reused(tmp_path):
    """A program sharded over a 2-device mesh (as a sweep's) is stored, read and run on it."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
    outs = [subprocess.run([sys.executable, "-c", SHARDED, str(tmp_path)], capture_output=True, text=True,
                           env=env, timeout=300) for _ in range(2)]
    assert [o.returncode for o in outs] == [0, 0], outs[0].stderr + outs[1].stderr
    assert [o.stdout.split() for o in outs] == [["read", "False", "[0.0,", "2.0,", "4.0,", "6.0]"],
                                                ["read", "True", "[0.0,", "2.0,", "4.0,", "6.0]"]]


def _run(kernel: Path, cache: str, *extra: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != compile_cache.ENV}
    env[compile_cache.ENV] = cache
    proc = subprocess.run([str(SCRIPT), *extra, "run", str(kernel), "--arch", str(ROOT / "sweeps" / "arches" /
                           "h200_8sm.toml"), "--clocks", str(kernel.with_suffix(".csv")), "--json"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.skipif(not SCRIPT.exists(), reason="the console script is not installed")
def test_cli_keeps_compiled_runs(tmp_path):
    """A first `jaxsched run` writes JAX's cache and the engine's program; the second reads it
    (the entry's time is touched) after loading the clock map's small programs from JAX's cache,
    and prints the same; `--no-compile-cache` writes nothing and prints the same too."""
    kernel = tmp_path / "tiny.toml"
    kernel.write_text('[kernel]\nname = "tiny"\ngrid = 40\nthreads = 64\nprogram = "ldg\\nfma dep\\nalu"\n')
    kernel.with_suffix(".csv").write_text("1500\n1600\n1700\n1800\n1900\n1980\n1980\n1980\n")
    folder = tmp_path / "cache"
    first = _run(kernel, str(folder))
    (entry,) = (folder / "engine").glob("*.exp")
    assert list((folder / "xla").iterdir())
    os.utime(entry, (1, 1))
    assert _run(kernel, str(folder)) == first
    assert entry.stat().st_mtime > 1
    doc = json.loads(first)
    assert doc["ctas"] == 40 and doc["sm_clock_mhz"] == [1500, 1600, 1700, 1800, 1900, 1980, 1980, 1980]
    assert _run(kernel, str(tmp_path / "unused"), "--no-compile-cache") == first
    assert not (tmp_path / "unused").exists()


@pytest.mark.parametrize("setting, argv, enabled", [
    ("default", ["run"], True), ("off", ["run"], False), ("default", ["--no-compile-cache", "run"], False),
    ("default", ["occupancy", "--threads", "0", "--regs", "32"], False),
])
def test_cli_turns_the_cache_on_for_compiling_commands(monkeypatch, tmp_path, setting, argv, enabled):
    from jaxsched.cli import main

    monkeypatch.setenv(compile_cache.ENV, str(tmp_path) if setting == "default" else setting)
    calls = []
    monkeypatch.setattr(compile_cache, "enable", calls.append)
    assert main([*argv, str(tmp_path / "missing.toml")] if argv[-1] == "run" else argv) == 2
    assert calls == ([tmp_path] if enabled else [])
