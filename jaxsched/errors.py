"""The one exception type users see, with the field, the value and the limit in its message.

CUDA says "too many resources requested for launch"; jaxsched says which resource, how much was
asked for, and what the limit is, so a sweep that fails tells the user which knob to turn.
"""

from __future__ import annotations


class JaxschedError(ValueError):
    """Bad input: names the offending field, the value given and the limit it breaks."""

    def __init__(self, field: str, value: object, limit: str, hint: str = ""):
        self.field = field
        self.value = value
        self.limit = limit
        message = f"{field} = {value!r}: {limit}"
        if hint:
            message += f" ({hint})"
        super().__init__(message)


def check(ok: bool, field: str, value: object, limit: str, hint: str = "") -> None:
    """Raise `JaxschedError(field, value, limit)` unless `ok`."""
    if not ok:
        raise JaxschedError(field, value, limit, hint)
