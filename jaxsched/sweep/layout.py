"""The configuration array (grid dimensions x config x replicate) and its chunks: the dataset's
dimension names (`dim_name`, `point_dims`, `sweep_dims`), the rectangular chunk shape
(`block_shape`), the `Layout` of a sweep cut into chunks (`make_layout`) and the configurations of
one chunk (`chunk_configs`). A chunk is both one batched engine call and one zarr chunk of the
store, so execution and storage share this one description of it."""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from ..sweep_design import CONFIG_DIM
from .configs import Config, point_configs
from .spec import Sweep

def dim_name(path: str) -> str:
    """The dataset name of a swept path: dots become underscores."""
    return path.replace(".", "_")


def point_dims(sweep: Sweep) -> tuple[str, ...]:
    """Dimensions of the points: one per grid path, then `config` for a design."""
    return tuple(dim_name(k) for k in sweep.grid) + ((CONFIG_DIM,) if sweep.design else ())


def sweep_dims(sweep: Sweep) -> tuple[str, ...]:
    """Dataset dimensions of the configuration array: the point dimensions, then `replicate`."""
    return point_dims(sweep) + ("replicate",)


def block_shape(shape: Sequence[int], chunk: int) -> tuple[int, ...]:
    """The rectangular chunk of at most `chunk` configurations, filled from the last dimension."""
    block, budget = [], max(int(chunk), 1)
    for size in reversed(shape):
        b = max(1, min(size, budget))
        block.append(b)
        budget = max(1, budget // b)
    return tuple(reversed(block))


@dataclasses.dataclass(frozen=True)
class Layout:
    """The configuration array (grid dimensions x config x replicate) cut into rectangular chunks."""

    dims: tuple[str, ...]
    shape: tuple[int, ...]
    block: tuple[int, ...]

    @property
    def n_configs(self) -> int:
        return math.prod(self.shape)

    @property
    def chunk_grid(self) -> tuple[int, ...]:
        return tuple(-(-s // b) for s, b in zip(self.shape, self.block))

    @property
    def n_chunks(self) -> int:
        return math.prod(self.chunk_grid)

    @property
    def chunk_size(self) -> int:
        return math.prod(self.block)

    def chunk_index(self, i: int) -> tuple[int, ...]:
        """Position of chunk `i` on the chunk grid (C order): its zarr chunk key."""
        return tuple(int(j) for j in np.unravel_index(i, self.chunk_grid))

    def region(self, i: int) -> tuple[slice, ...]:
        """Index slices of chunk `i` (C order over the chunk grid)."""
        return tuple(slice(j * b, min((j + 1) * b, s))
                     for j, b, s in zip(self.chunk_index(i), self.block, self.shape))

    def describe(self, i: int) -> str:
        """Chunk `i` for messages: its index ranges ("chunk 3 (policy_warp[1], replicate[0:2])")."""
        ranges = [f"{d}[{r.start}]" if r.stop - r.start == 1 else f"{d}[{r.start}:{r.stop}]"
                  for d, r in zip(self.dims, self.region(i))]
        return f"chunk {i} ({', '.join(ranges)})"

    def count(self, i: int) -> int:
        return math.prod(s.stop - s.start for s in self.region(i))

    def done_chunks(self, done: np.ndarray) -> np.ndarray:
        """Per chunk: every configuration in it is done."""
        full = tuple(g * b for g, b in zip(self.chunk_grid, self.block))
        padded = np.ones(full, dtype=bool)
        padded[tuple(slice(0, s) for s in self.shape)] = done
        split = padded.reshape([x for g, b in zip(self.chunk_grid, self.block) for x in (g, b)])
        return split.all(axis=tuple(range(1, 2 * len(self.shape), 2))).reshape(-1)


def make_layout(sweep: Sweep, chunk: int) -> Layout:
    shape = sweep.point_shape + (sweep.replicates,)
    return Layout(sweep_dims(sweep), shape, block_shape(shape, chunk))


def chunk_configs(sweep: Sweep, layout: Layout, i: int) -> list[Config]:
    """The configurations of chunk `i` that run (feasible points), in C order over its region."""
    *points, reps = layout.region(i)
    indices = [tuple(int(j) for j in ix) for ix in np.ndindex(*(s.stop - s.start for s in points))]
    starts = [s.start for s in points]
    return point_configs(sweep, [tuple(a + b for a, b in zip(ix, starts)) for ix in indices],
                         range(reps.start, reps.stop))
