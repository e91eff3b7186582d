"""TOML documents in, `JaxschedError` out: one place that turns a missing, unreadable or
non-UTF-8 file, or malformed TOML, into an error naming the file (kernels, workloads,
architectures, sweep and fit specs, run traces). And TOML out (`dumps`) in a form a person
edits: arrays filled line by line, small tables inline."""

from __future__ import annotations

import json
import math
import re
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


WIDTH = 100  # characters per line of an array


def dumps(doc: dict, header: str = "") -> str:
    """TOML text of `doc`: scalars and arrays first, then one `[table]` per dict value (a dict
    inside a table is an inline table). Arrays fit on their key's line, else fill lines of at
    most `WIDTH` characters. `header` becomes `#` comment lines at the top."""
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    lines += [_entry(k, v) for k, v in doc.items() if not isinstance(v, dict)]
    for name, table in doc.items():
        if isinstance(table, dict):
            lines += ["", f"[{_key(name)}]", *(_entry(k, v) for k, v in table.items())]
    return "\n".join(lines).lstrip("\n") + "\n"


def _key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _entry(key: str, value: object) -> str:
    start = f"{_key(key)} = "
    if not isinstance(value, list):
        return start + _value(value)
    items = [_value(v) for v in value]
    one_line = start + "[" + ", ".join(items) + "]"
    if len(one_line) <= WIDTH:
        return one_line
    rows, row = [], "   "
    for item in items:
        if len(row) + len(item) + 2 > WIDTH and row.strip():
            rows.append(row)
            row = "   "
        row += f" {item},"
    return "\n".join([start + "[", *rows, row, "]"])


def _value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return ("nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")) if not math.isfinite(value) \
            else repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no TOML form for {type(value).__name__}")
