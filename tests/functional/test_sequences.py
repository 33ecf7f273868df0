"""``is_init`` -> trajectory boundaries: segment_starts, trajectory_ends, split_pieces."""

from __future__ import annotations

import pytest
import torch

from recurrl.functional.sequences import (
    host_starts,
    pieces_from_starts,
    segment_starts,
    split_pieces,
    trajectory_ends,
)


def _grid(*rows: str) -> torch.Tensor:
    return torch.tensor([[c == "1" for c in row] for row in rows])


def test_segment_starts_forces_first_step_and_copies():
    is_init = _grid("0010", "0000", "1001")
    starts = segment_starts(is_init)
    assert starts.tolist() == _grid("1010", "1000", "1001").tolist()
    assert not is_init[0, 0]  # the input is not modified


def test_segment_starts_leading_dims():
    is_init = torch.zeros(2, 3, 4, dtype=torch.bool)
    assert segment_starts(is_init)[..., 0].all()
    assert not segment_starts(is_init)[..., 1:].any()


def test_trajectory_ends():
    is_init = _grid("0010", "0000", "1001", "1111")
    assert trajectory_ends(is_init).tolist() == _grid("0101", "0001", "0011", "1111").tolist()
    # a flag at t = 0 does not end anything; the last step always ends a trajectory
    assert trajectory_ends(_grid("1")).tolist() == [[True]]


def test_split_pieces_known_answer():
    pieces = split_pieces(_grid("0010", "0000", "1001"))
    # pieces: (0, len 2) (2, len 2) (4, len 4) (8, len 3) (11, len 1); longest first, stable
    assert pieces.start.tolist() == [4, 8, 0, 2, 11]
    assert pieces.length.tolist() == pieces.lengths == [4, 3, 2, 2, 1]
    assert pieces.start.dtype == pieces.length.dtype == torch.int64


@pytest.mark.parametrize(("n", "steps", "p"), [(1, 1, 0.5), (3, 8, 0.0), (3, 8, 1.0), (5, 13, 0.3)])
def test_split_pieces_partitions_the_grid(n, steps, p):
    torch.manual_seed(0)
    is_init = torch.rand(n, steps) < p
    pieces = split_pieces(is_init)
    starts = segment_starts(is_init).reshape(-1)
    covered = torch.zeros(n * steps, dtype=torch.int64)
    for start, length in zip(pieces.start.tolist(), pieces.lengths, strict=True):
        assert starts[start]  # every piece begins at a trajectory start
        assert start // steps == (start + length - 1) // steps  # and never crosses rows
        assert not starts[start + 1 : start + length].any()  # nor another start
        covered[start : start + length] += 1
    assert (covered == 1).all()
    assert pieces.lengths == sorted(pieces.lengths, reverse=True)
    assert len(pieces.lengths) == int(starts.sum())


def test_pieces_from_host_starts_are_split_pieces():
    torch.manual_seed(1)
    is_init = torch.rand(4, 9) < 0.3
    starts = host_starts(is_init)
    assert (starts == segment_starts(is_init).numpy()).all()
    is_init_before = is_init.clone()
    starts[0, 1] = True  # a copy: is_init is untouched
    assert torch.equal(is_init, is_init_before)
    a, b = pieces_from_starts(host_starts(is_init)), split_pieces(is_init)
    assert torch.equal(a.start, b.start) and torch.equal(a.length, b.length)
    assert a.lengths == b.lengths
