"""TOML documents in, `JaxschedError` out: one place that turns a missing, unreadable or
non-UTF-8 file, or malformed TOML, into an error naming the file (kernels, workloads,
architectures, sweep and fit specs, run traces)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from .errors import JaxschedError, check


def parse(text: str, source: str) -> dict:
    """The TOML document in `text`; `source` names it in the error."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise JaxschedError(source, "malformed TOML", str(exc)) from None


def read(path: str | Path, what: str) -> dict:
    """The TOML document in the file `path`, a `what` ("kernel file", ...) that must exist."""
    return parse(read_text(path, what), str(path))


def read_text(path: str | Path, what: str) -> str:
    """The UTF-8 text of the file `path`, a `what` that must exist and be readable."""
    p = Path(path)
    check(p.is_file(), what, str(p), "no such file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise JaxschedError(what, str(p), f"not UTF-8 text (byte {exc.start}: {exc.reason}); TOML files are UTF-8") \
            from None
    except OSError as exc:
        raise JaxschedError(what, str(p), f"cannot be read ({exc.strerror})") from None
    return text
