"""The chip's layout as the CTA dispatcher shows it: SM order, its rotation, GPC membership.

- Dispatch order: with one CTA per SM and a grid of one CTA per SM, CTA `i` (grid order) lands
  on the `i`-th SM the dispatcher picks, so each launch gives one sequence of `%smid`. If the
  dispatcher walks a fixed cyclic order from a start that moves between launches, every sequence
  is a rotation of one cycle; `cyclic_order` recovers the cycle (the most frequent successor of
  each SM) and how well each launch matches a rotation of it, and `common_lead` the SMs that
  every launch serves first whatever the rotation.
- GPCs: the CTAs of a thread-block cluster are co-scheduled on SMs of one GPC (CUDA programming
  guide, "Thread Block Clusters"), so SMs seen in one cluster share a GPC; `gpc_groups` joins
  them over many launches (union-find). That grouping is measured; it cannot split a GPC, and
  enough launches merge each GPC whole.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

import numpy as np

from ..errors import check


@dataclasses.dataclass(frozen=True)
class CyclicOrder:
    """A cyclic SM order and how each observed sequence sits on it."""

    order: list[int]  # the cycle, starting at the SM that most often receives CTA 0
    starts: list[int]  # per sequence: position in `order` of the SM that got CTA 0
    match: list[float]  # per sequence: fraction of positions equal to the rotated cycle
    complete: bool  # the successor map forms one cycle over all SMs seen


def cyclic_order(sequences: Sequence[Sequence[int]]) -> CyclicOrder:
    """The consensus cyclic order of SM ids over `sequences` (one per launch)."""
    check(len(sequences) >= 1, "sequences", len(sequences), "at least one launch")
    seqs = [np.asarray(s, dtype=np.int64) for s in sequences]
    sms = np.unique(np.concatenate(seqs))
    index = {int(s): i for i, s in enumerate(sms)}
    n = sms.size
    succ = np.zeros((n, n), dtype=np.int64)
    for s in seqs:
        for a, b in zip(s[:-1], s[1:]):
            succ[index[int(a)], index[int(b)]] += 1
    firsts, counts = np.unique([int(s[0]) for s in seqs], return_counts=True)
    head = int(firsts[np.argmax(counts)])
    order = [head]
    seen = {head}
    while len(order) < n:
        row = succ[index[order[-1]]].copy()
        row[[index[v] for v in seen]] = -1
        nxt = int(sms[np.argmax(row)])
        order.append(nxt)
        seen.add(nxt)
    complete = all(succ[index[a], index[b]] > 0 for a, b in zip(order, order[1:] + order[:1]))
    pos = {v: i for i, v in enumerate(order)}
    starts, match = [], []
    for s in seqs:
        p = pos[int(s[0])]
        rotated = np.asarray([order[(p + k) % n] for k in range(s.size)])
        starts.append(p)
        match.append(float(np.mean(rotated == s)))
    return CyclicOrder(order=order, starts=starts, match=match, complete=complete)


def common_lead(sequences: Sequence[Sequence[int]]) -> list[int]:
    """The SMs that every launch serves first: the first `k` SMs of every sequence, for the
    longest `k` short of a whole sequence at which they are the same set everywhere (their order
    may differ); empty if there is none."""
    seqs = [list(map(int, s)) for s in sequences]
    for k in range(min(len(s) for s in seqs) - 1, 0, -1):
        if len({frozenset(s[:k]) for s in seqs}) == 1:
            return sorted(seqs[0][:k])
    return []


def gpc_groups(clusters: Iterable[Sequence[int]]) -> list[list[int]]:
    """SM groups that must share a GPC: the connected components of "seen in one cluster"."""
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for members in clusters:
        members = [int(m) for m in members]
        for m in members:
            find(m)
        for m in members[1:]:
            a, b = find(members[0]), find(m)
            if a != b:
                parent[max(a, b)] = min(a, b)
    groups: dict[int, list[int]] = {}
    for x in parent:
        groups.setdefault(find(x), []).append(x)
    return sorted((sorted(g) for g in groups.values()), key=lambda g: g[0])


def clusters_from_records(smid: Sequence[int], cluster_id: Sequence[int]) -> list[list[int]]:
    """Per launch: the SM ids of each cluster (CTAs grouped by `%clusterid.x`)."""
    sm = np.asarray(smid, dtype=np.int64)
    cid = np.asarray(cluster_id, dtype=np.int64)
    return [sorted(set(sm[cid == c].tolist())) for c in np.unique(cid)]


def tpc_pairs_adjacent(order: Sequence[int]) -> float:
    """Fraction of even SM ids `2t` whose partner `2t + 1` is next to it in the cyclic order."""
    n = len(order)
    pos = {int(v): i for i, v in enumerate(order)}
    evens = [v for v in pos if v % 2 == 0 and v + 1 in pos]
    if not evens:
        return float("nan")
    near = [abs(pos[v] - pos[v + 1]) in (1, n - 1) for v in evens]
    return float(np.mean(near))
