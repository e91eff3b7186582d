"""Compiled simulations kept on disk, so that a repeated `jaxsched run` or sweep of the same shapes
skips XLA's compilation (most of a first run's 20 s on a 2-core CPU) and the engine's tracing.

Two stores in one folder, `default_folder()`: `$JAXSCHED_CACHE_DIR`, else
`$XDG_CACHE_HOME/jaxsched`, else `~/.cache/jaxsched` (`JAXSCHED_CACHE_DIR=off`: no cache):

- `xla/`: JAX's persistent compilation cache, for every jitted function: its executables, keyed
  by JAX on the lowered program.
- `engine/`: the engine's traced and lowered programs (`stored`: `jax.export`, StableHLO), each
  keyed by everything the traced program follows from: jaxsched's source, the versions of
  Python, JAX, jaxlib, equinox and numpy, the devices, `XLA_FLAGS`, JAX's and equinox's
  configuration, the static arguments and the tree, shapes and dtypes of the arguments. A hit
  skips tracing and lowering (about 2 s of the engine's on the 2-core CPU), and JAX's cache
  then has its executable. An entry that cannot be read is made anew; the least recently used
  entries beyond `ENGINE_ENTRIES` are removed.

The engine stores programs, not executables: executables written by
`jax.experimental.serialize_executable` failed to run on the CPU when loaded into a process that
had loaded others from JAX's cache ("Function iota_convert_fusion not found"), while JAX's own
cache loads them reliably (benchmarks/RESULTS.md, "Command-line start-up").

The command line turns both on (`--no-compile-cache` turns them off); from Python, `enable()`.
Entries are read as trusted as the folder (like JAX's own cache). Deleting the folder is always
safe.
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
ENGINE_ENTRIES = 64  # programs kept: about 150 kB each

_engine_folder: Path | None = None  # where `stored` keeps programs; None: off
_loaded: dict[str, tuple[Callable, Any]] = {}  # key -> (jitted exported program, output tree), in this process


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
    # every jitted function, not only those that take a second to compile (JAX's default): the
    # small programs of clock maps and bounds add up in a run that takes a few seconds
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    global _engine_folder
    _engine_folder = root / "engine"
    return root


def stored(fn: Callable) -> Callable:
    """`fn`, a `jax.jit` function called with static arguments by keyword, its traced programs
    kept in the engine store while `enable` is in force (and its arguments are not traced). A
    program sharded over several devices runs on the mesh of its static argument `mesh`. The
    jitted function's own attributes (`lower`, `_cache_size`) are the result's."""
    return _Stored(fn)


class _Stored:
    """`stored(fn)`."""

    def __init__(self, fn: Callable) -> None:
        self._fn = fn
        functools.update_wrapper(self, fn)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fn, name)

    def __call__(self, *args: Any, **static: Any) -> Any:
        import jax

        fn = self._fn
        leaves, in_tree = jax.tree.flatten(args)
        if _engine_folder is None or any(is_traced(x) for x in leaves):
            return fn(*args, **static)
        key = _key(fn, args, static)
        if key not in _loaded:
            entry = _read(key)
            if entry is None:
                entry = _export(fn, in_tree, leaves, static)
                if entry is None:  # not exportable: run it as it is
                    return fn(*args, **static)
                _write(key, entry)
            exported, out_tree = entry
            _loaded[key] = jax.jit(exported.call, **_shardings(exported, static.get("mesh"))), out_tree
        program, out_tree = _loaded[key]
        return jax.tree.unflatten(out_tree, program(*leaves))


def _shardings(exported: Any, mesh: Any) -> dict:
    """`jax.jit`'s shardings for a program exported for several devices: its own, on `mesh`,
    where it gave some, else replicated (the engine shards inside, with `shard_map`)."""
    if exported.nr_devices == 1:
        return {}
    from jax.sharding import NamedSharding, PartitionSpec

    def on_mesh(shardings: tuple) -> tuple:
        return tuple(NamedSharding(mesh, PartitionSpec()) if s is None else s for s in shardings)

    return dict(in_shardings=on_mesh(exported.in_shardings_jax(mesh)), out_shardings=on_mesh(exported.out_shardings_jax(mesh)))


def _export(fn: Callable, in_tree: Any, leaves: list, static: dict) -> tuple[Any, Any] | None:
    """`fn` traced and lowered for these arguments (`jax.export`, on their flat leaves: an
    exported program's trees must be serialisable, equinox modules are not), and its output
    tree; None where it cannot be exported (a host callback, an unsupported custom call)."""
    import jax

    trees = {}

    def flat(*xs: Any) -> tuple:
        out, trees["out"] = jax.tree.flatten(fn(*jax.tree.unflatten(in_tree, xs), **static))
        return tuple(out)

    try:
        exported = jax.export.export(jax.jit(flat))(*leaves)
    except (ValueError, NotImplementedError):
        return None
    return exported, trees["out"]


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
    """The store's name for `fn` traced for these arguments: a hash of everything its traced
    program follows from (module docstring)."""
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


def _read(key: str) -> tuple[Any, Any] | None:
    """The stored program of `key` and its output tree, or None (absent, or unreadable: made
    anew)."""
    import jax

    path = _engine_folder / f"{key}.exp"
    try:
        serialized, out_skeleton = pickle.loads(path.read_bytes())
        exported = jax.export.deserialize(bytearray(serialized))
        os.utime(path)  # recently used: kept by `_write`'s pruning
    except Exception:  # noqa: BLE001  (a missing, partial or stale file: export anew)
        return None
    return exported, jax.tree.structure(out_skeleton)


def _write(key: str, entry: tuple[Any, Any]) -> None:
    """Store a program under `key` (atomically: a killed write leaves no partial entry), then
    drop the least recently used entries beyond `ENGINE_ENTRIES`. A cache that cannot be
    written is skipped."""
    import jax

    exported, out_tree = entry
    # the output tree as a skeleton (its leaves zeros): a pickled PyTreeDef of equinox modules
    # does not unflatten again
    data = pickle.dumps((bytes(exported.serialize()), jax.tree.unflatten(out_tree, [0] * out_tree.num_leaves)))
    path = _engine_folder / f"{key}.exp"
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
        entries = sorted(_engine_folder.glob("*.exp"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in entries[ENGINE_ENTRIES:]:
            old.unlink(missing_ok=True)
    except OSError:
        tmp.unlink(missing_ok=True)
