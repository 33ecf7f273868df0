"""A sum tree and a min tree over non-negative leaves, for prioritized sampling.

Every operation is vectorised over a batch with torch: one op per tree level, so a batch of
updates or draws costs ``O(batch * log size)`` tensor work and no python loop over leaves.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["SumMinTree"]


class SumMinTree:
    """Sums (to draw leaves by mass) and minima (for importance weights) of ``size`` leaves.

    Levels are power-of-two float64 tensors; level 0 holds the leaves (padding leaves: sum 0,
    min ``inf``), level ``k + 1`` the pairwise sums / minima of level ``k``.

    Args:
        size: number of leaves.

    Examples:
        >>> import torch
        >>> tree = SumMinTree(5)
        >>> tree.build(torch.tensor([1.0, 0, 2, 3, 4]), torch.tensor([1.0, 9, 2, 3, 4]))
        >>> tree.total, tree.minimum
        (10.0, 1.0)
        >>> tree.find(torch.tensor([0.5, 1.0, 2.9, 3.0, 9.9])).tolist()  # leaf 1 has mass 0
        [0, 2, 2, 3, 4]
        >>> tree.set(torch.tensor([4]), torch.tensor([0.0]), torch.tensor([0.5]))
        >>> tree.total, tree.minimum
        (6.0, 0.5)
    """

    def __init__(self, size: int) -> None:
        self.size = int(size)
        self.depth = max(math.ceil(math.log2(max(self.size, 1))), 0)
        width = 1 << self.depth
        self._sum = [torch.zeros(width >> k, dtype=torch.float64) for k in range(self.depth + 1)]
        self._min = [torch.full((width >> k,), math.inf, dtype=torch.float64)
                     for k in range(self.depth + 1)]  # fmt: skip

    @property
    def total(self) -> float:
        """Sum of all leaves."""
        return float(self._sum[-1][0])

    @property
    def minimum(self) -> float:
        """Smallest min-leaf (``inf`` when all are unset)."""
        return float(self._min[-1][0])

    def build(self, mass: Tensor, low: Tensor) -> None:
        """Set all leaves: ``mass`` ``[size]`` (summed, >= 0) and ``low`` ``[size]``
        (minimised; ``inf`` leaves out)."""
        self._sum[0][: self.size] = mass
        self._min[0][: self.size] = low
        for k in range(self.depth):  # (strided adds beat a sum over a last dim of 2)
            self._sum[k + 1] = self._sum[k][0::2] + self._sum[k][1::2]
            self._min[k + 1] = torch.minimum(self._min[k][0::2], self._min[k][1::2])

    def set(self, index: Tensor, mass: Tensor, low: Tensor) -> None:
        """Set the leaves at ``index`` ``[B]`` (distinct) and refresh their ancestors."""
        self._sum[0][index] = mass.to(torch.float64)
        self._min[0][index] = low.to(torch.float64)
        for k in range(self.depth):
            index = torch.unique(index // 2)
            left, right = 2 * index, 2 * index + 1
            self._sum[k + 1][index] = self._sum[k][left] + self._sum[k][right]
            self._min[k + 1][index] = torch.minimum(self._min[k][left], self._min[k][right])

    def find(self, mass: Tensor) -> Tensor:
        """For each ``mass`` in ``[0, total)``, the leaf whose cumulative-sum interval holds
        it (``[B]`` int64): leaf ``i`` is found with probability ``mass_i / total`` when
        ``mass`` is uniform. Never returns a leaf of mass 0."""
        mass = mass.to(torch.float64).clone()
        node = torch.zeros(mass.shape, dtype=torch.int64)
        for k in range(self.depth - 1, -1, -1):
            left = 2 * node
            left_sum = self._sum[k][left]
            # Rounding may leave a draw just past the left subtree: only go right into mass.
            right = (mass >= left_sum) & (self._sum[k][left + 1] > 0)
            mass -= torch.where(right, left_sum, 0.0)
            node = left + right
        return node.clamp_max(self.size - 1)
