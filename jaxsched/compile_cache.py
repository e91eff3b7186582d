"""Compiled simulations kept on disk, so that a repeated `jaxsched run` or sweep of the same shapes
skips XLA's compilation (most of a first run's 20 s on a 2-core CPU) and the engine's tracing.

Two stores in one folder, `default_folder()`: `$JAXSCHED_CACHE_DIR`, else
`$XDG_CACHE_HOME/jaxsched`, else `~/.cache/jaxsched` (`JAXSCHED_CACHE_DIR=off`: no cache):

- `xla/`: JAX's persistent compilation cache, for every jitted function. JAX keys an entry by
  the lowered program, so tracing and lowering still run (about 2 s of the engine's).
- `engine/`: the engine's executables (`stored`), each keyed by everything the traced program
  follows from: jaxsched's source, the versions of Python, JAX, jaxlib, equinox and numpy, the
  devices, `XLA_FLAGS`, JAX's and equinox's configuration, the static arguments and the tree,
  shapes and dtypes of the arguments. A hit loads the executable and runs it without tracing.
  An entry that cannot be read or run is compiled anew; the least recently used entries beyond
  `ENGINE_ENTRIES` are removed.

The command line turns both on (`--no-compile-cache` turns them off); from Python, `enable()`.
Entries are pickles, loaded as trusted as the folder (like JAX's own cache). Deleting the folder
is always safe.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import sys
from pathlib import Path
from typing import Any, Callable

from .errors import JaxschedError, is_traced

ENV = "JAXSCHED_CACHE_DIR"
ENGINE_ENTRIES = 64  # executables kept: a few MB each (benchmarks/RESULTS.md, "Command-line start-up")

_engine_folder: Path | None = None  # where `stored` keeps executables; None: off
_loaded: dict[str, Any] = {}  # key -> executable, in this process


def default_folder() -> Path | None:
    """The cache folder from the environment (None when `JAXSCHED_CACHE_DIR=off`)."""
    given = os.environ.get(ENV, "").strip()
    if given.lower() == "off":
        return None
    if given:
        return Path(given).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "jaxsched"


def enable(folder: str | os.PathLike | None = None) -> Path:
    """Keep compiled programs in `folder` (default: `default_folder()`), for this process."""
    import jax

    root = Path(folder) if folder is not None else default_folder()
    if root is None:
        raise JaxschedError(ENV, "off", "no cache folder: pass one, or unset the variable")
    try:
        (root / "xla").mkdir(parents=True, exist_ok=True)
        (root / "engine").mkdir(exist_ok=True)
    except OSError as exc:
        raise JaxschedError("compile cache", str(root), f"cannot be created ({exc.strerror})") from None
    jax.config.update("jax_compilation_cache_dir", str(root / "xla"))
    # every compiled function, not only those that take a second: the engine's small helpers
    # compile in 10-100 ms each and load from the cache in about 1 ms
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    global _engine_folder
    _engine_folder = root / "engine"
    return root


def stored(fn: Callable) -> Callable:
    """`fn`, a `jax.jit` function called with static arguments by keyword, its executables kept
    in the engine store while `enable` is in force (and its arguments are not traced)."""

    @functools.wraps(fn)
    def call(*args: Any, **static: Any) -> Any:
        import jax

        if _engine_folder is None or any(is_traced(x) for x in jax.tree.leaves(args)):
            return fn(*args, **static)
        key = _key(fn, args, static)
        if key in _loaded:
            return _loaded[key](*args)
        compiled = _read(key)
        if compiled is not None:
            try:  # an entry that loads but does not run is compiled anew, like one that does not load
                out = jax.block_until_ready(compiled(*args))
                _loaded[key] = compiled
                return out
            except jax.errors.JaxRuntimeError:
                pass
        lowered = fn.lower(*args, **static)
        compiled = lowered.compile()
        # a host callback (jax.debug.print, equinox.error_if) does not survive serialisation
        if not lowered._lowering.compile_args.get("host_callbacks"):
            _write(key, compiled)
        _loaded[key] = compiled
        return compiled(*args)

    return call


@functools.cache
def _source_digest() -> str:
    """SHA-256 of jaxsched's Python source: any change to the code makes new keys."""
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parent
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _static_text(value: Any) -> str:
    """A static argument as text; a mesh by its axes and its devices' ids."""
    if hasattr(value, "axis_names") and hasattr(value, "devices"):
        return f"Mesh({value.axis_names}, {[d.id for d in value.devices.flat]})"
    return repr(value)


def _key(fn: Callable, args: tuple, static: dict) -> str:
    import equinox
    import jax
    import jaxlib
    import numpy as np

    leaves, tree = jax.tree.flatten(args)
    parts = [
        _source_digest(), f"{fn.__module__}.{fn.__qualname__}", sys.version,
        f"jax {jax.__version__} jaxlib {jaxlib.__version__} equinox {equinox.__version__} numpy {np.__version__}",
        repr([(d.platform, d.device_kind, d.id) for d in jax.devices()]),
        os.environ.get("XLA_FLAGS", ""),
        repr(sorted((k, v) for k, v in os.environ.items() if k.startswith("EQX_"))),
        repr(sorted((k, repr(v)) for k, v in jax.config.values.items())),
        f"x64 {jax.config.jax_enable_x64} default device {jax.config.jax_default_device}",
        repr(tree), repr([repr(jax.typeof(x)) for x in leaves]),
        repr(sorted((k, _static_text(v)) for k, v in static.items())),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:40]


def _read(key: str) -> Any:
    """The stored executable of `key`, or None (absent, or unreadable: compiled anew)."""
    import jax
    from jax.experimental import serialize_executable

    path = _engine_folder / f"{key}.exe"
    try:
        payload, args_skeleton, out_skeleton, device_ids = pickle.loads(path.read_bytes())
        by_id = {d.id: d for d in jax.devices()}
        compiled = serialize_executable.deserialize_and_load(
            payload, jax.tree.structure(args_skeleton), jax.tree.structure(out_skeleton),
            execution_devices=[by_id[i] for i in device_ids])
        os.utime(path)  # recently used: kept by `_write`'s pruning
    except Exception:  # noqa: BLE001  (a missing, partial or stale file: compile instead)
        return None
    return compiled


def _serialize(compiled: Any) -> tuple[bytes, Any, Any]:
    """`jax.experimental.serialize_executable.serialize`, but with the XLA executable written as
    JAX's own persistent cache writes it (`LoadedExecutable.serialize`). Written through
    `Client.serialize_executable`, as `serialize` does, a CPU executable loaded in a process
    that has loaded others from JAX's cache fails to find its kernels ("Function
    broadcast_multiply_fusion.1 not found") when it runs."""
    import io

    import jax
    from jax._src.lib import xla_client
    from jax.experimental import serialize_executable

    class Pickler(serialize_executable._JaxPjrtPickler):
        def persistent_id(self, obj: Any) -> Any:
            if isinstance(obj, xla_client.LoadedExecutable):
                return "exec", obj.serialize()
            return super().persistent_id(obj)

    if compiled._params.const_args:
        raise NotImplementedError("an executable with constant arguments")
    args_info_flat, in_tree = jax.tree.flatten(compiled.args_info)
    with io.BytesIO() as file:
        Pickler(file).dump((compiled._executable._unloaded_executable, args_info_flat, compiled._no_kwargs))
        return file.getvalue(), in_tree, compiled.out_tree


def _write(key: str, compiled: Any) -> None:
    """Store `compiled` under `key` (atomically: a killed write leaves no partial entry), then
    drop the least recently used entries beyond `ENGINE_ENTRIES`. A cache that cannot be
    written is skipped."""
    import jax

    try:
        payload, in_tree, out_tree = _serialize(compiled)
        # trees are stored as skeletons (their leaves zeros): a pickled PyTreeDef of equinox
        # modules does not unflatten again
        skeletons = (jax.tree.unflatten(in_tree, [0] * in_tree.num_leaves),
                     jax.tree.unflatten(out_tree, [0] * out_tree.num_leaves))
        device_ids = [d.id for d in compiled.runtime_executable().local_devices()]  # in the executable's order
        data = pickle.dumps((payload, *skeletons, device_ids))
    except (ValueError, NotImplementedError, TypeError, AttributeError, pickle.PicklingError):
        return  # this executable cannot be serialised
    path = _engine_folder / f"{key}.exe"
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
        entries = sorted(_engine_folder.glob("*.exe"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in entries[ENGINE_ENTRIES:]:
            old.unlink(missing_ok=True)
    except OSError:
        tmp.unlink(missing_ok=True)
