"""The control-flow structure of a warp program: its loops and if/else regions, how they nest,
and the rules a structure must keep for both engines to run it (docs/model.md section 6).

A program has up to `MAX_LOOPS` loops and `MAX_BRANCHES` if/else regions, each numbered in the
order it opens in the program text. Loop `k` spans instructions `loop_start[k] .. loop_end[k]`
(its last instruction carries the back-edge); branch `b` runs its if-path on
`branch_start[b] .. branch_mid[b] - 1` and its else-path on `branch_mid[b] .. branch_end[b] - 1`
(none when `branch_mid == branch_end`: an `if` without `else`). Absent entries are -1, so
programs of different structure pad to one shape. `branch_parent[b]` names the innermost path
that encloses branch `b`: `2 j` for branch `j`'s if-path, `2 j + 1` for its else-path, -1 for
none; a branch's lanes are those of that path that also take (or do not take) it.

The rules: regions nest (two are disjoint or one holds the other, a region inside a branch on one
of its paths), an enclosing region opens first, and no inner region ends on an enclosing loop's
last instruction (that instruction is the loop's own back-edge: skipping an inner region must
not skip it). With them, at most one loop ends at any instruction, and the innermost branch
holding an instruction is the one with the highest number.
"""

from __future__ import annotations

import numpy as np

MAX_LOOPS = 32  # loops per program
MAX_BRANCHES = 32  # if/else regions per program
NONE = -1  # absent loop or branch, no parent


def padded_count(n: int, limit: int) -> int:
    """The loop or branch count a compiled simulation pads `n` to: 1, then powers of two (so
    programs of similar structure share a compilation), at most `limit`."""
    return min(limit, 1 << max(0, int(n) - 1).bit_length())


def structure_ok(ls: np.ndarray, le: np.ndarray, bs: np.ndarray, bm: np.ndarray, be: np.ndarray,
                 parent: np.ndarray, exit_at: np.ndarray) -> tuple[np.ndarray, str]:
    """Per program (leading axes), whether its structure keeps every rule (module docstring), and
    the rule the first bad one breaks. `ls, le`: [..., L]; `bs, bm, be, parent`: [..., B];
    `exit_at`: [...], the index of the program's exit."""
    ls, le, bs, bm, be, parent = (np.asarray(x, np.int64) for x in (ls, le, bs, bm, be, parent))
    x = np.asarray(exit_at, np.int64)[..., None]
    has_loop = ls != NONE
    has_branch = bs != NONE
    rules = []
    loops = np.where(has_loop, (0 <= ls) & (ls <= le) & (le < x), le == NONE)
    rules.append((loops, "a loop spans 0 <= loop_start <= loop_end before the exit (or both -1: none)"))
    branches = np.where(has_branch, (0 <= bs) & (bs < bm) & (bm <= be) & (be <= x),
                        (bm == NONE) & (be == NONE) & (parent == NONE))
    rules.append((np.all(has_loop[..., 1:] <= has_loop[..., :-1], -1) & np.all(has_branch[..., 1:] <= has_branch[..., :-1], -1),
                  "absent loops and branches (-1) come after the real ones"))
    rules.append((branches, "a branch spans 0 <= branch_start < branch_mid <= branch_end <= the exit "
                            "(or all -1: none)"))
    # Every region as [first, last] with kind 0 (loop) or 1 (branch) and its number.
    first = np.concatenate([ls, bs], -1)
    last = np.concatenate([le, be - 1], -1)
    real = np.concatenate([has_loop, has_branch], -1)
    n_l, n_b = ls.shape[-1], bs.shape[-1]
    is_branch = np.arange(n_l + n_b) >= n_l
    index = np.concatenate([np.arange(n_l), np.arange(n_b)])
    f_i, f_j = first[..., :, None], first[..., None, :]
    l_i, l_j = last[..., :, None], last[..., None, :]
    both = real[..., :, None] & real[..., None, :] & ~np.eye(n_l + n_b, dtype=bool)
    disjoint = (l_i < f_j) | (l_j < f_i)
    holds = (f_i <= f_j) & (l_j <= l_i)  # region i holds region j (or they are equal)
    rules.append((~np.any(both & ~disjoint & ~holds & ~np.swapaxes(holds, -1, -2), axis=(-1, -2)),
                  "loops and if/else regions nest: two are disjoint or one holds the other"))
    # i encloses j: i holds j, and i is the larger, or (equal) the branch, or the earlier branch.
    same = holds & np.swapaxes(holds, -1, -2)
    kind_i, kind_j = is_branch[:, None], is_branch[None, :]
    earlier = (kind_i & ~kind_j) | ((kind_i == kind_j) & (index[:, None] < index[None, :]))
    encloses = both & holds & (~same | earlier)
    loop_i = ~kind_i
    rules.append((~np.any(encloses & loop_i & (l_j == l_i), axis=(-1, -2)),
                  "no inner loop or if/else ends on an enclosing loop's last instruction (its back-edge): "
                  "add an instruction after the inner `end`"))
    rules.append((~np.any(encloses & (kind_i == kind_j) & (index[:, None] > index[None, :]), axis=(-1, -2)),
                  "an enclosing loop or if/else opens before the regions it holds"))
    # A region inside a branch lies on one of its paths.
    mid_i = np.concatenate([np.full(ls.shape, NONE), bm], -1)[..., :, None]
    one_path = (l_j < mid_i) | (f_j >= mid_i)
    rules.append((~np.any(encloses & kind_i & ~one_path, axis=(-1, -2)),
                  "a region inside an if/else lies wholly on its if-path or its else-path"))
    # branch_parent: the innermost enclosing branch (the highest-numbered), and the path.
    enc_b = encloses[..., n_l:, n_l:]  # [.., j, b]: branch j encloses branch b
    j_of = np.where(enc_b, np.arange(n_b)[:, None], NONE).max(-2)  # per b
    side = (bs[..., None, :] >= bm[..., :, None])  # [.., j, b]: b on j's else-path
    side_of = np.take_along_axis(side, np.clip(j_of, 0, None)[..., None, :], -2)[..., 0, :]
    want = np.where(j_of == NONE, NONE, 2 * j_of + side_of)
    rules.append((np.all(~has_branch | (parent == want), -1),
                  "branch_parent names the innermost path around each branch (2 j: branch j's if-path, "
                  "2 j + 1: its else-path, -1: none)"))
    for ok, rule in rules:
        ok = np.all(ok, -1) if ok.ndim > np.ndim(exit_at) else ok
        if not np.all(ok):
            return ok, rule
    return np.ones(np.shape(exit_at), bool), ""


def executions(ls: np.ndarray, le: np.ndarray, bs: np.ndarray, bm: np.ndarray, be: np.ndarray,
               n_instr: int, trips: np.ndarray, if_lanes: np.ndarray, else_lanes: np.ndarray) -> np.ndarray:
    """How many times a warp issues each instruction (`[..., n_instr]`): the product of the trip
    counts of the loops around it, if every if- or else-path around it has lanes, else 0.
    `ls, le`: [L]; `bs, bm, be`: [B] (one program); `trips`: [..., L]; `if_lanes`,
    `else_lanes`: [..., B], the lanes of each branch's paths (docs/model.md sections 4, 6)."""
    i = np.arange(n_instr)
    count = np.ones(np.shape(trips)[:-1] + (n_instr,), np.int64)
    for k in range(len(ls)):
        if ls[k] >= 0:
            inside = (i >= ls[k]) & (i <= le[k])
            count = np.where(inside, count * np.asarray(trips)[..., k:k + 1], count)
    for b in range(len(bs)):
        if bs[b] >= 0:
            on_if = (i >= bs[b]) & (i < bm[b])
            on_else = (i >= bm[b]) & (i < be[b])
            count = np.where(on_if & (np.asarray(if_lanes)[..., b:b + 1] == 0), 0, count)
            count = np.where(on_else & (np.asarray(else_lanes)[..., b:b + 1] == 0), 0, count)
    return count
