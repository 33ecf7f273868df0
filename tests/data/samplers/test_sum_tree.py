"""SumMinTree (``recurrl/data/samplers/_sum_tree.py``) against a cumsum + searchsorted
reference, after builds and after batched updates."""

from __future__ import annotations

import math

import pytest
import torch

from recurrl.data.samplers._sum_tree import SumMinTree


def reference_find(mass: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
    cdf = torch.cumsum(mass.double(), 0)
    return torch.searchsorted(cdf, draws, right=True)


@pytest.mark.parametrize("size", [1, 2, 5, 64, 1000])
def test_find_total_and_minimum_match_the_reference(size):
    g = torch.Generator().manual_seed(size)
    mass = torch.rand(size, generator=g, dtype=torch.float64)
    mass[torch.rand(size, generator=g) < 0.3] = 0.0  # leaves that must never be found
    mass[0] = 0.5
    low = torch.where(mass > 0, mass, math.inf)
    tree = SumMinTree(size)
    tree.build(mass, low)
    for _ in range(3):
        draws = torch.rand(500, generator=g, dtype=torch.float64) * tree.total
        found = tree.find(draws)
        assert (mass[found] > 0).all()
        torch.testing.assert_close(found, reference_find(mass, draws))
        assert tree.total == pytest.approx(float(mass.sum()))
        assert tree.minimum == float(low.min())
        index = torch.randperm(size, generator=g)[: max(size // 3, 1)]
        mass[index] = torch.rand(len(index), generator=g, dtype=torch.float64)
        low = torch.where(mass > 0, mass, math.inf)
        tree.set(index, mass[index], low[index])


def test_draws_at_the_edges_stay_on_leaves_with_mass():
    tree = SumMinTree(6)
    mass = torch.tensor([0.0, 1.0, 0.0, 2.0, 0.0, 0.0], dtype=torch.float64)
    tree.build(mass, torch.where(mass > 0, mass, math.inf))
    edges = torch.tensor([0.0, 1.0, 3.0 - 1e-12, math.nextafter(3.0, 0.0)], dtype=torch.float64)
    assert tree.find(edges).tolist() == [1, 3, 3, 3]
