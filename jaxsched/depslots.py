"""Which writes of a named register reach each read of it (docs/model.md section 7).

A read of `r` waits only for the writes of `r` that can reach it: a register a compiler reuses
(an address temporary that was a load's destination before) does not make the read wait for
the old load. Reaching writes follow the program's paths: the next instruction, a loop's back
edge and its skip when it runs no trip, an if-path or else-path skipped.
"""

from __future__ import annotations

from collections.abc import Sequence


def reaching(
    n: int, writes: dict[int, list[str]], loops: Sequence[tuple[int, int]], branches: Sequence[tuple[int, int, int]],
) -> list[dict[str, frozenset[int]]]:
    """Per instruction, the writers of each register that reach it (before it executes), from
    `writes` (instruction -> registers), the loops `(start, end)` (end inclusive) and the
    branches `(start, mid, end)` (if-path `start .. mid - 1`, else-path `mid .. end - 1`)."""
    succ: list[set[int]] = [{i + 1} if i + 1 < n else set() for i in range(n)]
    skips: list[tuple[int, int]] = []  # (a, b): what reaches a's entry reaches b's entry too
    for s, e in loops:
        succ[e].add(s)
        skips.append((s, e + 1))
    for s, m, e in branches:
        skips += [(s, m), (m, e)]
    inn: list[dict[str, frozenset[int]]] = [{} for _ in range(n + 1)]
    merge = lambda into, more: {r: into.get(r, frozenset()) | more.get(r, frozenset())  # noqa: E731
                                for r in into.keys() | more.keys()}
    changed = True
    while changed:
        changed = False
        for i in range(n):
            out = dict(inn[i])
            out.update({r: frozenset({i}) for r in writes.get(i, [])})
            for j in succ[i]:
                merged = merge(inn[j], out)
                if merged != inn[j]:
                    inn[j], changed = merged, True
        for a, b in skips:
            merged = merge(inn[b], inn[a])
            if merged != inn[b]:
                inn[b], changed = merged, True
    return inn[:n]
