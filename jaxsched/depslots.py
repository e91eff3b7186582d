"""Named registers as dependence slots (docs/model.md section 7): which writes reach each read,
and which registers share a slot.

A read of `r` waits only for the writes of `r` that can reach it: a register a compiler reuses
(an address temporary that was a load's destination before) does not make the read wait for
the old load. Reaching writes follow the program's paths: the next instruction, a loop's back
edge and its skip when it runs no trip, an if-path or else-path skipped.

A warp has `MAX_DEP_SLOTS - 1` slots per kind of result for named registers; a program that
waits for more registers of one kind than that must let some share a slot, and a consumer then
waits for every result written to its slot since its own register's. Sharing costs nothing
where the other result is not waited for before this one anyway; it costs a whole latency where
a consumer of one register waits for a result written later into the same slot. So registers
are coloured like a compiler assigns its scoreboards: each written register, in order of first
write, takes the slot where it would delay the fewest consumers of the registers already there
(weighted by loop depth, since a loop's body runs many times), and the lowest such slot.
"""

from __future__ import annotations

from collections.abc import Sequence

_LOOP_WEIGHT = 16  # a conflict inside a loop counts this much more per level of nesting


def _ahead(i: int, n: int, loops: Sequence[tuple[int, int]]) -> list[int]:
    """The instructions after `i` in the order a warp meets them: to the end of the innermost
    loop around `i`, its start again up to `i` (the next trip), then past the loop."""
    around = [(s, e) for s, e in loops if s <= i <= e]
    if not around:
        return list(range(i + 1, n))
    s, e = max(around)  # the innermost: the latest start
    return [*range(i + 1, e + 1), *range(s, i + 1), *range(e + 1, n)]


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


def colour(
    n: int,
    reads: dict[int, list[str]],
    writes: dict[int, list[str]],
    registers: Sequence[str],
    loops: Sequence[tuple[int, int]],
    n_slots: int,
) -> dict[str, int]:
    """Slots 1 .. `n_slots` for `registers` (all of one kind of result), given per instruction
    the registers it reads and writes (of that kind) and the loops `(start, end)`."""
    wanted = set(registers)
    depth = [sum(s <= i <= e for s, e in loops) for i in range(n)]
    harm: dict[tuple[str, str], int] = {}  # (r, q): writing r delays a consumer of q
    for i in range(n):
        written = [r for r in writes.get(i, []) if r in wanted]
        if not written:
            continue
        order = _ahead(i, n, loops)
        first_read: dict[str, int] = {}
        first_write: dict[str, int] = {}
        for at, j in enumerate(order):
            for q in reads.get(j, []):
                first_read.setdefault(q, at)
            for q in writes.get(j, []):
                first_write.setdefault(q, at)
        for r in written:
            mine = first_read.get(r, len(order))
            for q in wanted - {r}:
                theirs = first_read.get(q)
                # q is still waited for (read before it is written again) before r is
                if theirs is not None and theirs < mine and theirs <= first_write.get(q, len(order)):
                    harm[r, q] = harm.get((r, q), 0) + _LOOP_WEIGHT ** depth[i]
    first = {r: min((i for i in range(n) if r in writes.get(i, [])), default=n) for r in registers}
    slot: dict[str, int] = {}
    for r in sorted(registers, key=lambda x: (first[x], registers.index(x))):
        cost = [sum(harm.get((r, q), 0) + harm.get((q, r), 0) for q in slot if slot[q] == s)
                for s in range(1, n_slots + 1)]
        slot[r] = 1 + min(range(n_slots), key=lambda s: (cost[s], sum(v == s + 1 for v in slot.values()), s))
    return slot
