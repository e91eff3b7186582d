"""TOML documents in, `JaxschedError` out: one place that turns a missing file or malformed TOML
into an error naming the file (kernels, workloads, architectures, sweep and fit specs)."""

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
    p = Path(path)
    check(p.is_file(), what, str(p), "no such file")
    return parse(p.read_text(), str(p))
